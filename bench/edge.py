"""The models edge users deploy: pocket's engine vs onnxruntime on pocket's own ONNX export,
batch 1, at the architectures' usual input sizes (issue 23's benchmark).

    python bench/edge.py                                  # every architecture, x86, 1 and 2 threads
    python bench/edge.py --models mobilenet_v2 --repeats 9
    python bench/edge.py --portable                       # also the portable path (what ARM runs)
    python bench/edge.py --ort-exact                      # int8: also onnxruntime's exact kernels
    python bench/edge.py --load 1                         # beside one busy process (2 vs 1 thread)
    python bench/edge.py --icount pi4,pi5 --models mobilenet_v2   # emulated Pi guest instructions
    python bench/edge.py --icount pi5 --split --out edge_arm     # ... and pocket's per kernel

Each architecture is the zoo model (pocket.train.models) with random weights and BatchNorm
statistics away from the identity, traced, checkpointed with a random calibration set and exported
by pocket.export to fp32/int8 `.bin` and `.onnx` (cached under bench/results/models/edge/, with
the export times in a sidecar JSON: the first run pays them).

Latency: one subprocess per framework, architecture, precision, thread count and repeat, each
repeat running every thread count with pocket and onnxruntime alternating, so that machine load
hits all the cells alike (see bench/infer.py for why one framework per process); each repeat is
the median call time, the table the median over repeats. `--portable`
adds a third framework, pocket with POCKET_FP32_FMA=0 POCKET_INT8_VNNI=0 (plain Numba, the code
ARM gets), ratioed against the same onnxruntime runs. `--load N` runs N busy processes (a
Python spin loop each) for the whole latency run: the table then adds, per model, 2-thread latency
over 1-thread latency for each framework (issue 23: no worse than 1 under one busy neighbour).

icount: `../shared/tools/arm64-env icount` runs one warm call of each framework on the emulated
Cortex-A72 (pi4) or A76 (pi5), one thread, between os.close(-4200) / os.close(-4201) markers, and
reports guest instructions per inference (the ARM speed proxy: emulated time is not speed). The
arm64 root needs `PY_PKGS="numpy numba onnxruntime" arm64-env setup` (`arm64-env icount` writes the
Pi's /proc/cpuinfo itself). Each Pi keeps its Numba cache (/tmp/arm64-numba-cache-$PI): a first
count compiles every kernel under emulation (tens of minutes), later ones load them.

`--split` adds, for pocket, one more warm call with a marker before each bound kernel call:
instructions per kernel (summed by kernel name), the table's "where it goes" list.

Writes bench/results/edge.{json,md} (`--out NAME`: NAME.{json,md}); ratios are pocket /
onnxruntime (lower wins).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
MODELS_DIR = RESULTS / "models" / "edge"
# ../shared/tools/arm64-env beside the checkout; ARM64_ENV=path for another place (a worktree)
ARM64_ENV = Path(os.environ.get("ARM64_ENV", ROOT.parent / "shared" / "tools" / "arm64-env"))
CALIB = 64
CLASSES = 1000

# name -> (input shape, zoo options): the sizes the table and the papers use
ARCHS = {
    "mobilenet_v2": ((3, 128, 128), {"width_mult": 0.5}),
    "mobilenet_v3_small": ((3, 224, 224), {}),
    "shufflenet_v2": ((3, 224, 224), {}),
    "squeezenet": ((3, 224, 224), {}),
    "resnet18": ((3, 224, 224), {}),
    "efficientnet_b0": ((3, 224, 224), {}),
}
PORTABLE_ENV = {"POCKET_FP32_FMA": "0", "POCKET_INT8_VNNI": "0"}


def build(name: str) -> dict[str, Path]:
    """Random-weight checkpoint -> {"fp32.bin", "int8.bin", "fp32.onnx", "int8.onnx"}."""
    files = {f"{p}.{f}": MODELS_DIR / f"{name}.{p}.{f}" for p in ("fp32", "int8")
             for f in ("bin", "onnx")}
    if all(p.exists() for p in files.values()):
        return files
    from pocket.export.app import export
    from pocket.train import models
    from pocket.train.checkpoint import save_checkpoint
    from pocket.train.trace import trace

    if name not in models.ZOO:
        raise SystemExit(f"bench/edge.py: the zoo has no {name!r} yet (it has "
                         f"{', '.join(models.ZOO)})")
    shape, options = ARCHS[name]
    MODELS_DIR.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    model = models.ZOO[name](shape, CLASSES, rng=rng, **options)
    model.eval()
    graph, params = trace(model, shape, {"task": "classification"})
    for k in params:  # BN running stats away from the identity, so folding does real work
        if k.endswith("running_var"):
            params[k] = rng.uniform(0.5, 2.0, params[k].shape).astype(np.float32)
        elif k.endswith("running_mean"):
            params[k] = rng.normal(0, 0.1, params[k].shape).astype(np.float32)
    calib = rng.random((CALIB, *shape), dtype=np.float32)
    ckpt = MODELS_DIR / f"{name}.ckpt"
    save_checkpoint(ckpt, graph=graph, state=params, optimizer_state={}, meta={}, calib_x=calib)
    times = {}
    for key, path in files.items():
        prec, fmt = key.split(".")
        t = time.perf_counter()
        export(ckpt, path, fmt=fmt, int8=prec == "int8")
        times[key] = time.perf_counter() - t
        print(f"  built {path.name} in {times[key]:.1f} s", file=sys.stderr, flush=True)
    (MODELS_DIR / f"{name}.export_times.json").write_text(json.dumps(times, indent=1))
    return files


# --------------------------------------------------------------------------- latency


def _median_call(fn, x, budget: float) -> float:
    times = []
    stop = time.perf_counter() + budget
    while len(times) < 5 or time.perf_counter() < stop:
        t = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _runner(framework: str, path: str, threads: int):
    if framework == "pocket":
        from pocket.infer import Engine

        return Engine(path, threads=threads, max_batch=1).run
    import onnxruntime as ort

    so = ort.SessionOptions()
    if framework == "ort_exact":  # its exact int8 kernels on x86 without VNNI (pocket compare's)
        so.add_session_config_entry("session.x64quantprecision", "1")
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    iname = sess.get_inputs()[0].name
    return lambda a: sess.run(None, {iname: a})[0]


def worker(args) -> None:
    """In a fresh process: one framework, one file, one thread count -> seconds per call."""
    fn = _runner(args.worker, args.file, args.threads)
    x = np.random.default_rng(1).random((1, *args.shape), dtype=np.float32)
    fn(x)
    _median_call(fn, x, 0.05)  # warm caches and thread pools
    print(json.dumps({"seconds": _median_call(fn, x, args.budget)}))


def _env(threads: int, extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        env[var] = str(threads)
    env.update(extra or {})
    return env


def latency(args, name: str, files: dict, threads: list[int]) -> list[dict]:
    """Rows for each precision and thread count; each repeat runs every thread count and
    framework in turn, so that a drift of the machine's speed hits all the cells alike."""
    shape = ARCHS[name][0]
    rows = []
    for prec in args.precisions:
        frameworks = (["pocket", "onnxruntime"] + (["portable"] if args.portable else [])
                      + (["ort_exact"] if args.ort_exact and prec == "int8" else []))
        per = {t: {fw: [] for fw in frameworks} for t in threads}
        for _ in range(args.repeats):
            for t in threads:
                for fw in frameworks:
                    kind = "pocket" if fw in ("pocket", "portable") else fw
                    path = files[f"{prec}.{'bin' if kind == 'pocket' else 'onnx'}"]
                    cmd = [sys.executable, __file__, "--worker", kind, "--file", str(path),
                           "--threads", str(t), "--shape", ",".join(map(str, shape)),
                           "--budget", str(args.budget)]
                    env = _env(t, PORTABLE_ENV if fw == "portable" else None)
                    out = subprocess.run(cmd, env=env, cwd=ROOT, check=True, stdout=subprocess.PIPE,
                                         text=True).stdout
                    per[t][fw].append(json.loads(out.splitlines()[-1])["seconds"])
        for t in threads:
            med = {k: statistics.median(v) for k, v in per[t].items()}
            row = {"model": name, "precision": prec, "threads": t,
                   "pocket_ms": med["pocket"] * 1e3, "ort_ms": med["onnxruntime"] * 1e3,
                   "ratio": med["pocket"] / med["onnxruntime"],
                   "repeats_ms": {k: [s * 1e3 for s in v] for k, v in per[t].items()}}
            if args.portable:
                row.update(portable_ms=med["portable"] * 1e3,
                           portable_ratio=med["portable"] / med["onnxruntime"])
            if "ort_exact" in med:
                row.update(ort_exact_ms=med["ort_exact"] * 1e3,
                           ratio_exact=med["pocket"] / med["ort_exact"])
            rows.append(row)
            print(f"  {name} {prec} t{t}: pocket {row['pocket_ms']:.3f} ms  ort "
                  f"{row['ort_ms']:.3f} ms  x{row['ratio']:.2f}"
                  + (f"  portable x{row['portable_ratio']:.2f}" if args.portable else "")
                  + (f"  ort_exact {row['ort_exact_ms']:.3f} ms x{row['ratio_exact']:.2f}"
                     if "ort_exact_ms" in row else ""),
                  file=sys.stderr, flush=True)
    return rows


