"""BLAS GEMMs split across Numba's threads: the portable path's large GEMMs in a team call.

Where the engine runs BLAS on the calling thread, its pool pinned to one thread (plans of
mostly small GEMMs on 2+ threads, see pools.spin_policy), a GEMM had the second core idle:
MobileNetV2-0.5's 24 GEMMs, half its time, ran on one thread while OpenMP's threads spun.
Waking BLAS's own pool beside Numba's was slower still (each starved the other). So the engine
binds such a GEMM (np.matmul(a, b, out=c) with float32 matrices of unit stride along one axis)
as `gemm_parts`: each of Numba's threads calls the loaded OpenBLAS's cblas_sgemm on its own
block of the output (columns, rows, or whole matrices of a batch), through the C entry point
(blas_libs.find_sgemm, a ctypes function: Numba calls it without the GIL or Python).

Exactness: each output element is one BLAS dot product along K, as in np.matmul, but OpenBLAS
may order a block's sums by the block's shape: the results can differ from np.matmul's (a
1-thread engine's) by float32 rounding, as any BLAS with another thread count does. The same
parts give the same bytes, run together or one after another (the serial twin, or a pool of
one), so a plan's team and solo calls (pools.Pace) agree exactly.
"""

from __future__ import annotations

from functools import partial

import numpy as np
from numba import njit, prange

from pocket.infer.blas_libs import NO_TRANS, ROW_MAJOR, TRANS, find_sgemv
from pocket.infer.jit import kernel
from pocket.infer.kernels_fp32 import bias_act_run

# a part's share of the split dimension: whole cache lines of columns, whole rows of 8
COL_ALIGN, ROW_ALIGN = 16, 8
# the split dimension's extent below which a part would be too thin to pay its call
MIN_COLS, MIN_ROWS = 64, 16
U = np.uint64
def _matrix(x: np.ndarray, rows: int, cols: int) -> tuple[int, int] | None:
    """(transposed, leading dimension) of a logical rows x cols float32 matrix x (the last two
    axes) as cblas reads it, or None when neither axis has unit stride."""
    s0, s1 = x.strides[-2], x.strides[-1]
    item = x.itemsize
    if s1 == item or cols == 1:
        ld = s0 // item if rows > 1 else cols
        return (0, ld) if s0 % item == 0 and ld >= max(cols, 1) else None
    if s0 == item or rows == 1:
        ld = s1 // item
        return (1, ld) if s1 % item == 0 and ld >= max(rows, 1) else None
    return None


def plan(a: np.ndarray, b: np.ndarray, out: np.ndarray, threads: int) -> tuple | None:
    """The geometry gemm_parts takes for np.matmul(a, b, out=out) split for `threads` threads,
    or None where it cannot (other dtypes or layouts, more than one batch axis, too little to
    split): (batch, m, n, k, ta, tb, lda, ldb, ldc, a's batch step, b's, out's (bytes),
    columns (1) or rows (0), parts)."""
    if any(x.dtype != np.float32 for x in (a, b, out)) or out.ndim > 3 or a.ndim > 3 or b.ndim > 3:
        return None
    if a.ndim < 2 or b.ndim < 2 or out.ndim < 2:
        return None
    m, k = a.shape[-2:]
    n = b.shape[-1]
    batch = out.shape[0] if out.ndim == 3 else 1
    if b.shape[-2] != k or out.shape[-2:] != (m, n):
        return None
    steps = []
    for x in (a, b, out):
        if x.ndim == 3 and x.shape[0] not in (1, batch):
            return None
        steps.append(x.strides[0] if x.ndim == 3 and x.shape[0] == batch and batch > 1 else 0)
    if min(steps) < 0:
        return None
    if out.ndim == 2 and (a.ndim == 3 or b.ndim == 3):
        return None
    ma, mb, mc = _matrix(a, m, k), _matrix(b, k, n), _matrix(out, m, n)
    if ma is None or mb is None or mc is None or mc[0] != 0:
        return None
    # NOTE: each part packs its own copy of the other operand (a column block packs all of
    # a's rows, a row block all of b's columns): split the longer side, so that the copies are
    # of the smaller operand, and parts run one after another (a solo call, see pools.Pace)
    # cost about one call (MobileNetV2's 1280 x 160 @ 160 x 16 by columns: 1.2x as long)
    if m == 1 or n == 1:
        # NOTE: a matrix-vector product (see plan_gemv): BLAS's gemv streams the matrix once;
        # sgemm packed its blocks first (MobileNetV2's 1 x 1280 @ 1280 x 1000 classifier split
        # in two took 349 us, np.matmul's gemv 276)
        return None
    if batch >= threads:
        cols, parts = 1, 1
    elif n >= max(m, MIN_COLS * threads):
        cols, parts = 1, threads
    elif m >= MIN_ROWS * threads:
        cols, parts = 0, threads
    elif n >= MIN_COLS * threads:
        cols, parts = 1, threads
    else:
        return None
    return (batch, m, n, k, ma[0], mb[0], ma[1], mb[1], mc[1], *steps, cols, parts)


