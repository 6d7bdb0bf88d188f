"""int8 quality of MobileNetV2 (issue 23, item 7): output SQNR against fp32 per calibration
method, and with --int8-target, on held-out image-like inputs.

    python bench/int8_quality.py                      # MobileNetV2-0.5 at 128x128
    python bench/int8_quality.py --width 1.0 --size 224 --target 20

The model is the zoo's `mobilenet_v2` (train/models_edge.py) with random weights and
data-dependent BatchNorm statistics (see bench/export_time.py), so each layer sees realistic
ranges; the inputs are multi-scale blurred noise (spatially correlated like photos, normalised
per channel as ImageNet preprocessing does), 64 for calibration and 64 held out. SQNR is
measured on the held-out ones through the reference interpreter, as `pocket compare` would.

Prints one JSON object (and writes bench/results/int8_quality.json): per method the SQNR and
top-1 agreement without a target, and with the target the SQNR reached, the layers kept fp32
and the export's wall time.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from export_time import RESULTS, data_dependent_bn  # noqa: E402


def photos(rng, n: int, size: int) -> np.ndarray:
    """Blurred noise at three scales, normalised per channel."""
    x = np.zeros((n, 3, size, size))
    for blur, weight in ((1, 0.3), (4, 0.5), (12, 1.0)):
        z = rng.normal(0, 1, x.shape)
        for _ in range(blur):
            for ax in (-1, -2):
                z = (z + np.roll(z, 1, ax) + np.roll(z, -1, ax)) / 3
        x += weight * z / z.std()
    x = (x - x.mean(axis=(0, 2, 3), keepdims=True)) / x.std(axis=(0, 2, 3), keepdims=True)
    return x.astype(np.float32)


def make_checkpoint(path: Path, width: float, size: int, calib: np.ndarray, seed: int = 0):
    from pocket.formats.ir import make_metadata
    from pocket.train import models
    from pocket.train.checkpoint import save_checkpoint
    from pocket.train.trace import trace

    rng = np.random.default_rng(seed)
    model = models.ZOO["mobilenet_v2"]((3, size, size), 1000, width_mult=width, rng=rng)
    model.eval()
    meta = make_metadata(task="classification", labels=[str(i) for i in range(1000)],
                         version="bench")
    graph, params = trace(model, (3, size, size), meta)
    params = {k: v.copy() for k, v in params.items()}
    for k in params:
        if k.endswith(".bias") and k.replace(".bias", ".running_mean") in params:
            params[k][...] = rng.normal(0, 0.2, params[k].shape)
    data_dependent_bn(graph, params, photos(rng, 8, size))
    save_checkpoint(path, graph=graph, state=params, optimizer_state={},
                    meta={"trainer": {}, "config": {}}, calib_x=calib)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--width", type=float, default=0.5)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--target", type=float, default=20.0)
    ap.add_argument("--methods", default="minmax,percentile,mse,entropy")
    args = ap.parse_args(argv)
    from pocket.export.app import export
    from pocket.formats import quant as Q
    from pocket.formats import reference
    from pocket.formats.container import read_container

    rng = np.random.default_rng(1)
    calib, held = photos(rng, 64, args.size), photos(rng, 64, args.size)
    res = {"model": f"mobilenet_v2 {args.width} at {args.size}x{args.size}",
           "target_db": args.target, "methods": {}}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "m.ckpt"
        make_checkpoint(ckpt, args.width, args.size, calib)
        with read_container(ckpt) as c:
            graph = c.graph
            params = {n: np.array(c.tensors[n]) for n in graph.params}
        fp32 = reference.run(graph, params, held)[graph.outputs[0]]

        def held_out(path):
            with read_container(path) as m:
                y = reference.run_container(m, held)[graph.outputs[0]]
            return {"sqnr_db": round(Q.sqnr_db(fp32, y), 2),
                    "top1_agreement": float(np.mean(fp32.argmax(1) == y.argmax(1)))}

        for method in args.methods.split(","):
            out = {}
            r = export(ckpt, Path(tmp) / f"{method}.bin", int8=True, calib_method=method)
            out["plain"] = {**held_out(r["output"]), "layers_fp32": len(r["layers_fp32"])}
            t0 = time.perf_counter()
            r = export(ckpt, Path(tmp) / f"{method}-t.bin", int8=True, calib_method=method,
                       int8_target=args.target)
            t = r["int8_target"]
            out["target"] = {**held_out(r["output"]), "wall_s": round(time.perf_counter() - t0, 1),
                             "calib_sqnr_db": round(t["reached_db"], 2),
                             "layers": len(r["layers"]),
                             "kept_fp32_for_target": t["layers_fp32"],
                             "kept_fp32_by_guard": [x["name"] for x in r["layers_fp32"]
                                                    if x["name"] not in t["layers_fp32"]]}
            res["methods"][method] = out
            print(method, json.dumps(out), file=sys.stderr)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "int8_quality.json").write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
