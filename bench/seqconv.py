"""Engine latency of the sequence zoo models (`tcn`, `ssm`, `transformer`): pocket vs
onnxruntime on our own ONNX export, fp32 and int8, batch 1 and 64.

    python bench/seqconv.py                        # all three, 1 thread, 5 repeats
    python bench/seqconv.py --models tcn --threads 1,2 --repeats 7 --precisions fp32

`ssm` is at examples/co2_ssm.toml's size (a 104-step window of one series, d_model 32,
d_state 16, 2 blocks), `transformer` at digits_vit.toml's width (16 tokens of 4 features, dim
64, 2 blocks, 4 heads); the same models bench/seq_train.py trains.

The model gets random weights and a random calibration set, goes through pocket.train (trace +
checkpoint) and pocket.export (.bin and .onnx, fp32 and int8), and runs as bench/infer.py's
models do: one subprocess per framework, precision, thread count and repeat, pocket and
onnxruntime alternating so that machine load hits both alike; the median over repeats of each
repeat's median call time. Writes bench/results/seqconv.{json,md}; ratio = pocket / onnxruntime.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import infer as bi  # noqa: E402  (bench/infer.py: _time_calls, _env, _load)

ROOT = bi.ROOT
RESULTS = bi.RESULTS
# features x time, as a forecaster reads a window: 4 series, 128 steps; 4 blocks of 32
# channels, kernel 3 (receptive field 61)
MODELS = {"tcn": {"input": (4, 128), "kw": {"channels": [32, 32, 32, 32], "kernel": 3}},
          "ssm": {"input": (104, 1), "kw": {"d_model": 32, "d_state": 16, "depth": 2}},
          "transformer": {"input": (16, 4),
                          "kw": {"dim": 64, "depth": 2, "heads": 4, "mlp_ratio": 2.0}}}


def build(name: str, folder: Path) -> dict[str, Path]:
    files = {f"{p}.{f}": folder / f"{name}.{p}.{f}" for p in ("fp32", "int8") for f in ("bin", "onnx")}
    if all(p.exists() for p in files.values()):
        return files
    from pocket.export.app import export
    from pocket.train import models
    from pocket.train.checkpoint import save_checkpoint
    from pocket.train.trace import trace

    folder.mkdir(parents=True, exist_ok=True)
    spec = MODELS[name]
    rng = np.random.default_rng(0)
    model = models.ZOO[name](spec["input"], 10, rng=rng, **spec["kw"]).eval()
    graph, params = trace(model, spec["input"], {"task": "classification"})
    calib = rng.standard_normal((256, *spec["input"])).astype(np.float32)
    ckpt = folder / f"{name}.ckpt"
    save_checkpoint(ckpt, graph=graph, state=params, optimizer_state={}, meta={}, calib_x=calib)
    for key, path in files.items():
        prec, fmt = key.split(".")
        export(ckpt, path, fmt=fmt, int8=prec == "int8")
    return files


def worker(args) -> None:
    """One framework, one precision, one thread count in a fresh process: JSON timings."""
    rows = []
    files = build(args.model, RESULTS / "models")
    shape = MODELS[args.model]["input"]
    if args.framework == "pocket":
        from pocket.infer import Engine

        fn = Engine(files[f"{args.precision}.bin"], threads=args.threads, max_batch=64).run
    else:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = args.threads, 1
        sess = ort.InferenceSession(str(files[f"{args.precision}.onnx"]), so,
                                    providers=["CPUExecutionProvider"])
        iname = sess.get_inputs()[0].name

        def fn(a):
            return sess.run(None, {iname: a})[0]
    for batch in (1, 64):
        x = np.random.default_rng(1).standard_normal((batch, *shape)).astype(np.float32)
        y = np.array(fn(x))
        bi._time_calls(fn, x, 0.05)
        rows.append({"batch": batch, "seconds": bi._time_calls(fn, x, args.budget * (1 + (batch > 1))),
                     "checksum": float(np.abs(y).sum())})
    print(json.dumps(rows))


def measure(model: str, threads: int, prec: str, repeats: int, budget: float) -> list[dict]:
    """Rows for one model, thread count and precision: both frameworks, batch 1 and 64."""
    per: dict[int, dict[str, list]] = {}
    for _ in range(repeats):
        for fw in ("pocket", "onnxruntime"):
            cmd = [sys.executable, __file__, "--worker", fw, "--threads", str(threads),
                   "--model", model, "--precision", prec, "--budget", str(budget)]
            out = subprocess.run(cmd, env=bi._env(threads), cwd=ROOT, check=True,
                                 stdout=subprocess.PIPE, text=True).stdout
            for r in json.loads(out.splitlines()[-1]):
                d = per.setdefault(r["batch"], {"pocket": [], "onnxruntime": [], "sums": {}})
                d[fw].append(r["seconds"])
                d["sums"][fw] = r["checksum"]
    rows = []
    for batch, t in per.items():
        p, o = statistics.median(t["pocket"]), statistics.median(t["onnxruntime"])
        # the same export run by both: sum |y| agreeing says both ran the same model
        sums = t["sums"]
        rel = abs(sums["pocket"] - sums["onnxruntime"]) / max(abs(sums["onnxruntime"]), 1e-30)
        rows.append({"model": model, "precision": prec, "batch": batch, "threads": threads,
                     "pocket_ms": p * 1e3, "ort_ms": o * 1e3, "ratio": p / o,
                     "checksum_rel_diff": rel,
                     "pocket_repeats_ms": [v * 1e3 for v in t["pocket"]],
                     "ort_repeats_ms": [v * 1e3 for v in t["onnxruntime"]]})
        print(f"  {model} {prec} b{batch} t{threads}: pocket {p * 1e3:.3f} ms  "
              f"ort {o * 1e3:.3f} ms  x{p / o:.2f}  (|y| sums differ by {rel:.1e})",
              file=sys.stderr, flush=True)
    return rows



def _fail(message: str) -> None:
    """Bad input: one `Error:` line on stderr, exit 3 (the project's rule)."""
    print(f"Error: {message}", file=sys.stderr)
    raise SystemExit(3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--threads", default="1")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--precisions", default="fp32,int8")
    ap.add_argument("--budget", type=float, default=0.3, help="seconds of calls per timing")
    ap.add_argument("--worker", dest="framework", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="tcn", choices=sorted(MODELS), help=argparse.SUPPRESS)
    ap.add_argument("--precision", default="fp32", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.framework:
        args.threads = int(args.threads)
        worker(args)
        return
    names = args.models.split(",")
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        _fail(f"unknown model(s) {', '.join(unknown)}; choose from "
                         f"{', '.join(MODELS)}")
    rows = []
    for model in names:
        build(model, RESULTS / "models")
        for threads in map(int, args.threads.split(",")):
            for prec in args.precisions.split(","):
                rows += measure(model, threads, prec, args.repeats, args.budget)
    import onnxruntime

    result = {"machine": platform.machine(), "python": platform.python_version(),
              "onnxruntime": onnxruntime.__version__, "load": bi._load(),
              "model": {m: MODELS[m] for m in names}, "rows": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "seqconv.json").write_text(json.dumps(result, indent=1))
    lines = ["| model | precision | batch | threads | pocket ms | onnxruntime ms | ratio |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['precision']} | {r['batch']} | {r['threads']} | "
              f"{r['pocket_ms']:.3f} | {r['ort_ms']:.3f} | {r['ratio']:.2f} |" for r in rows]
    (RESULTS / "seqconv.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
