"""fp32 linear over (N, ..., in) (sequences): the rows of all leading dims as one BLAS GEMM,
then bias and activation in place (kernels_seqattn.rows_bias_act)."""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_seqattn as ks
from pocket.infer.lowering_common import _EMPTY_F32, _act_code
from pocket.infer.routes.base import Route, register


@register
class LinearRows(Route):
    """A linear on (N, ..., in): its N * ... rows as one BLAS GEMM, then bias and activation.
    lowering.py sends every linear over (N, ..., in) here (fp32 only, by the op's schema), so
    no 2-D route needs to know about leading dims; last in the table, it never wins a 2-D
    linear, which it runs correctly all the same (POCKET_ROUTE=linear_rows)."""

    name, op = "linear_rows", "linear"

    def limits(self, geo, dtype, cpu):
        return None if dtype == "f32" else "fp32 only"

    def prepare(self, ctx, node):
        w = ctx.params[node.inputs[1]]
        b = ctx.params[node.inputs[2]] if len(node.inputs) > 2 else _EMPTY_F32
        return {"route": self.name, "wT": w.T, "b": b}

    def bind(self, ctx, step, node, d, n, pool=None):
        a = node.attrs
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        x2, y2 = x.reshape(-1, x.shape[-1]), y.reshape(-1, y.shape[-1])
        return [partial(np.matmul, x2, d["wT"], out=y2),
                partial(ks.rows_bias_act, y2, d["b"], _act_code(a), a["alpha"])]
