"""fp32 stride-1 conv (groups 1) on kernels_fma (AVX-512) reading its padded images in place: no
im2col, the GEMM's columns are the pixels at the pitch of the padded width. A fused 2x2/2
maxpool pools in the GEMM's epilogue, and may write straight into the next pitch conv's padded
images (padded_pairs). One image whose pixels fill whole tiles takes conv_fma_cols instead."""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_fma as kfma
from pocket.infer import kernels_fp32 as kf
from pocket.infer import lowering_common as lc
from pocket.infer.lowering_common import (
    _EMPTY_F32,
    _act_alpha,
    _act_code,
    _aligned,
    _pool_geom,
    _register_epi,
)
from pocket.infer.routes.base import ROUTES, Route, conv_prep, pitch_geometry, register, route_at
from pocket.infer.routes.conv_fma_cols import fma_limits
from pocket.infer.routes.conv_gemm_pitch import pitch_route_limits

# A stride-1 conv reads its padded images in place unless the pitch's junk columns (the
# padding, and the last partial tile of each image) cost more than im2col would: the copy
# costs about as much as this many multiply-adds per column element (measured: ~0.2 ns
# against ~0.012 ns a multiply-add), shared by the output channels.
FMA_IM2COL_MACS = 17


@register
class ConvFmaPitch(Route):
    name, op = "conv_fma_pitch", "conv2d"
    fuses_pool = True

    def limits(self, geo, dtype, cpu):
        return fma_limits(geo, dtype, cpu) or pitch_route_limits(geo, dtype)

    def declines(self, geo, dtype, cpu):
        mpi = kfma.tile_cols(pitch_geometry(geo)["pix"])
        if mpi > geo.ho * geo.wo * (1 + FMA_IM2COL_MACS / geo.o):
            return "its junk columns would cost more than im2col"
        return None

    def prepare(self, ctx, node):
        d = conv_prep(ctx, node, self.name)
        o, k, p = d["o"], d["k"], d["p"]
        kh, kw, sh, sw, ph, pw, dh, dw = d["geom"]
        d["w_bytes"], d["w2"] = 0, d["w"].reshape(o, k)
        geo = pitch_geometry(d["geo"])
        mpi = kfma.tile_cols(geo["pix"])
        d.update(geo, mpi=mpi)
        d["offs"] = kfma.pitch_offsets(d["geo"].c, geo["hp"], geo["wp"], kh, kw, dh, dw)
        # the last tile of the last image reads past its pixels (see kernels_fma.gemm)
        d["slack"] = (kw - 1) * dw + mpi - geo["pix"] + 16
        per_image = (d["padded"] + o * mpi) * 4
        d["chunk"] = max(1, min(ctx.max_batch, lc.FMA_SCRATCH_BYTES // per_image))
        d["scratch_bytes"] = (_aligned((d["chunk"] * d["padded"] + d["slack"]) * 4)
                              + _aligned(o * d["chunk"] * mpi * 4))
        # a batch of one takes im2col where the GEMM can write its output directly (see
        # at_batch): cnn_cifar fp32's first conv (3 -> 64, 32x32) at batch 1 saved the
        # padding and the epilogue pass (~50 -> ~30 us)
        if p % kfma.HALF_P == 0:
            cols = ROUTES["conv_fma_cols"].prepare(ctx, node)
            d["cols_plan"] = cols
            d["scratch_bytes"] = max(d["scratch_bytes"], cols["scratch_bytes"])
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
            mpi, padded = d["mpi"], d["padded"]
            xpad = ctx.scratch(step, np.float32, (m * padded + d["slack"],))
            yw = ctx.scratch(step, np.float32, (o, m * mpi),
                             _aligned((d["chunk"] * padded + d["slack"]) * 4))
            if not any(pads_into(ctx, s, n) == step for s in ctx.pad_after):
                calls.append(partial(kf.pad_images, xpad, xs, ph, pw, d["hp"], d["wp"], np.float32(0)))
            if (pool is not None and tuple(pool_geom) == (2, 2, 2, 2) and act in (0, 1)
                    and mpi <= kfma.POOL_GROUP_MAX):  # each part pools its own planes
                b_step = pads_into(ctx, step, n)
                if b_step is not None:  # ... into the next conv's padded images
                    q = route_at(ctx, b_step, n)[1]
                    bpad = ctx.scratch(b_step, np.float32, (n * q["padded"] + q["slack"],))
                    _, _, _, _, qph, qpw, _, _ = q["geom"]
                    calls.append(partial(kfma.gemm_pool2_padded, bpad[start * q["padded"]:], q["hp"], q["wp"],
                                         qph, qpw, *pool.shape[2:], yw, d["w2"], xpad, d["offs"], m, o, mpi,
                                         padded, k, d["pitch"], d["b"], act))
                    continue
                calls.append(partial(kfma.gemm_pool2_pitch, pool[start:start + m], yw, d["w2"], xpad,
                                     d["offs"], m, o, mpi, padded, k, d["pitch"], d["b"], act))
                continue
            calls += [partial(kfma.gemm, yw, d["w2"], xpad, d["offs"], m, o, mpi, padded, 0, k, mpi,
                              m * mpi, _EMPTY_F32, 0),
                      partial(kf.bias_act_pitch, y[start:start + m], yw, d["pitch"], mpi, d["b"], act,
                              alpha)
                      if pool is None else
                      partial(kfma.bias_act_pool2_pitch, pool[start:start + m], yw, d["pitch"], mpi,
                              d["b"], act)
                      if tuple(pool_geom) == (2, 2, 2, 2) and act in (0, 1) else
                      partial(kf.bias_act_pool_pitch, pool[start:start + m], yw, d["pitch"], mpi,
                              *pool_geom, d["b"], act, alpha)]
        return calls

    def with_pool(self, ctx, step, d, n, pooled):
        if takes_cols(ctx, step, d, n, pooled):  # (see prepare: no epilogue pass for one image)
            return ROUTES["conv_fma_cols"], d["cols_plan"]
        return self, d


def takes_cols(ctx, step: int, d: dict, n: int, pooled: bool) -> bool:
    """Whether conv `step` (prepared d, at its pitch) runs batch n as conv_fma_cols: one image
    whose GEMM can write its output with the bias and activation, no pool fused."""
    act = _act_code(ctx.graph.nodes[step].attrs)
    return "cols_plan" in d and n == 1 and not pooled and _register_epi(d["b"], act) is not None


def padded_pairs(ctx) -> dict[int, int]:
    """{conv step A: conv step B} where A (an AVX-512 pitch conv with a fused 2x2/2 pool
    and ReLU or none) may write its pooled output straight into B's padded images, B being a
    pitch conv (or a Winograd one with a pitch plan) and that output's only reader
    (kernels_fma.gemm_pool2_padded): B then pads nothing. Whether they do at a batch size
    is pads_into's call; the engine keeps B's scratch live from A on for these pairs."""
    pairs = {}
    for a_step, pool_step in ctx.pool_after.items():
        node, d = ctx.graph.nodes[a_step], ctx.prep[a_step]
        out = ctx.graph.nodes[pool_step].outputs[0]
        nxt = ctx.readers.get(out, [])
        if (d.get("route") != "conv_fma_pitch" or _act_code(node.attrs) not in (0, 1)
                or d["mpi"] > kfma.POOL_GROUP_MAX or out in ctx.graph.outputs or len(nxt) != 1
                or tuple(_pool_geom(ctx.graph.nodes[pool_step].attrs)[:4]) != (2, 2, 2, 2)):
            continue
        b_node, q = ctx.graph.nodes[nxt[0]], ctx.prep[nxt[0]]
        if b_node.op == "conv2d" and b_node.inputs[0] == out and "conv_fma_pitch" in (
                q.get("route"), q.get("pitch_plan", {}).get("route")):
            pairs[a_step] = nxt[0]
    return pairs


def pads_into(ctx, step: int, n: int) -> int | None:
    """The conv whose padded images conv `step` writes at batch n (see padded_pairs): where
    that conv runs at its pitch, all n images in one chunk."""
    b_step = ctx.pad_after.get(step)
    if b_step is None:
        return None
    _, d = route_at(ctx, b_step, n)
    cols = takes_cols(ctx, b_step, d, n, b_step in ctx.pool_after)
    return b_step if d["route"] == "conv_fma_pitch" and n <= d["chunk"] and not cols else None
