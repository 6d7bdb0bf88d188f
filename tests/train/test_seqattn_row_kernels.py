"""kernels_seqattn's row kernels (layer norm forward/backward, softmax forward/backward)
against naive NumPy twins written here, float32 and float64, odd row lengths, masked keys."""

from __future__ import annotations

import numpy as np
import pytest

from pocket.train import kernels_seqattn as K

RNG = np.random.default_rng(17)


def _ln_twin(x, w, b, eps, gy):
    x64, w64, g64 = x.astype(np.float64), w.astype(np.float64), gy.astype(np.float64)
    mu = x64.mean(axis=1, keepdims=True)
    inv = 1 / np.sqrt(((x64 - mu) ** 2).mean(axis=1, keepdims=True) + eps)
    xhat = (x64 - mu) * inv
    g = g64 * w64
    gx = inv * (g - g.mean(axis=1, keepdims=True) - xhat * (g * xhat).mean(axis=1, keepdims=True))
    return xhat * w64 + b, xhat, inv[:, 0], gx, (g64 * xhat).sum(axis=0), g64.sum(axis=0)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 2e-5)])
@pytest.mark.parametrize("rows,d", [(1, 1), (7, 5), (3, 64)])
def test_layer_norm_rows(dtype, tol, rows, d):
    x = (RNG.standard_normal((rows, d)) * 3 + 1).astype(dtype)
    w, b = RNG.standard_normal(d).astype(dtype), RNG.standard_normal(d).astype(dtype)
    gy = RNG.standard_normal((rows, d)).astype(dtype)
    y, xhat, inv = np.empty_like(x), np.empty_like(x), np.empty(rows, dtype)
    K.layer_norm_forward(x, w, b, 1e-5, y, xhat, inv)
    gx, gw, gb = np.empty_like(x), np.zeros(d), np.zeros(d)
    K.layer_norm_backward(gy, xhat, inv, w, gx, gw, gb)
    want = _ln_twin(x, w, b, 1e-5, gy)
    for got, ref in zip((y, xhat, inv, gx, gw, gb), want, strict=True):
        np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * max(1.0, np.abs(ref).max()))


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-14), (np.float32, 1e-6)])
def test_softmax_rows_and_backward(dtype, tol):
    s = (RNG.standard_normal((6, 11)) * 8).astype(dtype)
    s[1, 3:] = -np.inf  # a causal row: masked keys get exactly 0
    s[2, :] = 90.0  # large equal scores: exp shifted by the max
    want = np.exp(s.astype(np.float64) - s.max(axis=1, keepdims=True))
    want /= want.sum(axis=1, keepdims=True)
    p = s.copy()
    (K.softmax_rows32 if dtype == np.float32 else K.softmax_rows64)(p)
    np.testing.assert_allclose(p, want, rtol=tol, atol=tol)
    assert np.all(p[1, 3:] == 0)
    gp = RNG.standard_normal(p.shape).astype(dtype)
    p64, g64 = p.astype(np.float64), gp.astype(np.float64)
    ref = 0.25 * p64 * (g64 - (g64 * p64).sum(axis=1, keepdims=True))
    K.softmax_backward_rows(p, gp, dtype(0.25))
    np.testing.assert_allclose(gp, ref, rtol=tol, atol=tol)
