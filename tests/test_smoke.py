"""One-second smoke test: the package imports and the CLI answers."""

import subprocess
import sys

import pocket


def test_version_and_help_are_fast():
    out = subprocess.run([sys.executable, "-m", "pocket.cli", "--version"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0
    assert pocket.__version__ in out.stdout
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "pocket.cli", "--help"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0
    for cmd in ("train", "export", "infer", "compare", "inspect"):
        assert cmd in out.stdout
    # --help must not pay for the heavy stack
    for heavy in ("numpy", "numba", "onnx", "cupy"):
        assert f" {heavy}\n" not in out.stderr and f" {heavy}." not in out.stderr
