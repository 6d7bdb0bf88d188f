"""fp32 conv (groups 1) on the portable path: im2col of a chunk of images into (K, m*P), one
wide BLAS GEMM, one epilogue pass (bias, activation, a fused maxpool, back to NCHW)."""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_fp32 as kf
from pocket.infer import lowering_common as lc
from pocket.infer.lowering_common import _act_alpha, _act_code, _aligned, _im2col
from pocket.infer.routes.base import Route, conv_prep, register


def chunked(ctx, d: dict, per_image: int) -> dict:
    """Images a chunk within lowering_common.SCRATCH_BYTES, and the scratch: (w_bytes, then)
    the im2col columns of a chunk, then what else per_image counts."""
    k, p = d["k"], d["p"]
    d["chunk"] = max(1, min(ctx.max_batch, lc.SCRATCH_BYTES // per_image))
    d["scratch_bytes"] = d["w_bytes"] + _aligned(d["chunk"] * k * p * 4) + d["chunk"] * (
        per_image - k * p * 4)
    return d


@register
class ConvGemm(Route):
    name, op = "conv_gemm", "conv2d"
    fuses_pool = True

    def limits(self, geo, dtype, cpu):
        if dtype != "f32":
            return "fp32 only"
        if geo.groups != 1:
            return "groups 1 only"
        return None

    def prepare(self, ctx, node):
        d = conv_prep(ctx, node, self.name)
        o, k, p = d["o"], d["k"], d["p"]
        d["w_bytes"], d["w2"] = 0, d["w"].reshape(o, k)
        # one wide GEMM per chunk: col (K, m*P) and its result (O, m*P)
        return chunked(ctx, d, (k + o) * p * 4)

    def bind(self, ctx, step, node, d, n, pool=None):
        a = node.attrs
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        o, k, p, geom = d["o"], d["k"], d["p"], d["geom"]
        act, alpha = _act_code(a), _act_alpha(a)
        y3, x_w = y.reshape(n, o, p), y.shape[3]
        pool, pool_geom = pool or (None, ())
        calls = []
        for start in range(0, n, d["chunk"]):
            m = min(d["chunk"], n - start)
            xs, ys = x[start:start + m], y3[start:start + m]
            col = ctx.scratch(step, np.float32, (k, m * p))
            yw = ctx.scratch(step, np.float32, (o, m * p), _aligned(d["chunk"] * k * p * 4))
            calls += [_im2col(col, xs, geom, np.float32(0), 0, p),
                      partial(np.matmul, d["w2"], col, out=yw),
                      partial(kf.bias_act, ys, yw, 0, p, d["b"], act, alpha) if pool is None else
                      partial(kf.bias_act_pool, pool[start:start + m], yw, 0, p, x_w, *pool_geom,
                              d["b"], act, alpha)]
        return calls
