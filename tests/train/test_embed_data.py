"""The embedding task's open-set split and its config checks: whole classes held out, ids
renumbered, normalisation from the seen classes' training split alone; bad choices refused
with one clear message before training."""

from __future__ import annotations

import numpy as np
import pytest

from pocket.train.config import ConfigError, merge
from pocket.train.data import load_dataset
from pocket.train.data.images import read_digits
from pocket.train.data.sources import DataError


def test_held_out_classes_are_the_test_split():
    raw = read_digits()
    d = load_dataset("digits", task="embedding", holdout=[2, "5", 9])
    assert d.task == "embedding" and d.num_outputs == 7
    assert d.labels == ["0", "1", "3", "4", "6", "7", "8", "2", "5", "9"]
    seen = set(range(7))
    assert set(d.train.y) == seen and set(d.val.y) <= seen
    assert set(d.test.y) == {7, 8, 9}
    # every held-out sample, none of the others
    assert len(d.test) == int(np.isin(raw.y, [2, 5, 9]).sum())
    assert len(d.train) + len(d.val) == int((~np.isin(raw.y, [2, 5, 9])).sum())
    # statistics from the training split (seen classes) alone: undoing them gives raw pixels
    px = d.train.x * np.float32(d.preprocessing["std"][0]) + np.float32(d.preprocessing["mean"][0])
    assert px.mean() == pytest.approx(d.preprocessing["mean"][0], abs=1e-5)


def test_default_holdout_is_the_last_classes():
    d = load_dataset("digits", task="embedding")
    assert d.labels[d.num_outputs:] == ["6", "7", "8", "9"]


@pytest.mark.parametrize("holdout,words", [(["x"], "no class 'x'"), (["1"], "at least 2")])
def test_bad_holdout(holdout, words):
    with pytest.raises(DataError, match=words):
        load_dataset("digits", task="embedding", holdout=holdout)


def _trainer(tmp_path, **sections):
    from pocket.train.trainer import Trainer

    raw = {"run": {"out": str(tmp_path)}, "data": {"task": "embedding"},
           "model": {"name": "mlp", "hidden": [8]}, "train": {"epochs": 1}}
    for k, v in sections.items():
        raw[k] = {**raw.get(k, {}), **v}
    return Trainer(merge(raw), quiet=True)


@pytest.mark.parametrize("sections,words", [
    ({"train": {"loss": "mse"}}, "use arcface or softmax"),
    ({"train": {"monitor": "val_accuracy"}}, "not measured on an embedding"),
    ({"memory": {"checkpointing": 2}}, "do not plan the embedding task"),
])
def test_bad_choices_are_refused(tmp_path, sections, words):
    with pytest.raises(ConfigError, match=words):
        _trainer(tmp_path, **sections)


def test_embedding_section_is_checked():
    with pytest.raises(ConfigError, match=r"\[embedding\] s must be positive"):
        merge({"embedding": {"s": 0}})
    with pytest.raises(ConfigError, match="unknown key 'margin'"):
        merge({"embedding": {"margin": 0.5}})
    with pytest.raises(ConfigError, match=r"\[embedding\] dim must be at least 1"):
        merge({"embedding": {"dim": 0}})


def test_default_loss_is_arcface(tmp_path):
    t = _trainer(tmp_path, embedding={"dim": 4})
    assert t.loss_name == "arcface" and t.model.head.weight.shape == (6, 4)
    assert tuple(t.predict(t.data.test.x[:3]).shape) == (3, 4)


@pytest.mark.gpu
def test_an_embedding_epoch_on_cuda(tmp_path):
    t = _trainer(tmp_path, run={"device": "cuda", "out": str(tmp_path / "g")},
                 embedding={"dim": 4}, data={"prefetch": 0, "holdout": ["7", "8", "9"]})
    result = t.fit()
    assert 0.0 <= result["test"]["tar_far1e-2"] <= 1.0 and "val_loss" in result["final"]
    xp = t.device.xp
    assert isinstance(t.model.head.weight.data, xp.ndarray)
