"""int8 depthwise conv (groups == input channels == output channels): kernels_dw.dw_conv_q,
exact int32 sums with kernels_int8's epilogue, no im2row and no scratch. Ahead of the int8
im2row route (and the VNNI ones, which take groups == 1 only)."""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_dw as kd
from pocket.infer.lowering_common import _int8_consts
from pocket.infer.routes.base import Route, conv_prep, register
from pocket.infer.routes.conv_depthwise import depthwise_limit


@register
class ConvDepthwiseInt8(Route):
    name, op = "conv_depthwise_int8", "conv2d"

    def limits(self, geo, dtype, cpu):
        return "int8 only" if dtype != "i8" else depthwise_limit(geo)

    def prepare(self, ctx, node):
        d = conv_prep(ctx, node, self.name)
        d.update(_int8_consts(ctx, node, d["w"]))
        # b_q itself: the kernel folds x_zp out per plane (the border taps need it unfolded)
        d["b_q"] = (ctx.params[node.inputs[2]] if len(node.inputs) > 2
                    else np.zeros(0, np.int32))
        return d

    def bind(self, ctx, step, node, d, n, pool=None):
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        return [partial(kd.dw_conv_q, y, x, d["w"], d["b_q"], d["m"], node.attrs["x_zero_point"],
                        d["to_int8"], d["y_zp"], d["lo"], d["relu"], *d["geom"][2:])]
