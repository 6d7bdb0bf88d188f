"""Live and peak bytes by category: parameters, gradients, optimizer_state, activations,
temporaries.

Owners call `alloc(category, key, nbytes)` when an array starts to count and `free(category,
key)` when it stops: Parameters on creation and collection, gradients when `.grad` is set or
cleared, optimizers for their state, and autograd nodes for the arrays they save for backward
(deduplicated by identity, so an array saved by two nodes counts once).
"""

from __future__ import annotations

import contextlib

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "temporaries")
_WORK = ("activations", "temporaries")


class MemoryTracker:
    def __init__(self) -> None:
        self._entries: dict[str, dict] = {c: {} for c in CATEGORIES}  # key -> [nbytes, refs]
        self.live = dict.fromkeys(CATEGORIES, 0)
        self.peak = dict.fromkeys(CATEGORIES, 0)
        self.total_live = 0
        self.total_peak = 0
        # activations + temporaries together: their peaks do not coincide (a conv's workspace
        # lives while part of the saved activations are already freed), so the planner
        # measures the sum's own peak
        self.work_peak = 0

    def alloc(self, category: str, key, nbytes: int) -> None:
        entries = self._entries[category]
        entry = entries.get(key)
        if entry is not None:
            entry[1] += 1
            return
        entries[key] = [int(nbytes), 1]
        self.live[category] += int(nbytes)
        self.total_live += int(nbytes)
        if self.live[category] > self.peak[category]:
            self.peak[category] = self.live[category]
        if self.total_live > self.total_peak:
            self.total_peak = self.total_live
        if category in _WORK:
            work = self.live["activations"] + self.live["temporaries"]
            if work > self.work_peak:
                self.work_peak = work

    def free(self, category: str, key) -> None:
        entries = self._entries[category]
        entry = entries.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del entries[key]
            self.live[category] -= entry[0]
            self.total_live -= entry[0]

    def count(self, category: str) -> int:
        return len(self._entries[category])

    def reset_peak(self) -> None:
        self.peak = dict(self.live)
        self.total_peak = self.total_live
        self.work_peak = self.live["activations"] + self.live["temporaries"]

    def report(self) -> dict:
        """{category: {"live": bytes, "peak": bytes}, ..., "total": {...}, "table": str}."""
        out: dict = {c: {"live": self.live[c], "peak": self.peak[c]} for c in CATEGORIES}
        out["total"] = {"live": self.total_live, "peak": self.total_peak}
        out["table"] = self.table()
        return out

    def table(self) -> str:
        rows = [f"{'category':<16} {'live':>12} {'peak':>12}"]
        for c in CATEGORIES:
            live, peak = format_bytes(self.live[c]), format_bytes(self.peak[c])
            rows.append(f"{c:<16} {live:>12} {peak:>12}")
        rows.append(
            f"{'total':<16} {format_bytes(self.total_live):>12} {format_bytes(self.total_peak):>12}"
        )
        return "\n".join(rows)


def format_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def trainable_summary(named_params, optimizer_slots: int, full_params=None) -> dict:
    """Trainable parameters against all of them, and the gradient and optimizer-state bytes
    they cost against full fine-tuning (every parameter of `full_params`, default all, trained
    by the same optimizer): what freezing saved, e.g. with LoRA adapters (train/nn_lora.py),
    where full fine-tuning would train the base model's parameters, not the adapters."""
    named_params = list(named_params)
    sizes = [(int(p.data.size), int(p.data.dtype.itemsize), bool(p.requires_grad))
             for _, p in named_params]
    total = sum(n for n, _, _ in sizes)
    grad = sum(n * b for n, b, g in sizes if g)
    full = sum(int(p.data.size) * int(p.data.dtype.itemsize)
               for _, p in (named_params if full_params is None else full_params))
    return {"parameters": total, "trainable": sum(n for n, _, g in sizes if g),
            "fraction": sum(n for n, _, g in sizes if g) / total if total else 0.0,
            "gradient_bytes": grad, "full_gradient_bytes": full,
            "optimizer_state_bytes": grad * optimizer_slots,
            "full_optimizer_state_bytes": full * optimizer_slots}


def trainable_lines(s: dict) -> list[str]:
    saved = (s["full_gradient_bytes"] + s["full_optimizer_state_bytes"]
             - s["gradient_bytes"] - s["optimizer_state_bytes"])
    return [f"trainable parameters: {s['trainable']:,} of {s['parameters']:,} "
            f"({s['fraction']:.2%})",
            f"gradients {format_bytes(s['gradient_bytes'])} + optimizer state "
            f"{format_bytes(s['optimizer_state_bytes'])}, against "
            f"{format_bytes(s['full_gradient_bytes'])} + "
            f"{format_bytes(s['full_optimizer_state_bytes'])} for full fine-tuning: "
            f"{format_bytes(saved)} saved"]


_tracker = [MemoryTracker()]


def get_tracker() -> MemoryTracker:
    return _tracker[0]


def reset_tracker() -> MemoryTracker:
    """Start a fresh tracker (keys registered with the old one are forgotten)."""
    _tracker[0] = MemoryTracker()
    return _tracker[0]


def gpu_pool_stats() -> dict | None:
    """CuPy pool usage for the report on the GPU (None on CPU-only installs); the tracker
    counts arrays pocket owns, the pool also holds workspaces and cached blocks."""
    from pocket.train import backend

    return backend.gpu_pool_stats()


@contextlib.contextmanager
def tracking():
    """Count into a fresh tracker inside the block and restore the current one after, so a
    measurement (the planner's probe step) neither sees nor disturbs the run's own numbers."""
    prev = _tracker[0]
    _tracker[0] = MemoryTracker()
    try:
        yield _tracker[0]
    finally:
        _tracker[0] = prev
