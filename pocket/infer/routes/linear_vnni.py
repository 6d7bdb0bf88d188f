"""int8 linear on kernels_vnni (AVX-512 VNNI): with at least VNNI_TILE_ROWS rows (and K % 4 == 0)
the rows packed as the columns of channel x pixel tiles (gemm_cols), a chained linear's result
left packed for the next (linear_chain); fewer rows take the dot-product kernel along K
(gemm_rows)."""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_int8 as ki
from pocket.infer import kernels_vnni as kv
from pocket.infer.lowering_common import (
    _LINEAR_SKEW,
    _int8_consts,
    _tile_cols,
    _vnni_cols_bytes,
    _vnni_rows_bytes,
)
from pocket.infer.routes.base import Route, register, sample_rows
from pocket.infer.routes.linear_chain import chained_input, chained_output

# A linear with at least this many rows packs them for the channel x pixel tiles; fewer rows
# take the dot-product kernel along K.
VNNI_TILE_ROWS = 16


@register
class LinearVnni(Route):
    name, op = "linear_vnni", "linear"

    def limits(self, geo, dtype, cpu):
        if not cpu.vnni:
            return "needs AVX-512 VNNI (kernels_vnni; off with POCKET_INT8_VNNI=0)"
        if dtype != "i8":
            return "int8 only"
        return None if geo.k <= kv.MAX_K else f"K = {geo.k} exceeds kernels_vnni.MAX_K = {kv.MAX_K}"

    def prepare(self, ctx, node):
        w = ctx.params[node.inputs[1]]
        o, k = w.shape
        rows = ctx.max_batch * sample_rows(ctx, node)
        dot_rows = min(rows, VNNI_TILE_ROWS - 1) if k % 4 == 0 else rows
        scratch = sum(_vnni_rows_bytes(dot_rows, o, k))
        if rows >= VNNI_TILE_ROWS and k % 4 == 0:
            scratch = max(scratch, sum(_vnni_cols_bytes(rows, o, k)))
        return {"route": self.name, "w": w, "scratch_bytes": scratch, **_int8_consts(ctx, node, w)}

    def bind(self, ctx, step, node, d, n, pool=None):
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        n *= sample_rows(ctx, node)  # the rows of (N, ..., in): n at (N, in)
        w = d["w"]
        o, k = w.shape
        epi = (d["bias_u8"], d["m"], d["to_int8"], d["y_zp"], d["lo"], d["relu"])
        x8 = x.reshape(n, k).view(np.uint8)
        if n < VNNI_TILE_ROWS or k % 4:
            xu_bytes = _vnni_rows_bytes(n, o, k)[0]
            xu = ctx.scratch(step, np.uint8, (n, (k // 64 + 1) * 64))
            c = ctx.scratch(step, np.int32, (n, o), xu_bytes)
            return [partial(kv.pack_rows, xu, x8), partial(kv.gemm_rows, c, xu, w),
                    partial(ki.requant_rows, y.reshape(n, o), c[None], *epi)]
        mp = _tile_cols(n)
        calls = []
        if chained_input(ctx, step, n):  # the previous linear left its codes packed here
            xp = ctx.packed(node.inputs[0], np.uint32, (k // 4, mp))
        else:
            xp = ctx.scratch(step, np.uint32, (k // 4, mp))
            calls.append(partial(kv.pack_rows_t, xp, x8.view(np.uint32)))
        c = ctx.scratch(step, np.int32, (o, mp + _LINEAR_SKEW), _vnni_cols_bytes(n, o, k)[0])
        calls.append(partial(kv.gemm_cols, c, w, xp))
        if chained_output(ctx, step, n):  # packed for the next linear
            xq = ctx.packed(node.outputs[0], np.uint32, (o // 4, mp))
            return [*calls, partial(kv.requant_cols_pack, xq, c, c.view(np.float32), n, *epi[:2], *epi[3:])]
        return [*calls, partial(kv.requant_cols_t, y.reshape(n, o), c, c.view(np.float32), *epi)]
