"""Open-set metrics against brute force: every threshold enumerated, every pair compared, every
ranking walked, on small synthetic data (no scikit-learn)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pocket.train import metrics_embed as M


def data(seed, n=40, d=3, k=4, noise=0.8):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, k, n)
    centres = rng.normal(size=(k, d))
    return centres[y] + noise * rng.normal(size=(n, d)), y


def brute_pairs(emb, y):
    gen, imp = [], []
    for i, j in itertools.combinations(range(len(y)), 2):
        a, b = emb[i], emb[j]
        s = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
        (gen if y[i] == y[j] else imp).append(s)
    return np.array(gen), np.array(imp)


@pytest.mark.parametrize("seed", [0, 1])
def test_verification_against_enumerated_thresholds(seed):
    emb, y = data(seed)
    gen, imp = M.pair_scores(emb, y)
    bg, bi = brute_pairs(emb, y)
    np.testing.assert_allclose(np.sort(gen), np.sort(bg), atol=1e-12)
    np.testing.assert_allclose(np.sort(imp), np.sort(bi), atol=1e-12)
    # ties on purpose: rounded scores
    gen, imp = np.round(gen, 1), np.round(imp, 1)
    cands = [np.inf, *sorted(set(gen) | set(imp))]
    for far in (1e-2, 0.05, 0.3):
        best = max(np.mean(gen >= t) for t in cands if np.mean(imp >= t) <= far)
        assert M.tar_at_far(gen, imp, far)[0] == pytest.approx(best)
    auc = np.mean([1.0 if g > i else 0.5 if g == i else 0.0 for g in gen for i in imp])
    assert M.roc_auc(gen, imp) == pytest.approx(auc)
    gaps = [(abs(np.mean(imp >= t) - np.mean(gen < t)), t) for t in sorted(set(gen) | set(imp))]
    gap, t = min(gaps)
    e, th = M.eer(gen, imp)
    assert th == pytest.approx(t)
    assert e == pytest.approx((np.mean(imp >= t) + np.mean(gen < t)) / 2)


def test_separable_scores_are_perfect():
    gen, imp = np.array([0.9, 0.8, 0.95]), np.array([0.1, -0.3, 0.5, 0.2])
    assert M.roc_auc(gen, imp) == 1.0
    assert M.tar_at_far(gen, imp, 0.0) == (1.0, 0.5)
    assert M.eer(gen, imp)[0] == 0.0


@pytest.mark.parametrize("seed", [0, 2])
def test_retrieval_against_a_walk_of_each_ranking(seed):
    emb, y = data(seed, n=25)
    sims = emb @ emb.T / np.outer(np.linalg.norm(emb, axis=1), np.linalg.norm(emb, axis=1))
    top1, aps = [], []
    for q in range(len(y)):
        others = sorted((j for j in range(len(y)) if j != q), key=lambda j: -sims[q, j])
        top1.append(y[others[0]] == y[q])
        hits, precs = 0, []
        for rank, j in enumerate(others, 1):
            if y[j] == y[q]:
                hits += 1
                precs.append(hits / rank)
        if precs:
            aps.append(np.mean(precs))
    got1, got_map = M.retrieval(emb, y)
    assert got1 == pytest.approx(np.mean(top1))
    assert got_map == pytest.approx(np.mean(aps))
    nn = M.nearest(emb)
    assert all(nn[q] != q and sims[q, nn[q]] == max(sims[q, j] for j in range(len(y)) if j != q)
               for q in range(len(y)))


def test_evaluate_has_every_key():
    emb, y = data(3, n=30)
    out = M.evaluate(emb, y)
    assert tuple(out) == M.KEYS
    assert 0.0 <= out["eer"] <= 1.0 and 0.5 < out["auc"] <= 1.0
