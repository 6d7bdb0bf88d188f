"""`pocket infer --similarity` on an embedding model: the cosine of two inputs' embeddings and
the verdict at the threshold the model carries (metadata `embedding.threshold`, the EER
threshold on the classes held out of training; see train/task_embed.py)."""

from __future__ import annotations

import numpy as np

from pocket.infer.inputs import InputError

TASK = "embedding"


def check_model(model, path: str) -> None:
    if model.task != TASK:
        raise InputError(f"{path} is a {model.task} model, not an embedding model; --similarity "
                         "compares the embeddings of a model trained with [data] task = "
                         "\"embedding\"")


def similarity(model, names: list[str], y: np.ndarray) -> dict:
    """names and outputs (2, D) of two samples -> cosine, threshold and verdict."""
    if len(names) != 2:
        raise InputError(f"--similarity compares exactly two samples, got {len(names)}; give two "
                         "inputs (two images, or one array of two rows)")
    a, b = (np.asarray(v, np.float64).reshape(-1) for v in y)
    cos = float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-300))
    info = model.metadata.get(TASK) or {}
    t = info.get("threshold")
    out = {"a": names[0], "b": names[1], "cosine": cos,
           "threshold": None if t is None else float(t)}
    out["verdict"] = None if t is None else ("same" if cos >= t else "different")
    return out


def render(s: dict) -> str:
    head = f"{s['a']} vs {s['b']}: cosine similarity {s['cosine']:.4f}"
    if s["verdict"] is None:
        return head + " (the model stores no threshold: no verdict)"
    return head + f" -> {s['verdict']} (threshold {s['threshold']:.4f})"
