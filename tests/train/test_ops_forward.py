"""Forwards against independent references: naive loops and closed-form math."""

import math

import numpy as np
import pytest

from pocket.train import backend
from pocket.train import functional as F
from pocket.train.tensor import Tensor


def naive_conv2d(x, w, b, s, p, d, g):
    # x (N, C, H, W), w (O, C/g, kh, kw) -> out (N, O, Ho, Wo), one output element at a time
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp_ = np.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])))
    ho = (h + 2 * p[0] - d[0] * (kh - 1) - 1) // s[0] + 1
    wo = (wd + 2 * p[1] - d[1] * (kw - 1) - 1) // s[1] + 1
    out = np.zeros((n, o, ho, wo))
    og = o // g
    for ni in range(n):
        for oc in range(o):
            grp = oc // og
            for i in range(ho):
                for j in range(wo):
                    acc = b[oc]
                    for ci in range(cg):
                        for u in range(kh):
                            for v in range(kw):
                                acc += (w[oc, ci, u, v]
                                        * xp_[ni, grp * cg + ci, i * s[0] + u * d[0],
                                              j * s[1] + v * d[1]])
                    out[ni, oc, i, j] = acc
    return out


def naive_pool(x, k, s, p, mode, include_pad=True, d=(1, 1)):
    n, c, h, w = x.shape
    ho = (h + 2 * p[0] - d[0] * (k[0] - 1) - 1) // s[0] + 1
    wo = (w + 2 * p[1] - d[1] * (k[1] - 1) - 1) // s[1] + 1
    out = np.zeros((n, c, ho, wo))
    for ni in range(n):
        for ci in range(c):
            for i in range(ho):
                for j in range(wo):
                    vals = []
                    for u in range(k[0]):
                        for v in range(k[1]):
                            hh, ww = i * s[0] - p[0] + u * d[0], j * s[1] - p[1] + v * d[1]
                            if 0 <= hh < h and 0 <= ww < w:
                                vals.append(x[ni, ci, hh, ww])
                    if mode == "max":
                        out[ni, ci, i, j] = max(vals)
                    else:
                        out[ni, ci, i, j] = sum(vals) / (k[0] * k[1] if include_pad else len(vals))
    return out


CONV = [((1, 3, 5, 7), (4, 3, 3, 2), (1, 1), (0, 0), (1, 1), 1),
        ((2, 4, 9, 8), (6, 2, 3, 3), (2, 2), (1, 1), (1, 1), 2),
        ((1, 3, 8, 7), (3, 1, 3, 3), (1, 2), (2, 1), (2, 2), 3),
        ((3, 2, 4, 4), (5, 2, 1, 1), (1, 1), (0, 0), (1, 1), 1)]


@pytest.mark.parametrize("case", CONV)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_conv2d_matches_naive_loops(xp, rng, case, dtype):
    xs, ws, s, p, d, g = case
    x, w, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0])
    ref = naive_conv2d(x, w, b, s, p, d, g)
    out = F.conv2d(*(Tensor(xp.asarray(a, dtype)) for a in (x, w, b)), s, p, d, g)
    assert out.dtype == dtype
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(out.numpy(), ref, rtol=tol, atol=tol)


def test_conv2d_chunking_does_not_change_the_result(xp, rng, monkeypatch):
    from pocket.train import conv

    x, w = rng.standard_normal((5, 3, 6, 6)), rng.standard_normal((4, 3, 3, 3))
    xt, wt = Tensor(xp.asarray(x), requires_grad=True), Tensor(xp.asarray(w), requires_grad=True)
    monkeypatch.setitem(conv.CONV_WORKSPACE_BYTES, "cpu", 1)  # one sample per chunk
    monkeypatch.setitem(conv.CONV_WORKSPACE_BYTES, "cuda", 1)
    y = F.conv2d(xt, wt, padding=1)
    (y * y).sum().backward()
    np.testing.assert_allclose(y.numpy(), naive_conv2d(x, w, np.zeros(4), (1, 1), (1, 1),
                                                       (1, 1), 1), atol=1e-10)
    gx, gw = xt.grad.copy(), wt.grad.copy()
    monkeypatch.setitem(conv.CONV_WORKSPACE_BYTES, "cpu", 1 << 30)
    monkeypatch.setitem(conv.CONV_WORKSPACE_BYTES, "cuda", 1 << 30)
    xt.grad = wt.grad = None
    y = F.conv2d(xt, wt, padding=1)
    (y * y).sum().backward()
    np.testing.assert_allclose(backend.to_numpy(xt.grad), backend.to_numpy(gx), atol=1e-10)
    np.testing.assert_allclose(backend.to_numpy(wt.grad), backend.to_numpy(gw), atol=1e-9)


@pytest.mark.parametrize("k,s,p,d", [((2, 2), (2, 2), (0, 0), (1, 1)),
                                     ((3, 3), (2, 2), (1, 1), (1, 1)),
                                     ((3, 2), (1, 2), (1, 0), (1, 1)),
                                     ((2, 2), (1, 1), (0, 0), (2, 2))])
def test_maxpool2d_matches_naive(xp, rng, k, s, p, d):
    x = rng.standard_normal((2, 3, 7, 6)).astype(np.float32)
    out = F.maxpool2d(Tensor(xp.asarray(x)), k, s, p, d)
    np.testing.assert_array_equal(out.numpy(), naive_pool(x, k, s, p, "max", d=d))


