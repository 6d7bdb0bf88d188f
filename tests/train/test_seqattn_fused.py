"""FS.self_attention, the fused CPU path of MultiheadAttention (one GEMM for q/k/v, no head
split/merge copies): float64 gradcheck on odd shapes, and the composed ops (linear, reshape,
transpose, attention) on the same weights as its reference."""

import numpy as np
import pytest

from pocket.train import functional as F
from pocket.train import functional_seqattn as FS
from pocket.train import nn_seqattn as NS
from pocket.train.gradcheck import gradcheck
from pocket.train.tensor import Tensor


def _inputs(rng, n, length, e, dtype=np.float64):
    x = rng.standard_normal((n, length, e))
    ws = [rng.standard_normal(s) / np.sqrt(e) for _ in range(3) for s in ((e, e), (e,))]
    return [a.astype(dtype) for a in (x, *ws)]


def _composed(x, wq, bq, wk, bk, wv, bv, heads, causal=False, dropout_p=0.0, rng=None):
    n, length, e = x.shape

    def split(t):
        return t.reshape(n, length, heads, e // heads).transpose(0, 2, 1, 3)

    y = FS.attention(split(F.linear(x, wq, bq)), split(F.linear(x, wk, bk)),
                     split(F.linear(x, wv, bv)), causal, None, dropout_p, rng)
    return y.transpose(0, 2, 1, 3).reshape(n, length, e)


@pytest.mark.parametrize(("n", "length", "e", "heads"), [(2, 3, 6, 2), (1, 1, 4, 1),
                                                          (3, 5, 6, 3), (1, 4, 2, 2)])
@pytest.mark.parametrize("causal", [False, True])
def test_self_attention_gradcheck(rng, n, length, e, heads, causal):
    gradcheck(lambda *a: FS.self_attention(*a, heads=heads, causal=causal),
              _inputs(rng, n, length, e))


def test_self_attention_dropout_gradcheck(rng):
    def fn(*a):
        return FS.self_attention(*a, heads=2, dropout_p=0.3, rng=np.random.default_rng(3))

    gradcheck(fn, _inputs(rng, 2, 4, 4))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("causal", "dropout_p"), [(False, 0.0), (True, 0.0), (False, 0.25)])
def test_self_attention_matches_the_composed_ops(rng, dtype, causal, dropout_p):
    arrays = _inputs(rng, 3, 7, 8, dtype)
    gy = rng.standard_normal((3, 7, 8)).astype(dtype)
    results = []
    for fn in (FS.self_attention, _composed):
        ts = [Tensor(a.copy(), requires_grad=True) for a in arrays]
        y = fn(*ts, heads=4, causal=causal, dropout_p=dropout_p, rng=np.random.default_rng(5))
        y.backward(gy)
        results.append([y.data] + [t.grad for t in ts])
    tol = {"rtol": 1e-12, "atol": 1e-12} if dtype == np.float64 else {"rtol": 2e-5, "atol": 2e-6}
    for got, want in zip(*results, strict=True):
        np.testing.assert_allclose(got, want, **tol)


def test_frozen_projections_get_no_gradient(rng):
    x, *ws = (Tensor(a) for a in _inputs(rng, 2, 3, 4))
    x.requires_grad = True
    ws[2].requires_grad = True  # only wk
    FS.self_attention(x, *ws, heads=2).sum().backward()
    assert x.grad is not None and ws[2].grad is not None
    assert all(w.grad is None for i, w in enumerate(ws) if i != 2)


def test_multihead_attention_takes_the_fused_path_only_on_plain_linears(rng, monkeypatch):
    m = NS.MultiheadAttention(8, 2, rng=rng)
    x = Tensor(rng.standard_normal((2, 5, 8)).astype(np.float32))
    assert m._fused(x)
    y = m(x)
    assert y.node.parents[0].op == "self_attention"  # out_proj's input
    monkeypatch.setattr(NS.MultiheadAttention, "_fused", lambda self, x: False)
    np.testing.assert_allclose(m(x).data, y.data, rtol=1e-5, atol=1e-6)

    class Wrapped(NS.Linear):  # as LoRA's wrappers: not a plain Linear
        pass

    monkeypatch.undo()
    m.k_proj.__class__ = Wrapped
    assert not m._fused(x)
