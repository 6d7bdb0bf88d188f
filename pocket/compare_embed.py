"""`pocket compare` on embedding models (task "embedding"): the gates are the cosine of each
sample's two embeddings and retrieval agreement, not top-1 class agreement.

    cosine_min / cosine_mean   per sample, cos(emb_a, emb_b), over the compared samples
    retrieval_agreement        the share of samples whose nearest other sample (by cosine,
                               among the compared samples) is the same in both engines

fp32 keeps its atol/rtol gates as well (unit vectors, so absolute errors are comparable);
int8 is gated on the cosine and the agreement alone. The int8 agreement gate is loose (0.85)
because a nearest neighbour is often a near-tie: on the digits' held-out classes, int8 moves
each embedding by a cosine of ~3e-4 on average and flips 7-10% of the neighbours (measured
0.90-0.93 over three seeds, bench/embed_openset.py); fp32 flips none.
"""

from __future__ import annotations

import numpy as np

GATES = {"fp32": {"min_cosine": 0.9999, "min_agreement": 0.99},
         "int8": {"atol": None, "rtol": None, "min_cosine": 0.99, "min_agreement": 0.85}}


def rebuild(ck: dict, input_shape):
    """The training EmbeddingNet of a checkpoint, its head sized from the saved weights."""
    from pocket.train.task_embed import build_from_config

    cfg = ck["meta"]["config"]
    k = int(ck["state"]["head.weight"].shape[0])
    return build_from_config(cfg, input_shape, k, cfg["train"]["loss"] or "arcface",
                             np.random.default_rng(0))


def metrics(a: np.ndarray, b: np.ndarray) -> dict:
    from pocket.train.metrics_embed import nearest, unit

    ua, ub = unit(a), unit(b)
    cos = (ua * ub).sum(axis=1)
    out = {"cosine_min": float(cos.min()), "cosine_mean": float(cos.mean())}
    if len(a) > 1:
        out["retrieval_agreement"] = float((nearest(a) == nearest(b)).mean())
    return out


def gate(m: dict, gates: dict) -> list[str]:
    fails = []
    lim = gates.get("min_cosine")
    if lim is not None and m["cosine_min"] < lim:
        fails.append(f"cosine_min {m['cosine_min']:.6f} < min_cosine {lim:g}")
    lim, agree = gates.get("min_agreement"), m.get("retrieval_agreement")
    if lim is not None and agree is not None and agree < lim:
        fails.append(f"retrieval_agreement {agree:.4f} < min_agreement {lim:g}")
    return fails


def retrieval_top1(out: np.ndarray, y: np.ndarray) -> float:
    from pocket.train.metrics_embed import nearest

    return float((y[nearest(out)] == y).mean()) if len(y) > 1 else 0.0