# --------------------------------------------------------------------------- ARM icount

_ICOUNT_SCRIPT = """\
import os, sys
import numpy as np
sys.path.insert(0, {root!r})
fw, path, shape = sys.argv[1], sys.argv[2], tuple(int(d) for d in sys.argv[3].split(","))
split = len(sys.argv) > 4
x = np.random.default_rng(1).random((1, *shape), dtype=np.float32)


def mark(k):
    try:
        os.close(-4200 - k)
    except OSError:
        pass


if fw == "pocket":
    from pocket.infer import Engine
    eng = Engine(path, threads=1, max_batch=1)
    fn = eng.run
else:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = 1, 1
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    name = s.get_inputs()[0].name
    fn = lambda a: s.run(None, {{name: a}})[0]
fn(x); fn(x)
mark(0)
fn(x)
mark(1)
if split and fw == "pocket":
    # the same warm call, one marker before each bound kernel call: instructions per kernel
    bound = eng._bound[1]
    for name_, dst in bound.inputs.items():
        np.copyto(dst, x)
    names = []
    for c in bound.calls:
        f = getattr(c, "func", c)
        n = str(getattr(f, "__qualname__", None) or getattr(f, "__name__", None) or f)
        n = n.rsplit(".", 1)[-1]
        names.append(n[:-7] if n.endswith("_serial") else n)
    print("SPLIT " + " ".join(n.replace(" ", "_") for n in names), file=sys.stderr, flush=True)
    for c in bound.calls:
        mark(2)
        c()
    mark(3)
"""


