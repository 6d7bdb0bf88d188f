"""Token ids end to end through the CLI: an npz with `vocab` trains a `transformer` with an
embedding, exports to .bin and ONNX with an i64 input, and `pocket compare` passes its gates."""

import json
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

CONFIG = """
[data]
source = "npz:{npz}"
[model]
name = "transformer"
vocab = 10
dim = 8
depth = 1
heads = 2
[train]
epochs = 2
batch_size = 32
"""


def pocket(*args, expect=0):
    out = subprocess.run([sys.executable, "-m", "pocket.cli", *map(str, args)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == expect, f"{args}: exit {out.returncode}\n{out.stderr}"
    return out


def test_token_transformer_pipeline(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 10, (200, 6))
    npz = tmp_path / "tok.npz"
    np.savez(npz, x=x, y=(x[:, 0] > 4).astype(np.int64), vocab=10)
    cfg = tmp_path / "tok.toml"
    cfg.write_text(CONFIG.format(npz=npz))
    pocket("train", cfg, "--out", tmp_path / "run", "--quiet")
    ckpt = tmp_path / "run" / "best.ckpt"
    pocket("export", ckpt, "-o", tmp_path / "m.bin")
    pocket("export", ckpt, "-o", tmp_path / "m.onnx")
    out = json.loads(pocket("compare", ckpt, "--bin", tmp_path / "m.bin", "--onnx",
                            tmp_path / "m.onnx", "--atol", "1e-4", "--json").stdout)
    assert out["passed"]
    np.savez(npz, x=x, y=x[:, 0], vocab=5)  # ids up to 9 with a vocabulary of 5
    err = pocket("train", cfg, "--out", tmp_path / "run2", expect=3).stderr
    assert "token ids in [0, 5)" in err
