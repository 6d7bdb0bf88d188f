"""fp32 linear over (N, ..., in) (sequences): the rows of all leading dims as one BLAS GEMM,
then bias and activation in place (kernels_seqattn.rows_bias_act)."""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_seqattn as ks
from pocket.infer.lowering_common import _EMPTY_F32, _act_code
from pocket.infer.routes.base import Route, register

# A linear over (N, ..., in) with at most this many inputs runs as one Numba call
# (kernels_seqattn.linear_rows_small): a sequence model's first layer, 1-4 features a step.
# NOTE: 104 rows x 1 input x 32 outputs: 1.1 us, np.matmul + the epilogue 10.6 us; from
# K = 64 on BLAS is 1.3-3x faster.
SMALL_K = 4


@register
class LinearRows(Route):
    """A linear on (N, ..., in): its N * ... rows as one BLAS GEMM, then bias and activation.
    lowering.py sends every fp32 linear over (N, ..., in) here, so no 2-D fp32 route needs to
    know about leading dims (the int8 routes run an int8 one's rows themselves); last in the
    table, it never wins a 2-D linear, which it runs correctly all the same
    (POCKET_ROUTE=linear_rows)."""

    name, op = "linear_rows", "linear"

    def limits(self, geo, dtype, cpu):
        return None if dtype == "f32" else "fp32 only"

    def prepare(self, ctx, node):
        w = ctx.params[node.inputs[1]]
        b = ctx.params[node.inputs[2]] if len(node.inputs) > 2 else _EMPTY_F32
        # NOTE: W.T copied once into (in, out) row-major: NumPy's GEMM on the transposed view
        # of W took 6.0 us at 16 x 64 x 64, 15.8 at 16 x 64 x 128; on the copy through np.dot
        # 2.9 and 4.6 (at 1024 rows the two are even)
        wt = np.ascontiguousarray(w.T)
        return {"route": self.name, "wT": wt, "b": b, "prepared_bytes": wt.nbytes}

    def bind(self, ctx, step, node, d, n, pool=None):
        a = node.attrs
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        x2, y2 = x.reshape(-1, x.shape[-1]), y.reshape(-1, y.shape[-1])
        if x2.shape[1] <= SMALL_K:
            return [partial(ks.linear_rows_small, y2, x2, d["wT"], d["b"], _act_code(a), a["alpha"])]
        return [partial(np.dot, x2, d["wT"], out=y2),
                partial(ks.rows_bias_act, y2, d["b"], _act_code(a), a["alpha"])]
