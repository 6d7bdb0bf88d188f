"""float32 kernels of the sequence ops: layer norm, attention's softmax, embedding lookup.
Each is the optimized twin of its op (or of its part) in formats/reference_seqattn.py; sums run
in float64, like the other engine kernels, and nothing is allocated (attention's scores live in
the node's arena scratch)."""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from pocket.infer.jit import kernel
from pocket.infer.kernels_fp32 import act_inplace, erfc32, exp32, relu

_INV_SQRT2 = 1.0 / math.sqrt(2.0)


_SUMS = {"reassoc"}


@njit(cache=True, fastmath=_SUMS)
def _sum(row, n):
    # sum of row[:n] in float64, reassociated so that LLVM vectorizes it
    t = 0.0
    for j in range(n):
        t += row[j]
    return t


@njit(cache=True, fastmath=_SUMS)
def _sum_sq_dev(row, m):
    # sum of (row - m)^2 in float64, reassociated
    t = 0.0
    for j in range(row.shape[0]):
        c = row[j] - m
        t += c * c
    return t


@kernel
def layernorm(out, x, w, b, eps):
    """x (R, D) -> out (R, D): each row normalised (mean, biased var), then * w (D,) + b (D,).

    NOTE: the two sums in functions of their own with "reassoc" (NaN and inf still propagate):
    as plain loops they ran scalar, 4 ns an element at (1024, 64)."""
    r, d = x.shape
    for i in prange(r):
        row = x[i]
        m = _sum(row, d) / d
        inv = 1.0 / math.sqrt(_sum_sq_dev(row, m) / d + eps)
        dst = out[i]
        for j in range(d):
            dst[j] = (row[j] - m) * inv * w[j] + b[j]


_PROB_ROWS = 256  # rows of scores a task of attention_probs


@njit(cache=True)
def _exp_run(a, a0, n):
    # a[a0:a0 + n] = exp32 of itself: one flat vector loop (not reassociated: exp32's
    # Cody-Waite steps must keep their order)
    for i in range(n):
        k = np.uint64(a0 + i)
        a[k] = exp32(a[k])


@njit(cache=True, fastmath=_SUMS)
def _probs_block(sf, r0, r1, ls, scale, causal, lq):
    # rows [r0, r1) of the flat scores sf: shift by each row's max and scale, in place
    for row in range(r0, r1):
        base = np.uint64(row * ls)
        end = min(row % lq + 1, ls) if causal else ls
        m = np.float64(sf[base]) * scale
        for j in range(end):
            m = max(m, np.float64(sf[base + np.uint64(j)]) * scale)
        for j in range(end):
            k = base + np.uint64(j)
            sf[k] = np.float32(np.float64(sf[k]) * scale - m)


@njit(cache=True, fastmath=_SUMS)
def _norm_block(sf, r0, r1, ls, causal, lq):
    # rows [r0, r1): divide by the row sums (float64) over the keys each query sees, 0 after
    for row in range(r0, r1):
        base = np.uint64(row * ls)
        end = min(row % lq + 1, ls) if causal else ls
        t = 0.0
        for j in range(end):
            t += sf[base + np.uint64(j)]
        inv = 1.0 / t
        for j in range(end):
            k = base + np.uint64(j)
            sf[k] = np.float32(sf[k] * inv)
        for j in range(end, ls):
            sf[base + np.uint64(j)] = 0.0


