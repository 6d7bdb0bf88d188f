"""fp32 3x3 stride-1 conv (groups 1, dilation 1) as Winograd F(2x2, 3x3): transforms of the
images and filters, 16 GEMMs (2.25x fewer multiply-adds), an output transform that may pool.
kernels_winograd's transforms and BLAS on the portable path; on AVX-512 kernels_fma_winograd's
and kernels_fma's GEMM. A batch with few tiles runs at its pitch instead (the pitch plan)."""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_fma as kfma
from pocket.infer import kernels_fma_winograd as kfw
from pocket.infer import kernels_fp32 as kf
from pocket.infer import kernels_tile as kt
from pocket.infer import kernels_winograd as kwg
from pocket.infer import lowering_common as lc
from pocket.infer.lowering_common import _EMPTY_F32, _act_alpha, _act_code, _aligned, fused_residual
from pocket.infer.routes.base import ROUTES, Route, conv_prep, prepared, register
from pocket.infer.routes.conv_tile import tile_scratch, x86_portable

# fp32 3x3 stride-1 convs with at least this many input channels run as Winograd F(2x2, 3x3)
# (kernels_winograd): its 16 GEMMs do 2.25x fewer multiply-adds, which outweighs the
# transforms from about 64 channels on (32 was a little slower, measured at batch 1 and 64;
# with kernels_fma's transforms, cnn_mnist fp32 batch 64 at 32 went 4.82 -> 4.59 ms on one
# thread but 2.57 -> 2.74 ms on two).
WINOGRAD_MIN_C = 64
# ... on the portable path (kernels_winograd's transforms, BLAS or kernels_tile GEMMs) from 32:
# with U made once at load the transforms alone stay per call, and SqueezeNet's fires at 27x27
# (32 -> 128 channels) and 13x13 (48 -> 192) went 690 -> 590 and 392 -> 340 us a conv (one
# thread, 2-core Zen 2; the whole model 0.97x at 1 and 2 threads, interleaved A/B). 16 input
# channels (its 55x55 fires) lost: 0.99x on one thread, 1.07-1.11x on two
WINOGRAD_MIN_C_PORTABLE = 32
# ... and on AVX-512 for a batch of one from 32 too (batches of 2+ images a thread take
# conv_winograd_fused from 32 on; this route's four kernels got the batches between):
# SqueezeNet's fires at 27x27 (32 -> 128) and 13x13 (48 -> 192) at batch 1 took the model
# 0.94x on one and two threads (5.25 -> 4.94 ms, 3.37 -> 3.16, two engines interleaved),
# cnn_mnist's 32 -> 64 conv at 14x14 0.98x; at batch 2 and 3 on two threads cnn_mnist lost
# 15-20%, so one image only
WINOGRAD_MIN_C_ONE = 32
# ... and at least this many tiles (2x2 outputs) a call: with fewer (batch 1 on maps of 8x8 and
# less) the per-call filter transform and short loops cost more than the GEMM saves (cnn_cifar
# fp32 batch 1: 3.6 ms at 64, 4.2 ms at 16, 4.0 ms at 512). 14x14 maps (49 tiles) gain: ResNet-18's
# three 256-channel 3x3 convs there ran 3.5 ms each through im2col, 2.8 through Winograd (the
# whole model 0.91x, SqueezeNet's last two fires at 13x13 0.96x); 7x7 maps (16 tiles) lose
# (512 channels: 2.7 ms of filter transform and 3.7 of GEMMs a conv, for 3.6 through im2col).
WINOGRAD_MIN_TILES = 48
# Winograd's U (16, O*C) has rows this many floats longer: at O*C a multiple of 1024 its 16
# rows fall in one L1 set, and the filter transform, which writes all 16 per filter, ran 10x
# slower
U_SKEW = 16
# On x86's portable path the 16 GEMMs run on kernels_tile (one gemm_act call with 3-D
# weights, U packed at load): numpy's OpenBLAS ran ResNet-18's (64 x 64 @ 784, 128 x 128 @
# 196, 256 x 256 @ 49) at ~10 GMAC/s on a 2-core Zen 1 (Haswell kernels), the tiles at 12-16.
# ARM keeps BLAS (its instruction counts were not measured with the tiles)
TILE_GEMMS = True
# where a batch with few tiles runs: the first of these the table would take
PITCH_ROUTES = ("conv_fma_pitch", "conv_fma_cols", "conv_gemm_pitch", "conv_tile_cols")


def min_channels(fma: bool, n: int = 0) -> int:
    """The fewest input channels a conv runs as Winograd with: AVX-512 (kernels_fma) or not,
    for a call of n images (0: any batch)."""
    if not fma:
        return WINOGRAD_MIN_C_PORTABLE
    return WINOGRAD_MIN_C_ONE if n == 1 else WINOGRAD_MIN_C


