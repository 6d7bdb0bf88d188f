"""fp32 1x1 conv, stride 1, no padding (groups 1) on the portable path: one BLAS GEMM per image
straight from the NCHW input (no im2col), then bias and activation in place."""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_fp32 as kf
from pocket.infer.lowering_common import _act_alpha, _act_code
from pocket.infer.routes.base import Route, conv_prep, register


@register
class ConvPointwise(Route):
    name, op = "conv_pointwise", "conv2d"

    def limits(self, geo, dtype, cpu):
        if dtype != "f32":
            return "fp32 only"
        if geo.groups != 1 or (geo.kh, geo.kw, geo.sh, geo.sw, geo.ph, geo.pw) != (1, 1, 1, 1, 0, 0):
            return "needs a 1x1 kernel, stride 1, no padding, groups 1"
        return None

    def prepare(self, ctx, node):
        d = conv_prep(ctx, node, self.name)
        d["w2"] = d["w"].reshape(d["o"], d["k"])
        return d

    def bind(self, ctx, step, node, d, n, pool=None):
        a = node.attrs
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        o, k, p = d["o"], d["k"], d["p"]
        act, alpha = _act_code(a), _act_alpha(a)
        y3 = y.reshape(n, o, p)
        return [partial(np.matmul, d["w2"], x.reshape(n, k, p), out=y3),
                partial(kf.bias_act, y3, y3.reshape(n * o, p), o, 0, d["b"], act, alpha)]
