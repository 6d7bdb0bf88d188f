"""LoRA runs from a config: [lora] base loads a base checkpoint and freezes it, only the
adapters train (and have optimizer state), the checkpoint holds the full weights plus the merged
weight the graph uses, resume is bitwise without the base file, bad input is one `Error:` line,
and [data] classes selects and renumbers classes."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from pocket.cli import main
from pocket.formats.container import read_container
from pocket.train.checkpoint import DERIVED_PREFIX, load_checkpoint
from pocket.train.data import load_dataset
from pocket.train.data.sources import DataError
from pocket.train.run import train_from_config
from pocket.train.trainer import TrainingInterrupted

BASE = """\
[run]
seed = 0
tensorboard = false
[data]
source = "digits"
classes = [0, 1, 2]
[model]
name = "mlp"
hidden = [16]
[train]
epochs = 2
batch_size = 32
lr = 1e-2
schedule = "constant"
keep = "last"
"""

ADAPT = """\
[run]
seed = 0
tensorboard = false
[data]
source = "digits"
classes = [7, 8, 9]
[model]
name = "mlp"
hidden = [{hidden}]
[lora]
base = "{base}"
rank = 2
alpha = 4.0
dropout = 0.1
targets = ["linear"]
[train]
epochs = 2
batch_size = 32
lr = 1e-2
schedule = "constant"
keep = "last"
"""


def _adapt_text(base: str, hidden: int = 16, lora: str = "") -> str:
    text = ADAPT.format(base=base, hidden=hidden)
    for line in filter(None, lora.splitlines()):
        key = line.split("=")[0].strip()
        text = "\n".join(ln for ln in text.splitlines() if ln.split("=")[0].strip() != key)
        text = text.replace("[lora]", "[lora]\n" + line)
    return text + "\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("lora_run")
    (d / "base.toml").write_text(BASE)
    train_from_config(str(d / "base.toml"), {"out": str(d / "base")}, quiet=True)
    (d / "adapt.toml").write_text(_adapt_text(str(d / "base" / "last.ckpt")))
    result = train_from_config(str(d / "adapt.toml"), {"out": str(d / "adapt")}, quiet=True)
    return d, result


def test_adapters_train_over_the_frozen_base(runs):
    d, result = runs
    base = load_checkpoint(d / "base" / "last.ckpt")
    ck = load_checkpoint(d / "adapt" / "last.ckpt")
    plain = [k for k in ck["state"] if "lora_" not in k]
    assert sorted(plain) == sorted(base["state"])
    for k in plain:  # frozen: bit for bit the base's weights
        np.testing.assert_array_equal(ck["state"][k], base["state"][k])
    assert set(ck["optimizer"]["state"]) == {k for k in ck["state"] if "lora_" in k}
    for layer in ("1", "3"):
        assert np.abs(ck["state"][f"{layer}.lora_B"]).max() > 0  # the adapters did train
        w, a, b = (ck["state"][f"{layer}.{n}"].astype(np.float64)
                   for n in ("weight", "lora_A", "lora_B"))
        np.testing.assert_allclose(ck["derived"][f"{DERIVED_PREFIX}{layer}.weight"],
                                   w + 2.0 * b @ a, rtol=1e-6, atol=1e-6)
    linear = [n for n in ck["graph"].nodes if n.op == "linear"]
    assert [n.inputs[1] for n in linear] == [f"{DERIVED_PREFIX}1.weight",
                                             f"{DERIVED_PREFIX}3.weight"]
    t = result["trainable"]
    n_total = sum(v.size for k, v in ck["state"].items())
    n_lora = sum(v.size for k, v in ck["state"].items() if "lora_" in k)
    assert (t["parameters"], t["trainable"]) == (n_total, n_lora)
    assert t["fraction"] == pytest.approx(n_lora / n_total)
    # what the tracker measured is what the summary says LoRA costs
    assert result["memory"]["gradients"]["peak"] == t["gradient_bytes"] == 4 * n_lora
    assert result["memory"]["optimizer_state"]["peak"] == t["optimizer_state_bytes"]
    # full fine-tuning trains the base's parameters (all but the adapters)
    assert t["full_optimizer_state_bytes"] == 2 * 4 * (n_total - n_lora)
    assert t["full_gradient_bytes"] == 4 * (n_total - n_lora)
    assert result["test"]["accuracy"] > 0.6  # three new classes, chance is 1/3


def test_resume_is_bitwise_and_needs_no_base_file(runs, tmp_path):
    d, _ = runs
    base = tmp_path / "base.ckpt"
    base.write_bytes((d / "base" / "last.ckpt").read_bytes())
    cfg = tmp_path / "adapt.toml"
    cfg.write_text(_adapt_text(str(base)))

    def stop(trainer, epoch, step):
        if (epoch, step) == (1, 0):
            raise KeyboardInterrupt

    with pytest.raises(TrainingInterrupted):
        train_from_config(str(cfg), {"out": str(tmp_path / "run")}, quiet=True,
                          callbacks=[stop])
    base.unlink()
    train_from_config(None, {"resume": str(tmp_path / "run" / "last.ckpt")}, quiet=True)
    with read_container(d / "adapt" / "last.ckpt") as a, \
            read_container(tmp_path / "run" / "last.ckpt") as b:
        assert set(a.tensors) == set(b.tensors)
        for k in a.tensors:
            if not k.startswith("calib/"):
                np.testing.assert_array_equal(a.tensors[k], b.tensors[k], err_msg=k)


def _cli_train(folder: Path, text: str):
    (folder / "cfg.toml").write_text(text)
    old = os.getcwd()
    os.chdir(folder)
    try:
        return CliRunner().invoke(main, ["train", "cfg.toml", "--force", "--out", "r"],
                                  catch_exceptions=False,
                                  env={"POCKET_DEBUG": None, "POCKET_DEVICE": None})
    finally:
        os.chdir(old)


@pytest.mark.parametrize("case", [
    ("rank = 0", "", ["[lora] rank", "positive"]),
    ("rank = -3", "", ["[lora] rank"]),
    ("alpha = 0.0", "", ["[lora] alpha"]),
    ("targets = [\"nope\"]", "", ["targets 'nope' matched no linear layer"]),
    ("targets = []", "", ["[lora] targets"]),
    ("", "other_arch", ["another architecture"]),
    ("", "missing_base", ["no such checkpoint"]),
])
def test_bad_lora_input_is_one_error_line(runs, tmp_path, case):
    d, _ = runs
    lora, what, words = case
    base = str(d / "base" / "last.ckpt")
    if what == "missing_base":
        base = str(tmp_path / "nothing.ckpt")
    text = _adapt_text(base, hidden=32 if what == "other_arch" else 16, lora=lora)
    r = _cli_train(tmp_path, text)
    assert r.exit_code == 3, (r.exit_code, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.stderr
    assert "Traceback" not in r.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


def test_lora_keys_without_rank_are_refused(tmp_path):
    text = BASE + "[lora]\nalpha = 4.0\n"
    r = _cli_train(tmp_path, text)
    assert r.exit_code == 3 and "[lora] alpha is set but [lora] rank is not" in r.stderr


def test_data_classes_select_and_renumber():
    from sklearn.datasets import load_digits

    target = load_digits().target
    ds = load_dataset("digits", classes=[7, 2])
    assert ds.labels == ["7", "2"] and ds.num_outputs == 2
    ys = np.concatenate([ds.train.y, ds.val.y, ds.test.y])
    assert sorted(np.bincount(ys).tolist()) == sorted([(target == 7).sum(), (target == 2).sum()])
    assert np.bincount(ys)[0] == (target == 7).sum()
    with pytest.raises(DataError, match="not among its labels"):
        load_dataset("digits", classes=[11])


def test_a_lora_run_as_base_has_its_adapters_merged(runs):
    from pocket.train import lora

    d, _ = runs
    path = d / "adapt" / "last.ckpt"
    ck = load_checkpoint(path)
    got = lora.base_state(path, ck["meta"]["config"], ck["state"])
    assert sorted(got) == sorted(k for k in ck["state"] if "lora_" not in k)
    for layer in ("1", "3"):
        np.testing.assert_allclose(got[f"{layer}.weight"],
                                   ck["derived"][f"{DERIVED_PREFIX}{layer}.weight"], rtol=1e-6,
                                   atol=1e-7)


def test_fp16_run_merges_the_fp32_masters(runs, tmp_path):
    d, _ = runs
    text = _adapt_text(str(d / "base" / "last.ckpt")).replace("[train]\nepochs = 2",
                                                              "[train]\nepochs = 1")
    (tmp_path / "cfg.toml").write_text(text + "[memory]\nprecision = \"fp16\"\n")
    train_from_config(str(tmp_path / "cfg.toml"), {"out": str(tmp_path / "run")}, quiet=True)
    ck = load_checkpoint(tmp_path / "run" / "last.ckpt")
    for layer in ("1", "3"):
        w, a, b = (ck["state"][f"{layer}.{n}"].astype(np.float64)
                   for n in ("weight", "lora_A", "lora_B"))
        # from the fp16 copies the merge would be off by fp16 rounding (~1e-3 here)
        np.testing.assert_allclose(ck["derived"][f"{DERIVED_PREFIX}{layer}.weight"],
                                   w + 2.0 * b @ a, rtol=1e-6, atol=1e-6)


def test_the_report_says_what_lora_trained_and_saved(runs):
    from pocket.train.run import render

    _, result = runs
    t = result["trainable"]
    text = render(result)
    assert (f"trainable parameters: {t['trainable']:,} of {t['parameters']:,} "
            f"({t['trainable'] / t['parameters']:.2%})") in text
    assert "for full fine-tuning" in text and "saved" in text
