"""fp32 depthwise conv (groups == input channels == output channels, weight (C, 1, kh, kw)):
kernels_dw.dw_conv_padded (each plane copied into a padded scratch plane, then one flat
vector loop) for 3x3 and 5x5 at stride 1 or 2, kernels_dw.dw_conv (a vectorized interior per
plane and a per-pixel border, no scratch) for every other geometry; kernels_dwcl.dw_conv_cl
(the channels innermost) instead of the padded planes where kernels_dwcl.pays_f32 (small maps:
on ARM up to 28 x 28, on x86 4 x 4). Ahead of conv_direct, which stays for channel multipliers
(O a multiple of C)."""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_dw as kd
from pocket.infer import kernels_dwcl as kc
from pocket.infer.lowering_common import _act_alpha, _act_code, _aligned
from pocket.infer.routes.base import Route, conv_prep, prepared, register


def depthwise_limit(geo) -> str | None:
    if geo.groups == 1 or not geo.c == geo.o == geo.groups:
        return "needs groups == input channels == output channels > 1 (depthwise)"
    return None


def padded_prep(ctx, d: dict, sizes: tuple[int, ...]) -> None:
    """d gets the padded-plane kernels' scratch when its geometry is theirs: one row a thread
    of each region, the padded plane (sizes[0] bytes an element), then the flat outputs'
    regions (sizes[1:] bytes an element each). d["padded"] = (rows, plane, flat, offsets)."""
    geo = d["geo"]
    kh, kw, sh, sw, ph, pw, dh, dw = d["geom"]
    if not kd.padded_fast(kh, kw, sh, sw, dh, dw):
        return
    a, t = kd.padded_sizes(geo.h, geo.w, geo.ho, geo.wo, sh, ph, pw)
    rows = max(1, ctx.threads)
    offsets, at = [], 0
    for i, size in enumerate(sizes):
        offsets.append(at)
        at += _aligned(rows * (a if i == 0 else t) * size)
    d["padded"] = (rows, a, t, tuple(offsets))
    d["scratch_bytes"] = at


def plane_parts(ctx, geo, n: int, taps: int = 9) -> int:
    """The parts a depthwise call splits its n * C planes into: one a thread, or one when the
    call runs serially (too little work for the pool; `taps`: the AVX-512 kernels' measure,
    pools.depthwise_work)."""
    planes = n * geo.c
    if not ctx.parallel_elements(planes * max(geo.h * geo.w, geo.ho * geo.wo) * taps // 9):
        return 1
    return min(ctx.threads, planes)


def padded_scratch(ctx, step: int, d: dict, n: int, dtypes) -> list:
    """The regions of one bind (dtypes as padded_prep's sizes): as many parts as threads will
    share the N*C planes (one when the call runs serially)."""
    rows, a, t, offsets = d["padded"]
    parts = min(rows, plane_parts(ctx, d["geo"], n))
    return [ctx.scratch(step, dt, (parts, a if i == 0 else t), at)
            for i, (dt, at) in enumerate(zip(dtypes, offsets))]


@register
class ConvDepthwise(Route):
    name, op = "conv_depthwise", "conv2d"

    def limits(self, geo, dtype, cpu):
        return "fp32 only" if dtype != "f32" else depthwise_limit(geo)

    def prepare(self, ctx, node):
        d = conv_prep(ctx, node, self.name)
        geo = d["geo"]
        kh, kw, sh, sw, ph, pw, dh, dw = d["geom"]
        # channels innermost on small maps (see kernels_dwcl.pays_f32)
        if kc.fast(kh, kw, sh, sw, dh, dw) and kc.pays_f32(geo.h, geo.w, geo.ho, geo.wo, sh):
            rows = max(1, ctx.threads)
            d["cl"] = 4 * max(p * sum(kc.scratch_sizes_f32(geo.c, geo.h, geo.w, geo.ho, geo.wo,
                                                           ph, pw, p))
                              for p in range(1, rows + 1)) + 64
            d["scratch_bytes"] = d["cl"]
            return d
        padded_prep(ctx, d, (4, 4))
        return d

    def bind(self, ctx, step, node, d, n, pool=None):
        a = node.attrs
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        act, alpha = _act_code(a), _act_alpha(a)
        kh, kw, sh, sw, ph, pw, dh, dw = d["geom"]
        if "cl" in d:
            wt = prepared(d, "cl_w", lambda: kc.prepare_f32(d["w"], d["b"])[0])
            bl = prepared(d, "cl_b", lambda: kc.prepare_f32(d["w"], d["b"])[1])
            geo = d["geo"]
            parts = min(plane_parts(ctx, geo, n), kc.blocks_f32(geo.c))
            a_, t = kc.scratch_sizes_f32(geo.c, geo.h, geo.w, geo.ho, geo.wo, ph, pw, parts)
            xp = ctx.scratch(step, np.float32, (parts, a_))
            tmp = ctx.scratch(step, np.float32, (parts, t), -(-parts * a_ * 4 // 64) * 64)
            return [partial(kc.dw_conv_cl, y, x, wt, bl, xp, tmp, sh, ph, pw, act, alpha)]
        if "padded" in d:
            xp, tmp = padded_scratch(ctx, step, d, n, (np.float32, np.float32))
            return [partial(kd.dw_conv_padded, y, x, d["w"], d["b"], xp, tmp, sh, ph, pw, act,
                            alpha)]
        return [partial(kd.dw_conv, y, x, d["w"], d["b"], *d["geom"][2:], act, alpha)]