def _split(stderr: str) -> dict[str, int]:
    """Instructions per kernel name of the split run (markers -4202 before each call, -4203
    after the last), summed over the calls of one name."""
    names = next((ln.split()[1:] for ln in stderr.splitlines() if ln.startswith("SPLIT ")), [])
    marks = [int(v) for v in re.findall(r"ICOUNT -420[23] (\d+)", stderr)]
    out: dict[str, int] = {}
    for name, a, b in zip(names, marks, marks[1:]):
        out[name] = out.get(name, 0) + b - a
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def icount(pi: str, name: str, files: dict, precisions, timeout: int,
           split: bool = False) -> list[dict]:
    if not ARM64_ENV.exists():
        raise SystemExit(f"bench/edge.py: {ARM64_ENV} is not there; --icount needs arm64-env")
    shape = ",".join(map(str, ARCHS[name][0]))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "icount_run.py"
        script.write_text(_ICOUNT_SCRIPT.format(root=str(ROOT)))
        for prec in precisions:
            counts, kernels = {}, {}
            for fw, ext in (("pocket", "bin"), ("onnxruntime", "onnx")):
                # NOTE: no NUMBA_CACHE_DIR from here (an x86 one): each Pi keeps its own cache
                env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
                env.update(PI=pi, NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1",
                           OPENBLAS_NUM_THREADS="1", TMO=str(timeout))
                cmd = [str(ARM64_ENV), "icount", str(script), fw, str(files[f"{prec}.{ext}"]),
                       shape] + (["split"] if split else [])
                t = time.perf_counter()
                p = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
                marks = dict(re.findall(r"ICOUNT (-420[01]) (\d+)", p.stderr))
                if p.returncode or "-4200" not in marks or "-4201" not in marks:
                    raise SystemExit(f"bench/edge.py: icount of {fw} on {name} {prec} ({pi}) "
                                     f"failed (exit {p.returncode}):\n{p.stderr[-2000:]}")
                counts[fw] = int(marks["-4201"]) - int(marks["-4200"])
                if split and fw == "pocket":
                    kernels = _split(p.stderr)
                print(f"    {pi} {name} {prec} {fw}: {time.perf_counter() - t:.0f} s emulated",
                      file=sys.stderr, flush=True)
            rows.append({"pi": pi, "model": name, "precision": prec,
                         "pocket_instructions": counts["pocket"],
                         "ort_instructions": counts["onnxruntime"],
                         "ratio": counts["pocket"] / counts["onnxruntime"]})
            if kernels:
                rows[-1]["pocket_kernels"] = kernels
            print(f"  icount {pi} {name} {prec}: pocket {counts['pocket']:.3e}  ort "
                  f"{counts['onnxruntime']:.3e}  x{rows[-1]['ratio']:.2f}", file=sys.stderr,
                  flush=True)
    return rows


