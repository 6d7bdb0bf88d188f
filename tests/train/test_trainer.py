"""The trainer end to end, small: exact resume after a real SIGKILL, atomic checkpoints,
regression metadata, and the wiring of gradient accumulation.

The kill tests run the trainer in a child process that SIGKILLs itself, so nothing of the
interrupted run (open files, threads, finally blocks) gets a chance to tidy up.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from pocket.formats.container import read_container
from pocket.train.checkpoint import load_checkpoint
from pocket.train.run import train_from_config

REPO = Path(__file__).resolve().parents[2]

# Dropout, BN (2-D and 1-D) and augmentation: RNG state, running statistics and the batch
# stream all have to come back exactly for a resumed run to match. Three epochs of 8 steps.
# NOTE: the data is a small NPZ and the model has no convolution, so a child process pays
# neither scikit-learn's import nor the Numba kernels' compilation.
RESUME_TOML = """\
[run]
device = "cpu"
seed = 3
calib_samples = 8

[data]
source = "npz:{npz}"
augment = ["flip"]
prefetch = 0

[model]
layers = [
  {{type = "batchnorm"}},
  {{type = "flatten"}},
  {{type = "linear", out = 16}},
  {{type = "batchnorm"}},
  {{type = "relu"}},
  {{type = "dropout", p = 0.3}},
  {{type = "linear"}},
]

[train]
epochs = 3
batch_size = 16
optimizer = "adamw"
lr = 3e-3
schedule = "cosine"
"""


def _images_npz(folder: Path) -> Path:
    """190 noisy 1x6x6 images of 3 classes (bright left, right or middle)."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 190)
    x = rng.normal(0, 0.5, (190, 1, 6, 6)).astype(np.float32)
    for c, cols in enumerate((slice(0, 2), slice(4, 6), slice(2, 4))):
        x[y == c, :, :, cols] += 1.0
    path = folder / "images.npz"
    np.savez(path, x=x, y=y)
    return path


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("POCKET_DEBUG", None)
    return env


