"""What a run gives people besides checkpoints: R² and separate test/validation files, the
progress bar, TensorBoard event files, `pocket plot`, and YAML configs beside TOML.

Each checks against something independent of the code under test: scikit-learn's r2_score,
standardization redone by hand, the PNG bytes parsed with zlib, TFRecord framing read by hand.
"""

from __future__ import annotations

import io
import json
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from pocket.cli import main
from pocket.train.config import ConfigError, load_config
from pocket.train.data.sources import DataError, load_dataset
from pocket.train.progress import Progress

REPO = Path(__file__).resolve().parents[2]
DIABETES = REPO / "examples" / "data" / "diabetes.csv"

REGRESSION = """\
[run]
device = "cpu"
calib_samples = 8
tensorboard = false

[data]
source = "csv:{train}"
test = "csv:{test}"
validation = "csv:{val}"
target = "progression"
prefetch = 0

[model]
name = "mlp_regressor"
hidden = [8]

[train]
epochs = 2
batch_size = 32
lr = 1e-2
"""


def _split_csv(folder: Path) -> tuple[Path, Path, Path]:
    lines = DIABETES.read_text().splitlines()
    header, rows = lines[0], lines[1:]
    train, test, val = folder / "train.csv", folder / "test.csv", folder / "val.csv"
    train.write_text("\n".join([header, *rows[:300]]) + "\n")
    test.write_text("\n".join([header, *rows[300:380]]) + "\n")
    # The validation file's columns in another order: matched by name, not position.
    cols = header.split(",")
    order = list(reversed(range(len(cols))))
    val.write_text("\n".join(",".join(r.split(",")[i] for i in order)
                             for r in [header, *rows[380:]]) + "\n")
    return train, test, val


def test_regression_reports_r2_and_takes_separate_test_and_validation_files(tmp_path):
    from sklearn.metrics import r2_score

    from pocket.train.trainer import Trainer

    train, test, val = _split_csv(tmp_path)
    cfg_path = tmp_path / "reg.toml"
    cfg_path.write_text(REGRESSION.format(train=train, test=test, val=val))
    t = Trainer(load_config(cfg_path, {"out": str(tmp_path / "run")}), quiet=True)
    raw_train = np.genfromtxt(train, delimiter=",", names=True)
    raw_test = np.genfromtxt(test, delimiter=",", names=True)
    features = [c for c in raw_train.dtype.names if c != "progression"]
    xtr = np.stack([raw_train[c] for c in features], 1)
    xte = np.stack([raw_test[c] for c in features], 1)
    # Every training row is used for training; the splits are exactly the files.
    assert (len(t.data.train), len(t.data.test), len(t.data.val)) == (300, 80, 62)
    np.testing.assert_allclose(t.data.test.x, (xte - xtr.mean(0)) / xtr.std(0), rtol=1e-5,
                               atol=1e-5)
    r = t.fit()
    assert "val_r2" in r["final"] and "r2" in r["test"]
    y = raw_test["progression"]
    pred = t.predict(t.data.test.x)[:, 0].astype(np.float64)
    target = t.data.preprocessing["target"]
    pred = pred * target["std"] + target["mean"]
    # float32 targets in the split: agreement to ~1e-7, not to float64 rounding.
    assert t.evaluate(t.data.test)["r2"] == pytest.approx(r2_score(y, pred), abs=1e-6)


def test_a_separate_test_file_keeps_the_training_label_ids(tmp_path):
    rows = [f"{i % 5},{(i * 7) % 3},{['cat', 'dog', 'eel'][i % 3]}" for i in range(60)]
    (tmp_path / "train.csv").write_text("a,b,kind\n" + "\n".join(rows) + "\n")
    (tmp_path / "test.csv").write_text("b,kind,a\n0,eel,1\n1,cat,2\n2,eel,3\n")
    (tmp_path / "bad.csv").write_text("a,b,kind\n0,1,fox\n")
    ds = load_dataset(f"csv:{tmp_path / 'train.csv'}", target="kind",
                      test=f"csv:{tmp_path / 'test.csv'}")
    assert ds.labels == ["cat", "dog", "eel"]
    assert ds.test.y.tolist() == [2, 0, 2]
    with pytest.raises(DataError, match="'fox'"):
        load_dataset(f"csv:{tmp_path / 'train.csv'}", target="kind",
                     test=f"csv:{tmp_path / 'bad.csv'}")


