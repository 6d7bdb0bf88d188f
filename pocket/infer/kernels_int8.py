"""int8 kernels of the engine; their results must equal formats/reference.py bit for bit.

The arithmetic is pocket.formats.quant's:
    acc[o] = sum((x_q - x_zp) * w_q) + b_q[o]                       exact int32
           = sum(x_q * w_q) - x_zp * wsum[o] + b_q[o]               wsum[o] = sum(w_q[o])
The second form keeps the inner loop a pure int8 x int8 dot product; it stays exact because
int32 wrap-around is arithmetic modulo 2**32 and the true result fits int32. Padding must then
hold x_zp (not 0), which is what `im2row` writes.

Big GEMMs take a second, equally exact route (`requant_sum`): float32 BLAS on the int8 codes
converted to float32 in the engine's scratch (weights too, once per call, so no float copy of
the weights outlives a call), split over K in chunks of EXACT_K so every partial sum is an
integer below 2**24. BLAS sgemm runs 3-4x faster than the vectorized int8 dot (`gemm_q`).

Epilogue: to int8 y = clip(rint(float32(acc) * float32(m[o])) + y_zp, lo, hi), the product in
float32 (lo = y_zp when relu or clip is fused, hi = quantize(max) for a clip, else -128 and
127), or to float32 y = float32(acc * m[o]) in float64 then relu (also for clip) and the
ceiling (a clip's max, else inf). The kernels pass the three bounds through as one tuple,
`lo` = (lo, hi, ceiling). Callers may hand the epilogue acc as int32 (int32 arithmetic on the
sums and bias_adj wraps to the true total, which fits int32: the reference refuses any other),
int64 or an integer-valued float64: float32 of the same integer is the same float32.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from pocket.infer.jit import kernel

EXACT_K = 1024  # float32 sums of int8 x int8 products stay exact up to 1032 terms


# Adding and then subtracting 1.5 * 2**23 rounds a float32 of magnitude below 2**22 to an
# integer, ties to even (the add's own rounding does it)
_ROUND = np.float32(12582912.0)
_SAT32 = np.float32(512.0)  # |acc * m| past this saturates to -128 or 127 whatever y_zp is


@kernel
def quantize(out, x, scale, zp):
    """x (M,) f32 -> out (M,) i8; division in float32, ties to even, saturating.

    NOTE: np.rint here was a libm call per element (0.76 ns each, a third of mlp int8 at batch
    64); the quotient is clamped to +-256 first, where the result saturates anyway, so the
    _ROUND trick is exact and the loop vectorizes."""
    s = np.float32(scale)
    lim = np.float32(256.0)
    for i in prange(x.shape[0]):
        v = min(max(x[i] / s, -lim), lim)
        v = (v + _ROUND) - _ROUND + np.float32(zp)
        out[i] = np.int8(min(max(v, np.float32(-128.0)), np.float32(127.0)))


@kernel
def dequantize(out, x, scale, zp):
    """x (M,) i8 -> out (M,) f32 = (x - zp) * scale in float32."""
    s = np.float32(scale)
    for i in prange(x.shape[0]):
        out[i] = np.float32(np.int32(x[i]) - zp) * s


@kernel
def lut(out, x, table):
    """x (M,) i8 -> out (M,) i8 = table[x + 128]."""
    for i in prange(x.shape[0]):
        out[i] = table[np.int32(x[i]) + 128]


@kernel
def im2row(col, x, kh, kw, sh, sw, ph, pw, dh, dw, pad):
    """x (N, C, H, W) i8 -> col (N, Ho*Wo, C*kh*kw), column (c, i, j) as in OIHW; outside = pad.

    Rows hold one output pixel's receptive field contiguously, the layout the dot product wants.
    """
    n, c, h, w = x.shape
    wo = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    ho = col.shape[1] // wo
    for r in prange(n * ho):
        b, oh = r // ho, r % ho
        for ow in range(wo):
            row = col[b, oh * wo + ow]
            for ch in range(c):
                for i in range(kh):
                    ih = oh * sh - ph + i * dh
                    for j in range(kw):
                        iw = ow * sw - pw + j * dw
                        inside = 0 <= ih < h and 0 <= iw < w
                        row[(ch * kh + i) * kw + j] = x[b, ch, ih, iw] if inside else pad


@njit(cache=True)
def weight_sums(w):
    """w (O, K) i8 -> (O,) i32, the per-channel sums that fold x_zp out of the dot product."""
    o, k = w.shape
    out = np.zeros(o, np.int32)
    for i in range(o):
        for j in range(k):
            out[i] += np.int32(w[i, j])
    return out


@njit(cache=True, inline="always")
def _code(acc, m, y_zp, clamp):
    """_epilogue's int8 code, as a float32 (for loops that only write codes: _epilogue's
    result is float64, which halves the lanes of the conversion to int8).

    NOTE: np.rint is a libm call per element that keeps the loops scalar (3.1 ns an output on
    4-wide rows); clamping first keeps the _ROUND trick exact. Every step is float32 (y_zp and
    the bounds are small integers, exact in float32)."""
    v = np.float32(acc) * np.float32(m)
    v = min(max(v, -_SAT32), _SAT32)
    v = (v + _ROUND) - _ROUND + np.float32(y_zp)
    return min(max(v, np.float32(clamp[0])), np.float32(clamp[1]))


@njit(cache=True, inline="always")
def _code_clamped(acc, m, y_zp, clamp):
    """_code's value, clamped to the codes' range less y_zp BEFORE rounding: with integer
    bounds, clamp(rint(v) + y_zp, lo, hi) == rint(clamp(v, lo - y_zp, hi - y_zp)) + y_zp (rint
    is monotone and fixes integers), and |v| <= 255 then keeps the _ROUND trick exact, without
    _code's saturation: four operations a lane fewer.

    NOTE: where the loop vectorizes (kernels_vnni.requant_cols, kernels_dw's flat epilogue:
    the Pi 5's int8 requantization took 4.2e6 -> 3.5e6 instructions on MobileNetV2-0.5). In
    a loop LLVM leaves scalar the clamps are compare-and-branch, and there it cost more than
    _code's (kernels_dw in chunks of 16: 7.8e6 -> 9.6e6), so the other callers keep _code."""
    zp = np.float32(y_zp)
    v = np.float32(acc) * np.float32(m)
    v = min(max(v, np.float32(clamp[0]) - zp), np.float32(clamp[1]) - zp)
    return (v + _ROUND) - _ROUND + zp


@njit(cache=True, inline="always")
def total32(s, badj):
    """The int32 total of a sum and bias_adj (wrap-around is exact: the total fits int32)."""
    return np.int32(np.int32(s) + np.int32(badj))


@njit(cache=True, inline="always")
def _epilogue(acc, m, y_zp, clamp, to_int8, relu):
    """One int32 accumulator -> int8 code or float32 value (see the module docstring);
    clamp = (lowest code, highest code, float32 ceiling)."""
    if to_int8:
        return _code(acc, m, y_zp, clamp)
    v = np.float64(np.float32(np.float64(acc) * m))
    return min(max(v, 0.0) if relu else v, clamp[2])


@kernel
def gemm_q(out, col, w, bias_adj, m, groups, to_int8, y_zp, lo, relu):
    """col (N, P, K) i8, w (O, K/groups) i8 -> out (N, O, P) i8 or f32.

    bias_adj (O,) i64 = b_q - x_zp * wsum; m (O,) f64 the requant multiplier (or the real
    scale x_scale * w_scale for a float32 output, to_int8 False). The engine uses it for small
    work (few rows, grouped convs); big GEMMs take the exact float32 route (`requant_sum`).
    """
    n, p, k = col.shape
    o, kg = w.shape
    og = o // groups
    # NOTE: parallel over output channels: at batch 1 a linear has one row but many outputs.
    for oc in prange(o):
        k0 = (oc // og) * kg
        wr = w[oc]
        for r in range(n * p):
            # NOTE: slice first: indexing with `k0 + j` makes Numba handle negative indices,
            # which stops LLVM from vectorizing the loop.
            row = col[r // p, r % p, k0:k0 + kg]
            s = np.int32(0)
            # NOTE: Numba widens int arithmetic to int64; the explicit int32 casts keep the
            # loop in 32-bit lanes so LLVM vectorizes it (wrap-around is exact, see above).
            for j in range(kg):
                s = np.int32(s + np.int32(np.int32(row[j]) * np.int32(wr[j])))
            out[r // p, oc, r % p] = _epilogue(s + bias_adj[oc], m[oc], y_zp, lo, to_int8, relu)


_SUM_ROWS = 8  # requant_sum's rows a task (one float64 row of totals each)


@kernel
def requant_sum(out, yf, rb, cb, bias_adj, m, to_int8, y_zp, lo, relu):
    """yf (C, R, L) f32 partial sums over C chunks of K -> out (N, O, P) i8 or f32; the row of
    (image i, channel o) is yf[c, i*rb + o, i*cb:i*cb + P] (see kernels_fp32.bias_act).

    NOTE: the float32 route. Each chunk is a float32 GEMM of int8 codes (x_q unshifted, padding
    = x_zp, w_q) over at most EXACT_K terms: every partial sum is an integer below
    EXACT_K * 128 * 127 < 2**24, so float32 holds it exactly whatever the summation order,
    and the int64 total here equals the int8 dot product bit for bit.
    """
    kc = yf.shape[0]
    n, o, p = out.shape
    blocks = (n * o + _SUM_ROWS - 1) // _SUM_ROWS
    for blk in prange(blocks):
        # NOTE: the chunks' sums in float64, a row at a time (integers below kc * 2**24 plus
        # bias_adj: exact below 2**53), not through int64 an element: the float-int64
        # conversions and the chunk loop inside the pixel loop kept it scalar (ResNet-18 int8:
        # 2-7 ns an output, 3.4 ms of ~50)
        tot = np.empty(p if kc > 1 or not to_int8 else 0, np.float64)
        for r in range(blk * _SUM_ROWS, min(n * o, (blk + 1) * _SUM_ROWS)):
            b, oc = r // o, r % o
            badj, mo = bias_adj[oc], m[oc]
            dst = out[b, oc]
            row0 = yf[0, b * rb + oc, b * cb:b * cb + p]
            if to_int8 and kc == 1:
                for i in range(p):
                    dst[i] = _code(total32(row0[i], badj), mo, y_zp, lo)
                continue
            fb = np.float64(badj)
            for i in range(p):
                tot[i] = np.float64(row0[i]) + fb
            for c in range(1, kc):
                rowc = yf[c, b * rb + oc, b * cb:b * cb + p]
                for i in range(p):
                    tot[i] += np.float64(rowc[i])
            if to_int8:  # (_code's float32(acc) of the exact total: int32's rounding)
                for i in range(p):
                    dst[i] = _code(tot[i], mo, y_zp, lo)
            else:
                for i in range(p):
                    dst[i] = _epilogue(tot[i], mo, y_zp, lo, False, relu)


@kernel
def requant_rows(out, yf, bias_adj, m, to_int8, y_zp, lo, relu):
    """yf (C, N, O) f32 partial sums over C chunks of K -> out (N, O) i8 or f32: `requant_sum`
    for a linear, exact for the same reason.

    NOTE: `requant_sum` sees a linear as rows of 1 element (P = 1) and pays a row's slicing per
    element, ~10 ns, more than the GEMM at batch 64; here the inner loop runs along O.
    """
    kc = yf.shape[0]
    n, o = out.shape
    for i in prange(n):
        dst, row0 = out[i], yf[0, i]
        for oc in range(o):
            acc = np.int64(row0[oc])
            for c in range(1, kc):
                acc += np.int64(yf[c, i, oc])
            dst[oc] = _epilogue(acc + bias_adj[oc], m[oc], y_zp, lo, to_int8, relu)


@kernel
def _requant_pool_one_chunk(out, y, rb, cb, wd, kh, kw, sh, sw, bias_adj, m, to_int8, y_zp, lo, relu):
    """`requant_sum_pool` for one chunk of K (y 2-D): the float max is exact, so take it in
    float32 and convert once per output.

    NOTE: the loop order of kernels_fp32.bias_act_pool (window offsets outside, output columns
    inside, unsigned indices) lets LLVM vectorize the max; the per-output loop with the chunk
    test inside it ran ~2.5x slower (cnn_mnist conv1 at batch 1).
    """
    n, o, ho, wo = out.shape
    for r in prange(n * o):
        b, oc = r // o, r % o
        row = y[b * rb + oc, b * cb:]
        badj, mo = bias_adj[oc], m[oc]
        for oh in range(ho):
            dst = out[b, oc, oh]
            base = oh * sh * wd
            for ow in range(wo):
                f = row[np.uint64(base + ow * sw)]
                for i in range(kh):
                    for j in range(kw):
                        f = max(f, row[np.uint64(base + i * wd + j + ow * sw)])
                dst[ow] = _epilogue(np.int64(f) + badj, mo, y_zp, lo, to_int8, relu)


@kernel
def requant_sum_pool(out, yf, rb, cb, wd, kh, kw, sh, sw, bias_adj, m, to_int8, y_zp, lo, relu):
    """`requant_sum` with a fused unpadded maxpool: rows of H*W with row width wd ->
    out (N, O, Ho, Wo), the max over each kh x kw window.

    NOTE: exact: the epilogue is non-decreasing in acc (m > 0, rint, clip), so the max of the
    epilogues is the epilogue of the max accumulator; one epilogue per output, not per input.
    """
    kc = yf.shape[0]
    n, o, ho, wo = out.shape
    if kc == 1:
        _requant_pool_one_chunk(out, yf[0], rb, cb, wd, kh, kw, sh, sw, bias_adj, m, to_int8, y_zp, lo,
                                relu)
        return
    for r in prange(n * o):
        b, oc = r // o, r % o
        row0 = yf[0, b * rb + oc, b * cb:]
        for oh in range(ho):
            for ow in range(wo):
                best = np.int64(-(2 ** 62))
                for i in range(kh):
                    base = (oh * sh + i) * wd + ow * sw
                    if kc == 1:  # one chunk: the float max is exact, convert once
                        f = row0[base]
                        for j in range(1, kw):
                            f = max(f, row0[base + j])
                        best = max(best, np.int64(f))
                        continue
                    for j in range(kw):
                        acc = np.int64(row0[base + j])
                        for c in range(1, kc):
                            acc += np.int64(yf[c, b * rb + oc, b * cb + base + j])
                        best = max(best, acc)
                out[b, oc, oh, ow] = _epilogue(best + bias_adj[oc], m[oc], y_zp, lo, to_int8,
                                               relu)
