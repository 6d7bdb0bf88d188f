"""Engine kernels of the sequence convs: conv1d's im2col (fp32 and int8 codes), its direct
loops (for C/groups == 1), and the global max over time. Each has a naive NumPy twin in
tests/infer/test_seqconv_kernels.py; the whole ops are tested against formats/reference.py.

conv1d runs as im2col into the tap-major columns (C*K, N*Lo) plus one BLAS GEMM per group
(NumPy's matmul with out=, as kernels_fp32's conv2d), then kernels_fp32.bias_act (fp32) or
kernels_int8.requant_sum (int8) lays the (O, N*Lo) sums out as (N, O, Lo). The pools run as
the 2-D pool kernels on a height-1 view, and global_avgpool1d as kernels_fp32.global_avgpool.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from pocket.infer.jit import kernel
from pocket.infer.kernels_fp32 import activate, nanmax
from pocket.infer.kernels_int8 import _code, _epilogue, total32


@kernel
def im2col1d(col, x, k, s, pl, d, pad):
    """x (N, C, L) f32 or i8 -> col (C*K, N*Lo) f32: col[c*K + j, b*Lo + t] = x[b, c, t*s - pl
    + j*d], `pad` outside (0, or x_zp for int8 codes, which the bias then folds out)."""
    n, c, length = x.shape
    lo = col.shape[1] // n
    pv = np.float32(pad)
    for r in prange(c * k):
        ch, j = r // k, r % k
        off = j * d - pl
        # the steps t whose input t*s + off lies inside [0, L)
        t0 = min(lo, 0 if off >= 0 else -(off // s))
        t1 = (length - 1 - off) // s + 1 if length - 1 - off >= 0 else 0
        t1 = min(lo, max(t0, t1))
        for b in range(n):
            row = col[r, b * lo:(b + 1) * lo]
            xs = x[b, ch]
            for t in range(t0):
                row[t] = pv
            if s == 1:  # a contiguous run: a loop LLVM vectorizes
                src = xs[t0 + off:t1 + off]
                for t in range(t1 - t0):
                    row[t0 + t] = np.float32(src[t])
            else:
                for t in range(t0, t1):
                    row[t] = np.float32(xs[t * s + off])
            for t in range(t1, lo):
                row[t] = pv


@kernel
def conv1d_direct(out, x, w, b, s, pl, d, act, alpha):
    """x (N, C, L), w (O, C/g, K), b (O,) or empty -> out (N, O, Lo), float64 sums.

    Direct loops: where im2col buys nothing (C/groups == 1: depthwise and its multiples).
    """
    n, c, length = x.shape
    o, cg, k = w.shape
    lo = out.shape[2]
    og = o // (c // cg)
    for no in prange(n * o):
        bi, oc = no // o, no % o
        c0 = (oc // og) * cg
        bo = b[oc] if b.shape[0] > 0 else 0.0
        for t in range(lo):
            acc = 0.0
            for ci in range(cg):
                for j in range(k):
                    i = t * s - pl + j * d
                    if 0 <= i < length:
                        acc += x[bi, c0 + ci, i] * w[oc, ci, j]
            out[bi, oc, t] = activate(acc + bo, act, alpha)


@kernel
def to_f32(out, x):
    """out (M,) f32 = x (M,) i8: an int8 weight's codes for the float32 GEMM (exact)."""
    for i in prange(x.shape[0]):
        out[i] = np.float32(x[i])


@kernel
def global_maxpool1d(out, x):
    """x (N, C, L) -> out (N, C), the max over L; a NaN anywhere in a row wins."""
    n, c, length = x.shape
    for nc in prange(n * c):
        row = x[nc // c, nc % c]
        m = row[0]
        for i in range(1, length):
            m = nanmax(m, row[i])
        out[nc // c, nc % c] = m


@kernel
def pad_rows(xpad, x, pl, lp, pad):
    """x (N, C, L) f32 or i8 -> xpad (C, R) f32: channel c's row holds the N sequences back to
    back, each padded to lp = pl + L + pr with `pad` (pl of them before it; 0, or x_zp for int8
    codes), then `pad` to R >= N*lp.

    The layout of kernels_fma.gemm reading a stride-1 conv1d's input in place: tap j of
    channel c is the row at c*R + j*d, and output column b*lp + t (t < Lo) is sequence b's
    step t; the columns between sequences are discarded by the epilogue.
    """
    n, c, length = x.shape
    r = xpad.shape[1]
    z = np.float32(pad)
    # NOTE: unsigned flat indices: with signed ones Numba's negative-index wrap kept the copy
    # scalar (7 us a call at batch 1, more than the GEMM after it)
    xf, pf = x.reshape(-1), xpad.reshape(-1)
    for ch in prange(c):
        row = np.uint64(ch * r)
        for b in range(n):
            base = row + np.uint64(b * lp)
            for t in range(pl):
                pf[base + np.uint64(t)] = z
            src, dst = np.uint64((b * c + ch) * length), base + np.uint64(pl)
            for t in range(length):
                pf[dst + np.uint64(t)] = np.float32(xf[src + np.uint64(t)])
            for t in range(pl + length, lp):
                pf[base + np.uint64(t)] = z
        for t in range(n * lp, r):
            pf[row + np.uint64(t)] = z


@kernel
def requant_one(out, y, cb, bias_adj, m, to_int8, y_zp, lo, relu):
    """y (O, cols) f32, one GEMM's sums of int8 codes (exact integers: K <= EXACT_K) ->
    out (N, O, P) i8 or f32, the row of (sequence i, channel o) at y[o, i*cb:i*cb + P]:
    kernels_int8.requant_sum's result for one chunk of K, bit for bit.

    NOTE: to int8 the int32 total (kernels_int8.total32) and the float32 epilogue; to float32
    the sum plus the bias adjustment in float64 (exact: integers below 2**53), not through
    int64: the float-int64 conversions kept requant_sum's loop scalar (45% of tcn's int8
    engine call at batch 64)."""
    n, o, p = out.shape
    for r in prange(n * o):
        b, oc = r // o, r % o
        mo = m[oc]
        dst, row = out[b, oc], y[oc, b * cb:b * cb + p]
        if to_int8:
            for i in range(p):
                dst[i] = _code(total32(row[i], bias_adj[oc]), mo, y_zp, lo)
        else:
            badj = np.float64(bias_adj[oc])
            for i in range(p):
                dst[i] = _epilogue(np.float64(row[i]) + badj, mo, y_zp, lo, to_int8, relu)
