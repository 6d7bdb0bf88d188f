"""pocket compare on a spiking model: the exports' spike counts are the training model's, and
the count gate fails a model whose counts moved."""

from __future__ import annotations

import numpy as np
import pytest

from pocket.compare import compare, count_metrics, render

CONFIG = """
[run]
name = "snn_tiny"
seed = 0
[data]
source = "digits"
limit = 400
[model]
name = "snn"
steps = 4
channels = [4]
hidden = [16]
readout = "count"
[train]
epochs = 1
batch_size = 50
lr = 5e-3
"""


@pytest.fixture(scope="module")
def snn_exports(tmp_path_factory):
    pytest.importorskip("sklearn")
    from pocket.export.app import export
    from pocket.train.run import train_from_config

    root = tmp_path_factory.mktemp("snn")
    (root / "snn.toml").write_text(CONFIG)
    train_from_config(str(root / "snn.toml"), {"out": str(root / "run"), "force": True},
                      quiet=True)
    ckpt = str(root / "run" / "best.ckpt")
    paths = {"bin": str(root / "m.bin"), "int8": str(root / "m.int8.bin")}
    export(ckpt, paths["bin"])
    export(ckpt, paths["int8"], int8=True)
    try:
        import onnxruntime  # noqa: F401
    except ImportError:  # the .bin side alone
        return ckpt, paths
    paths["onnx"] = str(root / "m.onnx")
    export(ckpt, paths["onnx"])
    return ckpt, paths


def test_exports_give_the_training_models_spike_counts(snn_exports):
    ckpt, paths = snn_exports
    r = compare(ckpt, bin_path=paths["bin"], onnx_path=paths.get("onnx"))
    assert r["passed"] and r["spike_counts"], render(r)
    for p in r["pairs"]:
        assert p["gates"]["max_count_mismatch"] == 0.01 and p["gates"]["atol"] is None
        assert p["metrics"]["count_mismatch"] <= 0.01
    assert "samples whose counts differ" in render(r)
    q = compare(ckpt, bin_path=paths["int8"])
    assert q["passed"], render(q)
    assert q["pairs"][0]["precision"] == "int8"  # weight-only int8 is seen as int8
    acc = {k: e["accuracy"] for k, e in q["engines"].items()}
    assert acc["bin"] >= acc["train"] - 0.01


def test_the_count_gate_fails_moved_counts(snn_exports, tmp_path):
    from pocket.formats.container import read_container, write_container

    ckpt, paths = snn_exports
    with read_container(paths["bin"]) as c:
        g = c.graph
        g.nodes[-1].attrs["threshold"] *= 0.5  # the head fires about twice as often
        tensors = {k: np.array(v) for k, v in c.tensors.items()}
    write_container(tmp_path / "bad.bin", kind="model", tensors=tensors, graph=g)
    r = compare(ckpt, bin_path=str(tmp_path / "bad.bin"))
    assert not r["passed"]
    assert any("spike counts differ" in f and "max_count_mismatch" in f for f in r["failures"])
    loose = compare(ckpt, bin_path=str(tmp_path / "bad.bin"), max_count_mismatch=1.0,
                    min_agreement=0.0)
    assert loose["passed"]


def test_count_metrics_by_hand():
    a = np.array([[1, 2, 0], [3, 0, 0], [0, 0, 4]], np.float32)
    b = np.array([[1, 2, 0], [2, 0, 1], [0, 0, 4]], np.float32)
    m = count_metrics(a, b)
    assert m == {"count_mismatch_samples": 1, "count_mismatch": 1 / 3, "count_mismatch_spikes": 2}
