"""int8 conv (groups 1) with enough rows as exact float32 BLAS GEMMs on the int8 codes (see
kernels_int8.requant_sum): the weights converted to float32 once (at the first bind, kept:
routes.base.prepared), each chunk's im2col columns in the node's scratch, GEMMs over K in
pieces of kernels_int8.EXACT_K, a requantizing epilogue (that may pool). Batches with fewer
than F32_ROUTE_ROWS rows run as conv_int8_im2row.

On x86's portable path the pieces' sums are kernels_tile.gemm_act's, not numpy's BLAS (see
tile_sums): the same exact integers, the same bytes out."""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_int8 as ki
from pocket.infer import kernels_tile as kt
from pocket.infer.lowering_common import F32_ROUTE_ROWS, _aligned, _im2col
from pocket.infer.routes.base import ROUTES, Route, prepared, register
from pocket.infer.routes.conv_int8_im2row import int8_prep
from pocket.infer.routes.conv_tile import tile_scratch, x86_portable

# NOTE: a piece's sums are integers within 2**24 (K <= EXACT_K codes of at most 128 x 127), so
# kernels_tile's float32 chains (blocks of K summed in float32, any order) give BLAS's values.
# On a 2-core Zen 1 (numpy's OpenBLAS with its Haswell kernels) the tiles ran ResNet-18's
# 64 x 576 @ 3136 in 7.7 ms where BLAS took 10.6, 512 x 1024 @ 49 0.87x, 128 x 1152 @ 784 and
# 256 x 1024 @ 196 1.02-1.04x (alone, caches flushed). ARM keeps BLAS (not measured)
TILE_SUMS = True


def tile_sums(cpu) -> bool:
    """Whether the pieces' sums run on kernels_tile.gemm_act: x86's portable path."""
    return TILE_SUMS and x86_portable(cpu)


@register
class ConvInt8Blas(Route):
    name, op = "conv_int8_blas", "conv2d"
    fuses_pool = True

    def limits(self, geo, dtype, cpu):
        if dtype != "i8":
            return "int8 only"
        return None if geo.groups == 1 else "groups 1 only"

    def prepare(self, ctx, node):
        d = int8_prep(ctx, node, self.name)
        if tile_sums(ctx.cpu) and d["groups"] == 1:
            d["tile_at"] = _aligned(d["scratch_bytes"])
            d["parts"] = max(1, ctx.threads)
            d["scratch_bytes"] = d["tile_at"] + _aligned(
                d["parts"] * kt.scratch_floats(min(d["k"], ki.EXACT_K)) * 4)
        return d

    def at_batch(self, ctx, step, d, n):
        if n * d["p"] < F32_ROUTE_ROWS:
            return ROUTES["conv_int8_im2row"], d
        return self, d

    def bind(self, ctx, step, node, d, n, pool=None):
        a = node.attrs
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        o, k, p, geom = d["o"], d["k"], d["p"], d["geom"]
        y3, x_w = y.reshape(n, o, p), y.shape[3]
        pool, pool_geom = pool or (None, ())
        calls = []
        for start in range(0, n, d["chunk"]):
            m = min(d["chunk"], n - start)
            xs, ys = x[start:start + m], y3[start:start + m]
            col = ctx.scratch(step, np.float32, (k, m * p))
            yf = ctx.scratch(step, np.float32, (d["kc"], o, m * p), _aligned(d["chunk"] * k * p * 4))
            calls.append(_im2col(col, xs, geom, np.float32(a["x_zero_point"]), 0, p))
            if "tile_at" in d:
                calls += _tile_sums(ctx, step, d, col, yf, m * p)
            else:
                # NOTE: the float32 copy of the int8 weights made once (routes.base.prepared),
                # not per call (ResNet-18: 3.8 ms a call on x86); 4 bytes a weight while the
                # engine lives
                wf = prepared(d, "wf", lambda: d["w2"].astype(np.float32))
                for c in range(d["kc"]):
                    k0, k1 = c * ki.EXACT_K, min(k, (c + 1) * ki.EXACT_K)
                    calls.append(partial(np.matmul, wf[:, k0:k1], col[k0:k1], out=yf[c]))
            calls.append(_epilogue(d, ys, yf, p, x_w, pool, pool_geom, start, m))
        return calls


def _epilogue(d, ys, yf, p, x_w, pool, pool_geom, start, m) -> partial:
    epi = (d["bias_adj"], d["m"], d["to_int8"], d["y_zp"], d["lo"], d["relu"])
    if pool is None:
        return partial(ki.requant_sum, ys, yf, 0, p, *epi)
    return partial(ki.requant_sum_pool, pool[start:start + m], yf, 0, p, x_w, *pool_geom, *epi)


def _tile_sums(ctx, step, d: dict, col: np.ndarray, yf: np.ndarray, cols: int) -> list:
    """yf[c] = piece c of the weights (its K rows, packed for the tiles once) @ col's rows."""
    o, k = d["o"], d["k"]
    scratch = tile_scratch(ctx, step, d, -(-cols // kt.PB) * -(-o // kt.ROWS), o * k * cols,
                           min(k, ki.EXACT_K), d["tile_at"])
    zeros = prepared(d, "b_zeros", lambda: np.zeros(o, np.float32))
    calls = []
    for c in range(d["kc"]):
        k0, k1 = c * ki.EXACT_K, min(k, (c + 1) * ki.EXACT_K)
        wt = prepared(d, f"w_tiles{c}", lambda k0=k0, k1=k1: kt.pack_weights(
            d["w2"][:, k0:k1].astype(np.float32)))
        calls.append(partial(kt.gemm_act, yf[c].reshape(1, o, cols), wt,
                             col[k0:k1].reshape(1, k1 - k0, cols), zeros, scratch, 0, 0.0))
    return calls
