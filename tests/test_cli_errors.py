"""Bad input to `pocket train`: exit 3 and one `Error:` line that says what to fix, never a
traceback; POCKET_DEBUG=1 brings the traceback back."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]

GOOD_CSV = "a,b,y\n1,2,0\n4,5,1\n7,8,0\n2,3,1\n5,6,0\n8,9,1\n3,1,0\n6,4,1\n9,7,0\n1,5,1\n"


def _files(folder: Path) -> None:
    (folder / "good.csv").write_text(GOOD_CSV)
    (folder / "text_cell.csv").write_text(GOOD_CSV.replace("4,5,1", "4,five,1"))
    (folder / "nan.csv").write_text(GOOD_CSV.replace("4,5,1", "4,nan,1"))
    x = np.ones((20, 3), np.float32)
    np.savez(folder / "good.npz", x=x, y=np.arange(20) % 2)
    data = (folder / "good.npz").read_bytes()
    (folder / "truncated.npz").write_bytes(data[:len(data) // 2])
    x[3, 1] = np.nan
    np.savez(folder / "nan.npz", x=x, y=np.arange(20) % 2)
    (folder / "ok.toml").write_text(
        '[run]\ndevice = "cpu"\n[data]\ntarget = "y"\n[model]\nname = "mlp"\nhidden = [4]\n'
        '[train]\nepochs = 1\nbatch_size = 2\n')
    (folder / "typo.toml").write_text('[train]\nepocs = 2\n')
    (folder / "model.toml").write_text('[run]\ndevice = "cpu"\n[data]\nsource = "csv:good.csv"\n'
                                       'target = "y"\n[model]\nname = "resnt"\n')
    (folder / "malformed.toml").write_text('[train\nepochs = 2\n')
    (folder / "wrong_type.toml").write_text('[train]\nepochs = "ten"\n')


def _pocket(args: list[str], cwd: Path, debug: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("POCKET_DEBUG", None)
    env.pop("POCKET_DEVICE", None)
    if debug:
        env["POCKET_DEBUG"] = "1"
    return subprocess.run([sys.executable, "-m", "pocket.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


# (args after `pocket train`, words the one Error: line must hold)
CASES = {
    "missing data file": (["ok.toml", "--data", "csv:/no/such.csv"],
                          ["/no/such.csv", "not found"]),
    "csv text cell": (["ok.toml", "--data", "csv:text_cell.csv"],
                      ["text_cell.csv", "'b'", "not numeric", "'five'", "line 3"]),
    "truncated npz": (["ok.toml", "--data", "npz:truncated.npz"], ["truncated.npz", "NPZ"]),
    "unknown config key": (["typo.toml"], ["epocs", "[train]", "did you mean 'epochs'"]),
    "wrong type": (["wrong_type.toml"], ["epochs", "int", "'ten'"]),
    "csv NaN": (["ok.toml", "--data", "csv:nan.csv"], ["nan.csv", "NaN", "line 3", "'b'"]),
    "npz NaN": (["ok.toml", "--data", "npz:nan.npz"], ["nan.npz", "NaN", "(3, 1)"]),
    "unknown model": (["model.toml"], ["'resnt'", "did you mean 'resnet'"]),
    "bad budget": (["ok.toml", "--memory-budget", "4 lightyears"],
                   ["'4 lightyears'", "4GiB"]),
    "cuda without gpu": (["ok.toml", "--device", "cuda"], ["CUDA", "--device cpu"]),
    "missing config": (["nope.toml"], ["nope.toml", "not found"]),
    "malformed toml": (["malformed.toml"], ["malformed.toml", "not valid TOML", "line 1"]),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli_errors")
    _files(d)
    return d


def _cuda_present() -> bool:
    from pocket.train import backend

    return backend.cupy_available()


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_error_line_and_exit_3(folder, case):
    args, words = CASES[case]
    if case == "cuda without gpu" and _cuda_present():
        pytest.skip("this machine has a GPU")
    r = _pocket(["train", *args, "--out", str(folder / "run")], folder)
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("Error: ")
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert r.stdout == ""


def test_csv_without_target_column_lists_the_columns(folder):
    (folder / "no_target.toml").write_text(
        (folder / "ok.toml").read_text().replace('target = "y"', 'target = "label"'))
    r = _pocket(["train", "no_target.toml", "--data", "csv:good.csv"], folder)
    assert r.returncode == 3, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("Error: ") and "'label'" in line
    assert "a, b, y" in line


def test_debug_shows_the_traceback(folder):
    r = _pocket(["train", "typo.toml"], folder, debug=True)
    assert r.returncode != 0
    assert "Traceback (most recent call last)" in r.stderr
    assert "ConfigError" in r.stderr and "epocs" in r.stderr
