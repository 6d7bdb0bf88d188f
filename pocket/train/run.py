"""`pocket train`: config + flags -> Trainer -> result dict, and its text rendering."""

from __future__ import annotations

from pocket.train.config import format_size, load_config


def train_from_config(config_path: str | None, overrides: dict, *, quiet: bool = False,
                      callbacks=()) -> dict:
    """Run a training job as the CLI does; returns the JSON-able result."""
    from pocket.train.trainer import Trainer

    resume = overrides.pop("resume", None)
    cfg = load_config(config_path, overrides)
    trainer = Trainer(cfg, quiet=quiet, callbacks=callbacks)
    return trainer.fit(resume=resume)


def render(r: dict) -> str:
    lines = []  # the memory plan, if any, was printed (stderr) before training began
    best = r.get("best") or {}
    lines.append(f"trained {r['epochs']} epochs ({r['steps']} steps) in {r['seconds']:.1f}s on "
                 f"{r['device']}, {r['precision']}, micro-batch {r['micro_batch']} x "
                 f"{r['accumulation']}" + (f", {r['checkpoint_segments']} checkpoint segments"
                                           if r["checkpoint_segments"] > 1 else "")
                 + (", fp16 saved activations" if r["fp16_activations"] else ""))
    if best:
        score = best["score"]
        shown = f"{score:.4f}" if isinstance(score, float) else str(score)
        lines.append(f"best epoch {best['epoch']}: {best['metric']} {shown}")
    test = r.get("test") or {}
    if "accuracy" in test:
        lines.append(f"test accuracy {test['accuracy'] * 100:.2f}%  (loss {test['loss']:.4f})")
    elif test:
        lines.append("test " + "  ".join(f"{k} {v:.4g}" for k, v in test.items()))
    lines.append("")
    lines.append("memory by category (bytes held by arrays pocket tracks):")
    lines.append(r["memory_table"])
    if r.get("gpu_pool"):
        g = r["gpu_pool"]
        lines.append(f"GPU memory pool: used {format_size(g['used_bytes'])}, held "
                     f"{format_size(g['total_bytes'])}")
    if r.get("gpu_memory"):
        m = r["gpu_memory"]
        parts = ", ".join(f"{k} {format_size(v)}" for k, v in m["at_peak"].items() if v)
        lines.append(f"GPU peak (pool, measured): {format_size(m['peak_bytes'])}"
                     + (f" = {parts}, untracked {format_size(m['unattributed_bytes'])}"
                        if parts else ""))
    lines.append("")
    lines.append(f"checkpoints: {r['best_checkpoint']} (best), {r['last_checkpoint']} (last)")
    lines.append(f"metrics:     {r['run_dir']}/metrics.jsonl")
    return "\n".join(lines)
