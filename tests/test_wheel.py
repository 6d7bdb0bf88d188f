"""The device install as a user makes it: build the wheel, install it with [images] into a fresh
venv (from PyPI), check that only numpy, numba, llvmlite, click and Pillow came with it, and run
`pocket infer model.int8.bin digit.png` there, away from this checkout."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
# what a venv brings by itself, and what the edge install may add to it
BASE = {"pip", "setuptools", "wheel"}
EDGE = {"pocketnn", "numpy", "numba", "llvmlite", "click", "pillow"}


def _pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)
    assert r.returncode == 0, f"$ {' '.join(map(str, cmd))}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.mark.slow
def test_images_extra_installs_only_the_edge_and_infers_a_png(digits_ckpt, tmp_path):
    pil = pytest.importorskip("PIL.Image")
    sklearn = pytest.importorskip("sklearn.datasets")
    if not _pypi_reachable():
        pytest.skip("PyPI is not reachable from here")
    from pocket.export.app import export

    # the sources a wheel is built from, copied so the build leaves nothing in the checkout
    src = tmp_path / "src"
    shutil.copytree(REPO / "pocket", src / "pocket", ignore=shutil.ignore_patterns("__pycache__", "*.nbi",
                                                                                  "*.nbc"))
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / f, src / f)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(src)])
    (wheel,) = (tmp_path / "dist").glob("pocketnn-*.whl")

    venv = tmp_path / "venv"
    # NOTE: a venv without pip of its own (this pip installs into it): 5 s less, and `pip list`
    # then shows exactly what the install brought
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    py = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "NUMBA_CACHE", "POCKET_"))}
    pip = [sys.executable, "-m", "pip", "--python", str(py), "--disable-pip-version-check"]
    _run([*pip, "install", "-q", f"{wheel}[images]"], env=env)
    listed = json.loads(_run([*pip, "list", "--format", "json"], env=env).stdout)
    names = {p["name"].lower() for p in listed} - BASE
    extra = {"tomli"} if sys.version_info < (3, 11) else set()
    assert names == EDGE | extra, sorted(names)

    device = tmp_path / "device"
    device.mkdir()
    export(digits_ckpt, str(device / "model.int8.bin"), int8=True)
    digits = sklearn.load_digits()
    i = 13
    pil.fromarray(np.round(digits.images[i] * 255 / 16).astype(np.uint8)).save(device / "digit.png")
    env["NUMBA_CACHE_DIR"] = str(tmp_path / "numba_cache")
    r = _run([venv / "bin" / "pocket", "infer", "model.int8.bin", "digit.png"], cwd=device, env=env)
    assert r.stdout.startswith(f"digit.png: {digits.target[i]} ("), r.stdout
    r = _run([py, "-c", "import pocket, sys; print(pocket.__file__); "
              "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sklearn', 'scipy', 'onnx')))"],
             cwd=device, env=env)
    assert str(venv) in r.stdout.splitlines()[0] and r.stdout.splitlines()[1] == "[]"
