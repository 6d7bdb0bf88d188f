"""Engine kernels of the state-space family: the `ssm` recurrence one step at a time, and `glu`.

Twins of formats/reference_ssm.py. The recurrence keeps its state in float64 (two arrays, real
and imaginary): the state integrates over the whole sequence and its poles sit near the unit
circle, so float32 would drift on long windows; the inputs and outputs are float32.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from pocket.infer.jit import kernel
from pocket.infer.kernels_fp32 import exp32, fdiv


@kernel
def ssm_scan(y, x, da_re, da_im, w_re, w_im, d, s_re, s_im, reset, reverse, accumulate):
    """One direction of the diagonal state-space recurrence over a chunk of steps.

    x, y (N, L, H) float32; da, w (S, H) float64: dA and the read-out C dB, transposed; d (H,)
    float64 the skip; s (N, S, H) float64 the state, kept across calls unless `reset`. Per
    step: z = dA z + x_t, y_t = 2 Re(sum w z) (+ d x_t, or added to y when `accumulate`).

    NOTE: channels are the inner loop (the vector lanes: each reads its own x_t and sums its
    own states, in the order of k, as the reference does); along the states, a float64 sum
    per channel kept the loop scalar (47% of the ssm model's engine call at batch 64)."""
    n, length, h = x.shape
    ns = da_re.shape[0]
    xf, yf = x.reshape(-1), y.reshape(-1)
    dr, di, wr, wi = da_re.reshape(-1), da_im.reshape(-1), w_re.reshape(-1), w_im.reshape(-1)
    for b in prange(n):
        sr, si = s_re[b].reshape(-1), s_im[b].reshape(-1)
        if reset:
            sr[:] = 0.0
            si[:] = 0.0
        acc = np.empty(h)
        for step in range(length):
            t = length - 1 - step if reverse else step
            xo = np.uint64((b * length + t) * h)
            for c in range(h):
                acc[c] = 0.0
            for k in range(ns):
                o = np.uint64(k * h)
                for c in range(h):
                    q = o + np.uint64(c)
                    u = np.float64(xf[xo + np.uint64(c)])
                    zr = dr[q] * sr[q] - di[q] * si[q] + u
                    zi = dr[q] * si[q] + di[q] * sr[q]
                    sr[q] = zr
                    si[q] = zi
                    acc[c] += wr[q] * zr - wi[q] * zi
            for c in range(h):
                q = xo + np.uint64(c)
                if accumulate:
                    yf[q] = np.float32(np.float64(yf[q]) + 2.0 * acc[c])
                else:
                    yf[q] = np.float32(2.0 * acc[c] + d[c] * np.float64(xf[q]))


@kernel
def glu(y, x):
    """x (M, 2K, J) -> y (M, K, J) = first half * sigmoid(second half), in float32 on exp32
    (within a few ulp of the float64 formula; math.exp, a libm call an element, kept the loop
    scalar: 16% of the ssm model's engine call at batch 64)."""
    m, k2, j = x.shape
    half = (k2 // 2) * j
    xf, yf = x.reshape(-1), y.reshape(-1)
    for i in prange(m):
        a0, g0, y0 = np.uint64(i * 2 * half), np.uint64(i * 2 * half + half), np.uint64(i * half)
        for e in range(half):
            q = np.uint64(e)
            yf[y0 + q] = fdiv(xf[a0 + q], np.float32(1.0) + exp32(-xf[g0 + q]))
