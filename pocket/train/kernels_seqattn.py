"""Numba kernels for layer norm and attention's softmax on the CPU, forward and backward, one
pass a row each. Shapes are in the comments; the naive NumPy twins are in the tests.

NOTE: a transformer step at digits_vit.toml's width spent more time in NumPy's reductions
along short rows (D = 64 features, S = 16 keys: 90 reduce calls a step, the max over 16 keys
0.3 ms a call) and their temporaries than in the linears; one pass a row keeps a row in cache.
Statistics and row sums accumulate in float64 in both dtypes, and may be reassociated
("reassoc", as kernels_cpu's batchnorm), so LLVM vectorizes them; NaN and inf still propagate.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from pocket.train.kernels_gelu import exp32

_SUMS = {"reassoc"}


@njit(cache=True, fastmath=_SUMS)
def _row_sum(row):
    t = 0.0
    for j in range(row.shape[0]):
        t += row[j]
    return t


@njit(cache=True, fastmath=_SUMS)
def layer_norm_forward(x, w, b, eps, y, xhat, invstd):
    # x (R, D), w/b (D,) -> y, xhat (R, D), invstd (R,): statistics over each row
    r, d = x.shape
    for i in range(r):
        row = x[i]
        s = 0.0
        for j in range(d):
            s += row[j]
        mu = s / d
        v = 0.0
        for j in range(d):
            c = row[j] - mu
            v += c * c
        inv = 1.0 / math.sqrt(v / d + eps)
        invstd[i] = inv
        for j in range(d):
            h = (row[j] - mu) * inv
            xhat[i, j] = h
            y[i, j] = xhat[i, j] * w[j] + b[j]


@njit(cache=True, fastmath=_SUMS)
def layer_norm_backward(gy, xhat, invstd, w, gx, gw, gb):
    # gy, xhat (R, D), invstd (R,), w (D,) -> gx (R, D), gw/gb (D,) float64 sums over rows
    r, d = gy.shape
    for i in range(r):
        sg = 0.0
        sgx = 0.0
        for j in range(d):
            g = gy[i, j]
            h = xhat[i, j]
            gw[j] += g * h
            gb[j] += g
            gj = g * w[j]
            sg += gj
            sgx += gj * h
        mg = sg / d
        mgx = sgx / d
        inv = invstd[i]
        for j in range(d):
            gx[i, j] = inv * (gy[i, j] * w[j] - mg - xhat[i, j] * mgx)


@njit(cache=True)
def softmax_rows32(s):
    # s (R, S) f32 -> softmax of each row, in place (max-shifted, summed in float64)
    r, n = s.shape
    for i in range(r):
        row = s[i]
        m = row[0]
        for j in range(n):
            m = max(m, row[j])
        for j in range(n):
            v = row[j] - m
            # NOTE: exp32 clamps its argument at -86.9 (1.9e-38): a masked key (-inf) is 0
            row[j] = np.float32(0.0) if v < np.float32(-86.9) else exp32(v)
        # NOTE: the sum in a function of its own: exp32's Cody-Waite steps must not be
        # reassociated, the sum may be (a float64 sum in the loop above kept it scalar)
        inv = np.float32(1.0 / _row_sum(row))
        for j in range(n):
            row[j] *= inv


@njit(cache=True, fastmath=_SUMS)
def softmax_rows64(s):
    # s (R, S) f64 -> softmax of each row, in place (max-shifted)
    r, n = s.shape
    for i in range(r):
        row = s[i]
        m = row[0]
        for j in range(n):
            m = max(m, row[j])
        t = 0.0
        for j in range(n):
            e = math.exp(row[j] - m)
            row[j] = e
            t += e
        for j in range(n):
            row[j] /= t


@njit(cache=True, fastmath=_SUMS)
def softmax_backward_rows(p, gp, scale):
    # p, gp (R, S) -> gp = scale * p * (gp - sum(gp * p)) per row, in place
    r, n = p.shape
    for i in range(r):
        t = 0.0
        for j in range(n):
            t += gp[i, j] * p[i, j]
        for j in range(n):
            gp[i, j] = scale * (p[i, j] * (gp[i, j] - t))
