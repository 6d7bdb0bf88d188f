"""Open-set metrics of an embedding: verification over all pairs, retrieval by nearest
neighbours. NumPy only; `compare` reads them too.

The score of a pair is the cosine of the two embeddings. A pair is genuine when both samples
share a class, an impostor pair otherwise; "accept" means score > threshold.

    TAR at FAR f    the largest share of genuine pairs accepted while at most f of the impostor
                    pairs are: the threshold is the (floor(f * impostors) + 1)-th highest
                    impostor score, accepting only what is strictly above it
    ROC AUC         P(genuine score > impostor score), ties counting one half (Mann-Whitney)
    EER             where the false accept and false reject rates meet: over the candidate
                    thresholds (every score, accepting score >= t) the one with the smallest
                    |FAR - FRR|, EER = (FAR + FRR) / 2 there; `eer_threshold` is that t
    top-1           each sample's nearest other sample has its class
    mAP             mean over samples of the average precision of the ranking of all others
"""

from __future__ import annotations

import numpy as np

# Keys of `evaluate` (the trainer's val_/test_ metrics, in this order).
KEYS = ("tar_far1e-2", "tar_far1e-3", "auc", "eer", "eer_threshold", "top1", "map")


def unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64).reshape(len(x), -1)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def pair_scores(emb: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(genuine, impostor) cosine scores over every unordered pair i < j."""
    e = unit(emb)
    sim = e @ e.T
    i, j = np.triu_indices(len(e), k=1)
    same = labels[i] == labels[j]
    s = sim[i, j]
    return s[same], s[~same]


def tar_at_far(genuine: np.ndarray, impostor: np.ndarray, far: float) -> tuple[float, float]:
    """(TAR, threshold): accept score > threshold with at most `far` of impostors accepted."""
    imp = np.sort(impostor)[::-1]
    k = int(np.floor(far * len(imp) + 1e-9))
    if k >= len(imp):
        return 1.0, -np.inf
    t = float(imp[k])
    return float(np.mean(genuine > t)), t


def roc_auc(genuine: np.ndarray, impostor: np.ndarray) -> float:
    """Mann-Whitney U / (n_g n_i) from average ranks of the pooled scores."""
    s = np.concatenate([genuine, impostor])
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s))
    sorted_s = s[order]
    # average rank for ties: the mean of the first and last position of each run
    first = np.searchsorted(sorted_s, sorted_s, side="left")
    last = np.searchsorted(sorted_s, sorted_s, side="right")
    ranks[order] = (first + last + 1) / 2.0
    ng, ni = len(genuine), len(impostor)
    u = ranks[:ng].sum() - ng * (ng + 1) / 2.0
    return float(u / (ng * ni))


def eer(genuine: np.ndarray, impostor: np.ndarray) -> tuple[float, float]:
    """(EER, threshold) over the candidate thresholds t = every score, accept score >= t."""
    t = np.unique(np.concatenate([genuine, impostor]))
    g, i = np.sort(genuine), np.sort(impostor)
    far = 1.0 - np.searchsorted(i, t, side="left") / len(i)  # impostors >= t
    frr = np.searchsorted(g, t, side="left") / len(g)  # genuine < t
    k = int(np.argmin(np.abs(far - frr)))
    return float((far[k] + frr[k]) / 2.0), float(t[k])


def retrieval(emb: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """(top-1 accuracy, mAP), each sample a query against all the others."""
    e = unit(emb)
    sim = e @ e.T
    np.fill_diagonal(sim, -np.inf)
    n = len(e)
    order = np.argsort(-sim, axis=1, kind="stable")[:, : n - 1]  # self (-inf) is last
    rel = labels[order] == labels[:, None]
    top1 = float(rel[:, 0].mean())
    hits = np.cumsum(rel, axis=1)
    prec = hits / np.arange(1, n)
    count = rel.sum(axis=1)
    ap = np.where(count > 0, (prec * rel).sum(axis=1) / np.maximum(count, 1), 0.0)
    return top1, float(ap[count > 0].mean()) if np.any(count > 0) else 0.0


def nearest(emb: np.ndarray) -> np.ndarray:
    """Each sample's nearest other sample (index), by cosine."""
    e = unit(emb)
    sim = e @ e.T
    np.fill_diagonal(sim, -np.inf)
    return np.argmax(sim, axis=1)


def evaluate(emb: np.ndarray, labels: np.ndarray, max_samples: int = 2000,
             seed: int = 0) -> dict[str, float]:
    """Every metric of KEYS on (emb, labels); over `max_samples` samples (a seeded subset),
    since the pairs grow as N^2."""
    labels = np.asarray(labels)
    if len(labels) > max_samples:
        idx = np.sort(np.random.default_rng(seed).permutation(len(labels))[:max_samples])
        emb, labels = emb[idx], labels[idx]
    gen, imp = pair_scores(emb, labels)
    if len(gen) == 0 or len(imp) == 0:
        return {}
    out = {"tar_far1e-2": tar_at_far(gen, imp, 1e-2)[0], "tar_far1e-3": tar_at_far(gen, imp, 1e-3)[0],
           "auc": roc_auc(gen, imp)}
    out["eer"], out["eer_threshold"] = eer(gen, imp)
    out["top1"], out["map"] = retrieval(emb, labels)
    return out
