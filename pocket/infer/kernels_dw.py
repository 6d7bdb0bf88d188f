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

import numpy as np
from numba import njit, prange

from pocket.infer.jit import kernel
from pocket.infer.kernels_fp32 import activate
from pocket.infer.kernels_int8 import _epilogue

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
    """of[lo:hi] through activation `act` in place; ReLU, leaky ReLU, relu6 vectorized, NaN kept."""
    zero = np.float32(0.0)
    if act == 1:
        for t in range(lo, hi):
            v = of[np.uint64(t)]
            of[np.uint64(t)] = zero if v < zero else v
    elif act == 2:
        a = np.float32(alpha)
        for t in range(lo, hi):
            v = of[np.uint64(t)]
            of[np.uint64(t)] = v if v >= zero else a * v
    elif act == 9:
        top = np.float32(alpha)  # relu6: clip's max; float32 equals activate's (monotone rounding)
        for t in range(lo, hi):
            v = of[np.uint64(t)]
            v = zero if v < zero else v
            of[np.uint64(t)] = top if v > top else v
    elif act != 0:
        for t in range(lo, hi):
            of[t] = activate(np.float64(of[t]), act, alpha)


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
        xb, ob, wb = nc * h * wd, nc * ho * wo, ch * kh * kw
        bo = b[ch] if has_bias else np.float32(0.0)
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
        xb, ob, wb = nc * h * wd, nc * ho * wo, ch * kh * kw
        bq = np.int64(b[ch]) if has_bias else np.int64(0)
        epi = (m[ch], y_zp, lo, to_int8, relu)
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
