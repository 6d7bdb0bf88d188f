"""fp32 depthwise conv, 3x3 or 5x5 at stride 1 or 2 (dilation 1), on AVX-512
(kernels_fma_dw.dw_conv_fma): output rows computed straight from the input rows with masked
16-lane loads, no padded copy and no copy-out, the bias and the activation (ReLU, relu6, SiLU,
sigmoid) on the sums in registers; other activations take one pass over each plane. Ahead of
conv_depthwise (the portable padded-plane kernels), which takes every other geometry, every
CPU without AVX-512, and the 5x5 convs this route declines (stride 2, maps of 8 columns or
fewer, both to more than 196 pixels: see declines). 5x5 convs to at most 196 pixels take
kernels_fma_dwcv (16 channels a vector, see _cv); small 3x3 planes at stride 1 with "same"
padding (196 outputs) kernels_fma_dw.dw_conv_fma_flat (see _flat), and the rest the row
kernels.

NOTE: against kernels_dw.dw_conv_padded on one thread (EfficientNet-B0's and MobileNetV2's
layers, no activation): 32 x 112 x 112 3x3 0.46 -> 0.22 ms, 96 x 112 x 112 3x3/2 0.78 -> 0.42,
672 x 14 x 14 5x5 0.41 -> 0.20, 1152 x 7 x 7 5x5 0.23 -> 0.17.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_fma_cv as kcv
from pocket.infer import kernels_fma_dw as kfd
from pocket.infer import kernels_fma_dwcv as kdc
from pocket.infer import kernels_fma_im2col as kfi
from pocket.infer import kernels_fp32 as kf
from pocket.infer.lowering_common import _act_alpha, _act_code, register_epi
from pocket.infer.routes.base import Route, conv_prep, prepared, register
from pocket.infer.routes.conv_depthwise import depthwise_limit, plane_parts


@register
class ConvFmaDepthwise(Route):
    name, op = "conv_fma_depthwise", "conv2d"

    def limits(self, geo, dtype, cpu):
        if not cpu.fma:
            return "needs AVX-512 (kernels_fma_dw; off with POCKET_FP32_FMA=0)"
        if dtype != "f32":
            return "fp32 only"
        why = depthwise_limit(geo)
        if why is not None:
            return why
        if not kfd.fast(geo.kh, geo.kw, geo.sh, geo.sw, geo.dh, geo.dw):
            return "needs a 3x3 or 5x5 kernel, the same stride 1 or 2 both ways, dilation 1"
        return None

    def declines(self, geo, dtype, cpu):
        # NOTE: row by row, a 16-lane vector holds at most wo outputs, and 5x5/2 loads 32
        # inputs and shuffles them for each pair of taps: on 5x5 maps of 8 columns or fewer
        # (half the lanes idle or more) and at 5x5/2 conv_depthwise's flat loop over the
        # padded plane (or its phase planes) is faster. AVX-512 host, one thread, SiLU /
        # relu6 / hardswish, us, this route -> conv_depthwise: 1152 x 7 x 7 5x5 159 -> 109 /
        # 95 -> 86 / -, 672 x 14 x 14 5x5/2 188 -> 92 / 131 -> 82 / -, 288 x 14 x 14 5x5/2
        # 77 -> 38 / 56 -> 35 / 58 -> 36, 96 x 28 x 28 5x5/2 45 -> 35 / 33 -> 29 / 32 -> 29.
        # 3x3 stays here: on 8x8 and smaller maps it won or lost by ~10% by activation (4x4
        # relu6 11.5 vs 13.3 us, 8x8 SiLU 15.7 vs 13.4), and MobileNetV2 ran 1.03-1.05x slower
        # with them there; 5x5 on 14x14 maps here too (480 x 14 x 14 relu6 88 vs 101 us)
        # (small planes at stride 1 with "same" padding take the flat kernel: see _flat)
        # (5x5 to maps of at most kernels_fma_dwcv.MAX_OUT pixels takes that kernel: see _cv)
        if _cv(geo):
            return None
        if geo.kh == 5 and geo.wo <= 8 and not _flat(geo):
            return "5x5 on maps of 8 columns or fewer: conv_depthwise's flat loop fills the vectors"
        if geo.kh == 5 and geo.sh == 2:
            return "5x5 stride 2: conv_depthwise's phase planes are faster"
        return None

    def prepare(self, ctx, node):
        d = conv_prep(ctx, node, self.name)
        geo = d["geo"]
        if _cv(geo):
            d["cv"] = kdc.scratch_floats((geo.ho - 1) * geo.sh + geo.kh, (geo.wo - 1) * geo.sw + geo.kw,
                                         geo.ho, geo.wo)
            d["scratch_bytes"] = max(1, ctx.threads) * d["cv"] * 4
            return d
        if _flat(geo):
            d["masks"] = kfi.same_masks(kf.same_valid(geo.h, geo.w, geo.kh, geo.kw, geo.ph, geo.pw, 1, 1))
            d["scratch_bytes"] = 0
            return d
        d["row"] = kfd.scratch_size(geo.w, geo.wo)
        d["scratch_bytes"] = max(1, ctx.threads) * d["row"] * 4
        return d

    def bind(self, ctx, step, node, d, n, pool=None):
        a = node.attrs
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        act, alpha = _act_code(a), _act_alpha(a)
        epi = register_epi(act, alpha)
        kh, kw, sh, sw, ph, pw, dh, dw = d["geom"]
        parts = plane_parts(ctx, d["geo"], n, d["geo"].kh * d["geo"].kw)
        mode = -1 if epi is None else epi - 1
        if "cv" in d:
            c = d["geo"].c
            wpk = prepared(d, "wpk", lambda: kdc.pack(d["w"]))
            bpk = prepared(d, "bpk", lambda: kcv.pad_bias(d["b"], c))
            scratch = ctx.scratch(step, np.float32, (parts, d["cv"]))
            return [partial(kdc.dw_conv_fma_cv, y, x, wpk, bpk, scratch, sh, ph, pw, mode, act, alpha)]
        if "masks" in d:
            return [partial(kfd.dw_conv_fma_flat, y, x, d["w"], d["b"], d["masks"], parts, ph, pw,
                            mode, act, alpha)]
        scratch = ctx.scratch(step, np.float32, (parts, d["row"]))
        return [partial(kfd.dw_conv_fma, y, x, d["w"], d["b"], scratch, sh, ph, pw, mode, act,
                        alpha)]


def _cv(geo) -> bool:
    """Whether the node takes kernels_fma_dwcv (16 channels a vector): 5x5 to a map of at most
    MAX_OUT pixels.

    NOTE: one thread, through the engine, this route's other kernels or conv_depthwise ->
    kernels_fma_dwcv: 1152 x 7 x 7 5x5 SiLU 101 -> 85 us, 576 x 7 x 7 hardswish 42 -> 37, 672
    x 14 x 14 5x5/2 100 -> 62, 288 x 14 x 14 5x5/2 40 -> 25, 672 x 14 x 14 5x5 175 -> 172; but
    3x3 (1152 x 7 x 7 54 -> 57, 480 x 4 x 4 6.8 -> 11.3) and 28 x 28 maps (240 x 28 x 28 5x5
    183 -> 243) lose: the transposes in and out cost more than the lanes they fill."""
    return geo.kh == geo.kw == 5 and geo.sh == geo.sw and geo.ho * geo.wo <= kdc.MAX_OUT


def _flat(geo) -> bool:
    """Whether the node takes kernels_fma_dw.dw_conv_fma_flat: a small 3x3 plane at stride 1
    with "same" padding (kernels_fma_dw.FLAT_MAX)."""
    return (kfd.flat_fast(geo.h, geo.w, geo.ho, geo.wo, geo.kh, geo.sh)
            and geo.ph == geo.pw == geo.kh // 2)