@kernel
def attention_probs(s, scale, causal, lq):
    """s (R, S) = q k^T scores, rows r = (b, i) with query i = r % lq -> in place, the
    attention weights softmax(s * scale) over keys j (j <= i only when causal), 0 elsewhere;
    max-shifted, summed in float64. Attention is then two batched BLAS GEMMs around this.

    NOTE: three passes over a block of rows (the shift, exp32 over the whole block as one flat
    vector loop, the sums): rows are short (16 keys), and per row the loops' setup and
    remainders cost more than the exps (630-840 us at (4096, 16), this 245); the shifted
    score is taken in float64 and rounded once, so a weight moves by float32 rounding (with
    math.exp, a libm call an element, this was a quarter of a transformer's engine call)."""
    r, ls = s.shape
    sf = s.reshape(-1)
    for t in prange(-(-r // _PROB_ROWS)):
        r0 = t * _PROB_ROWS
        r1 = min(r, r0 + _PROB_ROWS)
        _probs_block(sf, r0, r1, ls, scale, causal, lq)
        # (masked keys are exp'd too, then zeroed: the block stays one run)
        _exp_run(sf, r0 * ls, (r1 - r0) * ls)
        _norm_block(sf, r0, r1, ls, causal, lq)


@kernel
def rows_bias_act(y, b, act, alpha):
    """y (R, O) f32 in place = activation(y + b (O,)) (b may be empty): a linear over
    (N, ..., in)'s epilogue, one pass a row on one array.

    NOTE: kernels_fp32.bias_act_rows given y as both out and input ran its bias loop scalar
    (LLVM's runtime alias check between two views of one buffer fails: 5x slower), and for
    an activation other than ReLU made a second pass; GELU (the transformer's MLP) is fused
    here, on erfc32, the others go through act_inplace after the bias."""
    r, o = y.shape
    yf = y.reshape(-1)
    has_bias = b.shape[0] > 0
    for i in prange(r):
        base = np.uint64(i * o)
        if act == 5:
            for j in range(o):
                k = base + np.uint64(j)
                v = yf[k] + (b[j] if has_bias else np.float32(0.0))
                yf[k] = np.float32(0.5) * v * erfc32(v * np.float32(-_INV_SQRT2))
        elif act == 1:
            for j in range(o):
                k = base + np.uint64(j)
                yf[k] = relu(yf[k] + (b[j] if has_bias else np.float32(0.0)))
        else:
            if has_bias:
                for j in range(o):
                    k = base + np.uint64(j)
                    yf[k] = yf[k] + b[j]
            if act != 0:
                act_inplace(yf, base, o, np.float32(0.0), act, alpha)


@njit(cache=True)
def gather_rows(out, ids, w):
    """ids (R,) int, w (V, D) -> out (R, D) = w[ids]; returns the position of the first id
    outside [0, V), or -1 (then out is complete)."""
    nv = w.shape[0]
    for i in range(ids.shape[0]):
        t = ids[i]
        if t < 0 or t >= nv:
            return i
        out[i, :] = w[t]
    return -1


@kernel(contract=True)
def linear_rows_small(y, x, wt, b, act, alpha):
    """x (R, K), wt (K, O) (the weights transposed), b (O,) or empty -> y (R, O) =
    activation(x @ wt + b), one row at a time: a few rows' linear in one call, its bias and
    activation on the row in L1 (rows_bias_act's loops); float32 sums with FMA, as BLAS's."""
    r, k = x.shape
    o = wt.shape[1]
    yf, xf, wf = y.reshape(-1), x.reshape(-1), wt.reshape(-1)
    has_bias = b.shape[0] > 0
    for i in prange(r):
        yo = np.uint64(i * o)
        for j in range(o):
            yf[yo + np.uint64(j)] = b[j] if has_bias else np.float32(0.0)
        for kk in range(k):
            xv = xf[np.uint64(i * k + kk)]
            wo = np.uint64(kk * o)
            for j in range(o):
                yf[yo + np.uint64(j)] += xv * wf[wo + np.uint64(j)]
        if act == 5:
            for j in range(o):
                v = yf[yo + np.uint64(j)]
                yf[yo + np.uint64(j)] = np.float32(0.5) * v * erfc32(v * np.float32(-_INV_SQRT2))
        elif act == 1:
            for j in range(o):
                yf[yo + np.uint64(j)] = relu(yf[yo + np.uint64(j)])
        elif act != 0:
            act_inplace(yf, yo, o, np.float32(0.0), act, alpha)


@kernel
def swap_mid(out, x):
    """x (A, B, C, D) -> out (A, C, B, D) = x.transpose(0, 2, 1, 3): attention's head split
    and merge, as row copies of D floats (np.copyto of the transposed view took ~3 us a call
    at batch 1, more than the linear before it)."""
    a, bb, c, d = x.shape
    xf, of = x.reshape(-1), out.reshape(-1)
    for i in prange(a * c):
        ia, ic = i // c, i % c
        for ib in range(bb):
            src = np.uint64(((ia * bb + ib) * c + ic) * d)
            dst = np.uint64(((ia * c + ic) * bb + ib) * d)
            for j in range(d):
                of[dst + np.uint64(j)] = xf[src + np.uint64(j)]


@kernel
def swap_last(out, x):
    """x (B, L, D) -> out (B, D, L) = x.transpose(0, 2, 1): attention's keys laid out for a
    plain GEMM (np.matmul with a transposed view of k took 2.7x as long at (256, 16, 16))."""
    nb, ln, d = x.shape
    for i in prange(nb):
        xs, os_ = x[i], out[i]
        for j in range(ln):
            for t in range(d):
                os_[t, j] = xs[j, t]
