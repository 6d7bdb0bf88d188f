"""The `embedding` task's hooks in the trainer: its model, its loss, its evaluation and the
metadata its checkpoints carry (trainer.py calls these where the task differs).

Validation (seen classes, unseen samples) and test (the held-out classes, data/openset.py)
both report the open-set metrics of metrics_embed on the embeddings; validation also reports
the head's loss, which "best" follows by default. The threshold at the EER on the held-out
classes goes into the model's metadata (`embedding.threshold`) for `pocket infer
--similarity`.
"""

from __future__ import annotations

import numpy as np

from pocket.train import backend, metrics_embed
from pocket.train.config import ConfigError
from pocket.train.models import build_model
from pocket.train.nn_embed import LOSSES, build_embedding
from pocket.train.tensor import Tensor, no_grad

TASK = "embedding"


def check(trainer) -> None:
    """The config choices that do not fit the task, refused before any training."""
    cfg = trainer.cfg
    if trainer.loss_name not in LOSSES:
        raise ConfigError(f"[train] loss = {trainer.loss_name!r} does not fit task = "
                          "\"embedding\"; use arcface or softmax (or leave loss out: arcface)")
    if cfg["train"]["monitor"] not in ("auto", "val_loss", "train_loss"):
        raise ConfigError(f"[train] monitor = {cfg['train']['monitor']!r} is not measured on an "
                          "embedding; use val_loss or train_loss")
    if cfg["memory"]["budget"] is not None or cfg["memory"]["checkpointing"] > 1:
        raise ConfigError("[memory] budget and checkpointing do not plan the embedding task's "
                          "training head yet; remove them")


def build(trainer, rng):
    return build_from_config(trainer.cfg, trainer.data.input_shape, trainer.data.num_outputs,
                             trainer.loss_name, rng)


def build_from_config(cfg: dict, input_shape, num_classes: int, loss_name: str, rng):
    """The EmbeddingNet of a config (compare.py rebuilds a checkpoint's model with it)."""
    emb = cfg["embedding"]
    backbone = build_model(cfg["model"], input_shape, emb["dim"], rng)
    return build_embedding(backbone, num_classes, emb["dim"], loss_name, s=emb["s"], m=emb["m"],
                           easy_margin=emb["easy_margin"], rng=rng)


def loss(trainer, out: Tensor, y) -> Tensor:
    return trainer.model.loss(out, y)


def evaluate(trainer, split, out: np.ndarray) -> dict:
    """Open-set metrics of the embeddings `out` of split; the head's loss where the split's
    classes are the head's (validation)."""
    res = {}
    k = trainer.data.num_outputs
    if np.all(split.y < k):
        with no_grad():
            emb = Tensor(backend.to_device(out.astype(np.float32), trainer.device))
            y = backend.to_device(split.y, trainer.device)
            res["loss"] = float(trainer.model.loss(emb, y).data)
    res.update(metrics_embed.evaluate(out, split.y, seed=trainer.seed))
    return res


def metadata(trainer, metrics: dict | None) -> dict:
    d = trainer.data
    info = {"dim": int(trainer.cfg["embedding"]["dim"]), "loss": trainer.loss_name,
            "trained_classes": d.labels[:d.num_outputs], "heldout_classes": d.labels[d.num_outputs:]}
    if metrics and "test_eer_threshold" in metrics:
        info["threshold"] = float(metrics["test_eer_threshold"])
        info["threshold_from"] = "EER on the held-out classes"
    return {TASK: info}
