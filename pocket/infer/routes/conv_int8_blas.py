"""int8 conv (groups 1) with enough rows as exact float32 BLAS GEMMs on the int8 codes (see
kernels_int8.requant_sum): the weights converted to float32 once (at the first bind, kept:
routes.base.prepared), each chunk's im2col columns in the node's scratch, GEMMs over K in
pieces of kernels_int8.EXACT_K, a requantizing epilogue (that may pool). Batches with fewer
than F32_ROUTE_ROWS rows run as conv_int8_im2row."""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_int8 as ki
from pocket.infer.lowering_common import F32_ROUTE_ROWS, _aligned, _im2col
from pocket.infer.routes.base import ROUTES, Route, prepared, register
from pocket.infer.routes.conv_int8_im2row import int8_prep


@register
class ConvInt8Blas(Route):
    name, op = "conv_int8_blas", "conv2d"
    fuses_pool = True

    def limits(self, geo, dtype, cpu):
        if dtype != "i8":
            return "int8 only"
        return None if geo.groups == 1 else "groups 1 only"

    def prepare(self, ctx, node):
        return int8_prep(ctx, node, self.name)

    def at_batch(self, ctx, step, d, n):
        if n * d["p"] < F32_ROUTE_ROWS:
            return ROUTES["conv_int8_im2row"], d
        return self, d

    def bind(self, ctx, step, node, d, n, pool=None):
        a = node.attrs
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        o, k, p, geom = d["o"], d["k"], d["p"], d["geom"]
        y3, x_w = y.reshape(n, o, p), y.shape[3]
        pool, pool_geom = pool or (None, ())
        calls = []
        for start in range(0, n, d["chunk"]):
            m = min(d["chunk"], n - start)
            xs, ys = x[start:start + m], y3[start:start + m]
            # NOTE: the float32 copy of the int8 weights made once (routes.base.prepared), not
            # per call (ResNet-18: 3.8 ms a call on x86); 4 bytes a weight while the engine lives
            wf = prepared(d, "wf", lambda: d["w2"].astype(np.float32))
            col = ctx.scratch(step, np.float32, (k, m * p))
            yf = ctx.scratch(step, np.float32, (d["kc"], o, m * p), _aligned(d["chunk"] * k * p * 4))
            calls.append(_im2col(col, xs, geom, np.float32(a["x_zero_point"]), 0, p))
            for c in range(d["kc"]):
                k0, k1 = c * ki.EXACT_K, min(k, (c + 1) * ki.EXACT_K)
                calls.append(partial(np.matmul, wf[:, k0:k1], col[k0:k1], out=yf[c]))
            epi = (d["bias_adj"], d["m"], d["to_int8"], d["y_zp"], d["lo"], d["relu"])
            if pool is None:
                calls.append(partial(ki.requant_sum, ys, yf, 0, p, *epi))
            else:
                calls.append(partial(ki.requant_sum_pool, pool[start:start + m], yf, 0, p, x_w,
                                     *pool_geom, *epi))
        return calls
