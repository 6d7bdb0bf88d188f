"""int8 conv (groups 1, any kernel, stride, padding and dilation) on kernels_sdot (ARM
`dotprod`): each chunk of images packed straight from its int8 codes into the sdot operand,
tap by tap, four channels a word (kernels_sdot.pack_taps: the im2row with its padding, no
padded copy), the weights reordered to match once, one tile GEMM, kernels_vnni's requantizing
epilogue, which may pool (kernels_pool.requant_cols_pool), or without a pool, where the kernels
take it (their `fused`), gemm_q: the epilogue in the tiles. Only where the CPU has the dot
product extension (Cortex-A76, the Pi 5); elsewhere conv_int8_blas / conv_int8_im2row, its
portable twins. 1x1 convs without padding take conv_sdot first (no reordering)."""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_pool as kp
from pocket.infer import kernels_sdot as ks
from pocket.infer import kernels_smull as km
from pocket.infer import kernels_vnni as kv
from pocket.infer.lowering_common import _int8_consts
from pocket.infer.routes.base import Route, conv_prep, prepared, register
from pocket.infer.routes.conv_sdot import (
    ConvSdot,
    ConvSmull,
    chunk_scratch,
    plan_chunks,
    q_args,
    sdot_limit,
    smull_limit,
)


def taps_k4(geo) -> int:
    """Words of the packed operand's column: kh*kw taps of ceil(C/4) words each."""
    return geo.kh * geo.kw * -(-geo.c // 4)


def _weights(w: np.ndarray, k4: int) -> np.ndarray:
    out = np.empty((w.shape[0], 4 * k4), np.int8)
    ks.weights_taps(out, w)
    return out


@register
class ConvSdotTaps(Route):
    name, op = "conv_sdot_taps", "conv2d"
    fuses_pool = True
    kern = ks  # the GEMM; kernels_smull's for ConvSmullTaps

    def gemm_extra(self, w: np.ndarray) -> tuple:
        return ConvSdot.gemm_extra(self, w)

    def cpu_limit(self, dtype, cpu) -> str | None:
        return sdot_limit(dtype, cpu)

    def limits(self, geo, dtype, cpu):
        why = self.cpu_limit(dtype, cpu)
        if why:
            return why
        if geo.groups != 1:
            return "groups 1 only"
        k = 4 * taps_k4(geo)
        return None if k <= ks.MAX_K else f"K = {k} (channels padded to 4) exceeds kernels_sdot.MAX_K"

    def prepare(self, ctx, node):
        d = conv_prep(ctx, node, self.name)
        d.update(_int8_consts(ctx, node, d["w"]))
        d["k4"] = taps_k4(d["geo"])
        plan_chunks(ctx, d)
        return d

    def bind(self, ctx, step, node, d, n, pool=None):
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        p, k4 = d["p"], d["k4"]
        ho, wo = y.shape[2:]
        pool, pool_geom = pool or (None, ())
        # NOTE: reordered once (routes.base.prepared), kept while the engine lives: K bytes a
        # channel, what the weights themselves take (plus the channel padding)
        wt = prepared(d, "w_taps", lambda: _weights(d["w"], k4))
        epi = (d["bias_adj"], d["m"], d["to_int8"], d["y_zp"], d["lo"], d["relu"])
        zp = node.attrs["x_zero_point"]
        extra = self.gemm_extra(d["w"])
        # the epilogue in the tiles where the GEMM allows it (not before a fused pool)
        q = q_args(d, k4, p, self.kern) if pool is None else None
        calls = []
        for start in range(0, n, d["chunk"]):
            m = min(d["chunk"], n - start)
            xp, c = chunk_scratch(ctx, step, d, m)
            calls.append(partial(ks.pack_taps, xp.view(np.int8), x[start:start + m], *d["geom"], zp))
            if q:
                calls.append(partial(self.kern.gemm_q, y[start:start + m], wt, xp, *q, *extra))
                continue
            calls += [partial(self.kern.gemm, c, wt, xp, *extra),
                      partial(kv.requant_cols, y[start:start + m], c, c.view(np.float32), wo, p, *epi)
                      if pool is None else
                      partial(kp.requant_cols_pool, pool[start:start + m], c, c.view(np.float32), ho, wo,
                              p, *pool_geom, *epi)]
        return calls


@register
class ConvSmullTaps(ConvSdotTaps):
    """conv_sdot_taps on kernels_smull: the Pi 4's A72 (no dotprod), the same operands; gemm_q
    on any map."""

    name = "conv_smull_taps"
    kern = km

    def gemm_extra(self, w):
        return ConvSmull.gemm_extra(self, w)

    def cpu_limit(self, dtype, cpu):
        return smull_limit(dtype, cpu)
