"""int8 linear on kernels_sdot (ARM `dotprod`): the weights packed once as the GEMM's column
operand (kernels_sdot.pack_1x1 of W^T: output channels as the 16-wide pixel tiles, four
inputs a word), the rows of x as its channel rows, so batch 1 fills whole tiles (a row of x
as the column operand would fill 1 of 16 columns); kernels_int8.requant_rows' epilogue.
Only where the CPU has the dot product extension (the Pi 5); elsewhere linear_int8, its
portable twin."""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_int8 as ki
from pocket.infer import kernels_sdot as ks
from pocket.infer.lowering_common import _aligned, _int8_consts
from pocket.infer.routes.base import Route, prepared, register, sample_rows
from pocket.infer.routes.conv_sdot import _cols, sdot_limit


def _pack(w: np.ndarray, k4: int) -> np.ndarray:
    """w (O, K) i8 -> (K4, Op) u32: word [k4, o] holds w[o, 4*k4:4*k4 + 4], zero past K, O."""
    o, k = w.shape
    wp = np.empty((k4, 4 * _cols(o)), np.int8)
    ks.pack_1x1.serial(wp, np.ascontiguousarray(w.T).reshape(1, k, o, 1), 1, 1)
    return wp.view(np.uint32)


@register
class LinearSdot(Route):
    name, op = "linear_sdot", "linear"

    def limits(self, geo, dtype, cpu):
        why = sdot_limit(dtype, cpu)
        if why:
            return why
        k = 4 * -(-geo.k // 4)
        return None if k <= ks.MAX_K else f"K = {k} exceeds kernels_sdot.MAX_K"

    def prepare(self, ctx, node):
        w = ctx.params[node.inputs[1]]
        o, k = w.shape
        rows = ctx.max_batch * sample_rows(ctx, node)
        k4 = -(-k // 4)
        # scratch: the rows padded to whole words (K % 4 != 0 only), the sums (N, Op) i32
        sizes = (_aligned(rows * 4 * k4) if k % 4 else 0, _aligned(4 * rows * _cols(o)))
        return {"route": self.name, "w": w, "k4": k4, "sizes": sizes, "scratch_bytes": sum(sizes),
                **_int8_consts(ctx, node, w)}

    def bind(self, ctx, step, node, d, n, pool=None):
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        n *= sample_rows(ctx, node)  # the rows of (N, ..., in): n at (N, in)
        epi = (d["bias_adj"], d["m"], d["to_int8"], d["y_zp"], d["lo"], d["relu"])
        o, k = d["w"].shape
        k4 = d["k4"]
        wp = prepared(d, "w_packed", lambda: _pack(d["w"], k4))
        calls, xr = [], x.reshape(n, k)
        if k % 4:
            # NOTE: the GEMM reads whole words of each row: a row of K % 4 != 0 is copied to
            # whole words (bytes past K meet zero weights, so they need no clearing)
            xw = ctx.scratch(step, np.int8, (n, 4 * k4))
            calls.append(partial(np.copyto, xw[:, :k], xr))
            xr = xw
        c = ctx.scratch(step, np.int32, (n, wp.shape[1]), d["sizes"][0])
        return [*calls, partial(ks.gemm, c, xr, wp),
                partial(ki.requant_rows, y.reshape(n, o), c[None, :, :o], *epi)]
