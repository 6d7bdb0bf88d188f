"""fp32 stride-1 conv (groups 1) on the portable path: the images padded once, then laid at the
pixel pitch of the padded width so that each im2col row is one contiguous copy
(kernels_fp32.im2col_pitch), one BLAS GEMM per chunk, an epilogue that drops the junk columns."""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_fp32 as kf
from pocket.infer import lowering_common as lc
from pocket.infer.lowering_common import _act_alpha, _act_code, _aligned
from pocket.infer.routes import conv_tile
from pocket.infer.routes.base import Route, conv_prep, pitch_geometry, register


def pitch_route_limits(geo, dtype) -> str | None:
    """What every fp32 route at a pixel pitch needs (see ConvGeometry.pitch_limit)."""
    if dtype != "f32":
        return "fp32 only"
    if geo.groups != 1 or not geo.stride1:
        return "needs stride 1 and groups 1"
    return geo.pitch_limit()


@register
class ConvGemmPitch(Route):
    name, op = "conv_gemm_pitch", "conv2d"
    fuses_pool = True

    def limits(self, geo, dtype, cpu):
        return pitch_route_limits(geo, dtype)

    def declines(self, geo, dtype, cpu):
        if conv_tile.cols_take_pitch(geo, cpu):
            return "conv_tile_cols runs it (x86's portable path)"
        return None

    def prepare(self, ctx, node):
        d = conv_prep(ctx, node, self.name)
        d["w_bytes"] = 0
        d.update(pitch_geometry(d["geo"]))
        d["w2"] = d["w"].reshape(d["o"], d["k"])
        per_image = ((d["k"] + d["o"]) * d["pix"] + d["padded"]) * 4
        d["chunk"] = max(1, min(ctx.max_batch, lc.SCRATCH_BYTES // per_image))
        d["scratch_bytes"] = (sum(_aligned(d["chunk"] * e * 4) for e in (
            d["k"] * d["pix"], d["o"] * d["pix"], d["padded"])) + _aligned(d["slack"] * 4))
        return d

    def bind(self, ctx, step, node, d, n, pool=None):
        a = node.attrs
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        o, k, geom = d["o"], d["k"], d["geom"]
        act, alpha = _act_code(a), _act_alpha(a)
        pool, pool_geom = pool or (None, ())
        kh, kw, sh, sw, ph, pw, dh, dw = geom
        calls = []
        for start in range(0, n, d["chunk"]):
            m = min(d["chunk"], n - start)
            xs = x[start:start + m]
            pix = d["pix"]
            col = ctx.scratch(step, np.float32, (k, m * pix))
            at = _aligned(d["chunk"] * pix * k * 4)
            yw = ctx.scratch(step, np.float32, (o, m * pix), at)
            at += _aligned(d["chunk"] * pix * o * 4)
            xpad = ctx.scratch(step, np.float32, (m * d["padded"] + d["slack"],), at)
            ho = y.shape[2]
            calls += [partial(kf.pad_images, xpad, xs, ph, pw, d["hp"], d["wp"], np.float32(0)),
                      partial(kf.im2col_pitch, col, xpad, m, xs.shape[1], d["hp"], d["wp"], kh, kw, dh,
                              dw, ho),
                      partial(np.matmul, d["w2"], col, out=yw),
                      partial(kf.bias_act_pitch, y[start:start + m], yw, d["pitch"], d["pix"], d["b"], act,
                              alpha)
                      if pool is None else
                      partial(kf.bias_act_pool_pitch, pool[start:start + m], yw, d["pitch"], d["pix"],
                              *pool_geom, d["b"], act, alpha)]
        return calls