# --------------------------------------------------------------------------- report


def markdown(result: dict) -> str:
    lines = [f"# Edge models: pocket vs onnxruntime ({result['machine']})", "",
             f"Batch 1. Load average before/after: {result['load_before']} / "
             f"{result['load_after']}. Median over {result['repeats']} repeats; ratio = pocket / "
             "onnxruntime (lower is better)."
             + (f" With {result['load']} busy process(es) beside the timed ones all along."
                if result.get("load") else ""), ""]
    if result["latency"]:
        port = any("portable_ms" in r for r in result["latency"])
        exact = any("ort_exact_ms" in r for r in result["latency"])
        lines += ["| model | precision | threads | pocket ms | onnxruntime ms | ratio |"
                  + (" portable ms | portable ratio |" if port else "")
                  + (" onnxruntime exact ms | ratio to exact |" if exact else ""),
                  "|---|---|---:|---:|---:|---:|" + ("---:|---:|" if port else "")
                  + ("---:|---:|" if exact else "")]
        for r in result["latency"]:
            lines.append(f"| {r['model']} | {r['precision']} | {r['threads']} | "
                         f"{r['pocket_ms']:.3f} | {r['ort_ms']:.3f} | {r['ratio']:.2f} |"
                         + (f" {r['portable_ms']:.3f} | {r['portable_ratio']:.2f} |"
                            if port else "")
                         + ((f" {r['ort_exact_ms']:.3f} | {r['ratio_exact']:.2f} |"
                             if "ort_exact_ms" in r else " | |") if exact else ""))
    cells = {(r["model"], r["precision"], r["threads"]): r for r in result["latency"]}
    pairs = [(r, cells[r["model"], r["precision"], 2]) for r in result["latency"]
             if r["threads"] == 1 and (r["model"], r["precision"], 2) in cells]
    if pairs:
        lines += ["", "2 threads over 1 thread (latency ratio; above 1: the second thread hurts):",
                  "", "| model | precision | pocket | onnxruntime |", "|---|---|---:|---:|"]
        for one, two in pairs:
            lines.append(f"| {one['model']} | {one['precision']} | "
                         f"{two['pocket_ms'] / one['pocket_ms']:.2f} | "
                         f"{two['ort_ms'] / one['ort_ms']:.2f} |")
    if result["icount"]:
        lines += ["", "Guest instructions per inference on the emulated Pi (one thread):", "",
                  "| Pi | model | precision | pocket | onnxruntime | ratio |",
                  "|---|---|---|---:|---:|---:|"]
        for r in result["icount"]:
            lines.append(f"| {r['pi']} | {r['model']} | {r['precision']} | "
                         f"{r['pocket_instructions']:.4g} | {r['ort_instructions']:.4g} | "
                         f"{r['ratio']:.2f} |")
        split = [r for r in result["icount"] if r.get("pocket_kernels")]
        if split:
            lines += ["", "Where pocket's instructions go (per kernel, share of the inference):",
                      ""]
            for r in split:
                total = sum(r["pocket_kernels"].values()) or 1
                top = ", ".join(f"{k} {100 * v / total:.0f}%"
                                for k, v in list(r["pocket_kernels"].items())[:5])
                lines.append(f"- {r['pi']} {r['model']} {r['precision']}: {top}")
    if result["export_s"]:
        lines += ["", "Export times of the cached models (seconds, when they were built):", "",
                  "| model | fp32 .bin | int8 .bin | fp32 .onnx | int8 .onnx |",
                  "|---|---:|---:|---:|---:|"]
        for name, t in result["export_s"].items():
            lines.append(f"| {name} | " + " | ".join(
                f"{t.get(k, float('nan')):.1f}" for k in ("fp32.bin", "int8.bin", "fp32.onnx",
                                                           "int8.onnx")) + " |")
    return "\n".join(lines) + "\n"


