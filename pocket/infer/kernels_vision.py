"""Kernels of the vision ops: standalone clip, broadcast mul, channel shuffle and slice. Each is
the optimized twin of its op in formats/reference_vision.py (relu6 and silu fused into a layer
are kernels_fp32.activate's codes 9 and 10). The shuffle and the slice move int8 codes as well
as floats (one compiled twin per dtype).
"""

from __future__ import annotations

import numpy as np
from numba import prange

from pocket.infer.jit import kernel


@kernel
def clip(out, x, lo, hi):
    """out (M,) = min(max(x (M,), lo), hi), NaN kept; lo, hi float32 (rounding is monotone, so
    clipping the float32 x by the rounded bounds equals the reference's float64 clip)."""
    for i in prange(x.shape[0]):
        v = x[i]
        out[i] = lo if v < lo else (hi if v > hi else v)


@kernel
def mul(out, a, b):
    """out (M,) = a (M,) * b (M,): the float32 product is the float64 one rounded once."""
    for i in prange(out.shape[0]):
        out[i] = a[i] * b[i]


@kernel
def mul_rows(out, x, s):
    """out (R, P) = x (R, P) * s (R,): a squeeze-and-excitation gate, (N*C, H*W) * (N*C,)."""
    r, p = out.shape
    for i in prange(r):
        si = s[i]
        for j in range(p):
            out[i, j] = x[i, j] * si


@kernel
def gate_weights(out, w, s):
    """out (N, O, K) = w (O, K) * s (N, K): a 1x1 conv's weights times image i's gate of each
    input channel (see lowering_vision.gated_convs), float32 products."""
    n, o, k = out.shape
    of, wf, sf = out.reshape(-1), w.reshape(-1), s.reshape(-1)
    for t in prange(n * o):
        dst, src, g = np.uint64(t * k), np.uint64(t % o * k), np.uint64(t // o * k)
        for j in range(k):
            u = np.uint64(j)
            of[dst + u] = wf[src + u] * sf[g + u]


@kernel
def mul_bcast(out, a, b):
    """out (A, B, C, D) = a * b, both already broadcast to out's shape (strides 0 where a dim
    is broadcast; any strides)."""
    n0, n1, n2, n3 = out.shape
    for r in prange(n0 * n1):
        i, j = r // n1, r % n1
        for k in range(n2):
            for m in range(n3):
                out[i, j, k, m] = a[i, j, k, m] * b[i, j, k, m]


@kernel
def channel_shuffle(out, x, g):
    """x (N, C, P) -> out (N, C, P): out[:, i*g + k] = x[:, k*(C/g) + i] (f32 or i8)."""
    n, c, p = x.shape
    cg = c // g
    for r in prange(n * c):
        b, oc = r // c, r % c
        ic = (oc % g) * cg + oc // g
        src, dst = x[b, ic], out[b, oc]
        for j in range(p):
            dst[j] = src[j]


@kernel
def slice_cols(out, x, start):
    """x (R, M) -> out (R, L) = x[:, start:start + L]; a slice along an axis viewed so that the
    axis and everything after it are the columns (f32 or i8)."""
    r, l = out.shape
    for i in prange(r):
        for j in range(l):
            out[i, j] = x[i, start + j]