def winograd_limits(geo, dtype) -> str | None:
    if dtype != "f32":
        return "fp32 only"
    if (geo.kh, geo.kw, geo.sh, geo.sw, geo.dh, geo.dw, geo.groups) != (3, 3, 1, 1, 1, 1, 1):
        return "needs a 3x3 kernel, stride 1, dilation 1, groups 1"
    return geo.pitch_limit()


def winograd_sizes(d: dict, m: int) -> list[int]:
    """Scratch of a Winograd conv for m images, in order: padded images (none for
    kernels_fma_winograd, which reads them unpadded), row scratch, V, M, output scratch
    (float32 elements). V and M have winograd_cols columns, rows kfw.VM_SKEW longer."""
    c, o = d["c"], d["o"]
    cols = winograd_cols(d, m)
    return [0 if d["fma"] else m * c * d["hp"] * d["wp"], m * c * 4 * d["wp"],
            16 * (c * cols + kfw.VM_SKEW), 16 * (o * cols + kfw.VM_SKEW), m * o * 8 * d["th"] * d["tw"]]


def filter_u(d: dict) -> np.ndarray:
    """U = G w G^T of every filter, (16, O*C + U_SKEW) float32 (the GEMMs read u[:, :O*C]):
    made at the first bind and kept (base.prepared), 16/9 of the weights' bytes.

    NOTE: it was made again at every call, in the arena: ResNet-18's transforms took 2 ms of
    a 45 ms call on the portable path."""
    return prepared(d, "u", lambda: _make_u(d))


def _make_u(d: dict) -> np.ndarray:
    o, c = d["o"], d["c"]
    u = np.zeros((16, o * c + U_SKEW), np.float32)
    (kfw.filter_transform if d["fma"] else kwg.filter_transform).serial(u[:, :o * c], d["w9"])
    return u


def filter_u_tiles(d: dict) -> np.ndarray:
    """U's 16 matrices (O, C) as kernels_tile.pack_weights lays them, (16, groups, C * ROWS),
    made at the first bind and kept in place of U (the same bytes but the last group's pad)."""
    def make():
        o, c = d["o"], d["c"]
        u = _make_u(d)
        return np.stack([kt.pack_weights(u[i, :o * c].reshape(o, c)) for i in range(16)])

    return prepared(d, "u_tiles", make)


def gemms_on_tiles(cpu) -> bool:
    """Whether the 16 GEMMs run on kernels_tile rather than BLAS: x86's portable path (see
    TILE_GEMMS)."""
    return TILE_GEMMS and x86_portable(cpu)


def winograd_cols(d: dict, m: int) -> int:
    """Columns of V and M for m images: their tiles, rounded up for kernels_fma's GEMM."""
    t = m * d["th"] * d["tw"]
    return kfma.tile_cols(t) if d["fma"] else t


