"""Pointwise convs (1x1, stride 1, no padding, groups 1) on the portable path: plain Numba that
LLVM vectorizes (NEON on ARM, AVX on x86), float32 and int8, the epilogue fused.

    y[o, p] = epilogue(sum over k of w[o, k] * x[k, p])      per image, x (K, P), y (O, P)

What it replaces there: a BLAS GEMM and then a separate pass over its output for the bias and
activation (or, for int8, a pass converting the codes to float32 first and one requantizing
after). On the first layers of the MobileNets (few channels, thousands of pixels) BLAS runs
at a few GMAC/s and the extra passes cost as much as the GEMM.

Blocking: the pixels go in blocks of PB; each block takes the output channels 8 at a time, and
for each 8 the input channels 4 at a time: one pass along the block loads 4 input rows and
updates 8 partial-sum rows (32 multiply-adds per 4 + 8 loads and 8 stores a vector), the 32
weights scalars hoisted out of the pass. The 8 partial rows live in a scratch row of 8 * PB
floats, PB apart: 8 rows of the output at its runtime stride could overlap as far as LLVM
knows, and the loop stayed scalar (3-6 GMAC/s measured); rows a constant PB apart it can prove
disjoint. The epilogue then reads each partial row once and writes the output row. Indices are
unsigned (see kernels_dw: Numba's negative-index wrap-around turns loads into gathers).

Channels past the last multiple of 8 take one output row at a time (4 loads per 4 FMAs).

float32: the sum is float32 in k order (contracted to FMAs), the bias added in the epilogue
(kernels_fp32.act_run, every activation); it differs from the reference by float32 rounding,
like the BLAS routes.

int8: the codes (x_q unshifted, w_q) are multiplied as float32: every product and partial sum
is an integer below K * 128 * 127 < 2**24 for K <= kernels_int8.EXACT_K, so the float32 sum is
exact in any order and the epilogue (kernels_int8._epilogue on acc + bias_adj, bias_adj =
b_q - x_zp * wsum) is bit for bit the reference's.

Work split: one task an (image, pixel block); `parts` parts (prange) take contiguous runs of
tasks, each with its own scratch row.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from pocket.infer.jit import kernel
from pocket.infer.kernels_fp32 import act_run
from pocket.infer.kernels_int8 import _code, _epilogue, total32

PB = 256  # pixels a block: the 8 partial rows are 8 KB, the 4 input rows' block 4 KB
ROWS = 8  # output channels a pass
U = np.uint64


@njit(cache=True, inline="always")
def _w4(w, o, k):
    return (np.float32(w[o, k]), np.float32(w[o, k + 1]), np.float32(w[o, k + 2]),
            np.float32(w[o, k + 3]))


@njit(cache=True, inline="always")
def _fma4(acc, i, first, wr, x0, x1, x2, x3):
    s = wr[0] * x0 + wr[1] * x1 + wr[2] * x2 + wr[3] * x3
    acc[i] = s if first else acc[i] + s


@njit(cache=True, inline="always")
def _pass8(acc, xf, r, pn, n, w, o0, k0, first):
    """One pass along the block: acc rows 0..7 (+)= w[o0 + r, k0:k0 + 4] @ x rows k0..k0+3
    (x row k0 at xf[r]). `first` is a literal at each call site: the loop has no test."""
    # NOTE: one assignment each: unpacking a tuple of these tuples trips parfors' array analysis
    w0 = _w4(w, o0, k0)
    w1 = _w4(w, o0 + 1, k0)
    w2 = _w4(w, o0 + 2, k0)
    w3 = _w4(w, o0 + 3, k0)
    w4 = _w4(w, o0 + 4, k0)
    w5 = _w4(w, o0 + 5, k0)
    w6 = _w4(w, o0 + 6, k0)
    w7 = _w4(w, o0 + 7, k0)
    for p in range(n):
        q = U(p)
        x0 = np.float32(xf[r + q])
        x1 = np.float32(xf[r + pn + q])
        x2 = np.float32(xf[r + U(2) * pn + q])
        x3 = np.float32(xf[r + U(3) * pn + q])
        _fma4(acc, q, first, w0, x0, x1, x2, x3)
        _fma4(acc, q + U(PB), first, w1, x0, x1, x2, x3)
        _fma4(acc, q + U(2 * PB), first, w2, x0, x1, x2, x3)
        _fma4(acc, q + U(3 * PB), first, w3, x0, x1, x2, x3)
        _fma4(acc, q + U(4 * PB), first, w4, x0, x1, x2, x3)
        _fma4(acc, q + U(5 * PB), first, w5, x0, x1, x2, x3)
        _fma4(acc, q + U(6 * PB), first, w6, x0, x1, x2, x3)
        _fma4(acc, q + U(7 * PB), first, w7, x0, x1, x2, x3)


@njit(cache=True, inline="always")
def _rows8(acc, xf, xb, pn, n, w, o0, k_n):
    """acc[r*PB + p] = sum over k of w[o0 + r, k] * x[k, p] for r < 8, p < n (x row k of the
    block at xf[xb + k*pn])."""
    k0 = 0
    if k_n >= 4:
        _pass8(acc, xf, xb, pn, n, w, o0, 0, True)
        k0 = 4
    while k0 + 4 <= k_n:
        _pass8(acc, xf, xb + U(k0) * pn, pn, n, w, o0, k0, False)
        k0 += 4
    for k in range(k0, k_n):
        r = xb + U(k) * pn
        for j in range(ROWS):
            wj = np.float32(w[o0 + j, k])
            a = U(j * PB)
            if k == 0:
                for p in range(n):
                    acc[a + U(p)] = wj * np.float32(xf[r + U(p)])
            else:
                for p in range(n):
                    acc[a + U(p)] += wj * np.float32(xf[r + U(p)])


@njit(cache=True, inline="always")
def _pass1(acc, xf, r, pn, n, w, o, k0, first):
    wr = _w4(w, o, k0)
    for p in range(n):
        q = U(p)
        _fma4(acc, q, first, wr, np.float32(xf[r + q]), np.float32(xf[r + pn + q]),
              np.float32(xf[r + U(2) * pn + q]), np.float32(xf[r + U(3) * pn + q]))


@njit(cache=True, inline="always")
def _row1(acc, xf, xb, pn, n, w, o, k_n):
    """acc[p] = sum over k of w[o, k] * x[k, p] for p < n: one channel (the last o % 8)."""
    k0 = 0
    if k_n >= 4:
        _pass1(acc, xf, xb, pn, n, w, o, 0, True)
        k0 = 4
    while k0 + 4 <= k_n:
        _pass1(acc, xf, xb + U(k0) * pn, pn, n, w, o, k0, False)
        k0 += 4
    for k in range(k0, k_n):
        wk = np.float32(w[o, k])
        r = xb + U(k) * pn
        if k == 0:
            for p in range(n):
                acc[U(p)] = wk * np.float32(xf[r + U(p)])
        else:
            for p in range(n):
                acc[U(p)] += wk * np.float32(xf[r + U(p)])


@njit(cache=True, inline="always")
def _span(part, parts, tasks):
    return part * tasks // parts, (part + 1) * tasks // parts


@kernel(contract=True)
def pw_conv(out, x, w, b, act, alpha, acc):
    """x (N, K, P) f32, w (O, K) f32, b (O,) or empty -> out (N, O, P) f32 = activation(w @ x
    + b) (act an ACT code); acc (parts, 8 * PB) f32 scratch, one row a part."""
    n, k_n, p_n = x.shape
    o_n = w.shape[0]
    has_bias = b.shape[0] > 0
    xf, of = x.reshape(-1), out.reshape(-1)
    nb = -(-p_n // PB)
    parts = acc.shape[0]
    pn = U(p_n)
    for part in prange(parts):
        a = acc[part]
        t0, t1 = _span(part, parts, n * nb)
        for t in range(t0, t1):
            i, p0 = t // nb, (t % nb) * PB
            m = min(PB, p_n - p0)
            xb = U(i * k_n * p_n + p0)
            ob = i * o_n * p_n + p0
            o0 = 0
            while o0 + ROWS <= o_n:
                _rows8(a, xf, xb, pn, m, w, o0, k_n)
                for j in range(ROWS):
                    bo = b[o0 + j] if has_bias else np.float32(0.0)
                    act_run(of, ob + (o0 + j) * p_n, a, j * PB, m, bo, act, alpha)
                o0 += ROWS
            for o in range(o0, o_n):
                _row1(a, xf, xb, pn, m, w, o, k_n)
                bo = b[o] if has_bias else np.float32(0.0)
                act_run(of, ob + o * p_n, a, 0, m, bo, act, alpha)


@kernel(contract=True)
def pw_conv_q(out, x, w, bias_adj, m, to_int8, y_zp, lo, relu, acc):
    """x (N, K, P) i8 codes, w (O, K) i8 -> out (N, O, P) i8 or f32 through
    kernels_int8._epilogue (bias_adj, m, to_int8, y_zp, lo, relu as in kernels_int8.gemm_q),
    K <= kernels_int8.EXACT_K; acc (parts, 8 * PB) f32 scratch."""
    n, k_n, p_n = x.shape
    o_n = w.shape[0]
    xf, of = x.reshape(-1), out.reshape(-1)
    nb = -(-p_n // PB)
    parts = acc.shape[0]
    pn = U(p_n)
    for part in prange(parts):
        a = acc[part]
        t0, t1 = _span(part, parts, n * nb)
        for t in range(t0, t1):
            i, p0 = t // nb, (t % nb) * PB
            cnt = min(PB, p_n - p0)
            xb = U(i * k_n * p_n + p0)
            ob = i * o_n * p_n + p0
            o0 = 0
            while o0 + ROWS <= o_n:
                _rows8(a, xf, xb, pn, cnt, w, o0, k_n)
                for j in range(ROWS):
                    _requant_row(of, ob + (o0 + j) * p_n, a, j * PB, cnt, bias_adj[o0 + j],
                                 m[o0 + j], y_zp, lo, to_int8, relu)
                o0 += ROWS
            for o in range(o0, o_n):
                _row1(a, xf, xb, pn, cnt, w, o, k_n)
                _requant_row(of, ob + o * p_n, a, 0, cnt, bias_adj[o], m[o], y_zp, lo, to_int8,
                             relu)


@njit(cache=True, inline="always")
def _requant_row(of, d0, a, s0, cnt, badj, mo, y_zp, lo, to_int8, relu):
    d, s = U(d0), U(s0)
    if to_int8:
        for p in range(cnt):
            of[d + U(p)] = _code(total32(a[s + U(p)], badj), mo, y_zp, lo)
    else:
        # NOTE: float64(sum) + float64(badj) is the int64 total exactly (integers below
        # 2**53), one conversion a lane where the int64 route took two
        bf = np.float64(badj)
        for p in range(cnt):
            of[d + U(p)] = _epilogue(np.float64(a[s + U(p)]) + bf, mo, y_zp, lo, to_int8, relu)
