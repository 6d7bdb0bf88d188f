"""How long `pocket export` takes on ResNet-18 at 224x224 (issue 23, item 6), per phase.

    python bench/export_time.py                    # fp32 .bin, then int8 .bin on 64 samples
    python bench/export_time.py --only int8 --calib-samples 16 --calibration mse
    python bench/export_time.py --profile          # add cProfile's shares per phase

The model is ImageNet-style ResNet-18 (7x7/2 stem, 3x3/2 max pool, basic blocks 64-128-256-512,
1000 classes) built from pocket's own layers (nn.Conv2d / BatchNorm2d / ResidualBlock /
MaxPool2d) with random weights. The BatchNorm statistics are not left at identity: one pass
over a few inputs sets each layer's running mean and variance to what its input really has
(data-dependent init), so activations keep realistic ranges through the 8 blocks, as after
training. Inputs are blurred noise (spatially correlated, like images).

Prints one JSON object: wall time per export and the phases the export report times
(`report["timings"]`, and the process's CPU seconds per phase, `cpu_timings`: on a loaded
machine the wall time is mostly waiting), and with --profile the share of the wall time spent
in the heavy functions. Writes bench/results/export_time.json.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import platform
import pstats
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT))


def resnet18(rng):
    from pocket.train import nn

    def stage(cin, cout, stride):
        return [nn.ResidualBlock(cin, cout, stride, rng=rng), nn.ResidualBlock(cout, cout, 1, rng=rng)]

    return nn.Sequential(
        nn.Conv2d(3, 64, 7, 2, 3, bias=False, rng=rng), nn.BatchNorm2d(64), nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
        *stage(64, 64, 1), *stage(64, 128, 2), *stage(128, 256, 2), *stage(256, 512, 2),
        nn.GlobalAvgPool2d(), nn.Flatten(), nn.Linear(512, 1000, rng=rng))


def images(rng, n: int, size: int) -> np.ndarray:
    x = rng.normal(0, 1, (n, 3, size, size))
    for _ in range(3):
        for ax in (-1, -2):
            x = (x + np.roll(x, 1, ax) + np.roll(x, -1, ax)) / 3
    return (x * 4).astype(np.float32)


def data_dependent_bn(graph, params, x) -> None:
    """Set every batchnorm's running stats to its input's batch statistics (in place)."""
    from pocket.formats import ops, reference  # noqa: F401 - registers the reference ops

    env = {next(iter(graph.inputs)): x, **params}
    for node in graph.nodes:
        if node.op == "batchnorm":
            v = env[node.inputs[0]].astype(np.float64)
            params[node.inputs[3]][...] = v.mean(axis=(0, 2, 3))
            params[node.inputs[4]][...] = v.var(axis=(0, 2, 3)) + 1e-3
            params[node.inputs[1]][...] = np.abs(params[node.inputs[1]]) + 0.5
        env[node.outputs[0]] = ops.impl("reference", node.op)(
            node.attrs, *(env[i] for i in node.inputs))


def make_checkpoint(path: Path, size: int, calib: int, seed: int = 0) -> None:
    from pocket.formats.ir import make_metadata
    from pocket.train.checkpoint import save_checkpoint
    from pocket.train.trace import trace

    rng = np.random.default_rng(seed)
    model = resnet18(rng)
    model.eval()
    meta = make_metadata(task="classification", labels=[str(i) for i in range(1000)],
                         version="bench")
    graph, params = trace(model, (3, size, size), meta)
    params = {k: v.copy() for k, v in params.items()}
    for k in params:  # the BN affine params: random, not the identity
        if k.endswith(".bias") and "bn" in k:
            params[k][...] = rng.normal(0, 0.1, params[k].shape)
    data_dependent_bn(graph, params, images(rng, 4, size))
    save_checkpoint(path, graph=graph, state=params, optimizer_state={},
                    meta={"trainer": {}, "config": {}}, calib_x=images(rng, calib, size))


# Functions whose cumulative time the profile reports, by (file suffix, function name).
PROFILED = {
    "reference.run (every graph run)": ("formats/reference.py", "run"),
    "conv (reference _conv)": ("formats/reference.py", "_conv"),
    "int8 epilogue (requantize)": ("formats/reference.py", "_int8_epilogue"),
    "calibration pass (run_pass)": ("export/calibrate.py", "run_pass"),
    "guard (_layer_errors)": ("export/quantize.py", "_layer_errors"),
    "sensitivity": ("export/sensitivity.py", "layer_sensitivity"),
    "write_container": ("formats/container.py", "write_container"),
}


def _shares(prof: cProfile.Profile, wall: float) -> dict:
    st = pstats.Stats(prof)
    out = {}
    for label, (suffix, fn) in PROFILED.items():
        cum = sum(v[3] for k, v in st.stats.items() if k[0].endswith(suffix) and k[2] == fn)
        out[label] = {"seconds": round(cum, 2), "share": round(cum / wall, 3) if wall else 0.0}
    # and the functions that spend the time themselves (tottime), the top 8
    top = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:8]
    out["self time, top 8"] = {f"{Path(k[0]).name}:{k[2]}": round(v[2] / wall, 3)
                               for k, v in top}
    return out


def run_one(ckpt: Path, out: Path, int8: bool, args) -> dict:
    from pocket.export.app import export

    kw = {"int8": int8}
    if int8:
        kw.update(calib_samples=args.calib_samples)
        for key, value in (("calib_method", args.calibration), ("int8_target", args.int8_target)):
            if value is not None:
                kw[key] = value
    prof = cProfile.Profile() if args.profile else None
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    report = export(ckpt, out, **kw)
    if prof:
        prof.disable()
    wall = time.perf_counter() - t0
    res = {"wall_s": round(wall, 2), "timings": report.get("timings"),
           "cpu_timings": report.get("cpu_timings"), "size": report["size"]}
    if int8:
        res["layers_fp32"] = report["layers_fp32"]
        res["agreement"] = report["agreement"]
    if prof:
        res["profile"] = _shares(prof, wall)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--calib-samples", type=int, default=64)
    ap.add_argument("--calibration", choices=["minmax", "percentile", "mse", "entropy"])
    ap.add_argument("--int8-target", type=float, metavar="SQNR_DB")
    ap.add_argument("--only", choices=["fp32", "int8"])
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args(argv)
    import os

    res = {"model": "resnet18", "size": args.size, "calib_samples": args.calib_samples,
           "machine": platform.machine(), "cpus": os.cpu_count(),
           "load_avg": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "resnet18.ckpt"
        t0 = time.perf_counter()
        make_checkpoint(ckpt, args.size, args.calib_samples)
        res["checkpoint_s"] = round(time.perf_counter() - t0, 2)
        if args.only != "int8":
            res["fp32"] = run_one(ckpt, Path(tmp) / "model.bin", False, args)
        if args.only != "fp32":
            res["int8"] = run_one(ckpt, Path(tmp) / "model.int8.bin", True, args)
    res["load_avg_end"] = os.getloadavg()[0]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "export_time.json").write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