@register
class ConvWinograd(Route):
    name, op = "conv_winograd", "conv2d"
    fuses_pool = True

    def limits(self, geo, dtype, cpu):
        return winograd_limits(geo, dtype)

    def declines(self, geo, dtype, cpu):
        least = min_channels(cpu.fma)
        return f"fewer than {least} input channels" if geo.c < least else None

    def prepare(self, ctx, node):
        return self.with_pitch_plan(ctx, node, self.transforms(ctx, node))

    def transforms(self, ctx, node) -> dict:
        """The Winograd part of the prepared dict (conv_winograd_fused adds its own)."""
        d = conv_prep(ctx, node, self.name)
        geo = d["geo"]
        c = geo.c
        d["w_bytes"] = 0
        d.update(c=c, th=-(-geo.ho // 2), tw=-(-geo.wo // 2), w9=d["w"].reshape(-1, 9), fma=ctx.cpu.fma)
        d["hp"], d["wp"] = 2 * d["th"] + 2, 2 * d["tw"] + 2
        # NOTE: U (16 x O x C) is not part of the budget: a GEMM reads all of U once per chunk
        # (from memory once it outgrows L2), so on small maps only big chunks amortize it
        per_image = (sum(winograd_sizes(d, 1)) - 16 * (c + d["o"]) * (
            winograd_cols(d, 1) - d["th"] * d["tw"])) * 4
        d["chunk"] = max(1, min(ctx.max_batch, lc.SCRATCH_BYTES // per_image))
        d["scratch_bytes"] = sum(_aligned(e * 4) for e in winograd_sizes(d, d["chunk"]))
        d["tiles"] = gemms_on_tiles(ctx.cpu)
        if d["tiles"]:  # one kernels_tile panel a thread, after the transforms' scratch
            d["parts"], d["tiles_at"] = max(1, ctx.threads), d["scratch_bytes"]
            d["scratch_bytes"] += _aligned(d["parts"] * kt.scratch_floats(c) * 4)
        return d

    def with_pitch_plan(self, ctx, node, d: dict) -> dict:
        """The pitch plan, for batches with few tiles; the scratch covers both."""
        pitch = next(ROUTES[r] for r in PITCH_ROUTES
                     if ROUTES[r].eligible(d["geo"], "f32", ctx.cpu)
                     and ROUTES[r].declines(d["geo"], "f32", ctx.cpu) is None)
        d["pitch_plan"] = pitch_plan = pitch.prepare(ctx, node)
        d["scratch_bytes"] = max(d["scratch_bytes"], pitch_plan["scratch_bytes"])
        return d

    def at_batch(self, ctx, step, d, n):
        if n * d["th"] * d["tw"] < WINOGRAD_MIN_TILES or d["c"] < min_channels(d["fma"], n):
            pitch = d["pitch_plan"]
            return ROUTES[pitch["route"]], pitch
        return self, d

    def pool_ok(self, d, n, pool_geom):
        return tuple(pool_geom) == (2, 2, 2, 2)  # the max of each 2x2 tile

    def bind(self, ctx, step, node, d, n, pool=None):
        a = node.attrs
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        o, geom = d["o"], d["geom"]
        act, alpha = _act_code(a), _act_alpha(a)
        pool, pool_geom = pool or (None, ())
        # AVX-512 with no activation and no pool: the residual add after the conv, if any, in
        # the output transform (kernels_fma_winograd.output_transform_res)
        res = fused_residual(ctx, step, n) if d["fma"] and act == 0 and pool is None else None
        calls = []
        for start in range(0, n, d["chunk"]):
            m = min(d["chunk"], n - start)
            xs = x[start:start + m]
            c, th, tw = d["c"], d["th"], d["tw"]
            cols = winograd_cols(d, m)
            padded = (0,) if d["fma"] else (m, c, d["hp"], d["wp"])
            shapes = [padded, (m * c, 4, d["wp"]), (16, c * cols + kfw.VM_SKEW),
                      (16, o * cols + kfw.VM_SKEW), (m * o, 8, th * tw)]
            at, views = 0, []
            for shape, full in zip(shapes, winograd_sizes(d, d["chunk"])):
                views.append(ctx.scratch(step, np.float32, shape, at))
                at += _aligned(full * 4)
            xpad, tin, v, mm, tout = views
            u = None if d.get("tiles") else filter_u(d)
            # AVX-512: the transforms of kernels_fma_winograd on V and M with skewed rows (VM_SKEW);
            # else kernels_winograd's, which want them contiguous
            fast = d["fma"] and act in (0, 1)
            v = (v[:, :c * cols] if d["fma"] else v.reshape(-1)[:16 * c * cols]).reshape(16, c, cols)
            mm = (mm[:, :o * cols] if fast else mm.reshape(-1)[:16 * o * cols]).reshape(16, o, cols)
            if d["fma"]:
                calls.append(partial(kfw.input_transform, v, xs, tin, th, tw, *geom[4:6]))
            else:
                calls += [partial(kf.pad_images, xpad.reshape(-1), xs, *geom[4:6], d["hp"], d["wp"],
                                  np.float32(0)),
                          partial(kwg.input_transform, v, xpad, tin, th, tw)]
            if d["fma"]:  # (input_transform zeroes the GEMM's last tile: never denormals)
                calls.append(partial(kfma.gemm, mm, u, v, kfma.row_offsets(c, cols), 16, o, cols,
                                     v.strides[0] // 4, o * c + U_SKEW, c, mm.strides[0] // 4, cols,
                                     _EMPTY_F32, 0))
            elif d["tiles"]:
                calls += _tile_gemms(ctx, step, d, mm, v)
            else:
                calls.append(partial(np.matmul, u[:, :o * c].reshape(16, o, c), v, out=mm))
            if res is not None:  # (the residual add's output, written here: see residual_convs)
                out, other, relu = res
                calls.append(partial(kfw.output_transform_res, out[start:start + m], mm, th, tw, d["b"],
                                     other[start:start + m], int(relu)))
                continue
            calls.append(partial(kfw.output_transform if fast else kwg.output_transform,
                                 y[start:start + m] if pool is None else
                                 pool[start:start + m], mm, tout, th, tw, d["b"], act, alpha,
                                 pool is not None))
        return calls


def _tile_gemms(ctx, step, d: dict, mm: np.ndarray, v: np.ndarray) -> list:
    """mm[i] (O, cols) = U[i] @ v[i] (C, cols) for the 16 i in one kernels_tile.gemm_act
    (each its own weights; no bias, no activation: the output transform adds them)."""
    o, c, cols = d["o"], d["c"], v.shape[2]
    scratch = tile_scratch(ctx, step, d, 16 * -(-cols // kt.PB) * -(-o // kt.ROWS),
                           16 * o * c * cols, c, d["tiles_at"])
    zeros = prepared(d, "b_zeros", lambda: np.zeros(o, np.float32))
    return [partial(kt.gemm_act, mm, filter_u_tiles(d), v, zeros, scratch, 0, 0.0)]
