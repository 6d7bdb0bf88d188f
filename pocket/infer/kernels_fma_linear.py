"""float32 linears of 16 rows or more on x86 with AVX-512 (routes.linear_fma), on kernels_fma's
tiles. A linear (N, K) @ W.T with N >= 16 rows runs as the GEMM W (O, K) @ x.T: the rows become
the pixels of the tiles (x.T copied, then the result copied back transposed with the bias and
activation), since W's rows are what the tile broadcasts from, read in place.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic

from pocket.infer.jit import kernel
from pocket.infer.kernels_fma import (
    _VF,
    BLOCK_K,
    GROUP_P,
    TILE_P,
    _channels,
    _gemm_block,
    _gemm_part,
    _gemm_split,
    _group,
    _rows_aligned,
    _tile_rows,
    _transposed,
)
from pocket.infer.kernels_fp32 import bias_act_run
from pocket.infer.kernels_vnni import _const, _ptr


def _make_transpose16():
    """dst[j, i] = src[i, j] for a 16 x 16 block of float32: rows of src lds bytes apart, rows
    of dst ldd bytes apart (addresses in bytes).

    Four butterfly stages (s = 8, 4, 2, 1) on the 16 row vectors: rows i and i + s swap the
    lanes l whose bit s differs from i's, which, over all four bits, is the transpose; 64
    two-vector shuffles per 256 floats."""

    @intrinsic
    def transpose16(typingctx, src, lds, dst, ldd):
        sig = types.void(*[types.intp] * 4)

        def codegen(context, builder, signature, args):
            src, lds, dst, ldd = args
            rows = [builder.load(_ptr(builder, builder.add(src, builder.mul(lds, _const(r))), _VF), align=4)
                    for r in range(16)]
            for r, v in enumerate(_transposed(builder, rows)):
                builder.store(v, _ptr(builder, builder.add(dst, builder.mul(ldd, _const(r))), _VF), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return transpose16


_transpose16 = _make_transpose16()


@kernel
def transpose_in(xt, x, parts):
    """x (N, K) -> xt (K, Mc) = x.T, its columns N..Mc zeros (the GEMM's last tile).

    16 x 16 blocks in registers (_transpose16), the rows and columns past the last whole
    block one by one. Parallel over `parts` groups of whole tiles of columns, as
    gemm_pixels splits its pixels, so that each core transposes the columns its GEMM reads.

    NOTE: 64 x 784 on one thread went 13.7 -> 7.7 us with the blocks, from the plain loop
    (which writes runs and reads strided). Split along K instead, both cores' blocks were
    slower than one core's plain loop in mlp fp32 at batch 64 (134 -> 143 us): each GEMM
    core then read half its columns from the other core's cache."""
    mc = xt.shape[1]
    n_p = (mc + TILE_P - 1) // TILE_P
    gp = (n_p + parts - 1) // parts
    n_g = (n_p + gp - 1) // gp
    for g in prange(n_g):  # _gemm_part's groups
        p0, p1 = _group(g, n_p, n_g)
        _transpose_part(xt, x, p0 * TILE_P, min(mc, p1 * TILE_P), 0, x.shape[1], False)


@njit(cache=True)
def _transpose_part(xt, x, c0, c1, j0, j1, rows_outer):
    """xt[j - j0, i] = x[i, j] for j0 <= j < j1 and c0 <= i < c1, zeros where i >= N.

    rows_outer: the 16 x 16 blocks a band of 16 rows of x at a time (for a block of K whose
    xt stays in L1: each row's loads then run along it, 64 x 784 in blocks of 128 columns
    8.3 -> 4.4 us); else a band of 16 columns at a time (for all of xt, written to L2:
    6.8 vs 7.7 us the other way)."""
    n, k = x.shape
    mc = xt.shape[1]
    xa, ta = np.int64(x.ctypes.data), np.int64(xt.ctypes.data)
    j16 = j0 + (j1 - j0) // 16 * 16
    r1 = max(c0, min(n, c1))  # rows of x in the part: c0..r1, then zero columns to c1
    w1 = c0 + (r1 - c0) // 16 * 16
    if rows_outer:
        for i0 in range(c0, w1, 16):
            for jb in range(j0, j16, 16):
                _transpose16(xa + (i0 * k + jb) * 4, k * 4, ta + ((jb - j0) * mc + i0) * 4, mc * 4)
    else:
        for jb in range(j0, j16, 16):
            for i0 in range(c0, w1, 16):
                _transpose16(xa + (i0 * k + jb) * 4, k * 4, ta + ((jb - j0) * mc + i0) * 4, mc * 4)
    for j in range(j0, j1):
        if j >= j16:
            for i in range(c0, w1):
                xt[j - j0, i] = x[i, j]
        for i in range(w1, r1):
            xt[j - j0, i] = x[i, j]
        for i in range(r1, c1):
            xt[j - j0, i] = np.float32(0.0)


@kernel
def gemm_rows(c, w, x, xt, offs, o, m, ldc, b, epi):
    """A linear's GEMM from its rows x (N, K): C (o, m) = W (o, K) @ x.T (gemm's arguments
    and epilogue), split along the channels into up to P = xt.shape[0] parts. Each part takes
    K a block of xt.shape[1] rows at a time (rows_block): it first transposes that block of x
    into its own xt[p] (transpose_in's layout), then runs its channels over it.

    NOTE: both cores of a channel-split GEMM read all of x.T: made by one transpose_in, half
    of it crossed from the other core's cache and the GEMM's parts waited on it (mlp fp32 at
    batch 64 on 2 threads: transpose 12 + GEMM 97 us). Each part transposing x for itself
    (7 us of work on each core, the same on both) took 84-88 us in all. By the block, the
    transposed rows are written to and read from L1, not L2."""
    parts = xt.shape[0]
    k = x.shape[1]
    n_p = (m + TILE_P - 1) // TILE_P
    tr = _tile_rows(m, n_p, o, True)
    n_o = min(parts, (o + tr - 1) // tr)
    kb = xt.shape[1]  # (not _block_k's: one half tile would take all of K, past the buffer)
    wa, ca, oa = np.int64(w.ctypes.data), np.int64(c.ctypes.data), np.int64(offs.ctypes.data)
    ba, relu = np.int64(b.ctypes.data), np.int64(epi == 2)
    for p in prange(n_o):
        buf = xt[p]
        for k0 in range(0, k, kb):
            nk = min(kb, k - k0)
            _transpose_part(buf, x, 0, m, k0, k0 + nk, True)
            # offs[k0] is k0 rows past the block's start: X's row 0 is that far before buf
            xb = np.int64(buf.ctypes.data) - k0 * m * 4
            o0, o1 = _channels(p, o, n_o, tr)
            _gemm_block(wa + k0 * 4, k, xb, oa + k0 * 8, nk, ca, ldc, k0, k0 + nk == k,
                        o0, o1, tr, 0, n_p, m, ba, epi, relu)


def rows_block(m: int, k: int) -> int:
    """The rows of K that gemm_rows transposes at a time for m columns: its xt[p] is (this, m).
    Never fewer for more columns (the engine sizes the buffers at its largest batch)."""
    return min(k, BLOCK_K // 2 if -(-m // TILE_P) <= 2 else BLOCK_K)


@kernel
def bias_act_t(out, c, b, act, alpha):
    """c (O, Mc), row i's sums in column i -> out (N, O) = act(c[:, :N].T + b) (b may be
    empty). Overwrites c.

    NOTE: the epilogue along c's rows (contiguous, vectorized), then a plain transposing copy
    written in runs like transpose_in: 4x faster than both in one strided loop."""
    n, o = out.shape
    has_bias = b.shape[0] > 0
    for j in prange(o):
        bias_act_run(c[j], c[j], n, b[j] if has_bias else np.float32(0.0), act, alpha)
    for i in prange(n):
        for j in range(o):
            out[i, j] = c[j, i]


_bias_act_t_serial = bias_act_t.serial


@kernel
def gemm_t(out, c, w, x, offs, o, m, ldw, ldc, b, act, alpha):
    """gemm of one item (gemm's arguments, no epilogue) into c, then bias_act_t(out, c, b,
    act, alpha), its epilogue on one thread: a linear's GEMM and its transposing epilogue in
    one call, for the last linear of a plan (mlp's 10 classes at batch 64: one call of
    ~0.6 us less, of ~190)."""
    tr = _tile_rows(m, GROUP_P, o, _rows_aligned(x, offs, 0, 1))
    n_g, n_o = _gemm_split(1, o, m, tr)
    for t in prange(n_g * n_o):
        _gemm_part(t, c, w, x, offs, o, m, 0, 0, ldw, 0, ldc, b, 0, n_g, n_o, tr)
    _bias_act_t_serial(out, c, b, act, alpha)
