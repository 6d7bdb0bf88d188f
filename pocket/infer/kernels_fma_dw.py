"""float32 depthwise conv on x86 with AVX-512 (routes.conv_fma_depthwise): each output row
computed straight from the input rows in LLVM IR, 16-lane FMAs, the bias and the activation
applied to the sums in registers. No padded copy of the plane and no copy-out.

kernels_dw.dw_conv_padded copies each plane into a padded scratch plane, runs one flat loop of
plain Numba over it (which LLVM vectorizes at 8 lanes on these CPUs: its cost model prefers
256-bit vectors) and copies the valid columns out: 9-10 GMAC/s on EfficientNet-B0's and
MobileNetV2's layers, the two copies costing as much as the sums, and the SiLU after them
(a second pass) as much again. Here:

- every load is masked to the lanes inside the input row, so the padding columns read as
  zeros, and a row outside the image is a row of zeros (scratch), so no tap tests a bound;
- stride 1 computes R_S1 output rows a call: each input row is loaded once, at each column
  shift, for all of them;
- stride 2 loads 32 consecutive inputs and takes their even or odd lanes (two taps a pair);
- each output's sum is two FMA chains (its even and odd tap columns), added at the end, so
  2R chains are in flight (4-cycle latency, two units);
- the activation (ReLU, relu6, SiLU, sigmoid, hardswish, hardsigmoid: kernels_fma's, within a
  few ulp of the float64 formula) runs on the sums before the one masked store; other
  activations take one pass over each plane;
- a small plane (at most 64 outputs, 196 at 3x3; stride 1, "same" padding) is one flat run
  of vectors instead (dw_conv_fma_flat), each tap a masked load at a fixed offset.

The sums differ from the reference's float64 sum by float32 rounding only (bias first, the
taps in an order of their own). ARM and older x86 keep kernels_dw.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from pocket.infer import kernels_fma as kfma
from pocket.infer.jit import kernel
from pocket.infer.kernels_dw import _parts, padded_fast
from pocket.infer.kernels_fp32 import act_inplace
from pocket.infer.kernels_int8 import _ROUND
from pocket.infer.kernels_vnni import _const, _lanes_below, _lanes_within, _loop, _masked_io, _ptr, _splat

_F32, _I32, _I64, _I8 = ir.FloatType(), ir.IntType(32), ir.IntType(64), ir.IntType(8)
_VF, _VI, _V8I = ir.VectorType(_F32, 16), ir.VectorType(_I32, 16), ir.VectorType(_I8, 16)
# shuffle_vector masks: the even and the odd lanes of two vectors (32 consecutive elements)
EVEN = ir.Constant(_VI, list(range(0, 32, 2)))
ODD = ir.Constant(_VI, list(range(1, 32, 2)))


# Output rows a call: R, computed together, each input row loaded once for all of them; each
# output's sum in two chains (its even and odd tap columns), so 2R chains of FMAs are in flight
# (4-cycle latency, two units: one pair of chains of 25 taps left a 5x5 layer on 7x7 maps
# waiting on them, 2x slower than kernels_dw's flat loop)
# (stride 2: 2 -> 4 rows, the rows' loads and even/odd shuffles shared by more outputs: one
# thread, inputs from L3, 3x3/2 16 x 112 x 112 ReLU 35 -> 30 us, 96 x 112 x 112 SiLU 326 ->
# 264, 240 x 28 x 28 SiLU 66 -> 51, 576 x 14 x 14 hardswish 70 -> 50; int8 (dw_conv_fma_q)
# 96 x 112 x 112 248 -> 212, 144 x 56 x 56 95 -> 84; 3 rows: within a few % of 4)
R_S1, R_S2 = 4, 4


def _make_rows(k: int, s: int, q: bool = False):
    """R output rows of one plane (R_S1 at stride 1, R_S2 at stride 2) straight from the input
    rows, no padded copy.

    Arguments: o (the address of R output row addresses: a row past the last is a junk row),
    r (the address of (R - 1) * s + k input row addresses: a row outside the image is a row of
    zeros), w (the channel's k*k taps), wd (input width), wo (output width), pw (left
    padding), bias (f32), mode (kernels_fma's tile modes). Chunks of 16 outputs along the
    rows; every load is masked to the lanes inside [0, wd) (the padding columns read as
    zeros, nothing outside the row is touched) and every store to those inside [0, wo).
    Stride 2 loads 32 consecutive inputs and takes their even or odd lanes (two taps from one
    pair of loads).

    q: int8 rows in and out (dw_conv_fma_q): the padding columns read as x_zp (an argument
    after mode, where mode is unused) and the rows outside the image are rows of x_zp, the
    codes convert to float32 (exact), bias is b_q - x_zp * sum(w_q), and the sums leave as
    kernels_int8._code_clamped's codes: arguments m, lo, hi (the clamp, less y_zp) and y_zp
    after x_zp."""
    nr = R_S1 if s == 1 else R_S2
    rows = (nr - 1) * s + k
    esz = 1 if q else 4  # bytes an element

    def codegen(context, builder, signature, args):
        o, r, w, wd, wo, pw, bias, mode = args[:8]
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VF, [_VF] * 3),
                                             "llvm.fma.v16f32")
        if q:
            xzp, m, lo, hi, yzp = args[8:]
            ld8, st8 = _masked_io(builder, _V8I, 1)
            pad = _splat(builder, builder.trunc(xzp, _I8), _V8I)

            def ld(addr, mask):
                return builder.sitofp(builder.sext(ld8(addr, mask, pad), _VI), _VF)
        else:
            ld, st = _masked_io(builder, _VF, 4)
        xr = [builder.load(_ptr(builder, builder.add(r, _const(8 * i)), _I64), align=8) for i in range(rows)]
        orow = [builder.load(_ptr(builder, builder.add(o, _const(8 * i)), _I64), align=8) for i in range(nr)]
        wv = [[_splat(builder, builder.load(_ptr(builder, builder.add(w, _const(4 * (i * k + j))), _F32),
                                            align=4), _VF) for j in range(k)] for i in range(k)]
        bv = _splat(builder, bias, _VF)

        def inside(first):
            return _lanes_within(builder, first, wd)

        def step(chunk, carried):
            ow0 = builder.mul(chunk, _const(16))
            acc = [[bv, ir.Constant(_VF, None)] for _ in range(nr)]

            def tap(q_, t, j, v):  # output row q_, tap (t, j), inputs v
                acc[q_][j & 1] = builder.call(fma, [wv[t][j], v, acc[q_][j & 1]])

            if s == 1:
                for j in range(k):
                    first = builder.sub(builder.add(ow0, _const(j)), pw)
                    msk = inside(first)
                    for i in range(rows):
                        v = ld(builder.add(xr[i], builder.mul(first, _const(esz))), msk)
                        for q_ in range(max(0, i - k + 1), min(nr, i + 1)):
                            tap(q_, i - q_, j, v)
            else:
                for j in range(0, k, 2):
                    first = builder.sub(builder.add(builder.mul(ow0, _const(2)), _const(j)), pw)
                    m_a, m_b = inside(first), inside(builder.add(first, _const(16)))
                    for i in range(rows):
                        a = builder.add(xr[i], builder.mul(first, _const(esz)))
                        va, vb = ld(a, m_a), ld(builder.add(a, _const(16 * esz)), m_b)
                        ve = builder.shuffle_vector(va, vb, EVEN)
                        vo = builder.shuffle_vector(va, vb, ODD) if j + 1 < k else None
                        for q_ in range(nr):
                            if 0 <= i - 2 * q_ < k:
                                tap(q_, i - 2 * q_, j, ve)
                                if vo is not None:
                                    tap(q_, i - 2 * q_, j + 1, vo)
            sums = [builder.fadd(a, b) for a, b in acc]
            out = _lanes_below(builder, builder.sub(wo, ow0))
            if q:
                # kernels_int8._code_clamped: v = sum * m, clamped to the codes less y_zp, then
                # rounded to even by the _ROUND trick (|v| <= 255: exact), + y_zp
                rnd = ir.Constant(_VF, [float(_ROUND)] * 16)
                vm, vlo, vhi, vzp = (_splat(builder, a, _VF) for a in (m, lo, hi, yzp))
                for q_ in range(nr):
                    v = builder.fmul(sums[q_], vm)
                    v = builder.select(builder.fcmp_ordered("<", v, vlo), vlo, v)
                    v = builder.select(builder.fcmp_ordered(">", v, vhi), vhi, v)
                    v = builder.fadd(builder.fsub(builder.fadd(v, rnd), rnd), vzp)
                    st8(builder.trunc(builder.fptosi(v, _VI), _V8I),
                        builder.add(orow[q_], ow0), out)
                return []

            def store(act):
                for q_ in range(nr):
                    st(act(builder, sums[q_]), builder.add(orow[q_], builder.mul(ow0, _const(4))), out)

            kfma._by_mode(builder, mode, store)
            return []

        _loop(builder, builder.sdiv(builder.add(wo, _const(15)), _const(16)), [], step)
        return context.get_dummy_value()

    if q:
        @intrinsic
        def row_q(typingctx, o, r, w, wd, wo, pw, bias, mode, xzp, m, lo, hi, yzp):
            return types.void(*[types.intp] * 6, types.float32, types.intp, types.intp,
                              *[types.float32] * 4), codegen

        return row_q

    @intrinsic
    def row(typingctx, o, r, w, wd, wo, pw, bias, mode):
        return types.void(*[types.intp] * 6, types.float32, types.intp), codegen

    return row


_R31, _R32, _R51, _R52 = _make_rows(3, 1), _make_rows(3, 2), _make_rows(5, 1), _make_rows(5, 2)
_Q31, _Q32, _Q51, _Q52 = (_make_rows(3, 1, True), _make_rows(3, 2, True), _make_rows(5, 1, True),
                          _make_rows(5, 2, True))


# the geometries dw_conv_fma takes: the padded-plane kernels' (3x3 and 5x5, stride 1 or 2 both
# ways, dilation 1)
fast = padded_fast


def scratch_size(wd: int, wo: int) -> int:
    """Elements of one part's scratch row: a row of zeros (the rows outside the image) and one
    of junk (a stride-1 pair's second row past the last)."""
    return -(-(wd + wo) // 16) * 16 + 16


@kernel
def dw_conv_fma(out, x, w, b, scratch, sh, ph, pw, mode, act, alpha):
    """Depthwise conv (weight (C, 1, k, k), k 3 or 5, stride sh both ways, padding (ph, pw))
    x (N, C, H, W) f32 -> out (N, C, Ho, Wo) f32, bias b (C,) or empty, then the activation:
    in registers where mode >= 0 (kernels_fma's tile modes), else kernels_fp32's code `act`
    (alpha) in one pass over each plane. scratch (parts, scratch_size) f32, any contents: one
    row a part, a thread's share of the N*C planes."""
    parts = scratch.shape[0]
    for part in prange(parts):
        lo, hi = _parts(x.shape[0] * x.shape[1], parts, part)
        _part(out, x, w, b, scratch[part], lo, hi, sh, ph, pw, mode, act, alpha)


@njit(cache=True)
def _part(out, x, w, b, scratch, lo, hi, sh, ph, pw, mode, act, alpha):
    n, c, h, wd = x.shape
    k = w.shape[2]
    ho, wo = out.shape[2], out.shape[3]
    has_bias = b.shape[0] > 0
    scratch[:wd] = 0.0
    za, junk = np.int64(scratch.ctypes.data), np.int64(scratch.ctypes.data) + (-(-wd // 16) * 16) * 4
    xa, oa, wa = np.int64(x.ctypes.data), np.int64(out.ctypes.data), np.int64(w.ctypes.data)
    nr = R_S1 if sh == 1 else R_S2
    rows, orows = np.empty((nr - 1) * sh + k, np.int64), np.empty(nr, np.int64)
    ra, oa_rows = np.int64(rows.ctypes.data), np.int64(orows.ctypes.data)
    reg = max(mode, 0)
    for nc in range(lo, hi):
        bo = b[nc % c] if has_bias else np.float32(0.0)
        wb = wa + (nc % c) * k * k * 4
        xp, op = xa + nc * h * wd * 4, oa + nc * ho * wo * 4
        for oh in range(0, ho, nr):
            top = oh * sh - ph
            for i in range(rows.shape[0]):
                ih = top + i
                rows[i] = xp + ih * wd * 4 if 0 <= ih < h else za
            for q in range(nr):
                orows[q] = op + (oh + q) * wo * 4 if oh + q < ho else junk
            if k == 3 and sh == 1:
                _R31(oa_rows, ra, wb, wd, wo, pw, bo, reg)
            elif k == 3:
                _R32(oa_rows, ra, wb, wd, wo, pw, bo, reg)
            elif sh == 1:
                _R51(oa_rows, ra, wb, wd, wo, pw, bo, reg)
            else:
                _R52(oa_rows, ra, wb, wd, wo, pw, bo, reg)
        if mode < 0 and act != 0:
            act_inplace(out.reshape(-1), nc * ho * wo, ho * wo, np.float32(0.0), act, alpha)


# --------------------------------------------------------------------------- small planes
#
# A 3x3 conv's plane of at most FLAT_MAX outputs at stride 1 with "same" padding
# (Ho, Wo = H, W): its outputs t = oh * W + ow and inputs share one flat index, tap (i, j)
# reading input t + (i - ph) * W + (j - pw) (kernels_fp32.im2col_same's indexing); so each tap
# is one masked load a vector of 16 outputs, the mask (kernels_fma_im2col.same_masks of
# kernels_fp32.same_valid, made at load) zeroing the lanes whose input is padding. Row by
# row, a 4x4 plane left 12 of 16 lanes idle, each input row loaded again for each column shift,
# and the setup of a row call (its row addresses) cost more than the sums.
# NOTE: one thread, against the row kernels: 480 x 4 x 4 3x3 12.7 -> 5.0 us, 192 x 8 x 8 9.9 ->
# 5.6, 480 x 14 x 14 3x3 47 -> 41, 3x3 on 16x16 even (23 vs 22). 5x5 planes this small take
# kernels_fma_dwcv (16 channels a vector: 1152 x 7 x 7 5x5 75 us here, 85 -> ~70 there with
# SiLU), so this kernel is 3x3 only.
FLAT_MAX = 196
_VB = ir.VectorType(ir.IntType(1), 16)


def flat_fast(h: int, w: int, ho: int, wo: int, kh: int, sh: int) -> bool:
    """Whether dw_conv_fma_flat takes this geometry (the route checks the rest: padding)."""
    return sh == 1 and (ho, wo) == (h, w) and kh == 3 and h * w <= FLAT_MAX


def _make_flat(k: int, nv: int):
    """nv vectors (16 outputs each) of one plane's flat run (see FLAT_MAX): o, x (the addresses
    of the block's first output and of the input at the same flat index), w (the channel's k*k
    taps), masks (the block's first mask of tap 0 in same_masks' int64 bits, ms bytes from one
    tap to the next), wd (W), ph, pw, n (the outputs from the block's first on), bias (f32), mode.
    Each vector's sum in two chains (the taps' even and odd columns, as the row kernels), the
    activation (kernels_fma's tile modes) in registers, one masked store a vector."""

    def codegen(context, builder, signature, args):
        o, x, w, masks, ms, wd, ph, pw, n, bias, mode = args
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VF, [_VF] * 3),
                                             "llvm.fma.v16f32")
        ld, st = _masked_io(builder, _VF, 4)
        bv = _splat(builder, bias, _VF)
        acc = [[bv, ir.Constant(_VF, None)] for _ in range(nv)]
        for i in range(k):
            row = builder.mul(builder.sub(_const(i), ph), wd)
            for j in range(k):
                t = i * k + j
                off = builder.mul(builder.add(row, builder.sub(_const(j), pw)), _const(4))
                wt = _splat(builder, builder.load(_ptr(builder, builder.add(w, _const(4 * t)), _F32),
                                                  align=4), _VF)
                mt = builder.add(masks, builder.mul(ms, _const(t)))
                for v in range(nv):
                    bits = builder.load(_ptr(builder, builder.add(mt, _const(8 * v)), _I64), align=8)
                    msk = builder.bitcast(builder.trunc(bits, ir.IntType(16)), _VB)
                    val = ld(builder.add(x, builder.add(off, _const(64 * v))), msk)
                    acc[v][j & 1] = builder.call(fma, [wt, val, acc[v][j & 1]])
        sums = [builder.fadd(a, b) for a, b in acc]

        def store(act):
            for v in range(nv):
                st(act(builder, sums[v]), builder.add(o, _const(64 * v)),
                   _lanes_below(builder, builder.sub(n, _const(16 * v))))

        kfma._by_mode(builder, mode, store)
        return context.get_dummy_value()

    @intrinsic
    def flat(typingctx, o, x, w, masks, ms, wd, ph, pw, n, bias, mode):
        return types.void(*[types.intp] * 9, types.float32, types.intp), codegen

    return flat


# (one intrinsic per vector count: a plane runs in blocks of 4 vectors, then 1-3)
_FL31, _FL32, _FL33, _FL34 = (_make_flat(3, nv) for nv in range(1, 5))


@kernel
def dw_conv_fma_flat(out, x, w, b, masks, parts, ph, pw, mode, act, alpha):
    """dw_conv_fma (same arguments but scratch) for flat_fast's small planes: masks =
    kernels_fma_im2col.same_masks(kernels_fp32.same_valid(H, W, k, k, ph, pw, 1, 1)), `parts`
    runs of the N*C planes for the threads."""
    for part in prange(parts):
        lo, hi = _parts(x.shape[0] * x.shape[1], parts, part)
        _flat_part(out, x, w, b, masks, lo, hi, ph, pw, mode, act, alpha)


@njit(cache=True, inline="always")
def _flat_block(nb, o, x, w, m, ms, wd, ph, pw, n, bo, reg):
    """A block of nb (1-4) vectors of a plane's flat run (see _make_flat)."""
    if nb == 4:
        _FL34(o, x, w, m, ms, wd, ph, pw, n, bo, reg)
    elif nb == 1:
        _FL31(o, x, w, m, ms, wd, ph, pw, n, bo, reg)
    elif nb == 2:
        _FL32(o, x, w, m, ms, wd, ph, pw, n, bo, reg)
    else:
        _FL33(o, x, w, m, ms, wd, ph, pw, n, bo, reg)


@njit(cache=True)
def _flat_part(out, x, w, b, masks, lo, hi, ph, pw, mode, act, alpha):
    c, h, wd = x.shape[1], x.shape[2], x.shape[3]
    k, n = w.shape[2], h * wd
    nv = (n + 15) // 16
    has_bias = b.shape[0] > 0
    xa, oa, wa, ma = (np.int64(x.ctypes.data), np.int64(out.ctypes.data), np.int64(w.ctypes.data),
                      np.int64(masks.ctypes.data))
    reg = max(mode, 0)
    for nc in range(lo, hi):
        bo = b[nc % c] if has_bias else np.float32(0.0)
        wb, xp, op = wa + (nc % c) * k * k * 4, xa + nc * n * 4, oa + nc * n * 4
        for v0 in range(0, nv, 4):
            _flat_block(min(4, nv - v0), op + v0 * 64, xp + v0 * 64, wb, ma + v0 * 8, nv * 8, wd,
                        ph, pw, n - v0 * 16, bo, reg)
        if mode < 0 and act != 0:
            act_inplace(out.reshape(-1), nc * n, n, np.float32(0.0), act, alpha)


# --------------------------------------------------------------------------- int8
#
# int8 codes in and out (routes.conv_depthwise_int8 on AVX-512): the row kernels above read
# the int8 rows, convert each vector of codes to float32 and sum in float32, which is exact:
# each product |x_q * w_q| <= 128 * 127, 25 of them and the bias b_q - x_zp * sum(w_q) stay
# below 2**24 (the route checks b_q: exact_bias). The sums leave as kernels_int8's codes.
# Against kernels_dw.dw_conv_padded_qf (which converts each plane into a padded float32 plane,
# sums it, then requantizes and copies out the valid columns): see the route.

# the largest |b_q| whose float32 sums stay exact: 2**24 less 25 * 128 * 127 for the products
# and as much again for x_zp * sum(w_q) (the kernel's bias is b_q - x_zp * sum(w_q), the
# route's bias_adj, as float32)
EXACT_BIAS = 2 ** 24 - 2 * 25 * 128 * 127


def exact_bias(b_q: np.ndarray) -> bool:
    return b_q.size == 0 or int(np.abs(b_q.astype(np.int64)).max()) <= EXACT_BIAS


def scratch_size_q(wd: int, wo: int) -> int:
    """Bytes of one part's scratch row: a row of x_zp codes (the rows outside the image) and one
    of junk (a stride-1 group's rows past the last)."""
    return -(-(wd + wo) // 64) * 64 + 64


@kernel
def dw_conv_fma_q(out, x, wf, badj, m, scratch, sh, ph, pw, x_zp, lo, hi, y_zp):
    """int8 depthwise conv (weight taps wf (C, k*k) f32, k 3 or 5, stride sh both ways, padding
    (ph, pw)) x (N, C, H, W) i8 -> out (N, C, Ho, Wo) i8 codes: kernels_int8._code_clamped of
    the exact sums with bias badj (C,) f32 and multipliers m (C,) f32; lo, hi the clamp less
    y_zp. scratch (parts, scratch_size_q) i8, any contents: one row a part."""
    parts = scratch.shape[0]
    for part in prange(parts):
        first, last = _parts(x.shape[0] * x.shape[1], parts, part)
        _part_q(out, x, wf, badj, m, scratch[part], first, last, sh, ph, pw, x_zp, lo, hi, y_zp)


@njit(cache=True)
def _part_q(out, x, wf, badj, m, scratch, first, last, sh, ph, pw, x_zp, lo, hi, y_zp):
    n, c, h, wd = x.shape
    k = 3 if wf.shape[1] == 9 else 5
    ho, wo = out.shape[2], out.shape[3]
    scratch[:wd] = np.int8(x_zp)
    za = np.int64(scratch.ctypes.data)
    junk = za + -(-wd // 64) * 64
    xa, oa, wa = np.int64(x.ctypes.data), np.int64(out.ctypes.data), np.int64(wf.ctypes.data)
    nr = R_S1 if sh == 1 else R_S2
    rows, orows = np.empty((nr - 1) * sh + k, np.int64), np.empty(nr, np.int64)
    ra, oa_rows = np.int64(rows.ctypes.data), np.int64(orows.ctypes.data)
    for nc in range(first, last):
        ch = nc % c
        bo, mf = badj[ch], m[ch]
        wb = wa + ch * k * k * 4
        xp, op = xa + nc * h * wd, oa + nc * ho * wo
        for oh in range(0, ho, nr):
            top = oh * sh - ph
            for i in range(rows.shape[0]):
                ih = top + i
                rows[i] = xp + ih * wd if 0 <= ih < h else za
            for q in range(nr):
                orows[q] = op + (oh + q) * wo if oh + q < ho else junk
            if k == 3 and sh == 1:
                _Q31(oa_rows, ra, wb, wd, wo, pw, bo, 0, x_zp, mf, lo, hi, y_zp)
            elif k == 3:
                _Q32(oa_rows, ra, wb, wd, wo, pw, bo, 0, x_zp, mf, lo, hi, y_zp)
            elif sh == 1:
                _Q51(oa_rows, ra, wb, wd, wo, pw, bo, 0, x_zp, mf, lo, hi, y_zp)
            else:
                _Q52(oa_rows, ra, wb, wd, wo, pw, bo, 0, x_zp, mf, lo, hi, y_zp)
