"""fp32 1x1 conv (stride 1, no padding, groups 1) on the portable path: kernels_pw.pw_conv, the
GEMM straight from the NCHW input with the bias and activation fused (no second pass over the
output). For the few-channel, many-pixel layers where a BLAS call is slow and the pass after
it costs as much; the others go on to conv_pointwise (BLAS)."""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_pw as kp
from pocket.infer.lowering_common import _act_alpha, _act_code, _aligned
from pocket.infer.routes.base import Route, conv_prep, register

# NOTE: measured on x86 against np.matmul + bias_act, one thread (OpenBLAS): 0.3-0.65x from
# 1024 pixels with weights up to ~6 KB (MobileNetV2's first blocks), ~0.65-0.95x at 256
# pixels, 1.1-1.2x at 64 pixels or at 128 x 288 weights over 768 pixels
PW_MIN_PIXELS = 256
PW_MAX_WEIGHTS = 16384  # O * K


def pointwise_limit(geo) -> str | None:
    if geo.groups != 1 or (geo.kh, geo.kw, geo.sh, geo.sw, geo.ph, geo.pw) != (1, 1, 1, 1, 0, 0):
        return "needs a 1x1 kernel, stride 1, no padding, groups 1"
    return None


def pointwise_declines(geo) -> str | None:
    if geo.ho * geo.wo < PW_MIN_PIXELS:
        return f"fewer than {PW_MIN_PIXELS} pixels: BLAS is faster"
    if geo.o * geo.c > PW_MAX_WEIGHTS:
        return f"more than {PW_MAX_WEIGHTS} weights: BLAS is faster"
    return None


def pw_prep(ctx, d: dict) -> dict:
    """The scratch: one partial-sum row of kernels_pw (8 * PB float32) a thread."""
    d["rows"] = max(1, ctx.threads)
    d["scratch_bytes"] = _aligned(d["rows"] * kp.ROWS * kp.PB * 4)
    return d


def pw_scratch(ctx, step: int, d: dict, n: int) -> np.ndarray:
    """One row a part: a part a thread, or one when the call runs serially."""
    tasks = n * -(-d["p"] // kp.PB)
    parts = min(d["rows"], tasks) if ctx.parallel(n * d["o"] * d["k"] * d["p"]) else 1
    return ctx.scratch(step, np.float32, (parts, kp.ROWS * kp.PB))


@register
class ConvPw(Route):
    name, op = "conv_pw", "conv2d"

    def limits(self, geo, dtype, cpu):
        return "fp32 only" if dtype != "f32" else pointwise_limit(geo)

    def declines(self, geo, dtype, cpu):
        return pointwise_declines(geo)

    def prepare(self, ctx, node):
        d = conv_prep(ctx, node, self.name)
        d["w2"] = d["w"].reshape(d["o"], d["k"])
        return pw_prep(ctx, d)

    def bind(self, ctx, step, node, d, n, pool=None):
        a = node.attrs
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        o, k, p = d["o"], d["k"], d["p"]
        return [partial(kp.pw_conv, y.reshape(n, o, p), x.reshape(n, k, p), d["w2"], d["b"],
                        _act_code(a), _act_alpha(a), pw_scratch(ctx, step, d, n))]
