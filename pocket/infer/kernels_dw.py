"""Depthwise conv2d kernels (groups == C == O, weight (C, 1, kh, kw)), float32 and int8.

A depthwise conv has one input plane per output plane and kh*kw multiply-adds per output:
im2col or a GEMM buys nothing, and the work is all in reading the input plane. So each
(image, channel) plane is one task (prange over N*C), and inside it:

- the interior, the output pixels whose every tap reads inside the input, runs one loop along
  the output row with the kh*kw weights as scalars broadcast over contiguous input runs (stride
  1) or a stride-2 run, and no bounds test: LLVM vectorizes it along the output width with
  nothing but plain Numba (no x86 intrinsics), which is what ARM NEON runs too;
- the border (the rows and columns that reach into the padding) takes a per-pixel loop over
  the taps that read inside the image, the others being zero (float32) or x_zp (int8), which
  contribute nothing.

The interior loop is compiled for fixed tap counts and strides (3x3 and 5x5, stride 1 and 2,
any padding and dilation): with constants LLVM unrolls the taps and keeps the sum in a
register. Every other geometry (7x7, 1x3, stride 3...) takes the border loop everywhere:
correct, not fast.

Stride 2 reads x[2*ow + j]: LLVM vectorizes that as an interleaved load (two vector loads and
a shuffle on x86, `ld2` on NEON). Deinterleaving each input row into even and odd buffers first
has not been measured against it; it would need scratch.

float32: the sum is float32 in tap order, bias first (the reference sums in float64 and rounds
once: they differ by float32 rounding only). ReLU keeps NaN (NaN < 0 is false).

int8: the arithmetic of pocket.formats.quant, exactly, as in kernels_int8:
    acc = b_q + sum((x_q - x_zp) * w_q)                 exact int32
In the interior every tap is inside, so acc = (b_q - x_zp * wsum) + sum(x_q * w_q): the loop is
a pure int8 x int8 product (|p| <= 2**14, an int16) summed in int32 lanes, which LLVM widens
and vectorizes; the border loop subtracts x_zp per tap, the padding then contributing zero.
The epilogue is kernels_int8._epilogue: int8 codes, or float32 values (to_int8 False).
"""

from __future__ import annotations

import platform

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from pocket.infer.jit import kernel
from pocket.infer.kernels_dwflat import CHUNK, TAIL, _f3s1, _f3s1c, _f3s1t, _f3s1tc, flat_sums
from pocket.infer.kernels_fp32 import act_inplace, relu
from pocket.infer.kernels_int8 import _code_clamped, _epilogue, total32
from pocket.infer.kernels_vnni import _const, _loop, _ptr, _splat

# (kh, kw, stride along the width) with an unrolled interior loop; any dilation, padding and
# stride along the height
FAST = ((3, 3, 1), (3, 3, 2), (5, 5, 1), (5, 5, 2))
RUN = 16  # interior rows are widened to a multiple of this many outputs (see _widen)