@kernel
def gemm_parts(sgemm, a, b, out, geo, ov, bias, act, alpha):
    """out = a @ b (np.matmul's batch semantics) as `parts` blocks a matrix, each one cblas_sgemm
    call (geo: see plan); with act >= 0 (a kernels_fp32.ACT code) each block then goes through
    activation(block + bias of its row) (bias empty: none) while it is in cache, ov being out
    as (batch, m, n) (the pass a conv's bias_act made over the whole output after the GEMM)."""
    batch, m, n, k, ta, tb, lda, ldb, ldc, sa, sb, sc, cols, parts = geo
    # (unsigned throughout: Numba types uintp + int64 as float64)
    pa, pb, pc = a.ctypes.data, b.ctypes.data, out.ctypes.data
    opa, opb = TRANS if ta else NO_TRANS, TRANS if tb else NO_TRANS
    span = n if cols else m
    align = COL_ALIGN if cols else ROW_ALIGN
    has_bias = bias.shape[0] > 0
    for task in prange(batch * parts):
        i, p = task // parts, task % parts
        lo = _edge(span, parts, p, align)
        hi = _edge(span, parts, p + 1, align)
        if hi <= lo:
            continue
        xa, xb, xc = pa + U(i * sa), pb + U(i * sb), pc + U(i * sc)
        if cols:
            sgemm(ROW_MAJOR, opa, opb, m, hi - lo, k, np.float32(1.0), xa, lda,
                  xb + U(lo * 4 * (ldb if tb else 1)), ldb, np.float32(0.0), xc + U(lo * 4), ldc)
            r0, r1, c0, c1 = 0, m, lo, hi
        else:
            sgemm(ROW_MAJOR, opa, opb, hi - lo, n, k, np.float32(1.0),
                  xa + U(lo * 4 * (1 if ta else lda)), lda, xb, ldb, np.float32(0.0),
                  xc + U(lo * 4 * ldc), ldc)
            r0, r1, c0, c1 = lo, hi, 0, n
        if act >= 0:
            for r in range(r0, r1):
                row = ov[i, r, c0:c1]
                bias_act_run(row, row, c1 - c0, bias[r] if has_bias else np.float32(0.0), act,
                             alpha)


