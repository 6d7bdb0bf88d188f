"""fp32 linear on the portable path: one BLAS GEMM (x @ W^T, W^T a view of the mmapped
weights), then bias and activation in place; up to conv_gemv.GEMV_MAX_BATCH rows of a 2-D input,
kernels_gemv's dot products along K with the bias and activation fused (MobileNetV2's and V3's
classifiers: 0.96-0.99x of the model's time)."""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_fp32 as kf
from pocket.infer import kernels_gemv as kg
from pocket.infer.lowering_common import _EMPTY_F32, _act_alpha, _act_code
from pocket.infer.routes.base import Route, register
from pocket.infer.routes.conv_gemv import GEMV_MAX_BATCH


def linear_prep(ctx, node, name: str) -> dict:
    w = ctx.params[node.inputs[1]]
    b = ctx.params[node.inputs[2]] if len(node.inputs) > 2 else _EMPTY_F32
    return {"route": name, "wf": w, "wT": w.T, "b": b}


@register
class LinearBlas(Route):
    name, op = "linear_blas", "linear"

    def limits(self, geo, dtype, cpu):
        return None if dtype == "f32" else "fp32 only"

    def prepare(self, ctx, node):
        return linear_prep(ctx, node, self.name)

    def bind(self, ctx, step, node, d, n, pool=None):
        a = node.attrs
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        if x.ndim == 2 and n <= GEMV_MAX_BATCH:  # dot products along K (see kernels_gemv)
            return [partial(kg.gemv, y, d["wf"], x, d["b"], _act_code(a), _act_alpha(a))]
        return [partial(np.matmul, x, d["wT"], out=y),
                partial(kf.bias_act_rows, y, y, d["b"], _act_code(a), _act_alpha(a))]
