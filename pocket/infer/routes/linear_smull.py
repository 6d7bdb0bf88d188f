"""int8 linear on kernels_smull (64-bit ARM without dotprod: the Pi 4's A72): 4 outputs' dot
products at a time, both operands along K as they are (kernels_smull.gemv: smull/smlal2/sadalp
on 16-byte loads of a row of x and of each weight row), the weights padded once to whole
16-byte runs; kernels_int8.requant_rows' epilogue. Only on such CPUs; elsewhere linear_int8,
its portable twin (float32 BLAS or scalar dot products of the codes)."""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_int8 as ki
from pocket.infer import kernels_smull as km
from pocket.infer.lowering_common import _aligned, _int8_consts
from pocket.infer.routes.base import Route, prepared, register, sample_rows
from pocket.infer.routes.conv_sdot import smull_limit


def _k16(k: int) -> int:
    return -(-k // 16) * 16


@register
class LinearSmull(Route):
    name, op = "linear_smull", "linear"

    def limits(self, geo, dtype, cpu):
        why = smull_limit(dtype, cpu)
        if why:
            return why
        return None if _k16(geo.k) <= km.MAX_K else f"K = {_k16(geo.k)} exceeds kernels_smull.MAX_K"

    def prepare(self, ctx, node):
        w = ctx.params[node.inputs[1]]
        o, k = w.shape
        rows = ctx.max_batch * sample_rows(ctx, node)
        # scratch: the rows padded to whole 16-byte runs (K % 16 != 0 only), the sums (N, O) i32
        sizes = (_aligned(rows * _k16(k)) if k % 16 else 0, _aligned(4 * rows * o))
        return {"route": self.name, "w": w, "sizes": sizes, "scratch_bytes": sum(sizes),
                **_int8_consts(ctx, node, w)}

    def bind(self, ctx, step, node, d, n, pool=None):
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        n *= sample_rows(ctx, node)  # the rows of (N, ..., in): n at (N, in)
        epi = (d["bias_adj"], d["m"], d["to_int8"], d["y_zp"], d["lo"], d["relu"])
        o, k = d["w"].shape
        k16 = _k16(k)
        # NOTE: padded once (routes.base.prepared), kept while the engine lives
        whole = k % 16 == 0 and d["w"].flags.c_contiguous
        wp = d["w"] if whole else prepared(d, "w_pad16", lambda: np.ascontiguousarray(
            np.pad(d["w"], ((0, 0), (0, k16 - k)))))
        calls, xr = [], x.reshape(n, k)
        if k % 16:
            # a row's bytes past K meet zero weights: they need no clearing
            xw = ctx.scratch(step, np.int8, (n, k16))
            calls.append(partial(np.copyto, xw[:, :k], xr))
            xr = xw
        c = ctx.scratch(step, np.int32, (n, o), d["sizes"][0])
        return [*calls, partial(km.gemv, c, xr, wp, km.pairs_ok(d["w"])),
                partial(ki.requant_rows, y.reshape(n, o), c[None], *epi)]
