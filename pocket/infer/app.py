"""`pocket infer`: run a model on files and report labels, probabilities or values.

The CLI calls exactly `infer(...)` (returns a JSON-able dict) and `render(result)` (text).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from pocket.infer.engine import Engine
from pocket.infer.inputs import InputError, load_inputs


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _ends_in_softmax(eng: Engine) -> bool:
    out = eng.output_names[0]
    return any(n.op == "softmax" and n.outputs[0] == out for n in eng.graph.nodes)


def _classify(eng: Engine, name: str, y: np.ndarray, top_k: int) -> list[dict]:
    y = y.reshape(y.shape[0], -1)
    probs = y.astype(np.float64) if _ends_in_softmax(eng) else _softmax(y)
    labels = eng.labels or [str(i) for i in range(probs.shape[1])]
    k = max(1, min(top_k, probs.shape[1]))
    rows = []
    for i, p in enumerate(probs):
        order = np.argsort(-p, kind="stable")[:k]
        top = [{"index": int(j), "label": labels[j] if j < len(labels) else str(j),
                "probability": float(p[j])} for j in order]
        rows.append({"name": name if len(probs) == 1 else f"{name}[{i}]",
                     "label": top[0]["label"], "probability": top[0]["probability"], "top": top})
    return rows


def _regress(eng: Engine, name: str, y: np.ndarray) -> list[dict]:
    # The trainer standardizes regression targets and records how, with the preprocessing.
    target = eng.metadata.get("target") or eng.preprocessing.get("target") or {}
    y = y.reshape(y.shape[0], -1).astype(np.float64)
    y = y * np.asarray(target.get("std", 1.0), np.float64) + np.asarray(target.get("mean", 0.0),
                                                                         np.float64)
    rows = []
    for i, v in enumerate(y):
        row = {"name": name if len(y) == 1 else f"{name}[{i}]", "values": [float(t) for t in v]}
        if target.get("name"):
            row["target"] = target["name"]
        rows.append(row)
    return rows


def infer(model_path: str, inputs: list[str], *, threads: int | None = None,
          batch_size: int | None = None, top_k: int = 1, output: str | None = None,
          bench: int = 0, warmup: bool = False) -> dict:
    """Run `model_path` on every input; see the module docstring. Raises PocketError subclasses."""
    if not inputs:
        raise InputError("give at least one input: an .npy/.npz array, an image, a folder or a CSV")
    if bench < 0 or top_k < 1 or (batch_size is not None and batch_size < 1):
        raise InputError("bench must be >= 0, top_k and batch_size >= 1")
    # NOTE: a one-off run on a few inputs answers sooner from the reference interpreter than
    # Numba starts (~0.4 s here, seconds on a Pi); more work switches to the kernels by itself
    with Engine(model_path, threads=threads, max_batch=batch_size or 64,
                interpret_first=not (bench or warmup)) as eng:
        t0 = time.perf_counter()
        if warmup:
            eng.warmup()
        warmup_s = time.perf_counter() - t0
        batches = load_inputs(inputs, eng.input_shape, eng.preprocessing)
        task = eng.task
        results, raw = [], []
        for name, x in batches:
            y = eng.run(x, copy=True)
            raw.append(y)
            if task == "classification":
                results += _classify(eng, name, y, top_k)
            else:
                results += _regress(eng, name, y)
        result = {"model": str(model_path), "task": task, "output": eng.output_names[0],
                  "results": results}
        if output is not None:
            out = Path(output)
            np.save(out, np.concatenate(raw, axis=0), allow_pickle=False)
            result["saved"] = str(out if out.suffix == ".npy" else out.with_name(out.name + ".npy"))
        if bench > 0:
            x = batches[0][1][: eng.max_batch]
            eng.run(x)
            times = []
            for _ in range(bench):
                t = time.perf_counter()
                eng.run(x)
                times.append(time.perf_counter() - t)
            ms = np.asarray(times) * 1e3
            result["timing"] = {"runs": bench, "batch": int(x.shape[0]),
                                "mean_ms": float(ms.mean()), "median_ms": float(np.median(ms)),
                                "min_ms": float(ms.min()),
                                "warmup_s": float(warmup_s) if warmup else None}
    return result


def render(result: dict) -> str:
    """The text form of `infer`'s result: one line per sample, then the timing."""
    lines = []
    for r in result["results"]:
        if "top" in r:
            best = f"{r['label']} ({r['probability']:.2f})"
            rest = ", ".join(f"{t['label']} ({t['probability']:.2f})" for t in r["top"][1:])
            lines.append(f"{r['name']}: {best}" + (f"  [{rest}]" if rest else ""))
        else:
            vals = ", ".join(f"{v:.6g}" for v in r["values"])
            tag = f"{r['target']} = " if r.get("target") else ""
            lines.append(f"{r['name']}: {tag}{vals}")
    if result.get("saved"):
        lines.append(f"saved outputs to {result['saved']}")
    t = result.get("timing")
    if t:
        lines.append(f"latency over {t['runs']} runs at batch {t['batch']}: "
                     f"median {t['median_ms']:.3f} ms, min {t['min_ms']:.3f} ms")
    return "\n".join(lines)