@pytest.mark.parametrize("inc", [True, False])
@pytest.mark.parametrize("k,s,p", [((2, 2), (2, 2), (0, 0)), ((3, 3), (2, 2), (1, 1)),
                                   ((2, 3), (1, 2), (1, 1))])
def test_avgpool2d_matches_naive(xp, rng, k, s, p, inc):
    x = rng.standard_normal((2, 3, 7, 6))
    out = F.avgpool2d(Tensor(xp.asarray(x)), k, s, p, inc)
    np.testing.assert_allclose(out.numpy(), naive_pool(x, k, s, p, "avg", inc), atol=1e-12)


def test_maxpool_propagates_nan(xp):
    x = np.zeros((1, 1, 2, 2), np.float32)
    x[0, 0, 1, 0] = np.nan
    assert np.isnan(F.maxpool2d(Tensor(xp.asarray(x)), 2).numpy()).all()


def test_batchnorm_closed_form_and_running_stats(xp, rng):
    x = rng.standard_normal((4, 3, 2, 5)) * 3 + 1
    g, b = rng.standard_normal(3), rng.standard_normal(3)
    rm, rv = xp.zeros(3), xp.ones(3)
    y = F.batchnorm(Tensor(xp.asarray(x)), Tensor(xp.asarray(g)), Tensor(xp.asarray(b)),
                    rm, rv, training=True, momentum=0.1, eps=1e-5)
    mu = x.mean(axis=(0, 2, 3))
    var = x.var(axis=(0, 2, 3))
    ref = (x - mu[:, None, None]) / np.sqrt(var[:, None, None] + 1e-5) * g[:, None, None]
    np.testing.assert_allclose(y.numpy(), ref + b[:, None, None], atol=1e-10)
    np.testing.assert_allclose(backend.to_numpy(rm), 0.1 * mu, atol=1e-12)
    unbiased = x.var(axis=(0, 2, 3), ddof=1)
    np.testing.assert_allclose(backend.to_numpy(rv), 0.9 + 0.1 * unbiased, atol=1e-12)
    y = F.batchnorm(Tensor(xp.asarray(x)), Tensor(xp.asarray(g)), Tensor(xp.asarray(b)),
                    rm, rv, training=False)
    rmn, rvn = backend.to_numpy(rm), backend.to_numpy(rv)
    ref = (x - rmn[:, None, None]) / np.sqrt(rvn[:, None, None] + 1e-5) * g[:, None, None]
    np.testing.assert_allclose(y.numpy(), ref + b[:, None, None], atol=1e-10)


def test_activations_closed_form(xp, rng):
    x = rng.standard_normal((4, 7)) * 3
    t = Tensor(xp.asarray(x))
    erf = np.vectorize(math.erf)
    np.testing.assert_allclose(F.gelu(t).numpy(), 0.5 * x * (1 + erf(x / math.sqrt(2))),
                               atol=1e-12)
    c = math.sqrt(2 / math.pi)
    np.testing.assert_allclose(F.gelu(t, "tanh").numpy(),
                               0.5 * x * (1 + np.tanh(c * (x + 0.044715 * x**3))), atol=1e-12)
    np.testing.assert_allclose(F.sigmoid(t).numpy(), 1 / (1 + np.exp(-x)), atol=1e-12)
    np.testing.assert_allclose(F.leaky_relu(t, 0.1).numpy(), np.where(x > 0, x, 0.1 * x))
    big = Tensor(xp.asarray([-1000.0, 1000.0]))
    np.testing.assert_array_equal(F.sigmoid(big).numpy(), [0.0, 1.0])
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(F.softmax(t).numpy(), e / e.sum(1, keepdims=True), atol=1e-12)


def test_cross_entropy_closed_form(xp, rng):
    x = rng.standard_normal((5, 4))
    t = np.array([0, 3, 1, 1, 2])
    logp = x - np.log(np.exp(x).sum(1, keepdims=True))
    nll = -logp[np.arange(5), t]
    ce = F.cross_entropy(Tensor(xp.asarray(x)), xp.asarray(t))
    np.testing.assert_allclose(ce.item(), nll.mean(), rtol=1e-12)
    smooth = 0.9 * nll - 0.1 * logp.mean(1)
    ce = F.cross_entropy(Tensor(xp.asarray(x)), xp.asarray(t), label_smoothing=0.1)
    np.testing.assert_allclose(ce.item(), smooth.mean(), rtol=1e-12)


def test_regression_losses_closed_form(xp, rng):
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    ta, tb = Tensor(xp.asarray(a)), Tensor(xp.asarray(b))
    d = a - b
    np.testing.assert_allclose(F.mse_loss(ta, tb).item(), (d**2).mean())
    np.testing.assert_allclose(F.l1_loss(ta, tb).item(), np.abs(d).mean())
    hub = np.where(np.abs(d) <= 0.5, 0.5 * d**2, 0.5 * (np.abs(d) - 0.25))
    np.testing.assert_allclose(F.huber_loss(ta, tb, delta=0.5).item(), hub.mean())


def test_dropout_scales_and_is_identity_in_eval(xp):
    x = Tensor(xp.ones((200, 50), dtype=np.float32))
    y = F.dropout(x, 0.25, training=True, rng=np.random.default_rng(0)).numpy()
    kept = y != 0
    assert abs(kept.mean() - 0.75) < 0.02
    np.testing.assert_allclose(y[kept], 1 / 0.75, rtol=1e-6)
    assert F.dropout(x, 0.25, training=False) is x
