"""fp32 3x3 stride-1 conv as Winograd F(2x2, 3x3) on AVX-512, fused (kernels_fma_winograd.fused_conv):
each thread runs its own images' whole conv in L2-sized chunks, the images read unpadded. For
ReLU or no activation and at least WINOGRAD_FUSED_PER_THREAD images a thread; other batches
take conv_winograd (or its pitch plan)."""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_fma as kfma
from pocket.infer import kernels_fma_winograd as kfw
from pocket.infer.lowering_common import _act_code
from pocket.infer.routes.base import ROUTES, Route, register
from pocket.infer.routes.conv_winograd import filter_u, winograd_limits

# From this many input channels on (not conv_winograd's 64): cnn_mnist fp32 at batch 64, whose
# 32 -> 64 conv is 3/4 of the model, went 4.03 -> 3.14 ms on one thread, 2.28 -> 1.79 on two
WINOGRAD_FUSED_MIN_C = 32
# The fused conv runs each thread's images one chunk at a time in its own part of the scratch,
# sized to stay in L2 (this many bytes) but of at least WINOGRAD_CHUNK_TILES tiles, so that the
# 16 GEMMs' reads of U (16 x O x C floats, from L3 once it outgrows L2) are shared by enough
# columns. cnn_cifar fp32 at batch 64 (U up to 4 MiB): 93.0 ms on one thread at 4 MiB and no
# minimum, 89.8 at 2 MiB and 96 or 128 tiles, 91.7 at 192, 93.8 at 256; two threads 50.5,
# 48.9, 48.5, 49.0, 49.9. cnn_mnist (U 128 KiB) ran best at 2 MiB (1 MiB: +5%, 4 MiB: +16%).
WINOGRAD_SCRATCH_BYTES = 2 << 20
WINOGRAD_CHUNK_TILES = 128
# With one image a thread or fewer, the fused conv leaves cores idle: the four kernels a chunk
# (each parallel) take those batches (cnn_cifar fp32 at batch 1 on two threads: 1.26 ms, fused
# 1.63).
WINOGRAD_FUSED_PER_THREAD = 2


@register
class ConvWinogradFused(Route):
    name, op = "conv_winograd_fused", "conv2d"
    fuses_pool = True

    def limits(self, geo, dtype, cpu):
        if not cpu.fma:
            return "needs AVX-512 (kernels_fma; off with POCKET_FP32_FMA=0)"
        return winograd_limits(geo, dtype)

    def declines(self, geo, dtype, cpu):
        return f"fewer than {WINOGRAD_FUSED_MIN_C} input channels" if geo.c < WINOGRAD_FUSED_MIN_C else None

    def prepare(self, ctx, node):
        d = ROUTES["conv_winograd"].transforms(ctx, node)
        d["route"] = self.name
        # a part of WINOGRAD_SCRATCH_BYTES a thread (U is prepared: conv_winograd.filter_u)
        c, th, tw, o = d["c"], d["th"], d["tw"], d["o"]
        per_image = 4 * sum(kfw.slot_floats(c, o, 1, th, tw))
        d["fused_chunk"] = max(1, min(ctx.max_batch, max(WINOGRAD_SCRATCH_BYTES // per_image,
                                                          -(-WINOGRAD_CHUNK_TILES // (th * tw)))))
        d["slot_bytes"] = 4 * sum(kfw.slot_floats(c, o, d["fused_chunk"], th, tw))
        d["scratch_bytes"] = max(d["scratch_bytes"], ctx.threads * d["slot_bytes"])
        return ROUTES["conv_winograd"].with_pitch_plan(ctx, node, d)

    def at_batch(self, ctx, step, d, n):
        if _act_code(ctx.graph.nodes[step].attrs) in (0, 1) and n >= WINOGRAD_FUSED_PER_THREAD * ctx.threads:
            return self, d
        return ROUTES["conv_winograd"].at_batch(ctx, step, d, n)

    def pool_ok(self, d, n, pool_geom):
        return tuple(pool_geom) == (2, 2, 2, 2)

    def bind(self, ctx, step, node, d, n, pool=None):
        """fused_conv over the whole batch, a part of the scratch a thread (as many as were
        prepared, should the thread count have grown since)."""
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        out = y if pool is None else pool[0]
        act = _act_code(node.attrs)
        c, o, th, tw, chunk = d["c"], d["o"], d["th"], d["tw"], d["fused_chunk"]
        ph, pw = d["geom"][4:6]
        u = filter_u(d)
        nt = max(1, min(ctx.threads, d["scratch_bytes"] // d["slot_bytes"]))
        scratch = ctx.scratch(step, np.float32, (nt * d["slot_bytes"] // 4,))
        offs = kfma.row_offsets(c, kfma.tile_cols(chunk * th * tw))
        return [partial(kfw.fused_conv, out, x, u, scratch, offs, nt, chunk, th, tw, ph, pw, d["b"], act,
                        pool is not None, kfw.slot_floats(c, o, chunk, th, tw))]
