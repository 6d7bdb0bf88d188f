"""fp32 linear on AVX-512 for few rows: kernels_fma.gemv, dot products along K, with the bias
and ReLU on the sums in registers (other activations in a pass after)."""

from __future__ import annotations

from functools import partial

from pocket.infer import kernels_fma as kfma
from pocket.infer import kernels_fp32 as kf
from pocket.infer.lowering_common import _EMPTY_F32, _act_alpha, _act_code, _register_epi
from pocket.infer.routes.base import Route, register
from pocket.infer.routes.linear_blas import linear_prep


def fma_linear_limits(dtype, cpu) -> str | None:
    if not cpu.fma:
        return "needs AVX-512 (kernels_fma; off with POCKET_FP32_FMA=0)"
    return None if dtype == "f32" else "fp32 only"


@register
class LinearGemv(Route):
    name, op = "linear_gemv", "linear"

    def limits(self, geo, dtype, cpu):
        return fma_linear_limits(dtype, cpu)

    def prepare(self, ctx, node):
        return linear_prep(ctx, node, self.name)

    def bind(self, ctx, step, node, d, n, pool=None):
        a = node.attrs
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        act = _act_code(a)
        epi = _register_epi(d["b"], act)
        if epi is not None:  # the epilogue on the sums in registers
            return [partial(kfma.gemv, y, x.reshape(n, -1), d["wf"], d["b"], epi)]
        return [partial(kfma.gemv, y, x.reshape(n, -1), d["wf"], _EMPTY_F32, 0),
                partial(kf.bias_act_rows, y, y, d["b"], act, _act_alpha(a))]
