"""Convs (groups 1) on the portable path through kernels_tile's register-tiled GEMM, the
bias and activation fused: `conv_tile` reads a 1x1 conv's NCHW input in place (stride 1, no
padding), `conv_tile_cols` the im2col columns of any other conv, one image at a time,
`conv_tile_phase` a stride-2 stem's input phases in place (x86); for int8
`conv_tile_q` and `conv_tile_q_cols` likewise (kernels_tile.gemm_q: exact float32 sums of the
codes, requantized as kernels_pw does), in place of conv_pw_int8 and conv_int8_blas.

They take the place of conv_pw / conv_pointwise (1x1) and conv_gemm (im2col + BLAS + a bias_act
pass) up to TILE_MAX_K (COLS_MAX_K) rows along K; past that OpenBLAS's packed kernels run faster.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_int8 as ki
from pocket.infer import kernels_phase as kq
from pocket.infer import kernels_tile as kt
from pocket.infer import kernels_tile_pool as ktp
from pocket.infer.lowering_common import _act_alpha, _act_code, _aligned, _im2col, _int8_consts
from pocket.infer.routes.base import Route, conv_prep, prepared, register
from pocket.infer.routes.conv_pw import pointwise_limit

# NOTE: measured against np.matmul + bias_act on one thread (OpenBLAS, Zen 2 AVX2): 0.55-0.9x
# up to K = 480 (MobileNet / EfficientNet / ShuffleNet 1x1 convs and 3-channel stems), about
# 1.0x at 1152 x 192 over 49 pixels, 1.15-1.2x at K = 672 and 1152; through im2col 1.15x at
# ResNet-18's 7x7 stem (64 x 147 over 12544 pixels), 1.0x at 64 x 128. Those were layers
# called alone, their weights in cache; in a network's sequence they come from memory, which
# OpenBLAS then reads twice a call (it packs them first) and the tiles once, packed at load
# (kernels_tile.pack_weights): 1x1 convs up to K = 1152 (was 512) took EfficientNet-B0 and
# MobileNetV3-small 0.97-0.98x on one thread, MobileNetV3-small 0.97-0.98x on two,
# EfficientNet-B0 1.00x there (Xeon, OpenBLAS on AVX-512; interleaved). The emulated Pi 5
# counts 0.1-0.5% more instructions (bench/results/s24_arm_pi5_tilek.md)
TILE_MAX_K = 1152
# ... and the convs through im2col columns (conv_tile_cols): on x86 (AVX2) up to COLS_MAX_K_X86
# rows along K, ahead of conv_gemm_pitch's BLAS too (cols_take_pitch). On a 2-core Zen 1
# (numpy's OpenBLAS with its Haswell kernels, ~10-12 GMAC/s where the tiles run 12-16),
# interleaved in one process: SqueezeNet's 55x55 fires (16 -> 64, K = 144) 0.93-0.94x of the
# whole model on one and two threads; ResNet-18's stem and stride-2 convs 0.975 / 1.00. On the
# Xeon's portable path (OpenBLAS on AVX-512) such raises were 0.99-1.01x. ARM keeps 128: its
# instruction counts were not measured with more
COLS_MAX_K_X86 = 4608
COLS_MAX_K = 128 if kt.W_VECTORS else COLS_MAX_K_X86


def x86_portable(cpu) -> bool:
    """x86 without AVX-512 with the tiles available: where kernels_tile takes GEMMs that run on
    numpy's BLAS elsewhere (im2col convs past K = 128, Winograd's GEMMs, int8 sums); ARM
    (W_VECTORS) keeps BLAS for them."""
    return kt.AVAILABLE and not kt.W_VECTORS and not cpu.fma


def tile_scratch(ctx, step, d: dict, tasks: int, work: int, k: int, at: int) -> np.ndarray:
    """A gemm_act call's scratch: one panel of k rows a part, as many parts as threads share
    its `tasks` (one where the call's `work` runs serially), at byte `at` of the step's."""
    parts = min(d["parts"], tasks) if ctx.parallel(work) else 1
    return ctx.scratch(step, np.float32, (parts, kt.scratch_floats(k)), at)


def cols_take_pitch(geo, cpu) -> bool:
    """Whether conv_tile_cols runs a conv that conv_gemm_pitch (BLAS) would: x86's portable
    path (the constants above), a conv it takes."""
    return x86_portable(cpu) and geo.groups == 1 and geo.k <= COLS_MAX_K


def _limits(geo, dtype, cpu) -> str | None:
    if dtype != "f32":
        return "fp32 only"
    if not kt.AVAILABLE:
        return "needs Numba's JIT (POCKET_FP32_TILE=0 opts out)"
    return None


def _declines(geo, most: int) -> str | None:
    if geo.k > most:
        return f"more than {most} rows along K: BLAS is faster"
    return None


def _prep(ctx, d: dict) -> dict:
    """The weights as (O, K) (laid out for the tiles at the first bind); the scratch: one
    kernels_tile panel a thread."""
    d["w2"] = d["w"].reshape(d["o"], d["k"])
    d["parts"] = max(1, ctx.threads)
    d["scratch_at"] = d.get("scratch_bytes", 0)
    d["scratch_bytes"] = d["scratch_at"] + _aligned(d["parts"] * kt.scratch_floats(d["k"]) * 4)
    return d


def _bias(d: dict) -> np.ndarray:
    """The bias the tiles add: the file's, or O zeros made once where the conv has none (the
    file's own is not copied, nor counted as prepared)."""
    if d["b"].shape[0]:
        return d["b"]
    return prepared(d, "b_zeros", lambda: np.zeros(d["o"], np.float32))


def _gemm(ctx, step, d: dict, a: dict, y: np.ndarray, x: np.ndarray) -> list:
    """The calls y (m, O, P) = act(w2 @ x[i] (K, P) + b) for each of its m images."""
    m, o, k, p = y.shape[0], d["o"], d["k"], d["p"]
    scratch = tile_scratch(ctx, step, d, m * -(-p // kt.PB) * -(-o // kt.ROWS), m * o * k * p,
                           k, d["scratch_at"])
    wt = prepared(d, "w_tiles", lambda: kt.pack_weights(d["w2"]))
    return [partial(kt.gemm_act, y.reshape(m, o, p), wt, x, _bias(d), scratch, _act_code(a),
                    _act_alpha(a))]


def _cols_calls(ctx, step, node, d: dict, n: int, pad, gemm) -> list:
    """Per image: its im2col columns (padding `pad`) into the node's scratch, then the calls
    gemm(its output (1, O, Ho, Wo), the columns (1, K, P)) returns."""
    x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
    k, p = d["k"], d["p"]
    col = ctx.scratch(step, np.float32, (k, p))
    calls = []
    for i in range(n):
        calls += [_im2col(col, x[i:i + 1], d["geom"], pad, 0, p), *gemm(y[i:i + 1], col.reshape(1, k, p))]
    return calls


@register
class ConvTile(Route):
    name, op = "conv_tile", "conv2d"

    def limits(self, geo, dtype, cpu):
        return _limits(geo, dtype, cpu) or pointwise_limit(geo)

    def declines(self, geo, dtype, cpu):
        return _declines(geo, TILE_MAX_K)

    def prepare(self, ctx, node):
        return _prep(ctx, conv_prep(ctx, node, self.name))

    def bind(self, ctx, step, node, d, n, pool=None):
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        return _gemm(ctx, step, d, node.attrs, y, x.reshape(n, d["k"], d["p"]))


@register
class ConvTileCols(Route):
    name, op = "conv_tile_cols", "conv2d"

    def limits(self, geo, dtype, cpu):
        if geo.groups != 1:
            return "groups 1 only"
        return _limits(geo, dtype, cpu)

    def declines(self, geo, dtype, cpu):
        return _declines(geo, COLS_MAX_K)

    def prepare(self, ctx, node):
        d = conv_prep(ctx, node, self.name)
        d["scratch_bytes"] = _aligned(d["k"] * d["p"] * 4)  # one image's columns
        return _prep(ctx, d)

    def bind(self, ctx, step, node, d, n, pool=None):
        return _cols_calls(ctx, step, node, d, n, np.float32(0),
                           lambda y, col: _gemm(ctx, step, d, node.attrs, y, col))


# NOTE: the stems (3-channel images): MobileNetV3-small's 3x3/2 conv to 16 x 112 x 112 took
# im2col 238 us and the GEMM over its 27 x 12544 columns 637 (hardswish after), onnxruntime
# 557 for the whole conv. Its phases are 3 x 4 planes of 113 x 113 (split in 62 us), which
# the tiles read in place. Past a few channels the taps' K streams outgrow L1 and the
# panel of im2col columns wins; ARM keeps conv_tile_cols (its instruction counts not measured)
PHASE_MAX_C = 4


@register
class ConvTilePhase(Route):
    """fp32 stride-2 convs (groups 1, dilation 1) of few input channels: the input's four
    phases (kernels_phase.split_phases), then kernels_tile.gemm_phase, one GEMM an output row
    whose rows of K are the taps' shifts of the phases, the bias and activation fused."""

    name, op = "conv_tile_phase", "conv2d"
    fuses_pool = fuses_padded_pool = True

    def limits(self, geo, dtype, cpu):
        if geo.groups != 1:
            return "groups 1 only"
        if (geo.sh, geo.sw) != (2, 2) or (geo.dh, geo.dw) != (1, 1):
            return "needs stride 2 both ways and dilation 1"
        return _limits(geo, dtype, cpu)

    def declines(self, geo, dtype, cpu):
        if not x86_portable(cpu):
            return "x86's portable path only (ARM: conv_tile_cols)"
        if geo.c > PHASE_MAX_C:
            return f"more than {PHASE_MAX_C} input channels: im2col's panel reads K better"
        if geo.kh == geo.kw == 1:
            return "a 1x1 kernel reads one phase of four"
        return None

    def prepare(self, ctx, node):
        d = conv_prep(ctx, node, self.name)
        geo = d["geo"]
        hq, wq = kq.phase_shape(geo.h, geo.w, geo.ph, geo.pw)
        per = 4 * geo.c * hq * wq
        rest, hard = kt.clamp_of(_act_code(node.attrs), _act_alpha(node.attrs))[2:]
        d.update(hq=hq, wq=wq, per=per, offs=kq.phase_offsets(geo.c, geo.kh, geo.kw, hq, wq),
                 w2=d["w"].reshape(d["o"], d["k"]), parts=max(1, ctx.threads),
                 act_rest=bool(rest or hard))
        d["phases_bytes"] = _aligned((per + kt.phase_slack(wq)) * 4)
        # (room for gemm_phase_pool's rings: the largest pool it fuses, 3x3 padded by 1)
        ring = ktp.ring_floats(d["o"], geo.wo, geo.wo // 2 + 1, 3, 3, 1)
        d["scratch_bytes"] = d["phases_bytes"] + _aligned(d["parts"] * max(kt.ROWS * kt.VL, ring) * 4)
        return d

    def pool_ok(self, d, n, pool_geom):
        """A 2x2 or 3x3 pool at stride 2 (padded or not) after a conv whose activation the
        tiles apply: kernels_tile_pool.gemm_phase_pool.

        NOTE: SqueezeNet's, ShuffleNetV2's and ResNet-18's stems: their maxpools read the
        stem's output back from memory (SqueezeNet's 64 x 111 x 111: 0.48-0.54 ms in the
        model's sequence, 0.17 alone)."""
        kh, kw, sh, sw, ph, pw = (*pool_geom, 0, 0)[:6]
        return ktp.fusable(kh, kw, sh, sw, ph, pw, d["geo"].wo, d["act_rest"])

    def bind(self, ctx, step, node, d, n, pool=None):
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        geo, a = d["geo"], node.attrs
        xq = ctx.scratch(step, np.float32, (d["per"] + kt.phase_slack(d["wq"]),))
        parts = min(d["parts"], geo.ho) if ctx.parallel(d["o"] * d["k"] * d["p"]) else 1
        cs = ctx.scratch(step, np.float32, (parts, kt.ROWS * kt.VL), d["phases_bytes"])
        wt = prepared(d, "w_phase", lambda: kt.pack_weights(d["w2"], blocked=False))
        calls = []
        if pool is not None:
            yp, (kh, kw, _, _, ph, pw) = pool[0], (*pool[1], 0, 0)[:6]
            parts = min(d["parts"], yp.shape[2]) if ctx.parallel(d["o"] * d["k"] * d["p"]) else 1
            ring = ctx.scratch(step, np.float32,
                               (parts, ktp.ring_floats(d["o"], geo.wo, yp.shape[3], kh, kw, pw)),
                               d["phases_bytes"])
        for i in range(n):
            calls.append(partial(kq.split_phases, xq, x[i:i + 1], geo.ph, geo.pw, d["hq"], d["wq"]))
            if pool is not None:
                calls.append(partial(ktp.gemm_phase_pool, yp[i], wt, xq, d["wq"], d["offs"], _bias(d),
                                     ring, geo.ho, geo.wo, kh, ph, _act_code(a), _act_alpha(a)))
                continue
            calls.append(partial(kt.gemm_phase, y[i], wt, xq, d["wq"], d["offs"], _bias(d), cs,
                                 _act_code(a), _act_alpha(a)))
        return calls


# --------------------------------------------------------------------------- int8
#
# NOTE: the whole of K sits in the panel (kernels_tile.gemm_q), so these routes stop at
# TILE_Q_MAX_K; the int8 weights are laid out for the tiles as float32 once (base.prepared)


def _q_limits(geo, dtype) -> str | None:
    if dtype != "i8":
        return "int8 only"
    if not kt.AVAILABLE:
        return "needs Numba's JIT (POCKET_FP32_TILE=0 opts out)"
    most = tile_q_max_k(geo)
    if geo.k > most:
        return f"needs at most {most} rows along K (the panel holds them all)"
    return None


TILE_Q_MAX_K = min(ki.EXACT_K, 512)
# ... and on x86 up to EXACT_K over maps of at most TILE_Q_NARROW_P pixels: the float32 BLAS of
# conv_int8_blas ran EfficientNet-B0's 672 -> 112 projects at 14x14 at 6 GMAC/s on a 2-core
# Zen 1 (numpy's OpenBLAS, narrow N). Interleaved, one thread / two: EfficientNet-B0 int8
# 0.93-0.95x / 0.95-0.96x, SqueezeNet int8 (its 64 -> 256 3x3 fires at 13x13, K = 576)
# 0.85x / 0.88x, MobileNetV3-small 0.99-1.0x / 0.96-0.98x; over ResNet-18's 56x56 maps (K =
# 576) the tiles were 1.005-1.01x slower, so wide maps keep BLAS. ARM keeps 512 (not measured)
TILE_Q_NARROW_P = 784
# ... and past EXACT_K (up to TILE_Q_LONG_K) where the weights keep every partial sum within
# 2**24 (ConvGeometry.w_l1): EfficientNet-B0's 1152 -> 192 / 320 projects at 7x7, which the
# float32 BLAS split in K blocks of 1024 + 128 (1.6-2.8 ms each at 1T)
TILE_Q_LONG_K = 4608


def tile_q_max_k(geo) -> int:
    """The most rows along K the int8 tile routes take for this conv (see TILE_Q_NARROW_P)."""
    if kt.W_VECTORS or geo.ho * geo.wo > TILE_Q_NARROW_P:
        return TILE_Q_MAX_K
    return TILE_Q_LONG_K if 128 * geo.w_l1 <= 2**24 else ki.EXACT_K


def _q_prep(ctx, node, d: dict) -> dict:
    d.update(_int8_consts(ctx, node, d["w"]))
    d["w2"] = d["w"].reshape(d["o"], d["k"])
    d["parts"] = max(1, ctx.threads)
    d["scratch_at"] = d.get("scratch_bytes", 0)
    d["scratch_bytes"] = d["scratch_at"] + _aligned(d["parts"] * kt.scratch_floats_q(d["k"]) * 4)
    return d


def _gemm_q(ctx, step, d: dict, y: np.ndarray, x: np.ndarray) -> partial:
    """The call y (m, O, P) = requantized(w @ x[i] (K, P) + bias_adj) for each of its m images."""
    m, o, k, p = y.shape[0], d["o"], d["k"], d["p"]
    tasks = m * -(-p // kt.PB) * -(-o // kt.ROWS)
    parts = min(d["parts"], tasks) if ctx.parallel(m * o * k * p) else 1
    scratch = ctx.scratch(step, np.float32, (parts, kt.scratch_floats_q(k)), d["scratch_at"])
    wf = prepared(d, "w_tiles", lambda: kt.pack_weights(d["w2"].astype(np.float32), blocked=False))
    return partial(kt.gemm_q, y.reshape(m, o, p), wf, x, d["bias_adj"], d["m"], d["to_int8"],
                   d["y_zp"], d["lo"], d["relu"], scratch)


@register
class ConvTileQ(Route):
    name, op = "conv_tile_q", "conv2d"

    def limits(self, geo, dtype, cpu):
        return _q_limits(geo, dtype) or pointwise_limit(geo)

    def prepare(self, ctx, node):
        return _q_prep(ctx, node, conv_prep(ctx, node, self.name))

    def bind(self, ctx, step, node, d, n, pool=None):
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        return [_gemm_q(ctx, step, d, y, x.reshape(n, d["k"], d["p"]))]


@register
class ConvTileQCols(Route):
    name, op = "conv_tile_q_cols", "conv2d"

    def limits(self, geo, dtype, cpu):
        if geo.groups != 1:
            return "groups 1 only"
        return _q_limits(geo, dtype)

    def prepare(self, ctx, node):
        d = conv_prep(ctx, node, self.name)
        d["scratch_bytes"] = _aligned(d["k"] * d["p"] * 4)  # one image's columns (float32 codes)
        return _q_prep(ctx, node, d)

    def bind(self, ctx, step, node, d, n, pool=None):
        return _cols_calls(ctx, step, node, d, n, np.float32(node.attrs["x_zero_point"]),
                           lambda y, col: [_gemm_q(ctx, step, d, y, col)])
