"""float32 kernels of the sequence ops: layer norm, attention's softmax, embedding lookup.
Each is the optimized twin of its op (or of its part) in formats/reference_seqattn.py; sums run
in float64, like the other engine kernels, and nothing is allocated (attention's scores live in
the node's arena scratch)."""

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
def attention_probs(s, scale, causal, lq):
    """s (R, S) = q k^T scores, rows r = (b, i) with query i = r % lq -> in place, the
    attention weights softmax(s * scale) over keys j (j <= i only when causal), 0 elsewhere;
    max-shifted, summed in float64. Attention is then two batched BLAS GEMMs around this."""
    r, ls = s.shape
    for row in prange(r):
        sr = s[row]
        end = min(row % lq + 1, ls) if causal else ls
        m = -np.inf
        for j in range(end):
            m = max(m, np.float64(sr[j]) * scale)
        tot = 0.0
        for j in range(end):
            e = math.exp(np.float64(sr[j]) * scale - m)
            sr[j] = e
            tot += e
        inv = 1.0 / tot
        for j in range(end):
            sr[j] = sr[j] * inv
        for j in range(end, ls):
            sr[j] = 0.0


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
