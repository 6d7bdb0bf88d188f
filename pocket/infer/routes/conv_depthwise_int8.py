"""int8 depthwise conv (groups == input channels == output channels): exact int32 sums with
kernels_int8's epilogue, no im2row. int8 codes out, 3x3 and 5x5 at stride 1 or 2, where
kernels_dwcl.pays (small maps; on ARM every map) and no weight is -128: kernels_dwcl.dw_conv_cl_q
(the channels innermost). Else on AVX-512, int8 codes out, 3x3 and 5x5 at stride 1 and
3x3 at stride 2: kernels_fma_dw.dw_conv_fma_q (the rows read in place, the codes converted to
float32 and summed exactly, the codes computed in registers). Elsewhere kernels_dw.dw_conv_padded_qf
/ _q (padded scratch planes holding x_zp, the sums in float32 or, on 3x3 stride 2, int32; then
the epilogue) for 3x3 and 5x5 at stride 1 or 2, kernels_dw.dw_conv_q (no scratch) for other
geometries. Ahead of the int8 im2row route (and the VNNI ones, which take groups == 1 only).

NOTE: dw_conv_fma_q against dw_conv_padded_qf / _q on one thread (AVX-512 host, bit-identical
codes): MobileNetV2-0.5's layers 0.43-0.82x (480 x 4 x 4 36 -> 16 us, 96 x 32 x 32 63 -> 36,
48 x 64 x 64 3x3/2 48 -> 39), ShuffleNetV2's 0.42-0.75x, MobileNetV3's 5x5 stride 1 0.62-0.65x;
5x5 stride 2 lost (96 x 28 x 28: 39 -> 44 us) and keeps the phase planes."""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_dw as kd
from pocket.infer import kernels_dwcl as kc
from pocket.infer import kernels_fma_dw as kfd
from pocket.infer.lowering_common import _EMPTY_I32, _int8_consts
from pocket.infer.routes.base import Route, conv_prep, prepared, register
from pocket.infer.routes.conv_depthwise import depthwise_limit, padded_prep, padded_scratch, plane_parts


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
        kh, kw, sh, sw, ph, pw, dh, dw = d["geom"]
        geo = d["geo"]
        # channels innermost on small maps (and on ARM everywhere), while the weights leave
        # two taps' products room in 16 bits (our quantizer's never reach -128)
        if (d["to_int8"] and kc.fast(kh, kw, sh, sw, dh, dw)
                and kc.pays(kh, geo.ho, geo.wo, ctx.cpu.fma) and int(d["w"].min()) > -128):
            rows = max(1, ctx.threads)
            d["cl"] = max(p * sum(kc.scratch_sizes(geo.c, geo.h, geo.w, geo.ho, geo.wo, ph, pw, p))
                          for p in range(1, rows + 1)) + 64  # + the codes' alignment
            d["scratch_bytes"] = d["cl"]
            return d
        d["fma_q"] = (ctx.cpu.fma and d["to_int8"] and kfd.fast(kh, kw, sh, sw, dh, dw)
                      and not (kh == 5 and sh == 2) and kfd.exact_bias(d["b_q"]))
        if d["fma_q"]:
            d["scratch_bytes"] = max(1, ctx.threads) * kfd.scratch_size_q(d["geo"].w, d["geo"].wo)
            return d
        d["float_sums"] = kd.FLOAT_SUMS and (sh == 1 or kh == 5)
        padded_prep(ctx, d, (4 if d["float_sums"] else 1, 4, 1 if d["to_int8"] else 4))
        return d

    def bind(self, ctx, step, node, d, n, pool=None):
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        kh, kw, sh, sw, ph, pw, dh, dw = d["geom"]
        x_zp = node.attrs["x_zero_point"]
        # kernels_int8._code_clamped's clamp, less y_zp, in float32
        zp = np.float32(d["y_zp"])
        lo, hi = np.float32(d["lo"][0]) - zp, np.float32(d["lo"][1]) - zp
        if "cl" in d:
            wt = prepared(d, "cl_w", lambda: kc.prepare_weights(d["w"]))
            badj = prepared(d, "cl_b", lambda: kc.lanes(d["bias_adj"], np.int32))
            m = prepared(d, "cl_m", lambda: kc.lanes(d["m"], np.float32))
            geo = d["geo"]
            parts = min(plane_parts(ctx, geo, n), kc.blocks(geo.c))
            a, t = kc.scratch_sizes(geo.c, geo.h, geo.w, geo.ho, geo.wo, ph, pw, parts)
            xp = ctx.scratch(step, np.int8, (parts, a))
            tmp = ctx.scratch(step, np.int8, (parts, t), -(-parts * a // 64) * 64)
            return [partial(kc.dw_conv_cl_q, y, x, wt, badj, m, xp, tmp, x_zp, lo, hi, zp,
                            sh, ph, pw)]
        if d["fma_q"]:
            # the taps and b_q - x_zp * sum(w_q) (bias_adj) as float32: exact (exact_bias)
            wf = prepared(d, "w_taps", lambda: d["w"].reshape(d["w"].shape[0], -1).astype(np.float32))
            badj = prepared(d, "b_taps", lambda: d["bias_adj"].astype(np.float32))
            m = prepared(d, "m_f32", lambda: d["m"].astype(np.float32))
            geo = d["geo"]
            row = kfd.scratch_size_q(geo.w, geo.wo)
            scratch = ctx.scratch(step, np.int8, (plane_parts(ctx, geo, n), row))
            return [partial(kfd.dw_conv_fma_q, y, x, wf, badj, m, scratch, sh, ph, pw, x_zp, lo, hi, zp)]
        epi = (d["m"], x_zp, d["to_int8"], d["y_zp"], d["lo"], d["relu"])
        if "padded" in d:
            if d["float_sums"]:
                fn, dtypes = kd.dw_conv_padded_qf, (np.float32, np.float32, y.dtype)
            else:
                fn, dtypes = kd.dw_conv_padded_q, (np.int8, np.int32, y.dtype)
            xp, acc, tmp = padded_scratch(ctx, step, d, n, dtypes)
            return [partial(fn, y, x, d["w"], d["b_q"], xp, acc, tmp, *epi, sh, ph, pw)]
        return [partial(kd.dw_conv_q, y, x, d["w"], d["b_q"], *epi, *d["geom"][2:])]