def out_size(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


@njit(cache=True, inline="always")
def _inside(n, k, s, p, d, size):
    """[lo, hi): the outputs along one axis whose k taps all read inside [0, size)."""
    lo = min(n, -(-p // s))
    return lo, max(lo, min(n, (size - 1 + p - (k - 1) * d) // s + 1))


@njit(cache=True, inline="always")
def _box(g, ho):
    """(r0, r1, c0, c1): the interior rows and columns, the same for every plane (each `_inside`
    is two integer divisions: once a call, not once a plane)."""
    h, wd, wo, kh, kw, sh, sw, ph, pw, dh, dw = g
    r0, r1 = _inside(ho, kh, sh, ph, dh, h)
    c0, c1 = _inside(wo, kw, sw, pw, dw, wd)
    return r0, r1, c0, c1


# --------------------------------------------------------------------------- float32
#
# NOTE: the planes are flat arrays and offsets (xb, ob, wb), never slices: a slice costs Numba
# reference counting (atomic increments) and a call to a compiled function more of it, which
# took more time than the sums themselves on 8x8 and 4x4 maps (1.3 us a plane, 3x3).


@njit(cache=True, inline="always")
def _act_run(of, lo, hi, act, alpha):
    """of[lo:hi] through activation `act` in place (kernels_fp32.act_inplace: vector loops)."""
    act_inplace(of, lo, hi - lo, np.float32(0.0), act, alpha)


@njit(cache=True, inline="always")
def _border_f32(of, ob, xf, xb, wf, wb, bo, oh, c0, c1, g):
    """Outputs (oh, [c0, c1)) of the plane at ob, bias added, from the taps that read inside
    the plane at xb. g = (H, W, Wo, kh, kw, sh, sw, ph, pw, dh, dw)."""
    h, wd, wo, kh, kw, sh, sw, ph, pw, dh, dw = g
    for ow in range(c0, c1):
        acc = bo
        for i in range(kh):
            ih = oh * sh - ph + i * dh
            if 0 <= ih < h:
                for j in range(kw):
                    iw = ow * sw - pw + j * dw
                    if 0 <= iw < wd:
                        acc += wf[wb + i * kw + j] * xf[xb + ih * wd + iw]
        of[ob + oh * wo + ow] = acc


@njit(cache=True, inline="always")
def _interior_f32(of, ob, xf, xb, wf, wb, bo, lo, hi, rs, dw, KH, KW, SW):
    """of[ob + ow] = bo + sum over taps of wf[wb + i*KW + j] * xf[xb + i*rs + ow*SW + j*dw]
    for ow in [lo, hi), every index inside its array. KH, KW, SW constants: the taps unroll and
    the loop along ow vectorizes."""
    for ow in range(lo, hi):
        # NOTE: unsigned indices spare Numba its negative-index wrap-around (which made the
        # store a scatter and the loads gathers)
        p = np.uint64(xb + ow * SW)
        acc = bo
        for i in range(KH):
            for j in range(KW):
                acc += wf[np.uint64(wb + i * KW + j)] * xf[p + np.uint64(i * rs + j * dw)]
        of[np.uint64(ob + ow)] = acc


@njit(cache=True, inline="always")
def _widen(c0, c1, wo, base, sw, reach, size):
    """The interior columns [c0, c1) widened inside [0, Wo) towards a multiple of RUN, as long
    as every read base + ow*sw + [0, reach] stays inside the flat plane [0, size).

    NOTE: the extra columns read the neighbouring rows (junk) and write border columns, which
    the border loop then overwrites. What it buys: no scalar remainder after the vector loop
    (a 62-wide interior is 7 vectors of 8 and 6 scalar outputs that cost as much as the 7)."""
    if c1 <= c0:
        return c0, c1
    run = -(-(c1 - c0) // RUN) * RUN
    e = min(wo, c0 + run)
    a = max(0, min(c0, e - run))
    if base + a * sw < 0 or base + (e - 1) * sw + reach >= size:
        return c0, c1
    return a, e


@njit(cache=True, inline="always")
def _plane_f32(of, ob, xf, xb, wf, wb, bo, g, box, ho, act, alpha, KH, KW, SW):
    """One plane: x at xb (H*W), w at wb (kh*kw) -> out at ob (Ho*Wo). box = (r0, r1, c0, c1):
    the interior rows and columns (`_box`); KH = 0: no unrolled interior (every pixel through
    the border loop)."""
    h, wd, wo, kh, kw, sh, sw, ph, pw, dh, dw = g
    r0, r1, c0, c1 = box
    if KH == 0:
        r0, r1 = ho, ho
    reach = (kh - 1) * dh * wd + (kw - 1) * dw
    for oh in range(ho):
        if r0 <= oh < r1:
            base = (oh * sh - ph) * wd - pw
            a, e = _widen(c0, c1, wo, base, sw, reach, h * wd)
            _interior_f32(of, ob + oh * wo, xf, xb + base, wf, wb, bo, a, e, dh * wd, dw, KH, KW, SW)
            _border_f32(of, ob, xf, xb, wf, wb, bo, oh, 0, c0, g)
            _border_f32(of, ob, xf, xb, wf, wb, bo, oh, c1, wo, g)
        else:
            _border_f32(of, ob, xf, xb, wf, wb, bo, oh, 0, wo, g)
    _act_run(of, ob, ob + ho * wo, act, alpha)


@kernel
def dw_conv(out, x, w, b, sh, sw, ph, pw, dh, dw, act, alpha):
    """x (N, C, H, W) f32, w (C, 1, kh, kw), b (C,) or empty -> out (N, C, Ho, Wo) f32.

    The arguments of kernels_fp32.conv2d_direct (act an ACT code), for groups == C == O.
    """
    n, c, h, wd = x.shape
    kh, kw = w.shape[2], w.shape[3]
    ho, wo = out.shape[2], out.shape[3]
    g = (h, wd, wo, kh, kw, sh, sw, ph, pw, dh, dw)
    box = _box(g, ho)
    has_bias = b.shape[0] > 0
    xf, of, wf = x.reshape(-1), out.reshape(-1), w.reshape(-1)
    for nc in prange(n * c):
        ch = nc % c
        bo = b[ch] if has_bias else np.float32(0.0)
        _dw_plane_f32(of, nc * ho * wo, xf, nc * h * wd, wf, ch * kh * kw, bo, g, box, ho, act, alpha)


# NOTE: not inlined: the prange loop above then compiles a call, not five unrolled planes
# (compiling the parallel twin took minutes)
@njit(cache=True)
def _dw_plane_f32(of, ob, xf, xb, wf, wb, bo, g, box, ho, act, alpha):
    kh, kw, sw = g[3], g[4], g[6]
    if kh == 3 and kw == 3 and sw == 1:
        _plane_f32(of, ob, xf, xb, wf, wb, bo, g, box, ho, act, alpha, 3, 3, 1)
    elif kh == 3 and kw == 3 and sw == 2:
        _plane_f32(of, ob, xf, xb, wf, wb, bo, g, box, ho, act, alpha, 3, 3, 2)
    elif kh == 5 and kw == 5 and sw == 1:
        _plane_f32(of, ob, xf, xb, wf, wb, bo, g, box, ho, act, alpha, 5, 5, 1)
    elif kh == 5 and kw == 5 and sw == 2:
        _plane_f32(of, ob, xf, xb, wf, wb, bo, g, box, ho, act, alpha, 5, 5, 2)
    else:
        _plane_f32(of, ob, xf, xb, wf, wb, bo, g, box, ho, act, alpha, 0, 0, 0)


# --------------------------------------------------------------------------- int8


@njit(cache=True, inline="always")
def _border_q(of, ob, xf, xb, wf, wb, bq, oh, c0, c1, g, x_zp, epi):
    """`_border_f32` for int8: sum((x_q - x_zp) * w_q) over the taps inside, exact in int64,
    then kernels_int8's epilogue. epi = (m, y_zp, lo, to_int8, relu)."""
    h, wd, wo, kh, kw, sh, sw, ph, pw, dh, dw = g
    m, y_zp, lo, to_int8, relu = epi
    for ow in range(c0, c1):
        acc = bq
        for i in range(kh):
            ih = oh * sh - ph + i * dh
            if 0 <= ih < h:
                for j in range(kw):
                    iw = ow * sw - pw + j * dw
                    if 0 <= iw < wd:
                        acc += (np.int64(xf[xb + ih * wd + iw]) - x_zp) * np.int64(wf[wb + i * kw + j])
        of[ob + oh * wo + ow] = _epilogue(acc, m, y_zp, lo, to_int8, relu)


@njit(cache=True, inline="always")
def _interior_q(of, ob, xf, xb, wf, wb, badj, epi, lo, hi, rs, dw, KH, KW, SW):
    """`_interior_f32` for int8: badj = b_q - x_zp * sum(w_q) plus the pure int8 x int8 sum.

    NOTE: the int32 casts keep the lanes 32-bit (Numba widens int arithmetic to int64), so LLVM
    vectorizes; wrap-around is exact, the true sum being far inside int32 (25 * 2**14)."""
    m, y_zp, ylo, to_int8, relu = epi
    for ow in range(lo, hi):
        p = np.uint64(xb + ow * SW)
        acc = np.int32(0)
        for i in range(KH):
            for j in range(KW):
                acc = np.int32(acc + np.int32(np.int32(xf[p + np.uint64(i * rs + j * dw)])
                                              * np.int32(wf[np.uint64(wb + i * KW + j)])))
        of[np.uint64(ob + ow)] = _epilogue(np.int64(acc) + badj, m, y_zp, ylo, to_int8, relu)


@njit(cache=True, inline="always")
def _plane_q(of, ob, xf, xb, wf, wb, bq, g, box, ho, x_zp, epi, KH, KW, SW):
    """`_plane_f32` for int8: x and w i8, bq = b_q -> out i8 or f32."""
    h, wd, wo, kh, kw, sh, sw, ph, pw, dh, dw = g
    r0, r1, c0, c1 = box
    if KH == 0:
        r0, r1 = ho, ho
    wsum = np.int64(0)
    for t in range(kh * kw):
        wsum += np.int64(wf[wb + t])
    badj = bq - x_zp * wsum
    reach = (kh - 1) * dh * wd + (kw - 1) * dw
    for oh in range(ho):
        if r0 <= oh < r1:
            base = (oh * sh - ph) * wd - pw
            a, e = _widen(c0, c1, wo, base, sw, reach, h * wd)
            _interior_q(of, ob + oh * wo, xf, xb + base, wf, wb, badj, epi, a, e, dh * wd, dw, KH,
                        KW, SW)
            _border_q(of, ob, xf, xb, wf, wb, bq, oh, 0, c0, g, x_zp, epi)
            _border_q(of, ob, xf, xb, wf, wb, bq, oh, c1, wo, g, x_zp, epi)
        else:
            _border_q(of, ob, xf, xb, wf, wb, bq, oh, 0, wo, g, x_zp, epi)


@kernel
def dw_conv_q(out, x, w, b, m, x_zp, to_int8, y_zp, lo, relu, sh, sw, ph, pw, dh, dw):
    """x (N, C, H, W) i8, w (C, 1, kh, kw) i8, b (C,) int b_q or empty -> out (N, C, Ho, Wo),
    i8 codes (to_int8) or f32 values.

    m (C,) f64 the requant multiplier (or x_scale * w_scale for a float32 output); y_zp and lo
    (y_zp with a fused ReLU, else -128) floats, as kernels_int8.gemm_q takes them.
    """
    n, c, h, wd = x.shape
    kh, kw = w.shape[2], w.shape[3]
    ho, wo = out.shape[2], out.shape[3]
    g = (h, wd, wo, kh, kw, sh, sw, ph, pw, dh, dw)
    box = _box(g, ho)
    has_bias = b.shape[0] > 0
    xf, of, wf = x.reshape(-1), out.reshape(-1), w.reshape(-1)
    zp = np.int64(x_zp)
    for nc in prange(n * c):
        ch = nc % c
        bq = np.int64(b[ch]) if has_bias else np.int64(0)
        epi = (m[ch], y_zp, lo, to_int8, relu)
        _dw_plane_q(of, nc * ho * wo, xf, nc * h * wd, wf, ch * kh * kw, bq, g, box, ho, zp, epi)


@njit(cache=True)
def _dw_plane_q(of, ob, xf, xb, wf, wb, bq, g, box, ho, zp, epi):
    """`_dw_plane_f32` for int8 (not inlined, for the same reason)."""
    kh, kw, sw = g[3], g[4], g[6]
    if kh == 3 and kw == 3 and sw == 1:
        _plane_q(of, ob, xf, xb, wf, wb, bq, g, box, ho, zp, epi, 3, 3, 1)
    elif kh == 3 and kw == 3 and sw == 2:
        _plane_q(of, ob, xf, xb, wf, wb, bq, g, box, ho, zp, epi, 3, 3, 2)
    elif kh == 5 and kw == 5 and sw == 1:
        _plane_q(of, ob, xf, xb, wf, wb, bq, g, box, ho, zp, epi, 5, 5, 1)
    elif kh == 5 and kw == 5 and sw == 2:
        _plane_q(of, ob, xf, xb, wf, wb, bq, g, box, ho, zp, epi, 5, 5, 2)
    else:
        _plane_q(of, ob, xf, xb, wf, wb, bq, g, box, ho, zp, epi, 0, 0, 0)


# --------------------------------------------------------------------------- padded planes
#
# The kernels above pay, per plane, a border loop with a bounds test per tap and a vector
# loop per row: on MobileNet's 8x8 and 4x4 maps that is most of the time (480 planes of 4x4:
# 190 us where the multiply-adds need a few). These copy each plane once into a padded
# scratch plane (the padding is written once a call: every plane fills the same interior),
# so every output is an interior one, and compute the whole plane as ONE flat loop over the
# outputs at the padded pitch, t = oh * pitch + ow: tap (i, j) of output t reads
# t + i*dh*pitch + j*dw, a constant offset, in chunks of VEC outputs (a loop of constant trip
# count, which LLVM turns into whole vectors: one AVX-512 register, four NEON ones, no scalar
# remainder). The columns ow >= Wo of each row are junk that the copy-out (with the
# activation or the int8 epilogue) skips.
#
# Stride 2 (dilation 1) splits the padded plane into its four phases (even/odd rows x even/
# odd columns, each at pitch Wq = ceil(Wp / 2)) as it copies: tap (i, j) of output
# (oh, ow) reads phase (i % 2, j % 2) at (oh + i // 2, ow + j // 2), so the flat loop again
# reads at constant offsets, contiguously, and the junk is one column in Wq, not half.
#
# Each part (a thread's share of the N*C planes) has its own scratch row: the padded plane
# (or phases) and the flat outputs (float32, or int32 sums for int8).

# the LLVM-vector parts (kernels_dwflat's sums, _split_pairs); without Numba's JIT (they cannot
# run as Python) the Numba loops that they replaced
VECTORS = not numba.config.DISABLE_JIT
VEC = 16  # outputs per chunk of the flat loop
# rows at least this wide split into their stride-2 phases as one loop over column pairs
# (see _pad_plane): 48 on x86 (timed), 8 elsewhere (the Pi 5's instruction counts); from
# 2 SPLIT_LANES columns on, as _split_pairs' vectors (96 x 112 x 112: 0.20 -> 0.15 ms; 480 x
# 28 x 28: 0.16 -> 0.06)
_X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")
PHASE_PAIRS = 48 if _X86 else 8
# int8 planes summed in float32 (dw_conv_padded_qf) or in int32 (dw_conv_padded_q): on x86 the
# float32 FMAs ran 1.1-1.35x faster on stride 1 and 5x5 (3x3 stride 2 keeps the int32 loop);
# on the Pi 5 the int32 loop took 5-19% fewer instructions on every layer measured (3x3 and
# 5x5, stride 1 and 2, 8x8 to 64x64 planes: the float32 route converts each plane first)
FLOAT_SUMS = _X86
SPLIT_LANES = 8  # column pairs a vector step of _split_pairs


def _make_split(lanes: int):
    """_split_pairs for `lanes` pairs a step."""

    @intrinsic
    def split(typingctx, even, odd, src, pairs, dst_like, src_like):
        dt, st = dst_like.dtype, src_like.dtype

        def codegen(context, builder, signature, args):
            return _split_code(context, builder, args, dt, st, lanes)

        return types.void(*[types.intp] * 4, dst_like, src_like), codegen

    return split


def _split_code(context, builder, args, dt, st, lanes):
    """even[m] = src[2m], odd[m] = src[2m + 1] for m < pairs (>= lanes; addresses in bytes;
    int8 -> float32 converted): one load of 2 lanes elements and two shuffles a step, the last
    step ending at the last pair (overlapping the one before: both write the same values).
    LLVM's own vectorization of the pairs loop (two stride-2 loads) ran the 96 x 112 x 112
    plane split of EfficientNet-B0 at 0.18 ns an element, twice a plain copy."""
    da, db, s, n = args[:4]
    d_ir, s_ir = context.get_value_type(dt), context.get_value_type(st)
    dsz, ssz = dt.bitwidth // 8, st.bitwidth // 8
    wide, dv = ir.VectorType(s_ir, 2 * lanes), ir.VectorType(d_ir, lanes)
    i32 = ir.IntType(32)
    pick = [ir.Constant(ir.VectorType(i32, lanes), [2 * j + k for j in range(lanes)])
            for k in (0, 1)]
    last = builder.sub(n, _const(lanes))

    def vec(i, carried):
        m = builder.mul(i, _const(lanes))
        m = builder.select(builder.icmp_signed("<", m, last), m, last)
        v = builder.load(_ptr(builder, builder.add(s, builder.mul(m, _const(2 * ssz))), wide),
                         align=1)
        for dst, idx in ((da, pick[0]), (db, pick[1])):
            part = builder.shuffle_vector(v, v, idx)
            if st != dt:
                part = builder.sitofp(part, dv)
            builder.store(part, _ptr(builder, builder.add(dst, builder.mul(m, _const(dsz))), dv),
                          align=1)
        return []

    _loop(builder, builder.sdiv(builder.add(n, _const(lanes - 1)), _const(lanes)), [], vec)
    return context.get_dummy_value()


# 8 pairs a step; 4 for rows of 8-15 columns (below 8, a plain loop). NOTE: MobileNetV3's and
# EfficientNet-B0's 14 x 14 stride-2 planes went element by element (1.3 ns an element: half
# of a 288 x 14 x 14 5x5/2 layer's 130 us)
_split_pairs, _split_quads = _make_split(SPLIT_LANES), _make_split(SPLIT_LANES // 2)


@intrinsic
def _copy_row(typingctx, dst, src, n, lo, hi, dst_like, src_like):
    """dst[0:n] = src[0:n] (byte addresses; int8 -> float32 converted), float32 values
    clamped from lo to hi on the way (NaN passes, as kernels_fp32.relu): vectors of 8 (4 for
    rows of 4-7), the last ending at n (overlapping the one before: both write the same
    values), element by element below 4. Nothing outside the n elements is read or written.

    NOTE: the padded planes' rows (in) and the flat outputs' valid columns (out) went element
    by element on MobileNetV3's and EfficientNet-B0's 7x7 and 14x14 planes (LLVM's vector
    loop barely runs on 7-14 elements): a fifth to a third of their 5x5 layers' time. Rows
    below SHORT_ROWS only: on 56- and 112-wide ones LLVM's loop ran 1.1-1.15x faster."""
    dt, st = dst_like.dtype, src_like.dtype
    is_float = isinstance(dt, types.Float)

    def codegen(context, builder, signature, args):
        d, s, count, vlo, vhi = args[:5]
        d_ir, s_ir = context.get_value_type(dt), context.get_value_type(st)
        dsz, ssz = dt.bitwidth // 8, st.bitwidth // 8

        def one(ty_s, ty_d, at):
            """the element or vector (of types ty_s -> ty_d) at element offset at"""
            v = builder.load(_ptr(builder, builder.add(s, builder.mul(at, _const(ssz))), ty_s),
                             align=1)
            if st != dt:
                v = builder.sitofp(v, ty_d)
            if is_float:
                vec = isinstance(ty_d, ir.VectorType)
                lo_v = _splat(builder, vlo, ty_d) if vec else vlo
                hi_v = _splat(builder, vhi, ty_d) if vec else vhi
                v = builder.select(builder.fcmp_ordered("<", v, lo_v), lo_v, v)
                v = builder.select(builder.fcmp_ordered(">", v, hi_v), hi_v, v)
            builder.store(v, _ptr(builder, builder.add(d, builder.mul(at, _const(dsz))), ty_d),
                          align=1)

        def vectors(lanes):
            vs, vd = ir.VectorType(s_ir, lanes), ir.VectorType(d_ir, lanes)
            last = builder.sub(count, _const(lanes))

            def step(i, carried):
                at = builder.mul(i, _const(lanes))
                one(vs, vd, builder.select(builder.icmp_signed("<", at, last), at, last))
                return []

            _loop(builder, builder.sdiv(builder.add(count, _const(lanes - 1)), _const(lanes)), [],
                  step)

        with builder.if_else(builder.icmp_signed(">=", count, _const(8))) as (wide, narrow):
            with wide:
                vectors(8)
            with narrow:
                with builder.if_else(builder.icmp_signed(">=", count, _const(4))) as (four, few):
                    with four:
                        vectors(4)
                    with few:
                        _loop(builder, count, [], lambda i, c: one(s_ir, d_ir, i) or [])
        return context.get_dummy_value()

    return types.void(types.intp, types.intp, types.intp, types.float32, types.float32, dst_like,
                      src_like), codegen


# stride 1: rows narrower than this copied in and out by _copy_row (interleaved, one thread,
# stride-1 layers against LLVM's loops: 7x7 0.83-0.87x, 14x14 0.81-0.96x, 28x28 1.02-1.05x,
# 56x56 1.11-1.14x)
SHORT_ROWS = 24


BLOCK = 64  # outputs per block of the flat loop, where n_out allows


def padded_fast(kh: int, kw: int, sh: int, sw: int, dh: int, dw: int) -> bool:
    """Whether the padded-plane kernels take this geometry (others take dw_conv / dw_conv_q)."""
    # NOTE: dilation 1 only: with the tap offsets constants (i * pitch + j) the flat loops ran
    # 1.5-1.8x faster on 3x3 s1 than with the dilation an argument (register pressure)
    return (kh, kw) in ((3, 3), (5, 5)) and sh == sw and sh in (1, 2) and dh == dw == 1


def padded_sizes(h: int, wd: int, ho: int, wo: int, sh: int, ph: int, pw: int) -> tuple[int, int]:
    """(elements of one part's padded plane scratch, of its flat output scratch)."""
    hp, wp = h + 2 * ph, wd + 2 * pw
    if sh == 1:
        pitch = _pitch1(wd, pw)
        n_out = -(-((ho - 1) * pitch + wo) // VEC) * VEC
        # the last flat output's last tap: (hp - ho) rows and (wp - wo) columns on
        reads = n_out + (hp - ho) * pitch + (wp - wo)
        return max(hp * pitch + pw, reads) + VEC, n_out
    hq, wq = -(-hp // 2), -(-wp // 2)
    return 4 * (hq * wq + VEC), -(-((ho - 1) * wq + wo) // VEC) * VEC


@njit(cache=True, inline="always")
def _pitch1(wd, pw):
    """The stride-1 padded rows' pitch: from pw = 2 (5x5) W + pw, one padding of pw between
    rows, a row's right padding being the next one's left (an output near the right edge
    reads the zeros that start the next row): MobileNetV3's 5x5 layers on 7x7 maps computed
    64 flat outputs a plane where with both paddings 80 (1.05-1.2x a layer). With pw = 1 it
    saved 3% of the outputs and ran slower (28x28: 0.9x), so both paddings stay there."""
    return wd + pw if pw >= 2 else wd + 2 * pw


@njit(cache=True, inline="always")
def _layout(h, wd, ho, wo, sh, ph, pw):
    """(pitch of the flat outputs, elements of one stride-2 phase plane, flat outputs).

    Stride 1: rows at _pitch1's pitch."""
    wp = wd + 2 * pw
    if sh == 1:
        pitch, plane = _pitch1(wd, pw), 0
    else:
        pitch = (wp + 1) // 2
        plane = ((h + 2 * ph + 1) // 2) * pitch + VEC
    return pitch, plane, -(-((ho - 1) * pitch + wo) // VEC) * VEC


@njit(cache=True, inline="always")
def _pad_plane(xp, xf, src, h, wd, ph, pw, pitch, plane, sh):
    """The plane at xf[src:] into the interior of xp: at _layout's pitch (stride 1), or split into
    its four phases (stride 2: planes of `plane` elements at pitch Wq)."""
    if sh == 1:
        if VECTORS and wd < SHORT_ROWS:
            xa, fa = np.int64(xp.ctypes.data), np.int64(xf.ctypes.data)
            for ih in range(h):
                d0, s0 = (ih + ph) * pitch + pw, src + ih * wd
                _copy_row(xa + d0 * xp.itemsize, fa + s0 * xf.itemsize, wd,
                          np.float32(-np.inf), np.float32(np.inf), xp, xf)
            return
        for ih in range(h):
            d0, s0 = (ih + ph) * pitch + pw, src + ih * wd
            for iw in range(wd):
                xp[np.uint64(d0 + iw)] = xf[np.uint64(s0 + iw)]
        return
    for ih in range(h):
        r = ih + ph
        d0, s0 = (r & 1) * 2 * plane + (r >> 1) * pitch, src + ih * wd
        if wd < PHASE_PAIRS and (wd < SPLIT_LANES or not VECTORS):
            for iw in range(wd):
                c = iw + pw
                xp[np.uint64(d0 + (c & 1) * plane + (c >> 1))] = xf[np.uint64(s0 + iw)]
            continue
        # NOTE: long rows as one loop over column pairs, which LLVM vectorizes (a stride-2
        # load each phase): 2x faster on 112- and 56-wide rows, slower below ~32 (the vector
        # loop then barely runs). Input column iw lands in phase (iw + pw) & 1 at (iw + pw) >> 1.
        da = d0 + (pw & 1) * plane + (pw >> 1)
        db = d0 + (1 - (pw & 1)) * plane + ((pw + 1) >> 1)
        if VECTORS and wd >= 2 * SPLIT_LANES:
            xa, fa = np.int64(xp.ctypes.data), np.int64(xf.ctypes.data)
            _split_pairs(xa + da * xp.itemsize, xa + db * xp.itemsize, fa + s0 * xf.itemsize,
                         wd >> 1, xp, xf)
        elif VECTORS and wd >= SPLIT_LANES:
            xa, fa = np.int64(xp.ctypes.data), np.int64(xf.ctypes.data)
            _split_quads(xa + da * xp.itemsize, xa + db * xp.itemsize, fa + s0 * xf.itemsize,
                         wd >> 1, xp, xf)
        else:
            for m in range(wd >> 1):
                xp[np.uint64(da + m)] = xf[np.uint64(s0 + 2 * m)]
                xp[np.uint64(db + m)] = xf[np.uint64(s0 + 2 * m + 1)]
        if wd & 1:
            c = wd - 1 + pw
            xp[np.uint64(d0 + (c & 1) * plane + (c >> 1))] = xf[np.uint64(s0 + wd - 1)]


@njit(cache=True, inline="always")
def _tap(i, j, pitch, plane, S):
    """The offset of tap (i, j) from its output's flat index."""
    if S == 1:
        return i * pitch + j
    return ((i & 1) * 2 + (j & 1)) * plane + (i >> 1) * pitch + (j >> 1)


@njit(cache=True, inline="always")
def _flat_f32(tmp, xp, wf, wb, bo, n_out, pitch, plane, KH, KW, S):
    """tmp[t] = bo + the sum of output t's taps, for t < n_out (a multiple of VEC).

    kernels_dwflat's vectors; without the JIT, Numba loops over blocks of BLOCK outputs where
    n_out allows (each lane's sum is a chain of kh*kw dependent multiply-adds: VEC outputs, two
    vectors, left the FMA units waiting on it)."""
    if VECTORS:
        flat_sums(tmp, xp, wf, wb, bo, n_out, pitch, plane, KH, S)
        return
    wide = n_out - n_out % BLOCK
    for t0 in range(0, wide, BLOCK):
        for u in range(BLOCK):
            _flat_one_f32(tmp, xp, wf, wb, bo, np.uint64(t0 + u), pitch, plane, KH, KW, S)
    for t0 in range(wide, n_out, VEC):
        for u in range(VEC):
            _flat_one_f32(tmp, xp, wf, wb, bo, np.uint64(t0 + u), pitch, plane, KH, KW, S)


@njit(cache=True, inline="always")
def _flat_one_f32(tmp, xp, wf, wb, bo, t, pitch, plane, KH, KW, S):
    acc = bo
    for i in range(KH):
        for j in range(KW):
            acc += (wf[np.uint64(wb + i * KW + j)]
                    * xp[t + np.uint64(_tap(i, j, pitch, plane, S))])
    tmp[t] = acc


@njit(cache=True, inline="always")
def _flat_q(acc, xp, wf, wb, n_out, pitch, plane, KH, KW, S):
    """acc[t] = the int32 sum of x_q * w_q over output t's taps (see _interior_q's casts),
    for t < n_out (a multiple of VEC)."""
    wide = n_out - n_out % BLOCK
    for t0 in range(0, wide, BLOCK):
        for u in range(BLOCK):
            _flat_one_q(acc, xp, wf, wb, np.uint64(t0 + u), pitch, plane, KH, KW, S)
    for t0 in range(wide, n_out, VEC):
        for u in range(VEC):
            _flat_one_q(acc, xp, wf, wb, np.uint64(t0 + u), pitch, plane, KH, KW, S)


@njit(cache=True, inline="always")
def _flat_one_q(acc, xp, wf, wb, t, pitch, plane, KH, KW, S):
    a = np.int32(0)
    for i in range(KH):
        for j in range(KW):
            a = np.int32(a + np.int32(np.int32(xp[t + np.uint64(_tap(i, j, pitch, plane, S))])
                                      * np.int32(wf[np.uint64(wb + i * KW + j)])))
    acc[t] = a


@njit(cache=True, inline="always")
def _flat_epilogue(tmp, acc, n_out, badj, epi):
    """tmp[t] = the epilogue of badj + acc[t] (int8 codes or float32 values, tmp's dtype).

    NOTE: a loop of its own: inside _flat_q's, LLVM vectorized neither (the multiply-adds ran
    scalar), and in the copy-out along 4- and 8-wide rows it ran scalar. One plain loop, not
    chunks of VEC: unrolled chunks left the clamps' branches to the SLP vectorizer, which
    kept them scalar on the Pi 5; the loop vectorizer makes them selects. With _code_clamped
    the Pi 5's MobileNetV2-0.5 int8 depthwise convs took 10.4e6 -> 9.6e6 instructions."""
    m, y_zp, clamp, to_int8, relu = epi
    if to_int8:
        for i in range(n_out):
            t = np.uint64(i)
            tmp[t] = _code_clamped(total32(acc[t], badj), m, y_zp, clamp)
    else:
        for i in range(n_out):
            t = np.uint64(i)
            tmp[t] = _epilogue(np.int64(acc[t]) + badj, m, y_zp, clamp, to_int8, relu)


@njit(cache=True, inline="always")
def _parts(tasks, parts, part):
    return part * tasks // parts, (part + 1) * tasks // parts


@kernel(contract=True)
def dw_conv_padded(out, x, w, b, xp_all, tmp_all, sh, ph, pw, act, alpha):
    """dw_conv for the geometries of padded_fast: xp_all (parts, padded_sizes[0]) and
    tmp_all (parts, padded_sizes[1]) float32 scratch, one row a part (a thread's planes)."""
    parts = xp_all.shape[0]
    direct = (VECTORS and w.shape[2] == 3 and sh == 1 and ph == pw == 1 and x.shape[3] >= DIRECT_W
              and x.shape[2] >= 3)
    for part in prange(parts):
        lo, hi = _parts(x.shape[0] * x.shape[1], parts, part)
        if direct:
            _direct_part_f32(out, x, w, b, lo, hi, act, alpha)
        else:
            _padded_part_f32(out, x, w, b, xp_all[part], tmp_all[part], lo, hi, sh, ph, pw, act,
                             alpha)


# NOTE: a part's planes in a function of their own, not inlined: the prange loops above and
# below then compile a call, not four unrolled flat loops each (the parallel twin's compile
# took most of a minute)
@njit(cache=True, fastmath={"contract"})
def _padded_part_f32(out, x, w, b, xp, tmp, lo, hi, sh, ph, pw, act, alpha):
    n, c, h, wd = x.shape
    kh = w.shape[2]
    ho, wo = out.shape[2], out.shape[3]
    pitch, plane, n_out = _layout(h, wd, ho, wo, sh, ph, pw)
    has_bias = b.shape[0] > 0
    xf, of, wf = x.reshape(-1), out.reshape(-1), w.reshape(-1)
    xp[:] = 0.0
    costly = act != 0 and act != 1 and act != 9
    # NOTE: a costly activation (SiLU, hardswish...) over a plane's flat outputs, junk columns
    # and all: one long vector loop, where along 7- to 14-wide rows SiLU ran mostly in scalar
    # remainders; on small planes (up to PART_ACT outputs) once over the part's outputs after
    # its planes instead: a call a plane cost ~110 ns over 64 flat outputs (SiLU latency-bound,
    # 1.7 ns an output, half of EfficientNet-B0's 672 x 14 x 14 5x5/2 layer). ReLU and clip cost
    # a compare in the copy-out (a pass over the flat outputs was 13% of a 144 x 56 x 56 ReLU6
    # layer)
    per_plane = costly and ho * wo > PART_ACT
    for nc in range(lo, hi):
        ch = nc % c
        _pad_plane(xp, xf, nc * h * wd, h, wd, ph, pw, pitch, plane, sh)
        bo = b[ch] if has_bias else np.float32(0.0)
        if kh == 3 and sh == 1:
            _flat_f32(tmp, xp, wf, ch * 9, bo, n_out, pitch, plane, 3, 3, 1)
        elif kh == 3:
            _flat_f32(tmp, xp, wf, ch * 9, bo, n_out, pitch, plane, 3, 3, 2)
        elif sh == 1:
            _flat_f32(tmp, xp, wf, ch * 25, bo, n_out, pitch, plane, 5, 5, 1)
        else:
            _flat_f32(tmp, xp, wf, ch * 25, bo, n_out, pitch, plane, 5, 5, 2)
        if per_plane:
            act_inplace(tmp, 0, n_out, np.float32(0.0), act, alpha)
        _copy_out(of, nc * ho * wo, tmp, ho, wo, pitch, act, alpha)
    if costly and not per_plane:
        act_inplace(of, lo * ho * wo, (hi - lo) * ho * wo, np.float32(0.0), act, alpha)


PART_ACT = 256  # see _padded_part_f32
# a solo call runs these as one part (bound.solo): parts only split the planes, each computed
# the same way in any part (its scratch rows are rewritten per plane, the padding per part)
dw_conv_padded.one_part = (4, 5)

# 3x3 stride-1 planes padded by 1 from this width on take _direct_3x3 (no padded copy, no
# copy-out). NOTE: one thread of a Zen 1, against the padded planes (interleaved, the same
# bits): 112 x 112 0.64x (no activation) / 0.79x (SiLU), 64 x 64 clip 0.83x, 56 x 56 0.85-0.91x;
# under it the first and last columns (one output at a time) cost what the copies did: 32 x 32
# clip 1.15x, 28 x 28 ReLU 0.99x, 24 x 24 1.24x
DIRECT_W = 48


# NOTE: a part function of its own, not a branch in _padded_part_f32: there its code slowed
# the padded planes' loops on small maps (MobileNetV2's 8 x 8 and EfficientNet-B0's 7 x 7
# layers 1.05-1.2x, the same bytes)
@njit(cache=True, fastmath={"contract"})
def _direct_part_f32(out, x, w, b, lo, hi, act, alpha):
    """dw_conv_padded's planes [lo, hi) by _direct_3x3 (3x3, stride 1, padded by 1)."""
    n, c, h, wd = x.shape
    xf, of, wf = x.reshape(-1), out.reshape(-1), w.reshape(-1)
    has_bias = b.shape[0] > 0
    clo = np.float32(0.0) if act == 1 or act == 9 else np.float32(-np.inf)
    chi = np.float32(alpha) if act == 9 else np.float32(np.inf)
    costly = act != 0 and act != 1 and act != 9
    for nc in range(lo, hi):
        ch = nc % c
        bo = b[ch] if has_bias else np.float32(0.0)
        _direct_3x3(of, nc * h * wd, xf, nc * h * wd, h, wd, wf, ch * 9, bo, clo, chi)
        if costly:  # (planes of DIRECT_W columns and more: past PART_ACT outputs)
            act_inplace(of, nc * h * wd, h * wd, np.float32(0.0), act, alpha)


@njit(cache=True, inline="always")
def _direct_3x3(of, ob, xf, xb, h, wd, wf, wb, bo, lo, hi):
    """The 3x3 stride-1 conv, padded by 1, of the plane at xf[xb:] into of[ob:] (Ho, Wo = H, W),
    each output put in [lo, hi] (ReLU, clip; -inf, inf: none), with no padded copy: rows
    1..H-2 by kernels_dwflat's loop reading x in place at pitch W (each output's taps are
    constant shifts of the plane; its first and last columns then read the rows beside theirs,
    and are computed again below), the first and last rows as loops over their inner columns,
    the first and last columns one output at a time.

    NOTE: the padded plane's copy and the copy-out past its junk columns were a third of a
    plane's time (EfficientNet-B0's 32 x 112 x 112 layer: copy 99 us, sums 300, copy-out 73,
    one thread of a Zen 1). Each output is the same float32 operations (bo, then a multiply-add
    a tap in (i, j) order) but the padding's taps, which added w * 0: the same bits."""
    t0, count = wd + 1, (h - 2) * wd - 2  # rows 1..H-2, less (1, 0) and (H-2, W-1)
    ta = np.int64(of.ctypes.data) + ob * 4
    xa = np.int64(xf.ctypes.data) + (xb - wd - 1) * 4  # output t's tap (i, j): t + i W + j
    wa = np.int64(wf.ctypes.data) + wb * 4
    full = count // CHUNK
    t1 = t0 + full * CHUNK
    rest = (count - full * CHUNK) // TAIL
    # NOTE: the clamping loop only for ReLU and clip: its two selects a vector with no bounds
    # (SiLU and the rest come after) were 1-4% more instructions a layer on the emulated Pi 4
    if lo == -np.inf and hi == np.inf:
        _f3s1(ta, xa, wa, bo, t0, full, wd, 0)
        _f3s1t(ta, xa, wa, bo, t1, rest, wd, 0)
    else:
        _f3s1c(ta, xa, wa, bo, t0, full, wd, 0, lo, hi)
        _f3s1tc(ta, xa, wa, bo, t1, rest, wd, 0, lo, hi)
    for t in range(t1 + rest * TAIL, t0 + count):
        oh = t // wd
        of[ob + t] = _within(_dw3_out(xf, xb, h, wd, oh, t - oh * wd, wf, wb, bo), lo, hi)
    w0, w1, w2 = wf[wb], wf[wb + 1], wf[wb + 2]
    w3, w4, w5 = wf[wb + 3], wf[wb + 4], wf[wb + 5]
    w6, w7, w8 = wf[wb + 6], wf[wb + 7], wf[wb + 8]
    last = (h - 1) * wd
    one = np.uint64(1)
    n = np.uint64(wd)
    for ow in range(1, wd - 1):  # row 0: taps of rows 1 and 2; row H-1: of rows 0 and 1
        acc = _two_rows(xf, np.uint64(xb + ow), n, bo, w3, w4, w5, w6, w7, w8)
        of[np.uint64(ob + ow)] = _within(acc, lo, hi)
        acc = _two_rows(xf, np.uint64(xb + last - wd + ow), n, bo, w0, w1, w2, w3, w4, w5)
        of[np.uint64(ob + last + ow)] = _within(acc, lo, hi)
    for oh in range(1, h - 1):  # the first and last columns of the inner rows: 6 taps each
        u = np.uint64(xb + (oh - 1) * wd)  # (oh - 1, 0)
        e = u + np.uint64(wd - 1)  # (oh - 1, W - 1)
        acc = bo + w1 * xf[u]
        acc += w2 * xf[u + one]
        acc += w4 * xf[u + n]
        acc += w5 * xf[u + n + one]
        acc += w7 * xf[u + n + n]
        acc += w8 * xf[u + n + n + one]
        of[np.uint64(ob + oh * wd)] = _within(acc, lo, hi)
        acc = bo + w0 * xf[e - one]
        acc += w1 * xf[e]
        acc += w3 * xf[e + n - one]
        acc += w4 * xf[e + n]
        acc += w6 * xf[e + n + n - one]
        acc += w7 * xf[e + n + n]
        of[np.uint64(ob + oh * wd + wd - 1)] = _within(acc, lo, hi)
    for oh in (0, h - 1):  # the corners
        for ow in (0, wd - 1):
            of[ob + oh * wd + ow] = _within(_dw3_out(xf, xb, h, wd, oh, ow, wf, wb, bo), lo, hi)


@njit(cache=True, inline="always")
def _two_rows(xf, u, n, bo, k0, k1, k2, k3, k4, k5):
    """bo, then k0..k2 times the floats at u - 1, u, u + 1, then k3..k5 times those a row of
    n on: a first or last row's output of _direct_3x3 (its taps in (i, j) order)."""
    one = np.uint64(1)
    acc = bo + k0 * xf[u - one]
    acc += k1 * xf[u]
    acc += k2 * xf[u + one]
    acc += k3 * xf[u + n - one]
    acc += k4 * xf[u + n]
    acc += k5 * xf[u + n + one]
    return acc


@njit(cache=True, inline="always")
def _within(v, lo, hi):
    """v put in [lo, hi], NaN kept (the flat loop's clamp, kernels_fp32.relu's rule)."""
    v = lo if v < lo else v
    return hi if v > hi else v


@njit(cache=True, inline="always")
def _dw3_out(xf, xb, h, wd, oh, ow, wf, wb, bo):
    """One output of _direct_3x3: bo, then its taps inside the plane in (i, j) order."""
    acc = bo
    for i in range(3):
        r = oh + i - 1
        if r >= 0 and r < h:
            for j in range(3):
                col = ow + j - 1
                if col >= 0 and col < wd:
                    acc += wf[wb + i * 3 + j] * xf[xb + r * wd + col]
    return acc


@njit(cache=True, inline="always")
def _copy_out(of, ob, tmp, ho, wo, pitch, act, alpha):
    """The valid columns of the flat outputs (rows at pitch) into the plane at ob, through
    ReLU (act 1) or clip from 0 to alpha (act 9) on the way; any other act was applied."""
    if VECTORS and wo < SHORT_ROWS:
        lo = np.float32(0.0) if act == 1 or act == 9 else np.float32(-np.inf)
        hi = np.float32(alpha) if act == 9 else np.float32(np.inf)
        oa, ta = np.int64(of.ctypes.data), np.int64(tmp.ctypes.data)
        for oh in range(ho):
            _copy_row(oa + (ob + oh * wo) * 4, ta + oh * pitch * 4, wo, lo, hi, of, tmp)
        return
    if act == 1:
        for oh in range(ho):
            src, dst = oh * pitch, ob + oh * wo
            for ow in range(wo):
                of[np.uint64(dst + ow)] = relu(tmp[np.uint64(src + ow)])
    elif act == 9:
        hi = np.float32(alpha)
        for oh in range(ho):
            src, dst = oh * pitch, ob + oh * wo
            for ow in range(wo):
                v = relu(tmp[np.uint64(src + ow)])
                of[np.uint64(dst + ow)] = hi if v > hi else v
    else:
        for oh in range(ho):
            src, dst = oh * pitch, ob + oh * wo
            for ow in range(wo):
                of[np.uint64(dst + ow)] = tmp[np.uint64(src + ow)]


@kernel
def dw_conv_padded_q(out, x, w, b, xp_all, acc_all, tmp_all, m, x_zp, to_int8, y_zp, lo, relu,
                     sh, ph, pw):
    """dw_conv_q for the geometries of padded_fast: xp_all (parts, padded_sizes[0]) int8,
    acc_all (parts, padded_sizes[1]) int32 (the sums) and tmp_all (parts, padded_sizes[1]) of
    out's dtype (the flat outputs after the epilogue).
    The padding holds x_zp, so every tap reads x_q and
    acc = (b_q - x_zp * sum(w_q)) + sum(x_q * w_q), exactly dw_conv_q's."""
    parts = xp_all.shape[0]
    for part in prange(parts):
        first, last = _parts(x.shape[0] * x.shape[1], parts, part)
        _padded_part_q(out, x, w, b, xp_all[part], acc_all[part], tmp_all[part], first, last, m,
                       x_zp, to_int8, y_zp, lo, relu, sh, ph, pw)


@kernel(contract=True)
def dw_conv_padded_qf(out, x, w, b, xp_all, acc_all, tmp_all, m, x_zp, to_int8, y_zp, lo, relu,
                      sh, ph, pw):
    """dw_conv_padded_q with the padded planes and the sums in float32 (xp_all, acc_all).

    The codes are dw_conv_padded_q's: each sum of up to 25 products x_q * w_q (|x_q| <= 128,
    |w_q| <= 127) stays below 2**24 (25 * 16256 = 406,400), so float32 holds every partial sum
    exactly in any order. The taps are then 16-lane FMAs on the converted plane, where the int32
    loop widens every tap's int8 loads: 1.1-1.35x on EfficientNet-B0's stride-1 and 5x5 layers,
    0.85x on 3x3 stride 2 (the phase split writes 4x the bytes), which keeps the int32 loop."""
    parts = xp_all.shape[0]
    for part in prange(parts):
        first, last = _parts(x.shape[0] * x.shape[1], parts, part)
        _padded_part_qf(out, x, w, b, xp_all[part], acc_all[part], tmp_all[part], first, last,
                        m, x_zp, to_int8, y_zp, lo, relu, sh, ph, pw)


dw_conv_padded_q.one_part = dw_conv_padded_qf.one_part = (4, 5, 6)  # (as dw_conv_padded's)


@njit(cache=True, inline="always")
def _plane_in_q(xp, xf, wf, b, nc, c, h, wd, kh, kw, ph, pw, pitch, plane, sh, zp, has_bias):
    """Pad plane nc into xp; its channel's weight offset and b_q - x_zp * sum(w_q)."""
    ch = nc % c
    _pad_plane(xp, xf, nc * h * wd, h, wd, ph, pw, pitch, plane, sh)
    wb = ch * kh * kw
    wsum = np.int64(0)
    for t in range(kh * kw):
        wsum += np.int64(wf[wb + t])
    return ch, wb, (np.int64(b[ch]) if has_bias else np.int64(0)) - zp * wsum


@njit(cache=True, inline="always")
def _plane_out_q(of, tmp, acc, nc, ho, wo, pitch, n_out, badj, epi):
    """The epilogue of the flat sums, then the valid columns of each row into out."""
    _flat_epilogue(tmp, acc, n_out, badj, epi)
    ob = nc * ho * wo
    for oh in range(ho):
        src, dst = oh * pitch, ob + oh * wo
        for ow in range(wo):
            of[np.uint64(dst + ow)] = tmp[np.uint64(src + ow)]


@njit(cache=True)
def _padded_part_q(out, x, w, b, xp, acc, tmp, first, last, m, x_zp, to_int8, y_zp, lo, relu,
                   sh, ph, pw):
    n, c, h, wd = x.shape
    kh, kw = w.shape[2], w.shape[3]
    ho, wo = out.shape[2], out.shape[3]
    pitch, plane, n_out = _layout(h, wd, ho, wo, sh, ph, pw)
    xf, of, wf = x.reshape(-1), out.reshape(-1), w.reshape(-1)
    xp[:] = np.int8(x_zp)
    for nc in range(first, last):
        ch, wb, badj = _plane_in_q(xp, xf, wf, b, nc, c, h, wd, kh, kw, ph, pw, pitch, plane, sh,
                                   np.int64(x_zp), b.shape[0] > 0)
        if kh == 3 and sh == 1:
            _flat_q(acc, xp, wf, wb, n_out, pitch, plane, 3, 3, 1)
        elif kh == 3:
            _flat_q(acc, xp, wf, wb, n_out, pitch, plane, 3, 3, 2)
        elif sh == 1:
            _flat_q(acc, xp, wf, wb, n_out, pitch, plane, 5, 5, 1)
        else:
            _flat_q(acc, xp, wf, wb, n_out, pitch, plane, 5, 5, 2)
        _plane_out_q(of, tmp, acc, nc, ho, wo, pitch, n_out, badj, (m[ch], y_zp, lo, to_int8, relu))


@njit(cache=True, fastmath={"contract"})
def _padded_part_qf(out, x, w, b, xp, acc, tmp, first, last, m, x_zp, to_int8, y_zp, lo, relu,
                    sh, ph, pw):
    n, c, h, wd = x.shape
    kh, kw = w.shape[2], w.shape[3]
    ho, wo = out.shape[2], out.shape[3]
    pitch, plane, n_out = _layout(h, wd, ho, wo, sh, ph, pw)
    xf, of, wf = x.reshape(-1), out.reshape(-1), w.reshape(-1)
    wff = np.empty(kh * kw, np.float32)
    xp[:] = np.float32(x_zp)
    for nc in range(first, last):
        ch, wb, badj = _plane_in_q(xp, xf, wf, b, nc, c, h, wd, kh, kw, ph, pw, pitch, plane, sh,
                                   np.int64(x_zp), b.shape[0] > 0)
        for t in range(kh * kw):
            wff[t] = np.float32(wf[wb + t])
        zero = np.float32(0.0)
        if kh == 3 and sh == 1:
            _flat_f32(acc, xp, wff, 0, zero, n_out, pitch, plane, 3, 3, 1)
        elif kh == 3:
            _flat_f32(acc, xp, wff, 0, zero, n_out, pitch, plane, 3, 3, 2)
        elif sh == 1:
            _flat_f32(acc, xp, wff, 0, zero, n_out, pitch, plane, 5, 5, 1)
        else:
            _flat_f32(acc, xp, wff, 0, zero, n_out, pitch, plane, 5, 5, 2)
        _plane_out_q(of, tmp, acc, nc, ho, wo, pitch, n_out, badj, (m[ch], y_zp, lo, to_int8, relu))
