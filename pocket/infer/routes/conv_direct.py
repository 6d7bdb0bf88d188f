"""fp32 depthwise-style conv (groups > 1, one input channel a group): kernels_fp32.conv2d_direct,
a direct loop over each output pixel's window, no scratch."""

from __future__ import annotations

from functools import partial

from pocket.infer import kernels_fp32 as kf
from pocket.infer.lowering_common import _act_alpha, _act_code
from pocket.infer.routes.base import Route, conv_prep, register


@register
class ConvDirect(Route):
    name, op = "conv_direct", "conv2d"

    def limits(self, geo, dtype, cpu):
        if dtype != "f32":
            return "fp32 only"
        if geo.groups == 1 or geo.c != geo.groups:
            return "needs one input channel a group (groups == input channels > 1)"
        return None

    def prepare(self, ctx, node):
        return conv_prep(ctx, node, self.name)

    def bind(self, ctx, step, node, d, n, pool=None):
        a = node.attrs
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        return [partial(kf.conv2d_direct, y, x, d["w"], d["b"], *d["geom"][2:], _act_code(a), _act_alpha(a))]
