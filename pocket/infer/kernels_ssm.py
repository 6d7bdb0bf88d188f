"""Engine kernels of the state-space family: the `ssm` recurrence one step at a time, and `glu`.

Twins of formats/reference_ssm.py. The recurrence keeps its state in float64 (two arrays, real
and imaginary): the state integrates over the whole sequence and its poles sit near the unit
circle, so float32 would drift on long windows; the inputs and outputs are float32.
"""

from __future__ import annotations

import math

import numpy as np
from numba import prange

from pocket.infer.jit import kernel


@kernel
def ssm_scan(y, x, da_re, da_im, w_re, w_im, d, s_re, s_im, reset, reverse, accumulate):
    """One direction of the diagonal state-space recurrence over a chunk of steps.

    x, y (N, L, H) float32; da, w (H, S) float64: dA and the read-out C dB; d (H,) float64 the
    skip; s (N, H, S) float64 the state, kept across calls unless `reset`. Per step:
    z = dA z + x_t, y_t = 2 Re(sum w z) (+ d x_t, or added to y when `accumulate`)."""
    n, length, h = x.shape
    ns = da_re.shape[1]
    for i in prange(n * h):
        b = i // h
        c = i % h
        if reset:
            for k in range(ns):
                s_re[b, c, k] = 0.0
                s_im[b, c, k] = 0.0
        for step in range(length):
            t = length - 1 - step if reverse else step
            u = np.float64(x[b, t, c])
            acc = 0.0
            for k in range(ns):
                zr = da_re[c, k] * s_re[b, c, k] - da_im[c, k] * s_im[b, c, k] + u
                zi = da_re[c, k] * s_im[b, c, k] + da_im[c, k] * s_re[b, c, k]
                s_re[b, c, k] = zr
                s_im[b, c, k] = zi
                acc += w_re[c, k] * zr - w_im[c, k] * zi
            if accumulate:
                y[b, t, c] = np.float32(np.float64(y[b, t, c]) + 2.0 * acc)
            else:
                y[b, t, c] = np.float32(2.0 * acc + d[c] * u)


@kernel
def glu(y, x):
    """x (M, 2K, J) -> y (M, K, J) = first half * sigmoid(second half), in float64."""
    m, k2, j = x.shape
    k = k2 // 2
    for i in prange(m):
        for a in range(k):
            for c in range(j):
                g = np.float64(x[i, k + a, c])
                y[i, a, c] = np.float32(np.float64(x[i, a, c]) / (1.0 + math.exp(-g)))
