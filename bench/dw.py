"""The depthwise convolutions of MobileNetV2-0.5 at 128x128, batch 1: pocket's kernels_dw vs
the routes they replace (kernels_fp32.conv2d_direct; int8 im2row + gemm_q) vs onnxruntime
running one depthwise Conv (+ Relu, which it fuses) or QLinearConv node.

    python bench/dw.py                  # all 10 distinct layers, 1 and 2 threads
    python bench/dw.py --rounds 5 --quick

The 17 depthwise layers of MobileNetV2 (width 0.5, channels rounded to multiples of 8 as in
the paper's reference code) come in 10 distinct shapes; the total weighs each by its count.
Each round times every candidate on every layer in turn (interleaved, so machine load hits them
alike), each the median of `--calls` calls; the table shows the median over rounds.
pocket at 1 thread runs the serial twins (what the engine binds for small work), at 2 the
parallel ones with Numba's pool at 2; onnxruntime with intra_op_num_threads 1 or 2.

kernels_dw is plain Numba (no x86 intrinsics): POCKET_FP32_FMA=0 POCKET_INT8_VNNI=0 (the
portable path) does not change it or the routes it is compared with.

Writes bench/results/dw.{json,md}; ratios are pocket / onnxruntime (lower wins).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from functools import partial
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"

# (channels, input size, stride, count): MobileNetV2-0.5's expanded depthwise 3x3 layers
LAYERS = [(16, 64, 1, 1), (48, 64, 2, 1), (96, 32, 1, 1), (96, 32, 2, 1), (96, 16, 1, 2),
          (96, 16, 2, 1), (192, 8, 1, 4), (288, 8, 1, 2), (288, 8, 2, 1), (480, 4, 1, 3)]
X_SCALE, X_ZP, Y_SCALE, Y_ZP = 0.05, -3, 0.04, -128


def _onnx_model(c: int, s: int, w, b, int8: bool, w_scale=None) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    attrs = {"group": c, "kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [s, s]}
    if int8:
        inits = [numpy_helper.from_array(np.array(X_SCALE, np.float32), "xs"),
                 numpy_helper.from_array(np.array(X_ZP, np.int8), "xz"),
                 numpy_helper.from_array(w, "w"),
                 numpy_helper.from_array(w_scale.astype(np.float32), "ws"),
                 numpy_helper.from_array(np.zeros(c, np.int8), "wz"),
                 numpy_helper.from_array(np.array(Y_SCALE, np.float32), "ys"),
                 numpy_helper.from_array(np.array(Y_ZP, np.int8), "yz"),
                 numpy_helper.from_array(b, "b")]
        nodes = [helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"],
                                  ["y"], **attrs)]
        et = TensorProto.INT8
    else:
        inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
        nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs),
                 helper.make_node("Relu", ["c"], ["y"])]
        et = TensorProto.FLOAT
    graph = helper.make_graph(nodes, "dw", [helper.make_tensor_value_info("x", et, None)],
                              [helper.make_tensor_value_info("y", et, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _session(model: bytes, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def candidates(c: int, size: int, s: int, rng) -> dict:
    """name -> (threads, zero-argument callable) for one layer."""
    from pocket.formats import quant as qm
    from pocket.infer import kernels_dw as kd
    from pocket.infer import kernels_fp32 as kf
    from pocket.infer import kernels_int8 as ki

    ho = kd.out_size(size, 3, s, 1, 1)
    x = rng.standard_normal((1, c, size, size)).astype(np.float32)
    w = (rng.standard_normal((c, 1, 3, 3)) / 3).astype(np.float32)
    b = (0.1 * rng.standard_normal(c)).astype(np.float32)
    y = np.empty((1, c, ho, ho), np.float32)
    xq = rng.integers(-128, 128, x.shape).astype(np.int8)
    wq, ws = qm.quantize_weights(w)
    bq = qm.quantize_bias(b, X_SCALE, ws)
    m = qm.requant_multiplier(X_SCALE, ws, Y_SCALE)
    yq = np.empty(y.shape, np.int8)
    col = np.empty((1, ho * ho, 9 * c), np.int8)
    w2 = wq.reshape(c, 9)
    badj = bq.astype(np.int64) - X_ZP * ki.weight_sums(w2).astype(np.int64)
    epi = (True, float(Y_ZP), (float(Y_ZP), 127.0, np.inf), True)  # relu: clamp [y_zp, 127]
    geom = (1, 1, 1, 1)
    out = {}
    yq3 = yq.reshape(1, c, ho * ho)

    def old_int8(im2row, gemm):
        im2row(col, xq, 3, 3, s, s, 1, 1, 1, 1, np.int8(X_ZP))
        gemm(yq3, col, w2, badj, m, c, *epi)

    for t in (1, 2):
        def pick(f, t=t):
            return f if t == 2 else f.serial

        out[f"fp32 dw t{t}"] = (t, partial(pick(kd.dw_conv), y, x, w, b, s, s, *geom, 1, 0.0))
        out[f"fp32 direct t{t}"] = (t, partial(pick(kf.conv2d_direct), y, x, w, b, s, s, *geom, 1,
                                               0.0))
        out[f"int8 dw t{t}"] = (t, partial(pick(kd.dw_conv_q), yq, xq, wq, bq, m, X_ZP, *epi, s, s,
                                           *geom))
        out[f"int8 im2row+gemm_q t{t}"] = (t, partial(old_int8, pick(ki.im2row), pick(ki.gemm_q)))
    import numba

    for t, f in out.values():
        # NOTE: compiled before onnxruntime is loaded: Numba compiling with onnxruntime
        # sessions alive crashed (a segfault in the garbage collector)
        numba.set_num_threads(t)
        f()
    for t in (1, 2):
        try:
            sf = _session(_onnx_model(c, s, w, b, False), t)
            sq = _session(_onnx_model(c, s, wq, bq, True, ws), t)
        except ImportError:
            continue
        out[f"fp32 onnxruntime t{t}"] = (t, lambda sf=sf: sf.run(None, {"x": x}))
        out[f"int8 onnxruntime t{t}"] = (t, lambda sq=sq: sq.run(None, {"x": xq}))
    return out


def run(rounds: int, calls: int, quick: bool) -> dict:
    import numba

    rng = np.random.default_rng(0)
    layers = LAYERS[::3] if quick else LAYERS
    cands = []
    for c, size, s, _ in layers:
        cands.append(candidates(c, size, s, rng))
        for t, f in cands[-1].values():  # warm up
            numba.set_num_threads(t)
            f()
    times = [{k: [] for k in cs} for cs in cands]
    for _ in range(rounds):
        for cs, ts in zip(cands, times, strict=True):
            for k, (t, f) in cs.items():
                numba.set_num_threads(t)
                one = []
                for _ in range(calls):
                    t0 = time.perf_counter()
                    f()
                    one.append(time.perf_counter() - t0)
                ts[k].append(statistics.median(one))
    rows = []
    for (c, size, s, count), ts in zip(layers, times, strict=True):
        rows.append({"layer": f"{c}x{size}x{size} s{s}", "count": count,
                     "us": {k: 1e6 * statistics.median(v) for k, v in ts.items()}})
    total = {k: sum(r["count"] * r["us"][k] for r in rows) for k in rows[0]["us"]}
    return {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "numba": numba.__version__, "rounds": rounds, "calls": calls,
            "portable_env": {k: os.environ.get(k) for k in ("POCKET_FP32_FMA", "POCKET_INT8_VNNI")},
            "rows": rows, "total_us": total}


def markdown(res: dict) -> str:
    keys = list(res["total_us"])
    ort = {p: {t: f"{p} onnxruntime t{t}" for t in (1, 2)} for p in ("fp32", "int8")}
    lines = ["| layer | n | " + " | ".join(keys) + " | fp32 dw/ort t1 | int8 dw/ort t1 |",
             "|---" * (len(keys) + 4) + "|"]

    def ratio(us, p):
        o = us.get(ort[p][1])
        return f"{us[f'{p} dw t1'] / o:.2f}x" if o else "-"

    for r in [*res["rows"], {"layer": "**all 17 (weighted)**", "count": 17, "us": res["total_us"]}]:
        us = r["us"]
        lines.append(f"| {r['layer']} | {r['count']} | " + " | ".join(f"{us[k]:.1f}" for k in keys)
                     + f" | {ratio(us, 'fp32')} | {ratio(us, 'int8')} |")
    return "\n".join(lines) + "\n\n(microseconds per call, batch 1; medians over rounds)\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="every third layer only")
    args = ap.parse_args()
    res = run(args.rounds, args.calls, args.quick)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "dw.json").write_text(json.dumps(res, indent=1))
    md = markdown(res)
    (RESULTS / "dw.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
