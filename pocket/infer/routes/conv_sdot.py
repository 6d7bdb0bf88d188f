"""int8 1x1 conv (groups 1, no padding, any stride) on kernels_sdot (ARM `dotprod`: 16 int8
multiply-adds an instruction): a chunk of images packed into (C/4, columns) words of four
channels, one tile GEMM, kernels_vnni's requantizing epilogue; or, for int8 codes out where K
fits one pass and each image's pixels are whole tiles (kernels_sdot.fused), the tiles
requantize in registers (gemm_q: the int32 sums are never stored; kernels_smull's on any map).
Only where the CPU has the dot product extension (Cortex-A76, the Pi 5); elsewhere
conv_int8_blas, its portable twin."""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_sdot as ks
from pocket.infer import kernels_smull as km
from pocket.infer import kernels_vnni as kv
from pocket.infer import lowering_common as lc
from pocket.infer.lowering_common import _aligned, _int8_consts
from pocket.infer.routes.base import Route, conv_prep, prepared, register


def _cols(rows: int) -> int:
    """Columns of the packed operand: rows rounded up to whole tiles of 16 pixels."""
    return -(-rows // ks.TILE_P) * ks.TILE_P


def _bytes(rows: int, o: int, k4: int) -> tuple[int, int]:
    """Scratch for `rows` pixels: xp (K4, Mp) u32 and c (O, Mp) i32."""
    mp = _cols(rows)
    return _aligned(4 * k4 * mp), _aligned(4 * o * mp)


def sdot_limit(dtype, cpu) -> str | None:
    """Why an sdot route cannot run here, or None (the CPU and dtype half of `limits`)."""
    if not cpu.sdot:
        return "needs the ARM dot product extension (kernels_sdot; off with POCKET_INT8_SDOT=0)"
    return "int8 only" if dtype != "i8" else None


def smull_limit(dtype, cpu) -> str | None:
    """sdot_limit for the smull routes (kernels_smull: 64-bit ARM without dotprod)."""
    if not cpu.smull:
        return ("needs 64-bit ARM without the dot product extension (kernels_smull; off with "
                "POCKET_INT8_SMULL=0)")
    return "int8 only" if dtype != "i8" else None


def plan_chunks(ctx, d: dict) -> None:
    """d["chunk"] images a GEMM (the packed operand and sums within VNNI_SCRATCH_BYTES a
    thread) and the scratch they need, from d's o, p and k4."""
    per_image = 4 * (d["k4"] + d["o"]) * d["p"]
    d["chunk"] = max(1, min(ctx.max_batch, lc.VNNI_SCRATCH_BYTES * ctx.threads // per_image))
    d["scratch_bytes"] = sum(_bytes(d["chunk"] * d["p"], d["o"], d["k4"]))


def chunk_scratch(ctx, step: int, d: dict, m: int) -> tuple[np.ndarray, np.ndarray]:
    """The packed operand xp (K4, Mp) u32 and the sums c (O, Mp) i32 of a chunk of m images."""
    mp = _cols(m * d["p"])
    xp_bytes, _ = _bytes(d["chunk"] * d["p"], d["o"], d["k4"])
    return (ctx.scratch(step, np.uint32, (d["k4"], mp)),
            ctx.scratch(step, np.int32, (d["o"], mp), xp_bytes))


def _pad_weights(w2: np.ndarray, k4: int) -> np.ndarray:
    out = np.empty((w2.shape[0], 4 * k4), np.int8)
    ks.pad_weights(out, w2)
    return out


def _float_fusable(d: dict) -> bool:
    """Whether gemm_q's float32 epilogue equals kernels_int8._epilogue's here: it adds the
    bias in int32 (the int64 total must fit: |bias_adj| + K * 128 * 128 < 2**31) and clamps
    in float32 (the ceiling must be a float32)."""
    ceil = float(d["lo"][2])
    return (int(np.abs(d["bias_adj"]).max(initial=0)) + d["k"] * 128 * 128 < 2**31
            and float(np.float32(ceil)) == ceil)


def q_args(d: dict, k4: int, p: int, kern) -> tuple | None:
    """kern.gemm_q's epilogue operands (badj, m, p, lo, hi, zp) where it takes the conv (see
    kern.fused and _float_fusable), else None."""
    if not (kern.fused(k4, p) and (d["to_int8"] or _float_fusable(d))):
        return None
    badj = prepared(d, "badj32", lambda: d["bias_adj"].astype(np.int32))
    if d["to_int8"]:
        # kernels_int8._code_clamped's operands, in float32
        mq = prepared(d, "m32", lambda: d["m"].astype(np.float32))
        zp = np.float32(d["y_zp"])
        return badj, mq, p, np.float32(d["lo"][0]) - zp, np.float32(d["lo"][1]) - zp, zp
    lo = np.float32(0 if d["relu"] else -np.inf)
    return badj, d["m"], p, lo, np.float32(d["lo"][2]), np.float32(0)


@register
class ConvSdot(Route):
    name, op = "conv_sdot", "conv2d"
    kern = ks  # the GEMMs (gemm, gemm_q, fused); kernels_smull's for ConvSmull

    def gemm_extra(self, w: np.ndarray) -> tuple:
        """The GEMMs' arguments after kernels_sdot's, for weights w."""
        return ()

    def cpu_limit(self, dtype, cpu) -> str | None:
        return sdot_limit(dtype, cpu)

    def limits(self, geo, dtype, cpu):
        why = self.cpu_limit(dtype, cpu)
        if why:
            return why
        if geo.groups != 1 or (geo.kh, geo.kw, geo.ph, geo.pw) != (1, 1, 0, 0):
            return "1x1 convs without padding, groups 1, only"
        return None if geo.k <= ks.MAX_K else f"K = {geo.k} exceeds kernels_sdot.MAX_K"

    def prepare(self, ctx, node):
        d = conv_prep(ctx, node, self.name)
        o, k = d["o"], d["k"]
        d.update(_int8_consts(ctx, node, d["w"]))
        d["w2"] = d["w"].reshape(o, k)
        d["k4"] = -(-k // 4)
        plan_chunks(ctx, d)
        return d

    def bind(self, ctx, step, node, d, n, pool=None):
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        p, k4 = d["p"], d["k4"]
        sh, sw = d["geom"][2:4]
        # K % 4 != 0: the weights padded to whole words, once (routes.base.prepared)
        w4 = d["w2"] if d["k"] % 4 == 0 else prepared(d, "w_pad", lambda: _pad_weights(d["w2"], k4))
        epi = (d["bias_adj"], d["m"], d["to_int8"], d["y_zp"], d["lo"], d["relu"])
        extra = self.gemm_extra(d["w"])
        q = q_args(d, k4, p, self.kern)
        calls = []
        for start in range(0, n, d["chunk"]):
            m = min(d["chunk"], n - start)
            xp, c = chunk_scratch(ctx, step, d, m)
            calls.append(partial(ks.pack_1x1, xp.view(np.int8), x[start:start + m], sh, sw))
            if q:
                calls.append(partial(self.kern.gemm_q, y[start:start + m], w4, xp, *q, *extra))
                continue
            calls += [partial(self.kern.gemm, c, w4, xp, *extra),
                      partial(kv.requant_cols, y[start:start + m], c, c.view(np.float32),
                              y.shape[3], p, *epi)]
        return calls


@register
class ConvSmull(ConvSdot):
    """conv_sdot on kernels_smull: the Pi 4's A72 (no dotprod), the same operands."""

    name = "conv_smull"
    kern = km

    def gemm_extra(self, w):
        return (km.pairs_ok(w),)

    def cpu_limit(self, dtype, cpu):
        return smull_limit(dtype, cpu)
