"""fp32 1x1 conv over a 1x1 map (a squeeze-and-excitation block's convs) on the portable path:
at a few images, kernels_gemv's dot products along K straight from the file's weights; at more,
one BLAS GEMM of the batch (x (N, K) @ w^T) and the bias and activation in place. Both replace
the pixel-tiled GEMMs, which ran each image's single pixel through a 16-wide tile."""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_fp32 as kf
from pocket.infer import kernels_gemv as kg
from pocket.infer.lowering_common import _act_alpha, _act_code
from pocket.infer.routes.base import register
from pocket.infer.routes.conv_pointwise import ConvPointwise

# NOTE: up to this batch the dot products (weights re-read per image, from L1/L2 after the
# first) beat the batch GEMM's BLAS call and separate bias pass
GEMV_MAX_BATCH = 4


@register
class ConvGemv(ConvPointwise):  # (its prepare: the weights as (O, K), no copy)
    name, op = "conv_gemv", "conv2d"

    def limits(self, geo, dtype, cpu):
        if dtype != "f32":
            return "fp32 only"
        if geo.groups != 1 or (geo.kh, geo.kw, geo.ph, geo.pw) != (1, 1, 0, 0) or (geo.h, geo.w) != (1, 1):
            return "needs a 1x1 conv without padding over a 1x1 map, groups 1"
        return None

    def bind(self, ctx, step, node, d, n, pool=None):
        a = node.attrs
        x = ctx.view(node.inputs[0], n).reshape(n, d["k"])
        y = ctx.view(node.outputs[0], n).reshape(n, d["o"])
        act, alpha = _act_code(a), _act_alpha(a)
        if n <= GEMV_MAX_BATCH:
            return [partial(kg.gemv, y, d["w2"], x, d["b"], act, alpha)]
        return [partial(np.matmul, x, d["w2"].T, out=y), partial(kf.bias_act_rows, y, y, d["b"], act, alpha)]
