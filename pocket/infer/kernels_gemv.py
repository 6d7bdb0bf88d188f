"""float32 matrix-vector products on the portable path: a conv whose output is one pixel (the
1x1 convs of a squeeze-and-excitation block, over a globally pooled map) at batch 1.

    y[i, o] = act(b[o] + sum over k of w[o, k] * x[i, k])      w (O, K), the file's own layout

What it replaces there: kernels_tile's GEMM, whose tiles are 16 (or 8) pixels wide and ran a
single pixel through a zero-padded scratch (7 of 8 lanes idle, 50-66 us for MobileNetV3's
576 x 144 excitation convs), and BLAS's batched matmul (52 us for 144 x 576). Here each output
is a dot product along K that LLVM vectorizes on its own (`reassoc`: partial sums on vector
lanes, interleaved), reading the weights once, in order, as they lie in the file: no copy.

Exactness: each output is the float32 dot product in some order of its lanes (contracted to
FMAs where the CPU has them), the bias added after; it differs from formats/reference.py by
float32 rounding, like BLAS. Rows go four at a time from each task's first (ROWS apart), the
last 1-3 of O alone: the order depends on K and the row's place only, the same bytes for any
thread count.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from pocket.infer.jit import kernel
from pocket.infer.kernels_fp32 import act_inplace, relu

ROWS = 64  # outputs a task: ROWS * K weights, a few KB to a few hundred


@njit(cache=True, inline="always")
def _dot(w, r, x, i, k):
    acc = np.float32(0.0)
    for j in range(k):
        acc += w[r, j] * x[i, j]
    return acc


@njit(cache=True, inline="always")
def _dot4(w, r, x, i, k):
    """_dot of rows r..r+3 in one pass along K: x[i] read once for the four, and four streams
    of weights in flight where one ran at the memory's latency (a network's classifier, its
    weights from memory on every call: 1000 x 1280 425 -> 360 us, 1000 x 1024 377 -> 283)."""
    a0 = a1 = a2 = a3 = np.float32(0.0)
    for j in range(k):
        xv = x[i, j]
        a0 += w[r, j] * xv
        a1 += w[r + 1, j] * xv
        a2 += w[r + 2, j] * xv
        a3 += w[r + 3, j] * xv
    return a0, a1, a2, a3


@kernel(contract=True, reassoc=True)
def gemv(y, w, x, b, act, alpha):
    """y (N, O) = act(b + w (O, K) @ x[i]) for each row x[i] of x (N, K); b may be empty. The
    activation: ReLU on the sums, the others (kernels_fp32.act_inplace) over each task's run."""
    n, o = y.shape
    k = w.shape[1]
    has_bias = b.shape[0] > 0
    blocks = (o + ROWS - 1) // ROWS
    yf = y.reshape(-1)
    for t in prange(n * blocks):
        i, r0 = t // blocks, (t % blocks) * ROWS
        r1 = min(o, r0 + ROWS)
        r4 = r0 + (r1 - r0) // 4 * 4
        for r in range(r0, r4, 4):
            sums = _dot4(w, r, x, i, k)
            for q in range(4):
                v = sums[q] + (b[r + q] if has_bias else np.float32(0.0))
                y[i, r + q] = relu(v) if act == 1 else v
        for r in range(r4, r1):
            v = _dot(w, r, x, i, k) + (b[r] if has_bias else np.float32(0.0))
            y[i, r] = relu(v) if act == 1 else v
        if act > 1:
            act_inplace(yf, i * o + r0, r1 - r0, np.float32(0.0), act, alpha)
