"""int8 linear on the portable path: with at least F32_ROUTE_ROWS rows, exact float32 BLAS GEMMs
on the int8 codes (the weights converted once, at the first such bind, and kept; the rows in
the node's scratch for that call; K in pieces
of kernels_int8.EXACT_K) and a requantizing epilogue; fewer rows take kernels_int8.gemm_q's
int8 dot products."""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_int8 as ki
from pocket.infer.lowering_common import F32_ROUTE_ROWS, _aligned, _int8_consts
from pocket.infer.routes.base import Route, prepared, register, sample_rows


@register
class LinearInt8(Route):
    name, op = "linear_int8", "linear"

    def limits(self, geo, dtype, cpu):
        return None if dtype == "i8" else "int8 only"

    def prepare(self, ctx, node):
        w = ctx.params[node.inputs[1]]
        o, k = w.shape
        rows = ctx.max_batch * sample_rows(ctx, node)
        kc = -(-k // ki.EXACT_K)
        # float32 route scratch: input rows, kc partial sums (the float32 weights are prepared)
        sizes = (0, rows * k * 4, kc * rows * o * 4)
        scratch = sum(map(_aligned, sizes)) if rows >= F32_ROUTE_ROWS else 0
        return {"route": self.name, "w": w, "kc": kc, "sizes": sizes, "scratch_bytes": scratch,
                **_int8_consts(ctx, node, w)}

    def bind(self, ctx, step, node, d, n, pool=None):
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        n *= sample_rows(ctx, node)  # the rows of (N, ..., in): n at (N, in)
        epi = (d["bias_adj"], d["m"], d["to_int8"], d["y_zp"], d["lo"], d["relu"])
        w = d["w"]
        o, k = w.shape
        if n < F32_ROUTE_ROWS:
            return [partial(ki.gemm_q, y.reshape(n, o, 1), x.reshape(n, 1, k), w, epi[0], epi[1], 1,
                            *epi[2:])]
        at = [0, _aligned(d["sizes"][0]), _aligned(d["sizes"][0]) + _aligned(d["sizes"][1])]
        # the float32 copy of the weights made once, at the first bind of 16+ rows (kept)
        wf = prepared(d, "wf", lambda: w.astype(np.float32))
        xf = ctx.scratch(step, np.float32, (n, k), at[1])
        yf = ctx.scratch(step, np.float32, (d["kc"], n, o), at[2])
        calls = [partial(np.copyto, xf, x.reshape(n, k))]
        for c in range(d["kc"]):
            k0, k1 = c * ki.EXACT_K, min(k, (c + 1) * ki.EXACT_K)
            calls.append(partial(np.matmul, xf[:, k0:k1], wf[:, k0:k1].T, out=yf[c]))
        return [*calls, partial(ki.requant_rows, y.reshape(n, o), yf, *epi)]