def _load() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(ARCHS))
    ap.add_argument("--precisions", default="fp32,int8")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--budget", type=float, default=0.5, help="seconds of calls per repeat")
    ap.add_argument("--ort-exact", action="store_true",
                    help="int8 rows also time onnxruntime with session.x64quantprecision=1 (its exact "
                         "int8 kernels on x86 without VNNI, as pocket compare runs it)")
    ap.add_argument("--portable", action="store_true",
                    help="also time pocket with POCKET_FP32_FMA=0 POCKET_INT8_VNNI=0")
    ap.add_argument("--icount", default="", help="pi4,pi5: guest instruction counts instead of "
                    "(or, with --latency, besides) x86 latency")
    ap.add_argument("--latency", action="store_true", help="with --icount: time x86 as well")
    ap.add_argument("--icount-timeout", type=int, default=7200)
    ap.add_argument("--split", action="store_true", help="with --icount: pocket's instructions "
                    "per kernel as well (one more warm call, a marker before each kernel)")
    ap.add_argument("--load", type=int, default=0,
                    help="busy processes running beside the timed ones (default 0)")
    ap.add_argument("--out", default="edge", help="results name: bench/results/NAME.{json,md}")
    ap.add_argument("--worker", choices=("pocket", "onnxruntime", "ort_exact"), help=argparse.SUPPRESS)
    ap.add_argument("--file", help=argparse.SUPPRESS)
    ap.add_argument("--shape", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        args.threads = int(args.threads)
        args.shape = tuple(int(d) for d in args.shape.split(","))
        worker(args)
        return
    names = [m for m in args.models.split(",") if m]
    unknown = set(names) - set(ARCHS)
    if unknown:
        ap.error(f"unknown model(s) {', '.join(sorted(unknown))}; choose from {', '.join(ARCHS)}")
    args.precisions = args.precisions.split(",")
    pis = [p for p in args.icount.split(",") if p]
    if any(p not in ("pi4", "pi5") for p in pis):
        ap.error("--icount takes pi4, pi5 or both")
    result = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python "
                         f"{platform.python_version()}", "load_before": _load(),
              "repeats": args.repeats, "latency": [], "icount": [], "export_s": {},
              "load": args.load}
    files = {name: build(name) for name in names}  # outside the timed workers
    for name in names:
        sidecar = MODELS_DIR / f"{name}.export_times.json"
        if sidecar.exists():
            result["export_s"][name] = json.loads(sidecar.read_text())
    if not pis or args.latency:
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(args.load)]
        try:
            threads = [int(t) for t in args.threads.split(",")]
            for name in names:
                result["latency"] += latency(args, name, files[name], threads)
        finally:
            for p in busy:
                p.kill()
    for pi in pis:
        for name in names:
            result["icount"] += icount(pi, name, files[name], args.precisions,
                                       args.icount_timeout, args.split)
    result["load_after"] = _load()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(result, indent=1))
    md = markdown(result)
    (RESULTS / f"{args.out}.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
