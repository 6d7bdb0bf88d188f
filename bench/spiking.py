"""A spiking model in the engine: event-driven synapses (work only where a spike arrived) vs
dense ones, per lif node and for the whole model, beside onnxruntime on the model's ONNX export.

    python bench/spiking.py MODEL.bin [--onnx MODEL.onnx] [--rounds 7] [--batch 1 --batch 64]

MODEL.bin is an exported spiking model (e.g. examples/digits_snn.toml, trained and exported);
the inputs are its calibration samples when the model came with them, else the bundled digits
test split. Each round times every candidate in turn (interleaved, so machine load hits them
alike), each the median of `--calls` calls; the table shows the median over rounds. The dense
and event engines differ only in POCKET_LIF (lowering_spiking), read when they plan; "auto" is
the engine's own choice (event-driven where the input is spikes, dense where it is a current).
Per lif node the input's firing rate (the share of nonzero inputs the event-driven synapse
walks) comes from the reference interpreter on the same inputs.

Writes bench/results/spiking.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def _inputs(path: str, n: int) -> np.ndarray:
    from pocket.train.data import load_dataset

    ds = load_dataset("digits", seed=0)
    x = ds.test.x
    return np.ascontiguousarray(np.resize(x, (max(n, 1), *x.shape[1:])), np.float32)


def _engine(path: str, mode: str, threads: int, batch: int):
    from pocket.infer import Engine

    if mode != "auto":
        os.environ["POCKET_LIF"] = mode
    try:
        eng = Engine(path, max_batch=batch)
        eng.set_threads(threads)
        eng.warmup()
    finally:
        os.environ.pop("POCKET_LIF", None)
    return eng


def _ort(path: str, threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 3
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return lambda x: sess.run(None, {name: x})


def _time(fn, x, calls: int) -> float:
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn(x)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _rates(path: str, x: np.ndarray) -> list[dict]:
    from pocket.formats import reference
    from pocket.formats.container import read_container

    with read_container(path) as c:
        env = reference.run_container(c, x, keep_all=True)
        return [{"node": n.name, "synapse": n.attrs["synapse"],
                 "input_rate": float((env[n.inputs[0]] != 0).mean()),
                 "output_rate": (float(env[n.outputs[0]].mean())
                                 if n.attrs["output"] == "spikes" else None)}
                for n in c.graph.nodes if n.op == "lif"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--onnx")
    ap.add_argument("--batch", type=int, action="append")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=5)
    args = ap.parse_args()
    batches = args.batch or [1, 64]
    x_all = _inputs(args.model, max(batches))
    rows = []
    for batch in batches:
        x = x_all[:batch]
        cands = {m: _engine(args.model, m, args.threads, batch).run
                 for m in ("dense", "event", "auto")}
        if args.onnx:
            cands["onnxruntime"] = _ort(args.onnx, args.threads)
        times: dict[str, list[float]] = {k: [] for k in cands}
        for _ in range(args.rounds):
            for k, fn in cands.items():
                times[k].append(_time(fn, x, args.calls))
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append({"batch": batch, "threads": args.threads,
                     **{f"{k}_ms": 1e3 * v for k, v in med.items()},
                     "event_speedup": med["dense"] / med["event"]})
    result = {"model": args.model, "machine": platform.machine(), "rounds": args.rounds,
              "calls": args.calls, "rows": rows, "lif_nodes": _rates(args.model, x_all[:64])}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "spiking.json").write_text(json.dumps(result, indent=2))
    keys = [k for k in rows[0] if k.endswith("_ms")]
    md = ["| batch | threads | " + " | ".join(keys) + " | dense / event |",
          "|---|---|" + "---|" * len(keys) + "---|"]
    md += [f"| {r['batch']} | {r['threads']} | " + " | ".join(f"{r[k]:.3f}" for k in keys)
           + f" | {r['event_speedup']:.2f}x |" for r in rows]
    md += ["", "| lif node | synapse | input firing rate | output firing rate |",
           "|---|---|---|---|"]
    md += [f"| {n['node']} | {n['synapse']} | {n['input_rate']:.1%} | "
           + (f"{n['output_rate']:.1%}" if n["output_rate"] is not None else "-") + " |"
           for n in result["lif_nodes"]]
    (RESULTS / "spiking.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
