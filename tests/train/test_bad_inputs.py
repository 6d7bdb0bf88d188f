"""Bad input to `pocket train` that a user can cause: every case is exit 3 and exactly one
`Error:` line that says what is wrong, never a traceback or the "this is a bug" line.

The cases run in-process through click's runner (the CLI's own error handling, without a
Python start per case); one runs as a real process to keep that path honest.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from pocket.cli import main
from pocket.formats.container import read_container, write_container
from pocket.train.run import train_from_config

REPO = Path(__file__).resolve().parents[2]

CSV = "a,b,y\n" + "".join(f"{i % 7},{(i * 3) % 5},{i % 2}\n" for i in range(40))
BASE = """\
[run]
device = "cpu"
calib_samples = 4
[data]
source = "{source}"
target = "y"
prefetch = 0
[model]
name = "mlp"
hidden = [4]
[train]
epochs = 1
batch_size = 8
"""


def _write(folder: Path, name: str, text: str) -> str:
    (folder / name).write_text(text, encoding="utf-8")
    return name


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("train_bad_inputs")
    (d / "good.csv").write_text(CSV)
    _write(d, "ok.toml", BASE.format(source="csv:good.csv"))
    x = np.ones((20, 3), np.float32)
    np.savez(d / "object.npz", x=np.array([[1, "a"]] * 20, dtype=object), y=np.arange(20) % 2)
    with zipfile.ZipFile(d / "pickle.npz", "w") as z:  # a raw pickle where an .npy belongs
        z.writestr("x.npy", pickle.dumps(x))
        z.writestr("y.npy", pickle.dumps(np.arange(20) % 2))
    (d / "corrupt.npz").write_bytes(b"PK\x03\x04" + bytes(range(256)) * 4)
    (d / "wide.csv").write_text("a,b,y\n1," + "9" * 140_000 + ",0\n2,3,1\n")
    return d


def _train(folder: Path, *args: str):
    runner = CliRunner()
    old = os.getcwd()
    os.chdir(folder)
    try:
        return runner.invoke(main, ["train", *args], catch_exceptions=False,
                             env={"POCKET_DEBUG": None, "POCKET_DEVICE": None})
    finally:
        os.chdir(old)


def _assert_one_error(r, words) -> str:
    assert r.exit_code == 3, (r.exit_code, r.stderr, r.stdout)
    assert "Traceback" not in r.stderr and "this is a bug" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("Error: ")
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert r.stdout == ""
    return lines[0]


def _cfg_text(train: str = "", model: str = "", data: str = "", memory: str = "",
              source: str = "csv:good.csv") -> str:
    text = BASE.format(source=source)
    for section, extra in (("[train]", train), ("[model]", model), ("[data]", data)):
        for line in filter(None, extra.splitlines()):
            key = line.split("=")[0].strip()
            lines = [ln for ln in text.splitlines() if ln.split("=")[0].strip() != key]
            at = lines.index(section)
            text = "\n".join(lines[:at + 1] + [line] + lines[at + 1:]) + "\n"
    if memory:
        text += "[memory]\n" + memory + "\n"
    return text


# (config text, words the one Error: line must hold)
CONFIGS = {
    "lr nan": (_cfg_text(train="lr = nan"), ["[train] lr", "finite", "nan"]),
    "lr inf": (_cfg_text(train="lr = inf"), ["[train] lr", "finite"]),
    "lr 1e30": (_cfg_text(train="lr = 1e30"), ["[train] lr", "at most 10"]),
    "weight_decay nan": (_cfg_text(train="weight_decay = nan"), ["weight_decay", "finite"]),
    "clip_grad_norm inf": (_cfg_text(train="clip_grad_norm = inf"), ["clip_grad_norm", "finite"]),
    "loss_scale nan": (_cfg_text(memory="loss_scale = nan"), ["loss_scale", "finite"]),
    "loss_scale huge": (_cfg_text(memory="loss_scale = 1e300"), ["loss_scale", "at most"]),
    "image_size big": (_cfg_text(data='image_size = "big"'), ["[data] image_size", "an int",
                                                              "'big'"]),
    "layers empty": (_cfg_text(model="layers = []"), ["[model] layers", "at least one layer"]),
    "batch_size 1e11": (_cfg_text(train="batch_size = 1e11"), ["[train] batch_size", "an int"]),
    "batch_size huge int": (_cfg_text(train="batch_size = 100000000000"),
                            ["[train] batch_size", "at most"]),
    "conv stride 0": (_cfg_text(model='layers = [{type = "flatten"}, {type = "linear", out = 4},'
                                      ' {type = "conv2d", out = 4, stride = 0}]'),
                      ["[model] layers[2] (conv2d)", "stride", "positive int", "0"]),
    "batchnorm eps negative": (_cfg_text(model='layers = [{type = "batchnorm", eps = -1e-5}, '
                                               '{type = "linear"}]'),
                               ["[model] layers[0] (batchnorm)", "eps", "-1e-05"]),
    "patience negative": (_cfg_text(train="patience = -1"), ["patience", "not be negative"]),
    "monitor unknown": (_cfg_text(train='monitor = "val_acc"'), ["monitor", "val_accuracy"]),
    "toml 5000 deep": (_cfg_text() + "x = " + "[" * 5000 + "]" * 5000 + "\n",
                       ["nested", "deep"]),
    "toml 5000 deep tables": (_cfg_text() + "[" + ".".join(["train"] * 5000) + "]\n",
                              ["nested", "deep"]),
    "loss mse on a classifier": (_cfg_text(train='loss = "mse"'),
                                 ["loss = 'mse'", "classification", "cross_entropy"]),
    "task regression on digits": (_cfg_text(data='task = "regression"\nlimit = 50',
                                            source="digits"),
                                  ["task = 'regression'", "digits", "classification set"]),
    "monitor accuracy on regression": (
        _cfg_text(data='task = "regression"', train='monitor = "val_accuracy"'),
        ["monitor = 'val_accuracy'", "regression", "val_r2"]),
    "yaml syntax": ("run: [device\n", ["not valid YAML"]),
    "yaml not a table": ("- 1\n- 2\n", ["a table of sections"]),
    "yaml nan lr": ("train:\n  lr: .nan\n", ["[train] lr", "finite"]),
    "yaml deep": ("x: " + "[" * 5000 + "]" * 5000 + "\n", ["nested", "deep"]),
    "yaml date name": ("run:\n  name: 2024-01-01\n", ["[run] name", "a str"]),
}


@pytest.mark.parametrize("case", list(CONFIGS))
def test_bad_config_is_one_error_line(folder, case):
    text, words = CONFIGS[case]
    name = "bad.yaml" if case.startswith("yaml") else "bad.toml"
    _write(folder, name, text)
    _assert_one_error(_train(folder, name, "--out", "run_" + case.replace(" ", "_")), words)


DATA = {
    "npz with an object member": ("npz:object.npz", ["object.npz", "NPZ"]),
    "npz with a raw pickle member": ("npz:pickle.npz", ["pickle.npz", "NPZ"]),
    "corrupt npz": ("npz:corrupt.npz", ["corrupt.npz", "NPZ"]),
    "csv field over 131072 characters": ("csv:wide.csv", ["wide.csv"]),
}


@pytest.mark.parametrize("case", list(DATA))
def test_bad_training_data_is_one_error_line(folder, case):
    src, words = DATA[case]
    _assert_one_error(_train(folder, "ok.toml", "--data", src, "--out", "run_data"), words)


@pytest.fixture(scope="module")
def checkpoint(folder):
    out = folder / "ckrun"
    old = os.getcwd()
    os.chdir(folder)  # the config names good.csv relative to the folder, as resume will
    try:
        train_from_config("ok.toml", {"out": str(out)}, quiet=True)
    finally:
        os.chdir(old)
    return out / "last.ckpt"


def _tampered(checkpoint: Path, folder: Path, name: str, change) -> Path:
    with read_container(checkpoint, expect_kind="checkpoint") as c:
        meta, graph = c.meta, c.graph
        tensors = {k: np.array(v) for k, v in c.tensors.items()}
    change(meta)
    d = folder / f"tampered_{name}"
    d.mkdir(exist_ok=True)
    path = d / "last.ckpt"
    write_container(path, kind="checkpoint", tensors=tensors, graph=graph, meta=meta)
    return path


def _set(path: tuple, value):
    def change(meta):
        d = meta
        for k in path[:-1]:
            d = d[k]
        if value is KeyError:
            del d[path[-1]]
        else:
            d[path[-1]] = value
    return change


TAMPERED = {
    "epoch a string": _set(("trainer", "epoch"), "three"),
    "step negative": _set(("trainer", "step"), -4),
    "no schedule": _set(("trainer", "schedule"), KeyError),
    "schedule a list": _set(("trainer", "schedule"), [1, 2]),
    "schedule value a string": _set(("trainer", "schedule", "last_step"), "x"),
    "rng a number": _set(("trainer", "rng"), 5),
    "rng of another generator": _set(("trainer", "rng"), {"bit_generator": "Nope", "state": 1}),
    "scaler without scale": _set(("trainer", "scaler"), {}),
    "best without rank": _set(("trainer", "best"), {"epoch": 1}),
    "best past the end": _set(("trainer", "best"),
                              {"epoch": 9, "metric": "val_loss", "rank": [0.0]}),
    "config a string": _set(("config",), "x"),
    "config with an unknown key": _set(("config", "train", "epocs"), 3),
    "history a dict": _set(("history",), {"a": 1}),
    "step schedule divides by zero": lambda m: (
        m["config"]["train"].update(schedule="step"),
        m["trainer"].update(schedule={"base_lr": 0.1, "last_step": 3, "step_size": 0,
                                      "gamma": 0.5})),
}


@pytest.mark.parametrize("case", list(TAMPERED))
def test_malformed_trainer_state_on_resume_is_one_error_line(folder, checkpoint, case):
    path = _tampered(checkpoint, folder, case.replace(" ", "_"), TAMPERED[case])
    _assert_one_error(_train(folder, "--resume", str(path)), [str(path), "malformed"])


def test_a_real_process_prints_one_line_and_no_traceback(folder):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("POCKET_DEBUG", None)
    _write(folder, "nan.toml", _cfg_text(train="lr = nan"))
    r = subprocess.run([sys.executable, "-m", "pocket.cli", "train", "nan.toml"], cwd=folder,
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 3 and "Traceback" not in r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("Error: ") and "[train] lr" in line and r.stdout == ""
