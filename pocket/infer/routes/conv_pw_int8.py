"""int8 1x1 conv (stride 1, no padding, groups 1) on the portable path: kernels_pw.pw_conv_q,
the codes multiplied as exact float32 straight from the NCHW input and requantized in the same
pass; no float32 copy of the input, of the weights, or of the sums (conv_int8_blas makes all
three). What the Pi 4 and x86 without VNNI run for MobileNet-style pointwise layers."""

from __future__ import annotations

from functools import partial

from pocket.infer import kernels_int8 as ki
from pocket.infer import kernels_pw as kp
from pocket.infer import kernels_tile as kt
from pocket.infer.lowering_common import _int8_consts
from pocket.infer.routes.base import Route, conv_prep, register
from pocket.infer.routes.conv_pw import pointwise_declines, pointwise_limit, pw_prep, pw_scratch

# NOTE: on x86 without VNNI, kernels_tile's int8 GEMM (conv_tile_q, next in the table) ran
# these layers in 0.64-0.96x pw_conv_q's time from 16 output channels on, the same bytes
# (2-core AMD Zen 1, one thread, each layer timed in its network's sequence: ShuffleNetV2
# int8 15.1 -> 13.8 ms, MobileNetV2-0.5 4.48 -> 4.24, SqueezeNet 28.1 -> 27.2, EfficientNet-B0
# 42.5 -> 41.4, MobileNetV3-small 7.55 -> 7.37); below 16 (MobileNetV2-0.5's 16 -> 8 project:
# two groups of 6 rows for 8 channels) 1.14x. ARM (the tiles' weight-vector form, as
# conv_tile's COLS_MAX_K) keeps pw_conv_q for every width: its instruction counts on the Pi 4
# were not measured.
TILE_Q_FROM_O = None if kt.W_VECTORS else 16


@register
class ConvPwInt8(Route):
    name, op = "conv_pw_int8", "conv2d"

    def limits(self, geo, dtype, cpu):
        if dtype != "i8":
            return "int8 only"
        if geo.c > ki.EXACT_K:
            return f"needs at most {ki.EXACT_K} input channels (exact float32 sums)"
        return pointwise_limit(geo)

    def declines(self, geo, dtype, cpu):
        if TILE_Q_FROM_O is not None and geo.o >= TILE_Q_FROM_O:
            return f"{TILE_Q_FROM_O} or more output channels on x86: conv_tile_q is faster"
        return pointwise_declines(geo)

    def prepare(self, ctx, node):
        d = conv_prep(ctx, node, self.name)
        d.update(_int8_consts(ctx, node, d["w"]))
        d["w2"] = d["w"].reshape(d["o"], d["k"])
        return pw_prep(ctx, d)

    def bind(self, ctx, step, node, d, n, pool=None):
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        o, k, p = d["o"], d["k"], d["p"]
        return [partial(kp.pw_conv_q, y.reshape(n, o, p), x.reshape(n, k, p), d["w2"], d["bias_adj"],
                        d["m"], d["to_int8"], d["y_zp"], d["lo"], d["relu"],
                        pw_scratch(ctx, step, d, n))]
