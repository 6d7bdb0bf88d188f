"""Resume continues the run its checkpoint names, whatever the resume command repeats or
omits; a new run never overwrites another; Ctrl-C says how to resume; logs, early stopping
and the choice of best or last checkpoint.

The kill-and-resume tests use the helpers of test_trainer.py (a child that SIGKILLs itself
after epoch k) and compare every weight, optimizer slot and trainer field bitwise.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_trainer import (
    _assert_killed,
    _assert_same_checkpoint,
    _child,
    _env,
    _history_without_timing,
    _write_config,
)

from pocket.formats.container import read_container
from pocket.train.config import ConfigError
from pocket.train.run import train_from_config
from pocket.train.trainer import RunExistsError


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The config and an uninterrupted 3-epoch run of it, shared by the resume tests."""
    d = tmp_path_factory.mktemp("resume")
    cfg = _write_config(d)
    train_from_config(str(cfg), {"out": str(d / "whole")}, quiet=True)
    return d, cfg, d / "whole"


def _kill_after(cfg: Path, out: Path, epoch: int, step: int = 0) -> None:
    """Train in a child that dies at (epoch, step): after `epoch` epochs and step+1 steps."""
    proc = _child(f"""
        import os, signal
        from pocket.train.run import train_from_config

        def kill(trainer, epoch, step):
            if (epoch, step) == ({epoch}, {step}):
                os.kill(os.getpid(), signal.SIGKILL)

        train_from_config({str(cfg)!r}, {{"out": {str(out)!r}}}, quiet=True, callbacks=[kill])
    """, cfg.parent)
    _assert_killed(proc)


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pocket.cli", *args], cwd=cwd, env=_env(),
                          capture_output=True, text=True, timeout=120)


def _assert_same_run(a: Path, b: Path) -> None:
    _assert_same_checkpoint(a / "last.ckpt", b / "last.ckpt")
    _assert_same_checkpoint(a / "best.ckpt", b / "best.ckpt")
    assert _history_without_timing(a / "metrics.jsonl") == \
        _history_without_timing(b / "metrics.jsonl")


def test_resume_is_bitwise_whatever_flags_it_repeats_or_omits(run):
    d, cfg, whole = run
    killed = d / "killed1"
    _kill_after(cfg, killed, epoch=1)
    with read_container(killed / "last.ckpt", expect_kind="checkpoint") as c:
        assert c.meta["trainer"]["epoch"] == 1
    copies = {name: d / name for name in ("bare", "repeated", "config_only")}
    for path in copies.values():
        shutil.copytree(killed, path)

    # The checkpoint alone, through the real command: no CONFIG, no flags.
    r = _cli(["train", "--resume", str(copies["bare"] / "last.ckpt"), "--json"], d)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["epochs"] == 3
    assert "resuming" in r.stderr and "from epoch 1 of 3" in r.stderr
    # Every flag repeated with the run's own value.
    train_from_config(str(cfg), {"resume": str(copies["repeated"] / "last.ckpt"), "epochs": 3,
                                 "lr": 3e-3, "out": str(copies["repeated"]), "seed": 3,
                                 "batch_size": 16, "device": "cpu"}, quiet=True)
    # The config file again, but not --out: the run continues in the checkpoint's folder.
    train_from_config(str(cfg), {"resume": str(copies["config_only"] / "last.ckpt")},
                      quiet=True)
    for path in copies.values():
        _assert_same_run(path, whole)


def test_killed_in_the_first_epoch_resumes_from_the_start_checkpoint(run):
    d, cfg, whole = run
    killed = d / "killed0"
    _kill_after(cfg, killed, epoch=0, step=3)
    with read_container(killed / "last.ckpt", expect_kind="checkpoint") as c:
        assert c.meta["trainer"]["epoch"] == 0 and c.meta["trainer"]["step"] == 0
    (killed / ".last.ckpt.0123456789ab.tmp").write_bytes(b"half a checkpoint")
    train_from_config(None, {"resume": str(killed / "last.ckpt")}, quiet=True)
    _assert_same_run(killed, whole)
    assert not list(killed.glob(".*.tmp")), "stale temporary files were left"


CTRL_C = """
    import signal
    import pocket.train.run as run
    from pocket.cli import main

    # A job started in the background by a non-interactive shell (CI, `cmd &`)
    # inherits SIGINT ignored; a terminal's Ctrl-C reaches a foreground process
    # that has Python's default handler, which is what this test is about.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    real = run.train_from_config

    def interrupt(trainer, epoch, step):
        if (epoch, step) == (1, 3):
            signal.raise_signal(signal.SIGINT)

    def with_callback(*args, **kwargs):
        return real(*args, **kwargs, callbacks=[interrupt])

    run.train_from_config = with_callback
    main(["train", {cfg!r}, "--out", {out!r}])
"""


