"""How the sequence-conv ops become kernel calls (see lowering.py for prepare and builders).

conv1d, fp32: C/groups == 1 runs the direct loops; otherwise, per chunk of sequences,
im2col1d into the tap-major columns (C*K, n*Lo) in the node's scratch, one BLAS GEMM per group
(W (O/g, C/g*K) @ col, into (O, n*Lo) scratch) and bias_act, which adds the bias, applies the
fused activation and lays the result out as (n, O, Lo).
On AVX-512 (kernels_fma) a stride-1 ungrouped conv1d skips im2col, fp32 and int8 alike: the
chunk's sequences are padded back to back into one row per channel (pad_rows), and
kernels_fma's GEMM reads tap j of channel c in place at a row offset (as the conv2d pitch
route does), one GEMM for the chunk.
conv1d, int8: the same columns hold the int8 codes as float32 (padding = x_zp), the weight's
codes are converted into the scratch once a call (no lasting float copy of the weights), the
GEMMs run over chunks of at most EXACT_K taps so each partial sum is an exact integer, and
kernels_int8.requant_sum adds them up in int64 and requantizes, as the conv2d float32 route.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.formats import ops
from pocket.formats.ir import Node
from pocket.infer import kernels_fma as kfma
from pocket.infer import kernels_fp32 as kf
from pocket.infer import kernels_int8 as ki
from pocket.infer import kernels_seqconv as ks
from pocket.infer.lowering_common import (
    _EMPTY_F32,
    FMA_SCRATCH_BYTES,
    SCRATCH_BYTES,
    _act_code,
    _aligned,
    _int8_consts,
    _register_epi,
)
from pocket.infer.plan import PlanContext


def _prep_conv1d(ctx: PlanContext, node: Node) -> dict:
    w = ctx.params[node.inputs[1]]
    o, cg, k = w.shape
    c, length = ctx.sample[node.inputs[0]]
    lo = ctx.sample[node.outputs[0]][1]
    int8 = "x_scale" in node.attrs
    a = node.attrs
    prep = {"direct": cg == 1 and not int8}
    if prep["direct"]:
        return prep
    if ctx.cpu.fma and a["stride"] == 1 and a["groups"] == 1 and c * k <= ki.EXACT_K:
        lp = sum(a["padding"]) + length
        per_seq = (c + o) * lp * 4
        chunk = max(1, min(ctx.max_batch, FMA_SCRATCH_BYTES // max(per_seq, 1)))
        rows = _pad_row(chunk, lp, k, a["dilation"])
        x_bytes = _aligned(c * rows * 4)
        prep.update(fma=True, lp=lp, chunk=chunk, x_bytes=x_bytes, w_bytes=0,
                    scratch_bytes=x_bytes + _aligned(o * kfma.tile_cols(chunk * lp) * 4))
        if int8:
            # NOTE: the int8 codes as float32 once, at load (exact: c * k <= EXACT_K, so every
            # sum stays below 2**24); converted a call into the scratch they cost tcn 11% of
            # its int8 batch-1 call
            prep["wf"] = w.reshape(o, c * k).astype(np.float32)
            prep["prepared_bytes"] = prep["wf"].nbytes
            prep["q"] = _int8_consts(ctx, node, w)
        return prep
    kc = -(-(cg * k) // ki.EXACT_K) if int8 else 1  # GEMM chunks along the taps
    per_seq = (c * k + kc * o) * lo * 4  # columns and sums of one sequence
    chunk = max(1, min(ctx.max_batch, SCRATCH_BYTES // max(per_seq, 1)))
    prep.update(chunk=chunk, kc=kc,
                col_bytes=_aligned(c * k * chunk * lo * 4),
                w_bytes=_aligned(o * cg * k * 4) if int8 else 0)
    prep["scratch_bytes"] = prep["col_bytes"] + prep["w_bytes"] + _aligned(kc * o * chunk * lo * 4)
    if int8:
        prep["q"] = _int8_consts(ctx, node, w)
    return prep


def _pad_row(n: int, lp: int, k: int, d: int) -> int:
    # the row of n padded sequences, and room for the GEMM's last tile and the taps' shifts
    return kfma.tile_cols(n * lp) + (k - 1) * d


def _b_conv1d_fma(ctx, step, node, n, x, y, w, b):
    a, prep = node.attrs, ctx.prep[step]
    o, c, k = w.shape[0], x.shape[1], w.shape[2]
    lp, lo, d, q = prep["lp"], y.shape[2], a["dilation"], prep.get("q")
    calls = []
    if q is None:
        w2 = w.reshape(o, c * k)
    else:  # the int8 codes as float32, prepared at load
        w2 = prep["wf"]
    pad = 0.0 if q is None else float(a["x_zero_point"])
    act = _act_code(a)
    for b0 in range(0, n, prep["chunk"]):
        m = min(n, b0 + prep["chunk"]) - b0
        rows, cols = _pad_row(m, lp, k, d), kfma.tile_cols(m * lp)
        xpad = ctx.scratch(step, np.float32, (c, rows))
        yw = ctx.scratch(step, np.float32, (o, cols), prep["x_bytes"] + prep["w_bytes"])
        offs = ((np.arange(c)[:, None] * rows + np.arange(k)[None, :] * d) * 4).reshape(-1)
        offs = offs.astype(np.int64)
        calls.append(partial(ks.pad_rows, xpad, x[b0:b0 + m], a["padding"][0], lp, pad))
        epi = _register_epi(b, act) if q is None else None
        if m == 1 and lo % kfma.HALF_P == 0 and epi is not None:
            # one sequence whose steps fill whole tiles: the GEMM's (O, Lo) is its output, so
            # the GEMM writes it with the bias and ReLU (no epilogue pass)
            calls.append(partial(kfma.gemm, y[b0], w2, xpad.reshape(-1), offs, 1, o, lo, 0, 0,
                                 c * k, 0, lo, b, epi))
            continue
        calls.append(partial(kfma.gemm, yw, w2, xpad.reshape(-1), offs, 1, o, cols, 0, 0, c * k,
                             0, cols, _EMPTY_F32, 0))
        if q is None:
            calls.append(partial(kf.bias_act, y[b0:b0 + m], yw, 0, lp, b, act, a.get("alpha", 0.0)))
        else:
            calls.append(partial(ks.requant_one, y[b0:b0 + m], yw, lp,
                                 q["bias_adj"], q["m"], q["to_int8"], q["y_zp"], q["lo"], q["relu"]))
    return calls


def _b_conv1d(ctx: PlanContext, step: int, node: Node, n: int) -> list:
    a, prep = node.attrs, ctx.prep[step]
    x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
    w = ctx.params[node.inputs[1]]
    b = ctx.params[node.inputs[2]] if len(node.inputs) > 2 else _EMPTY_F32
    s, (pl, _), d, g = a["stride"], a["padding"], a["dilation"], a["groups"]
    o, cg, k = w.shape
    c, lo = x.shape[1], y.shape[2]
    if prep["direct"]:
        return [partial(ks.conv1d_direct, y, x, w, b, s, pl, d, _act_code(a), a.get("alpha", 0.0))]
    if prep.get("fma"):
        return _b_conv1d_fma(ctx, step, node, n, x, y, w, b)
    q = prep.get("q")
    calls = []
    if q is None:
        wg = w.reshape(g, o // g, cg * k)
    else:
        wf = ctx.scratch(step, np.float32, (o * cg * k,), prep["col_bytes"])
        calls.append(partial(ks.to_f32, wf, w.reshape(-1)))
        wg = wf.reshape(g, o // g, cg * k)
    kc, at = prep["kc"], prep["col_bytes"] + prep["w_bytes"]
    step_k = -(-(cg * k) // kc)
    for b0 in range(0, n, prep["chunk"]):
        b1 = min(n, b0 + prep["chunk"])
        m = (b1 - b0) * lo
        col = ctx.scratch(step, np.float32, (c * k, m))
        sums = ctx.scratch(step, np.float32, (kc, o, m), at)
        calls.append(partial(ks.im2col1d, col, x[b0:b1], k, s, pl, d,
                             0.0 if q is None else float(a["x_zero_point"])))
        col3 = col.reshape(g, cg * k, m)
        for i in range(kc):
            k0, k1 = i * step_k, min(cg * k, (i + 1) * step_k)
            lhs = wg[0] if g == 1 and kc == 1 else wg[:, :, k0:k1]
            rhs = col if g == 1 and kc == 1 else col3[:, k0:k1]
            out = sums[i] if g == 1 and kc == 1 else sums[i].reshape(g, o // g, m)
            calls.append(partial(np.matmul, lhs, rhs, out=out))
        if q is None:
            calls.append(partial(kf.bias_act, y[b0:b1], sums[0], 0, lo, b, _act_code(a),
                                 a.get("alpha", 0.0)))
        else:
            calls.append(partial(ks.requant_one, y[b0:b1], sums[0], lo, q["bias_adj"], q["m"],
                                 q["to_int8"], q["y_zp"], q["lo"], q["relu"]) if kc == 1 else
                         partial(ki.requant_sum, y[b0:b1], sums, 0, lo, q["bias_adj"], q["m"],
                                 q["to_int8"], q["y_zp"], q["lo"], q["relu"]))
    return calls


def _b_pool1d(ctx, step, node, n):
    # the 2-D pool kernels on (n, C, 1, L)
    a = node.attrs
    x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
    x4, y4 = x.reshape(n, x.shape[1], 1, -1), y.reshape(n, y.shape[1], 1, -1)
    geom = (1, a["kernel"], 1, a.get("stride") or a["kernel"], 0, a["padding"])
    if node.op == "maxpool1d":
        return [partial(kf.maxpool2d, y4, x4, *geom)]
    return [partial(kf.avgpool2d, y4, x4, *geom, a["count_include_pad"])]


def _b_global1d(ctx, step, node, n):
    x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
    kernel = kf.global_avgpool if node.op == "global_avgpool1d" else ks.global_maxpool1d
    return [partial(kernel, y, x)]


PREPARE = {"conv1d": _prep_conv1d}
BUILDERS = ops.register_table("engine", {
    "conv1d": _b_conv1d, "maxpool1d": _b_pool1d, "avgpool1d": _b_pool1d,
    "global_avgpool1d": _b_global1d, "global_maxpool1d": _b_global1d,
})