@njit(cache=True, inline="always")
def _edge(span, parts, p, align):
    """Where part p of `parts` starts along a dimension of `span`: an even share rounded down
    to `align` (the end for p == parts)."""
    if p >= parts:
        return span
    return (span * p // parts) // align * align


# a vector-matrix product splits from this many outputs a thread (each part streams its own
# rows of the weights: memory-bound, two cores read them faster than one)
MIN_GEMV_COLS = 128


def plan_gemv(a: np.ndarray, b: np.ndarray, out: np.ndarray, threads: int) -> tuple | None:
    """The geometry of gemv_parts for np.matmul(a, b, out=out) with a (1, K), b (K, N) and out
    (1, N) float32, or None: (n, k, b transposed, ldb, a's element step, parts)."""
    if (a.ndim, b.ndim, out.ndim) != (2, 2, 2) or any(x.dtype != np.float32 for x in (a, b, out)):
        return None
    k, n = b.shape
    if a.shape != (1, k) or out.shape != (1, n) or n < MIN_GEMV_COLS * threads:
        return None
    mb = _matrix(b, k, n)
    inc = a.strides[1] // a.itemsize
    if mb is None or out.strides[1] != out.itemsize or a.strides[1] % a.itemsize or inc < 1:
        return None
    return n, k, mb[0], mb[1], inc, threads


@kernel
def gemv_parts(sgemv, a, b, out, geo):
    """out (1, N) = a (1, K) @ b (K, N) as `parts` blocks of outputs, each one cblas_sgemv
    call on its own columns of b (geo: see plan_gemv)."""
    n, k, tb, ldb, inc, parts = geo
    pa, pb, pc = a.ctypes.data, b.ctypes.data, out.ctypes.data
    for p in prange(parts):
        lo = _edge(n, parts, p, COL_ALIGN)
        hi = _edge(n, parts, p + 1, COL_ALIGN)
        if hi <= lo:
            continue
        if tb:  # b stored (N, K) by rows: out[lo:hi] = rows lo..hi of it times a
            sgemv(ROW_MAJOR, NO_TRANS, hi - lo, k, np.float32(1.0), pb + U(lo * 4 * ldb), ldb,
                  pa, inc, np.float32(0.0), pc + U(lo * 4), 1)
        else:  # b (K, N) by rows: out[lo:hi] = its columns lo..hi, transposed, times a
            sgemv(ROW_MAJOR, TRANS, k, hi - lo, np.float32(1.0), pb + U(lo * 4), ldb,
                  pa, inc, np.float32(0.0), pc + U(lo * 4), 1)


NO_EPILOGUE = (np.zeros(0, np.float32), -1, 0.0)


def split_call(sgemm, matmul, threads: int, after=None) -> tuple | None:
    """(gemm_parts or gemv_parts call, whether it took `after` in) for a bound
    np.matmul(a, b, out=out) of `threads` threads, or None where it does not split (see plan,
    plan_gemv). `after`, the call that
    follows it, is taken into the GEMM's epilogue when it is kernels_fp32.bias_act over that
    same output with one bias a row of each matrix (a 1x1 conv's bias and activation)."""
    from pocket.infer import kernels_fp32 as kf

    if len(matmul.args) != 2 or set(matmul.keywords) != {"out"}:
        return None
    (a, b), out = matmul.args, matmul.keywords["out"]
    geo = plan(a, b, out, threads)
    if geo is None:
        vgeo = plan_gemv(a, b, out, threads)
        sgemv = find_sgemv() if vgeo is not None else None
        return None if sgemv is None else (partial(gemv_parts, sgemv, a, b, out, vgeo), False)
    batch, m, n = geo[:3]
    ov = out.reshape(batch, m, n) if out.flags.c_contiguous else None
    epilogue, took = NO_EPILOGUE, False
    if after is not None and after.func is kf.bias_act and ov is not None and not after.keywords:
        dst, y, rb, cb, bias, act, alpha = after.args
        if (dst.ctypes.data == out.ctypes.data and dst.shape == (batch, m, n)
                and dst.flags.c_contiguous and y.ctypes.data == out.ctypes.data
                and y.shape == (batch * m, n) and rb == m and cb == 0
                and bias.shape[0] in (0, m)):
            epilogue, took = (bias, act, alpha), True
    if ov is None:
        ov = np.zeros((1, 1, 1), np.float32)  # (unused: no epilogue)
    return partial(gemm_parts, sgemm, a, b, out, geo, ov, *epilogue), took
