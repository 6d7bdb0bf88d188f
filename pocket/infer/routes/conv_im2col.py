"""fp32 conv of any groups: im2col of a chunk of images into (m, K, P), one batched BLAS matmul
over the groups straight into the NCHW output, then bias and activation (or a fused maxpool).
The route of grouped convs, and the one every fp32 conv may take."""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_fp32 as kf
from pocket.infer.lowering_common import _act_alpha, _act_code, _im2col
from pocket.infer.routes.base import Route, conv_prep, register
from pocket.infer.routes.conv_gemm import chunked


@register
class ConvIm2col(Route):
    name, op = "conv_im2col", "conv2d"
    fuses_pool = True

    def limits(self, geo, dtype, cpu):
        return None if dtype == "f32" else "fp32 only"

    def prepare(self, ctx, node):
        d = conv_prep(ctx, node, self.name)
        o, k, p, g = d["o"], d["k"], d["p"], d["groups"]
        d["w_bytes"], d["w2"] = 0, d["w"].reshape(g, o // g, k // g)
        return chunked(ctx, d, k * p * 4)

    def bind(self, ctx, step, node, d, n, pool=None):
        a = node.attrs
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        o, k, p, g, geom = d["o"], d["k"], d["p"], d["groups"], d["geom"]
        act, alpha = _act_code(a), _act_alpha(a)
        y3, x_w = y.reshape(n, o, p), y.shape[3]
        pool, pool_geom = pool or (None, ())
        calls = []
        for start in range(0, n, d["chunk"]):
            m = min(d["chunk"], n - start)
            xs, ys = x[start:start + m], y3[start:start + m]
            col = ctx.scratch(step, np.float32, (m, k, p))
            calls += [_im2col(col.reshape(m * k, p), xs, geom, np.float32(0), k, 0),
                      partial(np.matmul, d["w2"], col.reshape(m, g, k // g, p),
                              out=ys.reshape(m, g, o // g, p)),
                      partial(kf.bias_act, ys, ys.reshape(m * o, p), o, 0, d["b"], act, alpha)
                      if pool is None else
                      partial(kf.bias_act_pool, pool[start:start + m], ys.reshape(m * o, p), o, 0, x_w,
                              *pool_geom, d["b"], act, alpha)]
        return calls
