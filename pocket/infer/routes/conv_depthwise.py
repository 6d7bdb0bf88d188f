"""fp32 depthwise conv (groups == input channels == output channels, weight (C, 1, kh, kw)):
kernels_dw.dw_conv, a vectorized interior per plane and a per-pixel border, no scratch.
Ahead of conv_direct, which stays for channel multipliers (O a multiple of C)."""

from __future__ import annotations

from functools import partial

from pocket.infer import kernels_dw as kd
from pocket.infer.lowering_common import _act_alpha, _act_code
from pocket.infer.routes.base import Route, conv_prep, register


def depthwise_limit(geo) -> str | None:
    if geo.groups == 1 or not geo.c == geo.o == geo.groups:
        return "needs groups == input channels == output channels > 1 (depthwise)"
    return None


@register
class ConvDepthwise(Route):
    name, op = "conv_depthwise", "conv2d"

    def limits(self, geo, dtype, cpu):
        return "fp32 only" if dtype != "f32" else depthwise_limit(geo)

    def prepare(self, ctx, node):
        return conv_prep(ctx, node, self.name)

    def bind(self, ctx, step, node, d, n, pool=None):
        a = node.attrs
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        return [partial(kd.dw_conv, y, x, d["w"], d["b"], *d["geom"][2:], _act_code(a), _act_alpha(a))]