def _child(code: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter; it is expected to SIGKILL itself."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=120)


def _assert_killed(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr[-2000:])


def _write_config(tmp_path: Path, text: str | None = None) -> Path:
    if text is None:
        text = RESUME_TOML.format(npz=_images_npz(tmp_path).as_posix())
    p = tmp_path / "cfg.toml"
    p.write_text(text, encoding="utf-8")
    return p


def _assert_same_checkpoint(a: Path, b: Path) -> None:
    ca, cb = load_checkpoint(a), load_checkpoint(b)
    assert ca["state"].keys() == cb["state"].keys()
    for k in ca["state"]:
        assert np.array_equal(ca["state"][k], cb["state"][k]), f"state {k} differs"
    sa, sb = ca["optimizer"]["state"], cb["optimizer"]["state"]
    assert sa.keys() == sb.keys() and sa
    for p in sa:
        assert sa[p].keys() == sb[p].keys()
        for slot in sa[p]:
            assert np.array_equal(sa[p][slot], sb[p][slot]), f"optimizer {p}/{slot} differs"
    assert {k: v for k, v in ca["optimizer"].items() if k != "state"} == \
           {k: v for k, v in cb["optimizer"].items() if k != "state"}
    ta, tb = ca["meta"]["trainer"], cb["meta"]["trainer"]
    for key in ("epoch", "step", "rng", "schedule", "scaler", "best", "skipped_steps"):
        assert ta[key] == tb[key], key


def _history_without_timing(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return [{k: v for k, v in r.items() if k not in ("time_s", "peak_bytes")} for r in rows]


def test_sigkill_mid_epoch_then_resume_is_bitwise_identical(tmp_path):
    cfg = _write_config(tmp_path)
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    proc = _child(f"""
        import os, signal
        from pocket.train.run import train_from_config

        def kill(trainer, epoch, step):
            if (epoch, step) == (1, 4):  # the middle of epoch 2 of 3
                os.kill(os.getpid(), signal.SIGKILL)

        train_from_config({str(cfg)!r}, {{"out": {str(killed)!r}}}, quiet=True, callbacks=[kill])
    """, tmp_path)
    _assert_killed(proc)
    with read_container(killed / "last.ckpt", expect_kind="checkpoint") as c:
        assert c.meta["trainer"]["epoch"] == 1
    assert len((killed / "metrics.jsonl").read_text().splitlines()) == 1

    resumed = subprocess.run(
        [sys.executable, "-m", "pocket.cli", "train", str(cfg), "--out", str(killed),
         "--resume", str(killed / "last.ckpt"), "--json"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads(resumed.stdout)["epochs"] == 3

    train_from_config(str(cfg), {"out": str(whole)}, quiet=True)

    _assert_same_checkpoint(killed / "last.ckpt", whole / "last.ckpt")
    _assert_same_checkpoint(killed / "best.ckpt", whole / "best.ckpt")
    rows = _history_without_timing(killed / "metrics.jsonl")
    assert [r["epoch"] for r in rows] == [1, 2, 3]
    assert rows == _history_without_timing(whole / "metrics.jsonl")


KILL_IN_WRITE = """
    import os, signal
    from pocket.train.run import train_from_config

    armed = [False]
    writes = [0]
    real_fdopen = os.fdopen

    class KillingFile:
        # Writes through to the real file until {limit} bytes, then dies in the middle.
        def __init__(self, f):
            self.f, self.n = f, 0
        def write(self, b):
            b = bytes(b)
            if self.n + len(b) >= {limit}:
                self.f.write(b[:{limit} - self.n])
                self.f.flush()
                os.fsync(self.f.fileno())
                os.kill(os.getpid(), signal.SIGKILL)
            self.n += len(b)
            return self.f.write(b)
        def __getattr__(self, name):
            return getattr(self.f, name)
        def __enter__(self):
            return self
        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

    def fdopen(fd, *args, **kwargs):
        # Only the container writer opens files this way during a run.
        f = real_fdopen(fd, *args, **kwargs)
        if not armed[0]:
            return f
        writes[0] += 1
        return KillingFile(f) if writes[0] == {nth} else f

    os.fdopen = fdopen

    def arm(trainer, epoch, step):
        # After the last step of epoch 2, the next files written are that epoch's checkpoints.
        if epoch == 1 and step == trainer.steps_per_epoch - 1:
            armed[0] = True

    train_from_config({cfg!r}, {{"out": {out!r}}}, quiet=True, callbacks=[arm])
"""


def test_sigkill_while_writing_checkpoint_keeps_previous_one(tmp_path):
    cfg = _write_config(tmp_path)
    out = tmp_path / "run"
    proc = _child(KILL_IN_WRITE.format(cfg=str(cfg), out=str(out), limit=3000, nth=1), tmp_path)
    _assert_killed(proc)

    names = sorted(p.name for p in out.iterdir())
    partial = [n for n in names if n.endswith(".tmp")]
    assert partial, f"the child did not die inside a checkpoint write: {names}"
    assert all(not n.endswith(".ckpt") for n in partial)
    assert {n for n in names if n.endswith(".ckpt")} <= {"best.ckpt", "last.ckpt"}
    with read_container(out / "last.ckpt", expect_kind="checkpoint") as c:
        assert c.meta["trainer"]["epoch"] == 1  # the previous epoch, intact (CRCs checked)
        assert (out / "last.ckpt").stat().st_size > 3000
    with read_container(out / "best.ckpt", expect_kind="checkpoint") as c:
        assert c.meta["trainer"]["epoch"] == 1

    # And the run resumes from it to the end with one metrics line per epoch.
    r = train_from_config(str(cfg), {"out": str(out), "resume": str(out / "last.ckpt")},
                          quiet=True)
    assert r["epochs"] == 3
    rows = _history_without_timing(out / "metrics.jsonl")
    assert [row["epoch"] for row in rows] == [1, 2, 3]


def test_sigkill_between_best_and_last_checkpoint_keeps_them_consistent(tmp_path):
    """Killed after the first of an improving epoch's two checkpoint writes, the resumed run
    still ends with the same best.ckpt as an uninterrupted run (not an older model labelled
    with the new epoch's metrics)."""
    cfg = _write_config(tmp_path)
    cfg.write_text(cfg.read_text().replace("epochs = 3", "epochs = 2"))
    whole, out = tmp_path / "whole", tmp_path / "run"
    train_from_config(str(cfg), {"out": str(whole)}, quiet=True)
    with read_container(whole / "best.ckpt", expect_kind="checkpoint") as c:
        assert c.meta["trainer"]["best"]["epoch"] == 2  # precondition: epoch 2 improves

    proc = _child(KILL_IN_WRITE.format(cfg=str(cfg), out=str(out), limit=0, nth=2), tmp_path)
    _assert_killed(proc)
    train_from_config(str(cfg), {"out": str(out), "resume": str(out / "last.ckpt")}, quiet=True)

    _assert_same_checkpoint(out / "best.ckpt", whole / "best.ckpt")
    _assert_same_checkpoint(out / "last.ckpt", whole / "last.ckpt")
    with read_container(out / "best.ckpt") as a, read_container(whole / "best.ckpt") as b:
        assert a.graph.metadata["metrics"] == b.graph.metadata["metrics"]


DIABETES_TOML = """\
[run]
device = "cpu"
calib_samples = 8

[data]
source = "csv:{csv}"
target = "progression"
task = "regression"
prefetch = 0

[model]
name = "mlp_regressor"
hidden = [8]

[train]
epochs = 3
batch_size = 32
lr = 1e-2
"""


def test_regression_run_stores_target_statistics(tmp_path):
    csv = REPO / "examples" / "data" / "diabetes.csv"
    cfg = _write_config(tmp_path, DIABETES_TOML.format(csv=csv.as_posix()))
    r = train_from_config(str(cfg), {"out": str(tmp_path / "run")}, quiet=True)

    y = np.genfromtxt(csv, delimiter=",", names=True)["progression"]
    for name in ("best.ckpt", "last.ckpt"):
        with read_container(tmp_path / "run" / name, expect_kind="checkpoint") as c:
            target = c.graph.metadata["preprocessing"]["target"]
            assert target["name"] == "progression"
            assert math.isfinite(target["mean"]) and target["std"] > 0
            # Training-split statistics: close to, not equal to, the whole column's.
            assert abs(target["mean"] - y.mean()) < 0.2 * y.std()
            assert 0.7 * y.std() < target["std"] < 1.3 * y.std()
            assert c.graph.metadata["task"] == "regression"
    for split in ("test", "final"):
        metrics = r[split]
        key = "mae" if split == "test" else "val_mae"
        assert math.isfinite(metrics[key]) and metrics[key] > 0
        key = "rmse" if split == "test" else "val_rmse"
        assert math.isfinite(metrics[key]) and metrics[key] > 0
    # The loss is on the standardized target; mae/rmse are in the target's own units.
    with read_container(tmp_path / "run" / "best.ckpt", expect_kind="checkpoint") as c:
        std = c.graph.metadata["preprocessing"]["target"]["std"]
    assert r["test"]["rmse"] == pytest.approx(r["test"]["loss"] ** 0.5 * std, rel=1e-9)
    assert r["test"]["mae"] <= r["test"]["rmse"]


ACCUM_TOML = """\
[run]
device = "cpu"
seed = 1
calib_samples = 8

[data]
source = "digits"
limit = 200
prefetch = 0

[model]
name = "mlp"
hidden = [16]

[train]
epochs = 1
batch_size = 32
optimizer = "sgd"
momentum = 0.0
lr = 0.5
schedule = "constant"
weight_decay = 0.0

[memory]
accumulation = {k}
"""


class _Stop(Exception):
    pass


def _weights_after_first_step(tmp_path: Path, k: int) -> tuple[dict, int]:
    from pocket.train import backend

    cfg = tmp_path / f"accum{k}.toml"
    cfg.write_text(ACCUM_TOML.format(k=k), encoding="utf-8")
    seen: dict = {}

    def grab(trainer, epoch, step):
        seen["state"] = {n: backend.to_numpy(v).copy()
                         for n, v in trainer.model.state_dict().items()}
        seen["micro_batch"] = trainer.micro_batch
        raise _Stop

    with pytest.raises(_Stop):
        train_from_config(str(cfg), {"out": str(tmp_path / f"run{k}")}, quiet=True,
                          callbacks=[grab])
    return seen["state"], seen["micro_batch"]


def test_accumulation_matches_full_batch_through_the_trainer(tmp_path):
    full, mb1 = _weights_after_first_step(tmp_path, 1)
    acc, mb4 = _weights_after_first_step(tmp_path, 4)
    assert (mb1, mb4) == (32, 8)
    init = _initial_weights(tmp_path)
    for name in full:
        moved = full[name] - init[name]
        assert np.abs(moved).max() > 1e-4, f"{name} did not move"  # the step did something
        np.testing.assert_allclose(acc[name], full[name], rtol=1e-6, atol=1e-6 *
                                   np.abs(full[name]).max(), err_msg=name)


def _initial_weights(tmp_path: Path) -> dict:
    from pocket.train import backend
    from pocket.train.config import load_config
    from pocket.train.trainer import Trainer

    t = Trainer(load_config(tmp_path / "accum1.toml", {"out": str(tmp_path / "init")}),
                quiet=True)
    return {n: backend.to_numpy(v).copy() for n, v in t.model.state_dict().items()}