def test_progress_bar_shows_rate_and_eta(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    err = Tty()
    monkeypatch.setattr(sys, "stderr", err)
    p = Progress(True)
    p.update("epoch 1/4 loss 0.5", 10, 40, elapsed=2.0, run_left=90.0)
    text = err.getvalue()
    assert "10/40" in text and "5.0 steps/s" in text
    assert "ETA 0:06" in text and "(run 1:36)" in text  # 30 steps at 5/s; plus 90 s
    p.finish()
    assert err.getvalue().endswith("\n")


def _records(path: Path):
    """TFRecord framing: u64 length, u32 crc, payload, u32 crc."""
    data = path.read_bytes()
    at = 0
    while at < len(data):
        (n,) = struct.unpack_from("<Q", data, at)
        yield data[at + 12: at + 12 + n]
        at += 12 + n + 4


def test_tensorboard_event_files_hold_the_epoch_scalars(tmp_path):
    pytest.importorskip("tensorboardX")
    from tensorboardX.proto.event_pb2 import Event
    from test_trainer import _write_config

    from pocket.train.run import train_from_config

    cfg = _write_config(tmp_path)
    out = tmp_path / "run"
    train_from_config(str(cfg), {"out": str(out), "epochs": 2}, quiet=True)
    files = list((out / "tensorboard").glob("events.out.tfevents.*"))
    assert len(files) == 1
    seen: dict[str, dict[int, float]] = {}
    for rec in _records(files[0]):
        ev = Event.FromString(rec)
        for v in ev.summary.value:
            seen.setdefault(v.tag, {})[ev.step] = v.simple_value
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for key in ("train_loss", "val_loss", "val_accuracy", "lr"):
        assert seen[key] == pytest.approx({r["epoch"]: r[key] for r in rows}, rel=1e-6), key


def test_without_tensorboardx_a_run_skips_it_and_asking_for_it_is_an_error(tmp_path,
                                                                          monkeypatch):
    from test_trainer import _write_config

    from pocket.train.run import train_from_config

    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # import now fails
    cfg = _write_config(tmp_path)
    out = tmp_path / "run"
    train_from_config(str(cfg), {"out": str(out), "epochs": 1}, quiet=True)
    assert not (out / "tensorboard").exists()
    cfg.write_text(cfg.read_text().replace("seed = 3", "seed = 3\ntensorboard = true"))
    with pytest.raises(ConfigError, match=r"pip install 'pocketnn\[tensorboard\]'"):
        train_from_config(str(cfg), {"out": str(tmp_path / "run2"), "epochs": 1}, quiet=True)


def _metrics_file(folder: Path, regression: bool = False) -> Path:
    rows = []
    for e in range(1, 6):
        row = {"epoch": e, "step": 10 * e, "train_loss": 1 / e, "lr": 0.01 / e,
               "time_s": 0.1, "skipped_steps": 0, "peak_bytes": 2**20 * (1 + e)}
        if regression:
            row.update(val_loss=1.2 / e, val_r2=1 - 1 / (e + 1), val_mae=3.0 / e)
        else:
            row.update(train_accuracy=1 - 0.5 / e, val_loss="nan" if e == 3 else 1.1 / e,
                       val_accuracy=1 - 0.6 / e)
        rows.append(json.dumps(row))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    return folder


def _png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, at = [], 8
    while at < len(data):
        (n,) = struct.unpack_from(">I", data, at)
        kind, body = data[at + 4: at + 8], data[at + 8: at + 8 + n]
        (crc,) = struct.unpack_from(">I", data, at + 8 + n)
        assert zlib.crc32(kind + body) == crc, kind
        chunks.append((kind, body))
        at += 12 + n
    assert chunks[0][0] == b"IHDR" and chunks[-1][0] == b"IEND"
    return chunks


def _count_panels(png: Path) -> int:
    """Axes frames in the image: the black horizontal spines, two per panel."""
    from PIL import Image

    gray = np.asarray(Image.open(png).convert("L"))
    h, w = gray.shape
    segments = set()
    for row in range(h):
        dark = np.concatenate([[0], (gray[row] < 60).astype(np.int8), [0]])
        edges = np.flatnonzero(np.diff(dark))
        for a, b in zip(edges[::2], edges[1::2]):
            if b - a > 0.3 * w:
                segments.add((row, a // 8))
    # A spine a few pixels thick shows in adjacent rows: count each once.
    spines = {(r, c) for r, c in segments if (r - 1, c) not in segments}
    return len(spines) // 2


@pytest.mark.parametrize("regression", [False, True])
def test_plot_writes_a_png_with_four_panels(tmp_path, regression):
    pytest.importorskip("matplotlib")
    run = _metrics_file(tmp_path / "run", regression)
    out = tmp_path / "curves.png"
    r = CliRunner().invoke(main, ["plot", str(run), "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    result = json.loads(r.stdout)
    assert result["panels"] == ["loss", "metrics", "lr", "memory"] and result["epochs"] == 5
    assert result["series"]["metrics"] == (["val_r2"] if regression else
                                           ["train_accuracy", "val_accuracy"])
    chunks = _png_chunks(out.read_bytes())
    width, height = struct.unpack(">II", chunks[0][1][:8])
    assert (width, height) == (1000, 700)
    texts = dict(body.split(b"\0", 1) for kind, body in chunks if kind == b"tEXt")
    assert texts[b"Description"] == b"pocket plot panels: loss, metrics, lr, memory"
    assert _count_panels(out) == 4


def test_plot_errors_are_one_line(tmp_path, monkeypatch):
    r = CliRunner().invoke(main, ["plot", str(tmp_path)])
    assert r.exit_code == 3 and "no metrics.jsonl" in r.stderr
    run = _metrics_file(tmp_path / "run")
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    r = CliRunner().invoke(main, ["plot", str(run)])
    assert r.exit_code == 3
    (line,) = r.stderr.strip().splitlines()
    assert line == "Error: pocket plot needs matplotlib: pip install 'pocketnn[plot]'"


YAML = """\
# the same config as the TOML below
run:
  device: cpu
  seed: 3
data:
  source: npz:x.npz
  augment: [flip]
model:
  layers:
    - {type: flatten}
    - {type: linear, out: 16}
    - {type: relu}
    - {type: linear}
train:
  epochs: 3
  lr: 3e-3
  weight_decay: 1e-4
  betas: [0.9, 0.999]
"""

TOML = """\
[run]
device = "cpu"
seed = 3
[data]
source = "npz:x.npz"
augment = ["flip"]
[model]
layers = [{type = "flatten"}, {type = "linear", out = 16}, {type = "relu"}, {type = "linear"}]
[train]
epochs = 3
lr = 3e-3
weight_decay = 1e-4
betas = [0.9, 0.999]
"""


def test_yaml_configs_read_like_toml(tmp_path):
    pytest.importorskip("yaml")
    (tmp_path / "a.yaml").write_text(YAML)
    (tmp_path / "a.toml").write_text(TOML)
    y, t = load_config(tmp_path / "a.yaml"), load_config(tmp_path / "a.toml")
    assert y == t and isinstance(y["train"]["lr"], float)
    # The same mistake, the same message.
    (tmp_path / "b.yml").write_text("train:\n  epocs: 3\n")
    (tmp_path / "b.toml").write_text("[train]\nepocs = 3\n")
    messages = []
    for name in ("b.yml", "b.toml"):
        with pytest.raises(ConfigError) as e:
            load_config(tmp_path / name)
        messages.append(str(e.value).replace(str(tmp_path / name), "FILE"))
    assert messages[0] == messages[1]
    assert "did you mean 'epochs'" in messages[0]


def test_the_yaml_example_is_the_toml_example():
    pytest.importorskip("yaml")
    examples = REPO / "examples"
    assert load_config(examples / "digits_cnn.yaml") == load_config(examples / "digits_cnn.toml")


def test_a_separate_npz_test_set_must_have_the_training_sample_shape(tmp_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "train.npz", x=rng.random((30, 1, 4, 4)), y=np.arange(30) % 3)
    np.savez(tmp_path / "test.npz", x=rng.random((6, 1, 4, 4)), y=np.array([2, 2, 1, 0, 1, 2]))
    np.savez(tmp_path / "wide.npz", x=rng.random((6, 1, 4, 5)), y=np.arange(6) % 3)
    ds = load_dataset(f"npz:{tmp_path / 'train.npz'}", test=f"npz:{tmp_path / 'test.npz'}",
                      val_fraction=0.2)
    assert len(ds.test) == 6 and ds.test.y.tolist() == [2, 2, 1, 0, 1, 2]
    assert len(ds.train) + len(ds.val) == 30  # nothing of the training file held out as test
    with pytest.raises(DataError, match=r"\[data\] test .*\[1, 4, 5\].*\[1, 4, 4\]"):
        load_dataset(f"npz:{tmp_path / 'train.npz'}", test=f"npz:{tmp_path / 'wide.npz'}")


def test_yaml_without_pyyaml_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "yaml", None)
    (tmp_path / "a.yaml").write_text(YAML)
    with pytest.raises(ConfigError, match=r"pip install 'pocketnn\[yaml\]'"):
        load_config(tmp_path / "a.yaml")
