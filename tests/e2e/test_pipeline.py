"""train -> export -> infer -> compare through the CLI, on a small digits model, in seconds."""

import json
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("sklearn")
pytest.importorskip("onnxruntime")
pytest.importorskip("PIL")

CONFIG = """
[run]
seed = 3
[data]
source = "digits"
[model]
name = "mlp"
hidden = [48]
[train]
epochs = 4
batch_size = 32
lr = 5e-3
"""


def pocket(*args, expect=0):
    out = subprocess.run([sys.executable, "-m", "pocket.cli", *map(str, args)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == expect, f"{args}: exit {out.returncode}\n{out.stderr}"
    return out


def test_train_export_infer_compare(tmp_path):
    cfg = tmp_path / "digits_mlp.toml"
    cfg.write_text(CONFIG)
    run = tmp_path / "run"
    train = json.loads(pocket("train", cfg, "--out", run, "--json").stdout)
    assert train["test"]["accuracy"] >= 0.85
    for name in ("best.ckpt", "last.ckpt", "metrics.jsonl"):
        assert (run / name).exists()
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 4

    ckpt = run / "best.ckpt"
    fp32, int8, onnx = run / "model.bin", run / "model.int8.bin", run / "model.int8.onnx"
    pocket("export", ckpt, "-o", fp32)
    rep = json.loads(pocket("export", ckpt, "-o", int8, "--int8", "--json").stdout)
    assert rep["int8"] and rep["size"] < rep["fp32_size"]
    pocket("export", ckpt, "-o", onnx, "--int8")

    # Real image files, decoded with the preprocessing stored in the model.
    samples = tmp_path / "samples"
    subprocess.run([sys.executable, "scripts/digits_samples.py", samples, "4"], check=True,
                   capture_output=True, timeout=120)
    res = json.loads(pocket("infer", int8, samples, "--top-k", "3", "--json").stdout)
    assert len(res["results"]) == 4
    right = sum(r["label"] == r["name"].rsplit("label", 1)[1].split(".")[0]
                for r in res["results"])
    assert right >= 3
    assert all(len(r["top"]) == 3 for r in res["results"])
    text = pocket("infer", fp32, samples).stdout
    assert text.count("(") >= 4  # "7 (0.98)" per image

    # Raw arrays, and the raw outputs saved.
    x = np.random.default_rng(0).standard_normal((3, 1, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    pocket("infer", fp32, tmp_path / "x.npy", "-o", tmp_path / "y.npy")
    assert np.load(tmp_path / "y.npy").shape == (3, 10)

    ok = json.loads(pocket("compare", ckpt, "--bin", fp32, "--json").stdout)
    assert ok["passed"]
    ok = json.loads(pocket("compare", ckpt, "--bin", int8, "--onnx", onnx, "--json").stdout)
    assert ok["passed"]
    assert pocket("inspect", int8).stdout.startswith(str(int8))
