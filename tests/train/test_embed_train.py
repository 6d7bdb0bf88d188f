"""The embedding family in train: l2norm and the ArcFace margin against float64 finite
differences, the ArcFace loss against the paper's formula written out in NumPy, and the
EmbeddingNet tracing to a graph without its class head."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pocket.train import functional_embed as FE
from pocket.train import nn
from pocket.train.gradcheck import gradcheck
from pocket.train.nn_embed import build_embedding
from pocket.train.tensor import Tensor
from pocket.train.trace import trace


def test_l2norm_gradcheck_both_branches():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 5))
    x[1] *= 0.05  # norm ~0.1 < eps: the clamped branch y = x / eps
    assert np.linalg.norm(x[1]) < 0.4 and np.linalg.norm(x[[0, 2, 3]], axis=1).min() > 0.6
    gradcheck(lambda t: FE.l2_normalize(t, axis=1, eps=0.5), [x])
    gradcheck(lambda t: FE.l2_normalize(t, axis=0), [rng.normal(size=(3, 2))])


def test_l2norm_forward_is_the_definition():
    x = np.array([[3.0, 4.0], [0.0, 0.0]], np.float32)
    y = FE.l2_normalize(Tensor(x), axis=1).data
    np.testing.assert_allclose(y, [[0.6, 0.8], [0.0, 0.0]], rtol=1e-7)


@pytest.mark.parametrize("easy", [False, True])
def test_arc_margin_gradcheck_off_the_kink(easy):
    m = 0.5
    th = math.cos(math.pi - m)
    c = np.array([0.9, 0.3, -0.2, -0.95, 0.5])  # both branches, none within 0.02 of a kink
    kink = 0.0 if easy else th
    assert np.abs(c - kink).min() > 0.02
    gradcheck(lambda t: FE.arc_margin(t, m, easy), [c])


def paper_arcface(x, w, y, s, m, easy):
    # insightface's ArcMarginProduct, in NumPy float64, written from the paper's code
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    wn = w / np.linalg.norm(w, axis=1, keepdims=True)
    cosine = xn @ wn.T
    sine = np.sqrt(np.clip(1.0 - cosine**2, 0, 1))
    phi = cosine * math.cos(m) - sine * math.sin(m)
    if easy:
        phi = np.where(cosine > 0, phi, cosine)
    else:
        phi = np.where(cosine > math.cos(math.pi - m), phi, cosine - math.sin(math.pi - m) * m)
    one_hot = np.eye(w.shape[0])[y]
    out = s * (one_hot * phi + (1.0 - one_hot) * cosine)
    z = out - out.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return -logp[np.arange(len(y)), y].mean()


@pytest.mark.parametrize("easy", [False, True])
def test_arcface_loss_matches_the_paper_and_gradchecks(easy):
    rng = np.random.default_rng(3)
    x, w = rng.normal(size=(6, 4)), rng.normal(size=(5, 4))
    y = np.array([0, 1, 2, 3, 4, 1])
    # a target pointing away from its centre: the fallback branch is exercised too
    x[5] = -w[1] + 0.3 * rng.normal(size=4)
    loss = FE.arcface_loss(Tensor(x), Tensor(w), y, s=8.0, m=0.5, easy_margin=easy)
    np.testing.assert_allclose(float(loss.data), paper_arcface(x, w, y, 8.0, 0.5, easy),
                               rtol=1e-10)
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    wn = w / np.linalg.norm(w, axis=1, keepdims=True)
    c = (xn * wn[y]).sum(axis=1)
    assert np.abs(c - (0.0 if easy else math.cos(math.pi - 0.5))).min() > 0.02
    gradcheck(lambda a, b: FE.arcface_loss(a, b, y, 8.0, 0.5, easy), [x, w])


def test_softmax_loss_gradcheck():
    rng = np.random.default_rng(4)
    y = np.array([0, 2, 1])
    gradcheck(lambda a, b, c: FE.softmax_loss(a, b, c, y),
              [rng.normal(size=(3, 4)), rng.normal(size=(3, 4)), rng.normal(size=3)])


@pytest.mark.parametrize("loss", ["arcface", "softmax"])
def test_embedding_net_traces_without_its_head(loss):
    rng = np.random.default_rng(0)
    backbone = nn.Sequential(nn.Flatten(), nn.Linear(12, 8, rng=rng), nn.ReLU(),
                             nn.Linear(8, 5, rng=rng))
    model = build_embedding(backbone, 3, 5, loss, rng=rng)
    assert any(k.startswith("head.") for k in model.state_dict())
    g, params = trace(model, (3, 4))
    assert g.nodes[-1].op == "l2norm" and not any(k.startswith("head") for k in params)
    x = rng.normal(size=(2, 3, 4)).astype(np.float32)
    from pocket.formats import reference as ref

    model.eval()
    np.testing.assert_allclose(ref.run(g, params, x)["output"], model(Tensor(x)).data,
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("easy", [False, True])
def test_arcface_runs_on_the_array_module(xp, easy):
    from pocket.train import backend

    rng = np.random.default_rng(5)
    x, w = rng.normal(size=(5, 4)).astype(np.float32), rng.normal(size=(3, 4)).astype(np.float32)
    y = np.array([0, 1, 2, 1, 0])
    tx = Tensor(xp.asarray(x), requires_grad=True)
    tw = Tensor(xp.asarray(w), requires_grad=True)
    loss = FE.arcface_loss(FE.l2_normalize(tx, axis=1), tw, xp.asarray(y), 8.0, 0.4, easy)
    loss.backward()
    assert float(loss.data) == pytest.approx(paper_arcface(x, w, y, 8.0, 0.4, easy), rel=1e-5)
    assert isinstance(tx.grad, xp.ndarray) and isinstance(tw.grad, xp.ndarray)
    assert np.all(np.isfinite(backend.to_numpy(tw.grad)))
