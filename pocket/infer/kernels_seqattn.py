"""float32 kernels of the sequence ops: layer norm, attention, embedding lookup. Each is the
optimized twin of its op in formats/reference_seqattn.py; sums run in float64, like the other
engine kernels, and nothing is allocated (the scores live in the node's arena scratch)."""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from pocket.infer.jit import kernel


@kernel
def layernorm(out, x, w, b, eps):
    """x (R, D) -> out (R, D): each row normalised (mean, biased var), then * w (D,) + b (D,)."""
    r, d = x.shape
    for i in prange(r):
        row = x[i]
        m = 0.0
        for j in range(d):
            m += row[j]
        m /= d
        var = 0.0
        for j in range(d):
            t = row[j] - m
            var += t * t
        inv = 1.0 / math.sqrt(var / d + eps)
        dst = out[i]
        for j in range(d):
            dst[j] = (row[j] - m) * inv * w[j] + b[j]


@kernel
def attention(out, q, k, v, s, scale, causal):
    """q (B, L, D), k (B, S, D), v (B, S, Dv), s (B*L, S) float64 scratch -> out (B, L, Dv) =
    softmax(q k^T * scale [keys j <= i when causal]) v, one query row per iteration."""
    nb, lq, d = q.shape
    ls, dv = k.shape[1], v.shape[2]
    for r in prange(nb * lq):
        bi, i = r // lq, r % lq
        end = min(i + 1, ls) if causal else ls
        sr, qr, dst = s[r], q[bi, i], out[bi, i]
        m = -np.inf
        for j in range(end):
            kr = k[bi, j]
            acc = 0.0
            for c in range(d):
                acc += np.float64(qr[c]) * kr[c]
            acc *= scale
            sr[j] = acc
            m = max(m, acc)
        tot = 0.0
        for j in range(end):
            e = math.exp(sr[j] - m)
            sr[j] = e
            tot += e
        for c in range(dv):
            dst[c] = 0.0
        if end == 0:  # a causal query before the first key (L > S never gets here)
            continue
        inv = 1.0 / tot
        for j in range(end):
            p = np.float32(sr[j] * inv)
            vr = v[bi, j]
            for c in range(dv):
                dst[c] += p * vr[c]


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
