"""int8 conv (groups 1) on kernels_vnni (AVX-512 VNNI, 64 int8 multiply-adds an instruction):
a chunk of images shifted to unsigned and padded (at stride 1 at the pitch of the padded
width), packed into (K/4, columns) words, one tile GEMM, a requantizing epilogue that may pool.
Images of C % 4 == 0 channels take conv_vnni_quad."""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_pool as kp
from pocket.infer import kernels_vnni as kv
from pocket.infer import lowering_common as lc
from pocket.infer.lowering_common import _aligned, _int8_consts, _tile_cols, _vnni_cols_bytes
from pocket.infer.routes.base import Route, conv_prep, pitch_geometry, prepared, register

# A stride-1 int8 conv whose output is at most this wide packs its columns at a pitch of Wo
# (no junk columns) rather than Wp: on 4x4 and 8x8 maps the junk (33%, 20%) cost the GEMM
# more than packing by a pixel table costs (cnn_cifar int8 at batch 1: 1021 -> 940 us)
VNNI_PITCH_MAX_WO = 8


def vnni_limits(geo, dtype, cpu) -> str | None:
    if not cpu.vnni:
        return "needs AVX-512 VNNI (kernels_vnni; off with POCKET_INT8_VNNI=0)"
    if dtype != "i8":
        return "int8 only"
    if geo.groups != 1:
        return "groups 1 only"
    if geo.k > kv.MAX_K:
        return f"K = C x kh x kw = {geo.k} exceeds kernels_vnni.MAX_K = {kv.MAX_K}"
    # the padded images sit at the pitch of the padded width at stride 1 (pitch_geometry)
    return geo.pitch_limit() if geo.stride1 else None


def vnni_prep(ctx, node, name: str) -> dict:
    d = conv_prep(ctx, node, name)
    w, o, k, p = d["w"], d["o"], d["k"], d["p"]
    sh, sw = d["geom"][2:4]
    d.update(_int8_consts(ctx, node, w))
    d["w2"] = w.reshape(o, k)
    d.update(pitch_geometry(d["geo"]))
    ho, wo = d["ho"], d["wo"]
    if wo <= VNNI_PITCH_MAX_WO:
        d["pitch"], d["pix"] = wo, p
    flat = (sh, sw) == (1, 1) and d["pitch"] == d["wp"]  # one run per image: no table
    d["flat"] = flat
    d["poffs"] = np.zeros(0, np.int64) if flat else kv.pixel_offsets(ho, wo, sh, sw, d["wp"])
    per_image = (k + 4 * o) * d["pix"] + d["padded"]
    d["chunk"] = max(1, min(ctx.max_batch, lc.VNNI_SCRATCH_BYTES * ctx.threads // per_image))
    d["k4"] = -(-k // 4)
    # K % 4 != 0 (a first layer): the weights padded to whole 4-byte groups, once (bind)
    d["scratch_bytes"] = (sum(_vnni_cols_bytes(d["chunk"] * d["pix"], o, 4 * d["k4"]))
                          + _aligned(d["chunk"] * d["padded"]) + _aligned(d["slack"]))
    return d


def _pad_weights(w2: np.ndarray, k4: int) -> np.ndarray:
    wp = np.empty((w2.shape[0], 4 * k4), np.int8)
    kv.pad_weights(wp, w2)
    return wp


@register
class ConvVnni(Route):
    name, op = "conv_vnni", "conv2d"
    fuses_pool = True

    def limits(self, geo, dtype, cpu):
        return vnni_limits(geo, dtype, cpu)

    def prepare(self, ctx, node):
        return vnni_prep(ctx, node, self.name)

    def bind(self, ctx, step, node, d, n, pool=None):
        a = node.attrs
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        o, geom = d["o"], d["geom"]
        pool, pool_geom = pool or (None, ())
        calls = []
        for start in range(0, n, d["chunk"]):
            m = min(d["chunk"], n - start)
            xs = x[start:start + m]
            k4, pix, mpc = d["k4"], d["pix"], _tile_cols(m * d["pix"])
            xp_bytes, c_bytes = _vnni_cols_bytes(d["chunk"] * pix, o, 4 * k4)
            xp = ctx.scratch(step, np.uint32, (k4, mpc))
            c = ctx.scratch(step, np.int32, (o, mpc), xp_bytes)
            kh, kw, sh, sw, ph, pw, dh, dw = geom
            hp, wp = d["hp"], d["wp"]
            xpad = ctx.scratch(step, np.uint8, (m * d["padded"] + d["slack"],), xp_bytes + c_bytes)
            w2 = d["w2"] if d["k"] % 4 == 0 else prepared(d, "w_pad", lambda: _pad_weights(d["w2"], d["k4"]))
            epi = (d["bias_u8"], d["m"], d["to_int8"], d["y_zp"], d["lo"], d["relu"])
            ho, wo = y.shape[2:]
            calls += [partial(kv.pad_shift, xpad, xs.view(np.uint8), ph, pw, hp, wp,
                              a["x_zero_point"] + 128),
                      partial(kv.pack_cols, xp, xpad, m, xs.shape[1], hp, wp, kh, kw, dh, dw, pix,
                              d["poffs"]),
                      partial(kv.gemm_cols, c, w2, xp),
                      partial(kv.requant_cols, y[start:start + m], c, c.view(np.float32), d["pitch"], pix,
                              *epi)
                      if pool is None else
                      partial(kp.requant_cols_pool, pool[start:start + m], c, c.view(np.float32), ho,
                              d["pitch"], pix, *pool_geom, *epi)]
        return calls
