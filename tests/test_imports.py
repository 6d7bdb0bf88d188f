"""The edge install stays light: formats and infer import neither the trainer nor GPU/ONNX/CLI code."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

HEAVY = ["cupy", "onnx", "onnxruntime", "click", "pocket.train", "pocket.export", "pocket.cli",
         "pocket.compare"]


@pytest.mark.parametrize("module", ["pocket.formats", "pocket.formats.container",
                                    "pocket.formats.describe", "pocket.infer"])
def test_light_imports(module):
    code = (f"import sys, {module}\n"
            f"bad = [m for m in {HEAVY!r} if m in sys.modules]\n"
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"{module} pulled in {out.stdout.strip()}"


def test_no_pickle_in_formats():
    # NumPy itself imports pickle, so check our sources instead of sys.modules.
    root = pathlib.Path(__file__).resolve().parents[1] / "pocket" / "formats"
    for f in root.glob("*.py"):
        text = f.read_text()
        assert not re.search(r"^\s*(import|from) (c?pickle|marshal|shelve)\b", text, re.M), f
        assert "allow_pickle=True" not in text, f
