"""fp32 linear on AVX-512 with many rows: a kernels_fma GEMM with the rows as the columns of its
packed operand. On up to ROWS_COPIES threads each thread transposes its own blocks of x
(gemm_rows); small weights on several threads split the rows (gemm_pixels); the last GEMM and
its transposing epilogue may be one call (gemm_t); a chained linear leaves its result packed
for the next (linear_chain). Batches of fewer than FMA_LINEAR_ROWS rows run as linear_gemv."""

from __future__ import annotations

from functools import partial

import numba
import numpy as np

from pocket.infer import kernels_fma as kfma
from pocket.infer import kernels_fma_linear as kfl
from pocket.infer import kernels_fp32 as kf
from pocket.infer.lowering_common import (
    _EMPTY_F32,
    _LINEAR_SKEW,
    _act_alpha,
    _act_code,
    _aligned,
    _register_epi,
)
from pocket.infer.routes.base import ROUTES, Route, register
from pocket.infer.routes.linear_blas import linear_prep
from pocket.infer.routes.linear_chain import chained_input, chained_output
from pocket.infer.routes.linear_gemv import fma_linear_limits

# An fp32 linear with at least this many rows runs on its GEMM (the rows as its pixels); fewer
# rows take its dot-product kernel along K (one tile would be mostly junk).
FMA_LINEAR_ROWS = 16
# A linear GEMM on several threads splits its rows (the GEMM's pixels) across them, one group
# a thread, where its weights are at most this many floats (kernels_fma.gemm_pixels). Each
# core then reads all the weights for its 32-64 columns: mlp fp32 at batch 64 on 2 threads,
# 128 x 256 weights: 22 -> 18-19 us; 256 x 784: 85 -> 115 us.
PIXEL_SPLIT_WEIGHTS = 1 << 16
# A linear from rows (not chained) on up to ROWS_COPIES threads transposes its input a block
# of K at a time in each thread, for its own channels (kernels_fma_linear.gemm_rows): its scratch
# holds that many blocks. On one thread too: each block then goes from x in L2 to L1 and is
# read there, where transpose_in wrote all of x.T to L2 first (mlp fp32 at batch 64, its
# first linear: 160.5 -> ~156.5 us)
ROWS_COPIES = 4


@register
class LinearFma(Route):
    name, op = "linear_fma", "linear"

    def limits(self, geo, dtype, cpu):
        return fma_linear_limits(dtype, cpu)

    def declines(self, geo, dtype, cpu):
        return f"fewer than {FMA_LINEAR_ROWS} rows" if geo.rows < FMA_LINEAR_ROWS else None

    def prepare(self, ctx, node):
        d = linear_prep(ctx, node, self.name)
        o, k = d["wf"].shape
        cols = kfma.tile_cols(ctx.max_batch)
        d["copies"] = min(ROWS_COPIES, numba.config.NUMBA_NUM_THREADS)
        d["rows_at"] = _aligned(max(k, d["copies"] * kfl.rows_block(cols, k)) * cols * 4)
        d["scratch_bytes"] = d["rows_at"] + _aligned(o * (cols + _LINEAR_SKEW) * 4)
        return d

    def at_batch(self, ctx, step, d, n):
        return (self, d) if n >= FMA_LINEAR_ROWS else (ROUTES["linear_gemv"], d)

    def bind(self, ctx, step, node, d, n, pool=None):
        a = node.attrs
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        w = d["wf"]
        o, k = w.shape
        cols = kfma.tile_cols(n)
        parts = min(ctx.threads, -(-cols // kfma.TILE_P))
        offs = kfma.row_offsets(k, cols)
        calls, own = [], None  # own: a copy of x.T for each thread (kernels_fma_linear.gemm_rows)
        if chained_input(ctx, step, n):  # the previous linear left x.T here
            xt = ctx.packed(node.inputs[0], np.float32, (k, cols))
        elif ctx.threads == 1 or (ctx.threads <= d["copies"] and ctx.parallel(4 * o * cols * k)):
            own = ctx.scratch(step, np.float32, (ctx.threads, kfl.rows_block(cols, k), cols))
        else:
            xt = ctx.scratch(step, np.float32, (k, cols))
            calls.append(partial(kfl.transpose_in, xt, x.reshape(n, k), parts))

        def gemm(c, ldc, b, epi):
            if own is not None:
                return partial(kfl.gemm_rows, c, w, x.reshape(n, k), own, offs, o, cols, ldc, b, epi)
            if parts > 1 and o * k <= PIXEL_SPLIT_WEIGHTS:
                return partial(kfma.gemm_pixels, c, w, xt, offs, o, cols, k, ldc, b, epi, parts)
            return partial(kfma.gemm, c, w, xt, offs, 1, o, cols, 0, 0, k, 0, ldc, b, epi)

        if chained_output(ctx, step, n):  # y.T, for the next linear
            yt = ctx.packed(node.outputs[0], np.float32, (o, cols))
            act = _act_code(a)
            epi = _register_epi(d["b"], act)
            if epi is not None:
                # bias and ReLU on the GEMM's tiles in registers; the columns past the rows
                # get act(bias) or the sums of finite inputs: finite, and the next GEMM's
                # results there are never read
                return [*calls, gemm(yt, cols, d["b"], epi)]
            return [*calls, gemm(yt, cols, _EMPTY_F32, 0),
                    partial(kf.bias_act_cols, yt, n, d["b"], act, _act_alpha(a))]
        ldc = cols + _LINEAR_SKEW
        c = ctx.scratch(step, np.float32, (o, ldc), d["rows_at"])
        g = gemm(c, ldc, _EMPTY_F32, 0)
        if g.func is kfma.gemm:  # the GEMM and its epilogue in one call
            return [*calls, partial(kfl.gemm_t, y, c, w, xt, offs, o, cols, k, ldc, d["b"],
                                    _act_code(a), _act_alpha(a))]
        return [*calls, g, partial(kfl.bias_act_t, y, c, d["b"], _act_code(a), _act_alpha(a))]
