"""`pocket infer`: run a model on files and report labels, probabilities or values.

The CLI calls exactly `infer(...)` (returns a JSON-able dict) and `render(result)` (text).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from pocket.infer.api import Model, decode
from pocket.infer.inputs import Batch, InputError, load_inputs


def _rows(model: Model, batch: Batch, y: np.ndarray, top_k: int) -> list[dict]:
    pred = decode(y, model)
    if pred.probs is None:
        target = (model.metadata.get("target") or model.preprocessing.get("target") or {}).get("name")
        return [{"name": name, "values": [float(t) for t in v], **({"target": target} if target else {})}
                for name, v in zip(batch.names, pred.values)]
    names = pred.class_names
    k = max(1, min(top_k, pred.probs.shape[1]))
    rows = []
    for name, p in zip(batch.names, pred.probs):
        order = np.argsort(-p, kind="stable")[:k]
        top = [{"index": int(j), "label": names[j] if j < len(names) else str(j),
                "probability": float(p[j])} for j in order]
        rows.append({"name": name, "label": top[0]["label"], "probability": top[0]["probability"],
                     "top": top})
    return rows


def synthetic_input(model: Model, n: int = 1) -> np.ndarray:
    """n random model-ready samples (standard normal, seeded): what --warmup and --bench run on
    when no input is given (the preprocessing makes real inputs roughly that)."""
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, *model.input_shape)).astype(model.engine.input_dtype)


def infer(model_path: str, inputs: list[str], *, threads: int | None = None,
          batch_size: int | None = None, top_k: int = 1, output: str | None = None,
          bench: int = 0, warmup: bool = False, stdin=None, sep: str | None = None,
          similarity: bool = False) -> dict:
    """Run `model_path` on every input; see the module docstring. Raises PocketError subclasses.

    Without inputs, --warmup and --bench run on a synthetic batch of one sample.
    similarity: an embedding model's cosine of two inputs, and the verdict (infer/embed.py)."""
    if not inputs and not (bench or warmup):
        raise InputError("give at least one input: an .npy/.npz array, an image, a folder, a CSV "
                         "or - (stdin); or --warmup / --bench N")
    if bench < 0 or top_k < 1 or (batch_size is not None and batch_size < 1):
        raise InputError("bench must be >= 0, top_k and batch_size >= 1")
    if inputs.count("-") > 1:
        raise InputError("standard input (-) can be read only once")
    # NOTE: a one-off run on a few inputs answers sooner from the reference interpreter than
    # Numba starts (~0.4 s here, seconds on a Pi); more work switches to the kernels by itself
    with Model(model_path, threads=threads, max_batch=batch_size or 64,
               interpret_first=not (bench or warmup)) as model:
        eng = model.engine
        if similarity:
            from pocket.infer import embed

            embed.check_model(model, model_path)
        t0 = time.perf_counter()
        if warmup:
            eng.warmup()
        warmup_s = time.perf_counter() - t0
        if "timeseries" in eng.preprocessing and inputs and not bench and output is None:
            from pocket.infer import forecast as fc  # a forecast: the series' units and times

            return {"model": str(model_path), "task": "forecast", "output": eng.output_names[0],
                    "results": fc.forecast(model, inputs),
                    "time_column": eng.preprocessing["timeseries"]["time_column"]}
        batches = load_inputs(inputs, eng.input_shape, eng.preprocessing, batch_size=batch_size,
                              stdin=stdin, sep=sep)
        results, raw = [], []
        for batch in batches:
            y = eng.run(batch.x, copy=True)
            raw.append(y)
            results += _rows(model, batch, y, top_k)
        result = {"model": str(model_path), "task": model.task, "output": eng.output_names[0],
                  "results": results}
        if similarity:
            result["similarity"] = embed.similarity(model, [r["name"] for r in results],
                                                    np.concatenate(raw, axis=0))
        if warmup:
            result["warmup_s"] = float(warmup_s)
        if output is not None:
            if not raw:
                raise InputError("-o saves the outputs of inputs; give at least one input")
            out = Path(output)
            np.save(out, np.concatenate(raw, axis=0), allow_pickle=False)
            result["saved"] = str(out if out.suffix == ".npy" else out.with_name(out.name + ".npy"))
        if bench > 0:
            x = batches[0].x[: eng.max_batch] if batches else synthetic_input(model)
            eng.run(x)
            times = []
            for _ in range(bench):
                t = time.perf_counter()
                eng.run(x)
                times.append(time.perf_counter() - t)
            ms = np.asarray(times) * 1e3
            result["timing"] = {"runs": bench, "batch": int(x.shape[0]),
                                "input": "given" if batches else "synthetic",
                                "mean_ms": float(ms.mean()), "median_ms": float(np.median(ms)),
                                "min_ms": float(ms.min()),
                                "warmup_s": float(warmup_s) if warmup else None}
    return result


def render(result: dict) -> str:
    """The text form of `infer`'s result: one line per sample, then the timing."""
    lines = []
    if result.get("task") == "forecast":
        from pocket.infer import forecast as fc

        return "\n".join(fc.render(result["results"], result.get("time_column", "")))
    if result.get("similarity"):
        from pocket.infer import embed

        lines.append(embed.render(result["similarity"]))
    for r in result["results"] if not result.get("similarity") else ():
        if "top" in r:
            best = f"{r['label']} ({r['probability']:.2f})"
            rest = ", ".join(f"{t['label']} ({t['probability']:.2f})" for t in r["top"][1:])
            lines.append(f"{r['name']}: {best}" + (f"  [{rest}]" if rest else ""))
        else:
            vals = ", ".join(f"{v:.6g}" for v in r["values"])
            tag = f"{r['target']} = " if r.get("target") else ""
            lines.append(f"{r['name']}: {tag}{vals}")
    if result.get("warmup_s") is not None:
        lines.append(f"warmed up in {result['warmup_s']:.2f} s (kernels compiled or loaded from "
                     "the Numba cache)")
    if result.get("saved"):
        lines.append(f"saved outputs to {result['saved']}")
    t = result.get("timing")
    if t:
        lines.append(f"latency over {t['runs']} runs at batch {t['batch']}: "
                     f"median {t['median_ms']:.3f} ms, min {t['min_ms']:.3f} ms")
    return "\n".join(lines)
