"""int8 conv of any groups: im2row of each chunk into (m, P, K) int8 codes, then kernels_int8's
dot kernel with its requantizing epilogue (gemm_q). The route every int8 conv may take, and
what conv_int8_blas runs for batches of few rows."""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_int8 as ki
from pocket.infer.lowering_common import _int8_consts
from pocket.infer.routes.base import Route, conv_prep, register
from pocket.infer.routes.conv_gemm import chunked


def int8_prep(ctx, node, name: str) -> dict:
    """What both portable int8 routes prepare: int8 constants, the chunk and its scratch.

    float32 route (groups 1): per image col (K, P) f32 and kc partial sums (O, P) f32 (its
    float32 weights are prepared, not scratch); that also covers the im2row route's (P, K) i8."""
    d = conv_prep(ctx, node, name)
    o, k, p, g = d["o"], d["k"], d["p"], d["groups"]
    d.update(_int8_consts(ctx, node, d["w"]))
    d["w2"] = d["w"].reshape(o, k // g)
    d["kc"] = -(-k // ki.EXACT_K)
    d["w_bytes"] = 0
    return chunked(ctx, d, k * p * 4 + (d["kc"] * o * p * 4 if g == 1 else 0))


@register
class ConvInt8Im2row(Route):
    name, op = "conv_int8_im2row", "conv2d"

    def limits(self, geo, dtype, cpu):
        return None if dtype == "i8" else "int8 only"

    def prepare(self, ctx, node):
        return int8_prep(ctx, node, self.name)

    def bind(self, ctx, step, node, d, n, pool=None):
        a = node.attrs
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        o, k, p, g, geom = d["o"], d["k"], d["p"], d["groups"], d["geom"]
        y3 = y.reshape(n, o, p)
        calls = []
        for start in range(0, n, d["chunk"]):
            m = min(d["chunk"], n - start)
            xs, ys = x[start:start + m], y3[start:start + m]
            col = ctx.scratch(step, np.int8, (m, p, k))
            calls += [partial(ki.im2row, col, xs, *geom, np.int8(a["x_zero_point"])),
                      partial(ki.gemm_q, ys, col, d["w2"], d["bias_adj"], d["m"], g, d["to_int8"], d["y_zp"],
                              d["lo"], d["relu"])]
        return calls
