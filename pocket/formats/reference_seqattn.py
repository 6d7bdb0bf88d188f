"""The reference (the executable meaning, float64 inside) of the sequence and attention ops:
layernorm, embedding, matmul, transpose, attention. See formats/reference.py."""

from __future__ import annotations

import math

import numpy as np

from pocket.formats import ops
from pocket.formats.errors import FormatError


def _f64(x) -> np.ndarray:
    return np.asarray(x, np.float64)


@ops.register("reference", "layernorm")
def layernorm(a, x, w, b, **_):
    """(x - mean) / sqrt(var + eps) * w + b, mean and (biased) var over dims axis..end."""
    x = _f64(x)
    axes = tuple(range(a.get("axis", -1) % x.ndim, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mean) / np.sqrt(var + a.get("eps", 1e-5)) * _f64(w) + _f64(b)
    return y.astype(np.float32)


@ops.register("reference", "embedding")
def embedding(a, ids, w, **_):
    """w[ids]; an id outside [0, V) is a FormatError (never NumPy's wrap-around)."""
    ids = np.asarray(ids)
    v = w.shape[0]
    bad = (ids < 0) | (ids >= v)
    if bad.any():
        raise FormatError(f"embedding id {int(ids[bad].flat[0])} is outside [0, {v})")
    return np.asarray(w, np.float32)[ids.astype(np.int64)]


@ops.register("reference", "matmul")
def matmul(a, x, y, **_):
    return np.matmul(_f64(x), _f64(y)).astype(np.float32)


@ops.register("reference", "transpose")
def transpose(a, x, **_):
    return np.ascontiguousarray(np.transpose(x, a["perm"]))


@ops.register("reference", "attention")
def attention(a, q, k, v, **_):
    """softmax(q k^T * scale + mask) v per (batch, head), written out one query at a time."""
    q, k, v = _f64(q), _f64(k), _f64(v)
    n, h, lq, d = q.shape
    scale = a.get("scale") or 1.0 / math.sqrt(d)
    out = np.zeros((n, h, lq, v.shape[3]))
    for i in range(lq):
        s = np.einsum("nhd,nhsd->nhs", q[:, :, i], k) * scale
        if a.get("causal", False):
            s[:, :, i + 1:] = -np.inf  # key j > query i is the future
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        out[:, :, i] = np.einsum("nhs,nhsd->nhd", p, v)
    return out.astype(np.float32)