def test_ctrl_c_says_what_last_ckpt_holds_and_the_resume_command_works(run):
    d, cfg, whole = run
    out = d / "interrupted"
    code = textwrap.dedent(CTRL_C.format(cfg=str(cfg), out=str(out)))
    proc = subprocess.run([sys.executable, "-c", code],
                          cwd=d, env=_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 130, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "Interrupted in epoch 2 of 3" in last
    assert f"{out / 'last.ckpt'} holds epoch 1 of 3" in last
    command = last.split("Resume with: ", 1)[1]
    args = shlex.split(command)
    assert args[:3] == ["pocket", "train", "--resume"]
    r = _cli(args[1:], d)
    assert r.returncode == 0, r.stderr[-2000:]
    _assert_same_run(out, whole)


def test_a_new_run_refuses_an_existing_run_folder_without_force(run):
    d, cfg, whole = run
    out = d / "again"
    train_from_config(str(cfg), {"out": str(out), "epochs": 1}, quiet=True)
    before = (out / "last.ckpt").read_bytes()
    with pytest.raises(RunExistsError) as e:
        train_from_config(str(cfg), {"out": str(out), "epochs": 1}, quiet=True)
    msg = str(e.value)
    assert str(out) in msg and "--force" in msg and "--resume" in msg
    assert (out / "last.ckpt").read_bytes() == before  # untouched
    r = train_from_config(str(cfg), {"out": str(out), "epochs": 2, "force": True}, quiet=True)
    assert r["epochs"] == 2
    assert [row["epoch"] for row in _history_without_timing(out / "metrics.jsonl")] == [1, 2]


def test_resume_refuses_flags_that_would_change_the_run(run):
    d, cfg, whole = run
    ck = str(whole / "last.ckpt")
    for flags, words in (({"lr": 0.1}, ["--lr 0.1", "0.003"]),
                         ({"batch_size": 8}, ["--batch-size 8", "16"]),
                         ({"out": str(d / "elsewhere")}, ["--out", str(whole)]),
                         ({"epochs": 2}, ["--epochs 2", "3 epochs"]),
                         ({"force": True}, ["--force", "--resume"])):
        with pytest.raises(ConfigError) as e:
            train_from_config(None, {"resume": ck, **flags}, quiet=True)
        for w in words:
            assert w in str(e.value), (w, str(e.value))


def test_a_config_file_that_differs_is_named_and_the_checkpoint_wins(run, capsys):
    d, cfg, whole = run
    out = d / "differs"
    shutil.copytree(whole, out)
    other = d / "other.toml"
    other.write_text(cfg.read_text().replace("lr = 3e-3", "lr = 0.1"))
    r = train_from_config(str(other), {"resume": str(out / "last.ckpt")})
    err = capsys.readouterr().err
    assert "differs from the checkpoint's config in [train] lr" in err
    assert "nothing to train" in err and r["epochs"] == 3
    _assert_same_run(out, whole)


def test_epochs_extend_a_finished_run_and_the_log_says_so(run, capsys):
    d, cfg, whole = run
    out = d / "extended"
    shutil.copytree(whole, out)
    r = train_from_config(None, {"resume": str(out / "last.ckpt"), "epochs": 4})
    err = capsys.readouterr().err
    assert r["epochs"] == 4
    assert "4 epochs in all (the run was for 3)" in err
    assert [row["epoch"] for row in _history_without_timing(out / "metrics.jsonl")] == [1, 2, 3, 4]
    # The first three epochs are the original run's, untouched.
    assert _history_without_timing(out / "metrics.jsonl")[:3] == \
        _history_without_timing(whole / "metrics.jsonl")


def test_early_stopping_and_keeping_the_last_checkpoint(run, capsys):
    d, cfg, whole = run
    text = cfg.read_text().replace('schedule = "cosine"', 'schedule = "cosine"\npatience = 1\n'
                                   'min_delta = 100.0\nmonitor = "val_loss"\nkeep = "last"')
    cfg2 = d / "early.toml"
    cfg2.write_text(text)
    out = d / "early"
    r = train_from_config(str(cfg2), {"out": str(out)}, verbose=True)
    err = capsys.readouterr().err
    assert "peak" in err and "MiB" in err  # --verbose's extra on each epoch line
    # Epoch 1 sets the best; epoch 2 cannot beat it by 100, and patience is 1 epoch.
    assert r["epochs"] == 2 and r["stopped_early"]["epoch"] == 2
    assert "early stop after epoch 2" in err and "val_loss has not improved by more than 100" \
        in err
    assert r["result_checkpoint"] == str(out / "last.ckpt")
    with read_container(out / "last.ckpt", expect_kind="checkpoint") as c:
        assert set(c.graph.metadata["metrics"]) >= {"test_loss", "test_accuracy"}
        assert c.meta["trainer"]["stopped"]["epoch"] == 2
    # Resuming a stopped run trains nothing more.
    again = train_from_config(None, {"resume": str(out / "last.ckpt")}, quiet=True)
    assert again["epochs"] == 2 and again["steps"] == r["steps"]


def test_json_keeps_progress_on_stderr_and_quiet_silences_it(run):
    d, cfg, whole = run
    r = _cli(["train", str(cfg), "--out", str(d / "json"), "--epochs", "1", "--json"], d)
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(r.stdout)  # exactly one JSON object, nothing else on stdout
    assert result["epochs"] == 1
    assert "epoch   1" in r.stderr
    q = _cli(["train", str(cfg), "--out", str(d / "quiet"), "--epochs", "1", "--quiet"], d)
    assert q.returncode == 0 and q.stderr == "" and "trained 1 epoch " in q.stdout
