"""Inference latency and warm start: the pocket engine vs onnxruntime on our own ONNX export.

    python bench/infer.py                                   # everything (several minutes)
    python bench/infer.py --quick                           # cnn_mnist, fewer repeats
    python bench/infer.py --models mlp,cnn_mnist --threads 2 --repeats 7
    python bench/infer.py --against /path/to/old/checkout   # A/B: this tree vs another pocket

Three reference models get random weights and a random calibration set, go through
pocket.train (trace + checkpoint) and pocket.export (.bin and .onnx, fp32 and int8), and run:

- latency at batch 1 and time per batch at 64, fp32 and int8, for each thread count: one
  subprocess per framework, model, precision, thread count and repeat (BLAS, Numba and
  OpenMP pools are sized before import), pocket and onnxruntime alternating so machine load
  hits both alike; the median over repeats of each repeat's median call time;
- warm start: a fresh `python -c` that imports, loads and answers one batch-1 call, after one
  untimed run to warm the caches; wall time from spawn to the answer, median over repeats.
  pocket twice: with its compiled kernels from the first call, and interpreting first (the
  reference interpreter answers until Numba would have paid off; what `pocket infer` does).

With --against, a second pocket tree (an older commit's checkout) runs as a third framework in
the same interleaving, on the same .bin files, and each cell also reports pocket / that tree: how
a change moved each cell, measured in one run on one machine state.

Writes bench/results/infer.{json,md}; the ratio column is pocket / onnxruntime (lower wins).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
MODELS = {"mlp": (1, 28, 28), "cnn_mnist": (1, 28, 28), "cnn_cifar": (3, 32, 32)}
CIFAR_CHANNELS = (64, 64, 128, 128, 256, 256, 256, 256)
CALIB = 256


def _network(name: str, rng):
    from pocket.train import nn

    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256, rng=rng), nn.ReLU(),
                             nn.Linear(256, 128, rng=rng), nn.ReLU(), nn.Linear(128, 10, rng=rng))
    if name == "cnn_mnist":
        return nn.Sequential(nn.Conv2d(1, 32, 3, padding=1, rng=rng), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(32, 64, 3, padding=1, rng=rng), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(3136, 128, rng=rng), nn.ReLU(),
                             nn.Linear(128, 10, rng=rng))
    from pocket.train import models

    return models.vgg((3, 32, 32), 10, channels=list(CIFAR_CHANNELS), rng=rng)


def build(name: str, folder: Path) -> dict[str, Path]:
    """Checkpoint with random weights -> {"fp32.bin", "int8.bin", "fp32.onnx", "int8.onnx"}."""
    files = {f"{p}.{f}": folder / f"{name}.{p}.{f}" for p in ("fp32", "int8") for f in ("bin", "onnx")}
    if all(p.exists() for p in files.values()):
        return files
    from pocket.export.app import export
    from pocket.train.checkpoint import save_checkpoint
    from pocket.train.trace import trace

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    graph, params = trace(_network(name, rng), MODELS[name], {"task": "classification"})
    for k in params:  # BN running stats away from the identity, so folding does real work
        if k.endswith("running_var"):
            params[k] = rng.uniform(0.5, 2.0, params[k].shape).astype(np.float32)
        elif k.endswith("running_mean"):
            params[k] = rng.normal(0, 0.1, params[k].shape).astype(np.float32)
    calib = rng.random((CALIB, *MODELS[name]), dtype=np.float32)
    ckpt = folder / f"{name}.ckpt"
    save_checkpoint(ckpt, graph=graph, state=params, optimizer_state={}, meta={}, calib_x=calib)
    for key, path in files.items():
        prec, fmt = key.split(".")
        export(ckpt, path, fmt=fmt, int8=prec == "int8")
    return files


# --------------------------------------------------------------------------- latency worker


def _time_calls(fn, x, budget: float) -> float:
    """Median seconds per call over as many calls as fit in `budget` (at least 5)."""
    times = []
    stop = time.perf_counter() + budget
    while len(times) < 5 or time.perf_counter() < stop:
        t = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def latency_worker(args) -> None:
    """In a fresh process, one framework, one thread count: print one JSON list of timings.

    NOTE: one framework per process. onnxruntime's intra-op threads spin after each run and
    OpenBLAS's threads spin too; in one process each pool's spinning starves the other's
    threads on a 2-core machine and the second framework measures 100x slower.
    """
    rows = []
    for name in args.models:
        files = build(name, RESULTS / "models")
        for prec in args.precisions:
            if args.framework == "pocket":
                from pocket.infer import Engine

                eng = Engine(files[f"{prec}.bin"], threads=args.threads, max_batch=64)
                fn = eng.run
            else:
                import onnxruntime as ort

                so = ort.SessionOptions()
                so.intra_op_num_threads, so.inter_op_num_threads = args.threads, 1
                sess = ort.InferenceSession(str(files[f"{prec}.onnx"]), so,
                                            providers=["CPUExecutionProvider"])
                iname = sess.get_inputs()[0].name

                def fn(a, sess=sess, iname=iname):
                    return sess.run(None, {iname: a})[0]
            for batch in args.batches:
                x = np.random.default_rng(1).random((batch, *MODELS[name]), dtype=np.float32)
                y = np.array(fn(x))
                _time_calls(fn, x, 0.05)  # warm caches and thread pools
                rows.append({"model": name, "precision": prec, "batch": batch,
                             "seconds": _time_calls(fn, x, args.budget * (1 if batch == 1 else 2)),
                             "checksum": float(np.abs(y).sum())})
    print(json.dumps(rows))


def latency(args, threads: int) -> list[dict]:
    """Alternate pocket and onnxruntime workers repeat by repeat, so load drifts hit both."""
    per: dict[tuple, dict[str, list[float]]] = {}
    frameworks = ("pocket", "base", "onnxruntime") if args.against else ("pocket", "onnxruntime")
    for _ in range(args.repeats):
        # NOTE: one process per model and precision, as one deployment runs one model: thread
        # pool settings are process-wide and the engine picks them from the first model it
        # plans (OpenMP spins briefly only when a plan has no BLAS call, see engine.py)
        for name in args.models:
            for prec in args.precisions:
                for fw in frameworks:
                    # the base tree runs this same worker with its own package first on the path
                    cmd = [sys.executable, __file__, "--worker", "onnxruntime" if fw == "onnxruntime"
                           else "pocket", "--threads", str(threads), "--models", name,
                           "--precisions", prec, "--batches", ",".join(map(str, args.batches)),
                           "--budget", str(args.budget)]
                    env = _env(threads, args.against if fw == "base" else ROOT)
                    out = subprocess.run(cmd, env=env, cwd=ROOT, check=True,
                                         stdout=subprocess.PIPE, text=True).stdout
                    for r in json.loads(out.splitlines()[-1]):
                        key = (r["model"], r["precision"], r["batch"])
                        per.setdefault(key, {f: [] for f in frameworks})[fw].append(r["seconds"])
    rows = []
    for (name, prec, batch), t in per.items():
        med = {k: statistics.median(v) for k, v in t.items()}
        rows.append({"model": name, "precision": prec, "batch": batch, "threads": threads,
                     "pocket_ms": med["pocket"] * 1e3, "ort_ms": med["onnxruntime"] * 1e3,
                     "ratio": med["pocket"] / med["onnxruntime"],
                     "pocket_repeats_ms": [v * 1e3 for v in t["pocket"]],
                     "ort_repeats_ms": [v * 1e3 for v in t["onnxruntime"]]})
        vs = ""
        if "base" in med:
            rows[-1].update(base_ms=med["base"] * 1e3, vs_base=med["pocket"] / med["base"],
                            base_repeats_ms=[v * 1e3 for v in t["base"]])
            vs = f"  base {rows[-1]['base_ms']:.3f} ms  vs base x{rows[-1]['vs_base']:.3f}"
        print(f"  {name} {prec} b{batch} t{threads}: pocket {rows[-1]['pocket_ms']:.3f} ms  "
              f"ort {rows[-1]['ort_ms']:.3f} ms  x{rows[-1]['ratio']:.2f}{vs}", file=sys.stderr,
              flush=True)
    return rows


# --------------------------------------------------------------------------- warm start

_START = {
    "pocket": ("import time, numpy as np\n"
               "from pocket.infer import Engine\n"
               "e = Engine({path!r}, threads={threads})\n"
               "e.run(np.zeros((1, {shape}), np.float32))\n"
               "print(time.time())\n"),
    # what `pocket infer` does for a short run: the first answers from the reference
    # interpreter, Numba not imported yet (see Engine's interpret_first)
    "pocket_interpret": ("import time, numpy as np\n"
                         "from pocket.infer import Engine\n"
                         "e = Engine({path!r}, threads={threads}, interpret_first=True)\n"
                         "e.run(np.zeros((1, {shape}), np.float32))\n"
                         "print(time.time())\n"),
    "onnxruntime": ("import time, numpy as np, onnxruntime as ort\n"
                    "so = ort.SessionOptions()\n"
                    "so.intra_op_num_threads, so.inter_op_num_threads = {threads}, 1\n"
                    "s = ort.InferenceSession({path!r}, so, providers=['CPUExecutionProvider'])\n"
                    "s.run(None, {{s.get_inputs()[0].name: np.zeros((1, {shape}), np.float32)}})\n"
                    "print(time.time())\n"),
}


def start_times(name: str, prec: str, threads: int, repeats: int, env: dict) -> dict:
    files = build(name, RESULTS / "models")
    shape = ", ".join(map(str, MODELS[name]))
    codes = {k: c.format(path=str(files[f"{prec}.{'onnx' if k == 'onnxruntime' else 'bin'}"]),
                         threads=threads, shape=shape) for k, c in _START.items()}
    per: dict[str, list[float]] = {k: [] for k in codes}
    for r in range(repeats + 1):
        for k, code in codes.items():
            t0 = time.time()
            out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, check=True,
                                 capture_output=True, text=True).stdout
            if r:  # the first round only warms the caches
                per[k].append(float(out.split()[-1]) - t0)
    med = {k: statistics.median(v) for k, v in per.items()}
    return {"model": name, "precision": prec, "threads": threads, "pocket_s": med["pocket"],
            "pocket_interpret_s": med["pocket_interpret"], "ort_s": med["onnxruntime"],
            "delta_s": med["pocket"] - med["onnxruntime"],
            "interpret_delta_s": med["pocket_interpret"] - med["onnxruntime"],
            "pocket_repeats_s": per["pocket"], "pocket_interpret_repeats_s": per["pocket_interpret"],
            "ort_repeats_s": per["onnxruntime"]}


# --------------------------------------------------------------------------- driver


def _env(threads: int, tree: Path | str = ROOT) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree) + os.pathsep + env.get("PYTHONPATH", "")
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        env[var] = str(threads)
    return env


def _load() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "?"


def markdown(result: dict) -> str:
    base = result.get("against")
    lines = [f"# Inference: pocket vs onnxruntime ({result['machine']})", "",
             f"Load average before/after: {result['load_before']} / {result['load_after']}. "
             "Median over repeats; ratio = pocket / onnxruntime (lower is better)."
             + (f" Base: the pocket tree at {base}, interleaved in the same run." if base else ""), "",
             "| model | precision | batch | threads | pocket ms | onnxruntime ms | ratio |"
             + (" base ms | pocket / base |" if base else ""),
             "|---|---|---:|---:|---:|---:|---:|" + ("---:|---:|" if base else "")]
    for r in result["latency"]:
        lines.append(f"| {r['model']} | {r['precision']} | {r['batch']} | {r['threads']} | "
                     f"{r['pocket_ms']:.3f} | {r['ort_ms']:.3f} | {r['ratio']:.2f} |"
                     + (f" {r['base_ms']:.3f} | {r['vs_base']:.3f} |" if base else ""))
    if result["start"]:
        lines += ["", "Warm-cache start (fresh process: import, load, first batch-1 answer); "
                  "kernels: Engine(path), the compiled kernels from the first call; interpret "
                  "first: Engine(path, interpret_first=True), as `pocket infer` runs a short job:",
                  "", "| model | precision | threads | pocket kernels s | pocket interpret first s "
                  "| onnxruntime s | kernels - ort s | interpret first - ort s |",
                  "|---|---|---:|---:|---:|---:|---:|---:|"]
        for r in result["start"]:
            lines.append(f"| {r['model']} | {r['precision']} | {r['threads']} | {r['pocket_s']:.3f}"
                         f" | {r['pocket_interpret_s']:.3f} | {r['ort_s']:.3f} | {r['delta_s']:+.3f}"
                         f" | {r['interpret_delta_s']:+.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--precisions", default="fp32,int8")
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--budget", type=float, default=0.3, help="seconds of calls per repeat")
    ap.add_argument("--start-repeats", type=int, default=5)
    ap.add_argument("--no-start", action="store_true", help="skip the warm-start measurement")
    ap.add_argument("--quick", action="store_true", help="cnn_mnist, 3 repeats, short budgets")
    ap.add_argument("--against", metavar="TREE",
                    help="another pocket checkout, timed interleaved as a third framework")
    ap.add_argument("--worker", choices=("pocket", "onnxruntime"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.models, args.repeats, args.budget, args.start_repeats = "cnn_mnist", 3, 0.1, 3
    args.models = [m for m in args.models.split(",") if m]
    unknown = set(args.models) - set(MODELS)
    if unknown:
        ap.error(f"unknown model(s) {', '.join(sorted(unknown))}; choose from {', '.join(MODELS)}")
    args.precisions = args.precisions.split(",")
    args.batches = [int(b) for b in args.batches.split(",")]
    if args.worker:
        args.framework, args.threads = args.worker, int(args.threads)
        latency_worker(args)
        return
    threads = [int(t) for t in args.threads.split(",")]
    if args.against and not (Path(args.against) / "pocket" / "infer").is_dir():
        ap.error(f"--against {args.against}: not a pocket checkout (no pocket/infer there)")
    for name in args.models:  # build once, outside the timed workers
        build(name, RESULTS / "models")
    result = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
                         f"{platform.python_version()}", "load_before": _load(),
              "latency": [], "start": [], "against": args.against}
    for t in threads:
        result["latency"] += latency(args, t)
    if not args.no_start:
        t = max(threads)
        for name in args.models:
            for prec in args.precisions:
                result["start"].append(start_times(name, prec, t, args.start_repeats, _env(t)))
                r = result["start"][-1]
                print(f"  start {name} {prec}: pocket {r['pocket_s']:.3f} s  interpret first "
                      f"{r['pocket_interpret_s']:.3f} s  ort {r['ort_s']:.3f} s", file=sys.stderr,
                      flush=True)
    result["load_after"] = _load()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "infer.json").write_text(json.dumps(result, indent=1))
    md = markdown(result)
    (RESULTS / "infer.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
