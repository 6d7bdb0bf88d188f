"""int8 depthwise conv (groups == input channels == output channels): exact int32 sums with
kernels_int8's epilogue, no im2row. kernels_dw.dw_conv_padded_qf / _q (padded scratch planes
holding x_zp, the sums in float32 or, on 3x3 stride 2, int32; then the epilogue) for 3x3 and 5x5
at stride 1 or 2, kernels_dw.dw_conv_q (no
scratch) for other geometries. Ahead of the int8 im2row route (and the VNNI ones, which take
groups == 1 only)."""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_dw as kd
from pocket.infer.lowering_common import _EMPTY_I32, _int8_consts
from pocket.infer.routes.base import Route, conv_prep, register
from pocket.infer.routes.conv_depthwise import depthwise_limit, padded_prep, padded_scratch


@register
class ConvDepthwiseInt8(Route):
    name, op = "conv_depthwise_int8", "conv2d"

    def limits(self, geo, dtype, cpu):
        return "int8 only" if dtype != "i8" else depthwise_limit(geo)

    def prepare(self, ctx, node):
        d = conv_prep(ctx, node, self.name)
        d.update(_int8_consts(ctx, node, d["w"]))
        # b_q itself: the kernel folds x_zp out per plane (the border taps need it unfolded)
        d["b_q"] = ctx.params[node.inputs[2]] if len(node.inputs) > 2 else _EMPTY_I32
        # float32 sums (kd.dw_conv_padded_qf) where kd.FLOAT_SUMS (x86), except on 3x3 stride 2,
        # where the int8 planes win
        kh, sh = d["geom"][0], d["geom"][2]
        d["float_sums"] = kd.FLOAT_SUMS and (sh == 1 or kh == 5)
        padded_prep(ctx, d, (4 if d["float_sums"] else 1, 4, 1 if d["to_int8"] else 4))
        return d

    def bind(self, ctx, step, node, d, n, pool=None):
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        kh, kw, sh, sw, ph, pw, dh, dw = d["geom"]
        epi = (d["m"], node.attrs["x_zero_point"], d["to_int8"], d["y_zp"], d["lo"], d["relu"])
        if "padded" in d:
            if d["float_sums"]:
                fn, dtypes = kd.dw_conv_padded_qf, (np.float32, np.float32, y.dtype)
            else:
                fn, dtypes = kd.dw_conv_padded_q, (np.int8, np.int32, y.dtype)
            xp, acc, tmp = padded_scratch(ctx, step, d, n, dtypes)
            return [partial(fn, y, x, d["w"], d["b_q"], xp, acc, tmp, *epi, sh, ph, pw)]
        return [partial(kd.dw_conv_q, y, x, d["w"], d["b_q"], *epi, *d["geom"][2:])]
