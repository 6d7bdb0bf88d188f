"""`pocket infer` on an embedding model: the vectors (printed, or saved with -o) and
--similarity's cosine and verdict at the model's threshold; a clear error elsewhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from models import save_model

from pocket.formats.ir import Graph, Node, ValueInfo
from pocket.infer import app
from pocket.infer.inputs import InputError


def _graph(task, threshold=0.5):
    rng = np.random.default_rng(1)
    w = rng.normal(size=(4, 6)).astype(np.float32)
    nodes = [Node("fc", "linear", ["input", "w"], ["h"], {})]
    if task == "embedding":
        nodes.append(Node("norm", "l2norm", ["h"], ["output"], {"axis": 1, "eps": 1e-12}))
    else:
        nodes[0].outputs = ["output"]
    meta = {"task": task}
    if task == "embedding" and threshold is not None:
        meta["embedding"] = {"dim": 4, "threshold": threshold}
    g = Graph({"input": ValueInfo("f32", ("N", 6))}, ["output"], nodes,
              {"w": ValueInfo("f32", w.shape)}, meta)
    g.validate()
    return g, {"w": w}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("emb")
    out = {}
    for name, task, t in (("emb", "embedding", 0.5), ("nothr", "embedding", None),
                          ("cls", "classification", None)):
        g, p = _graph(task, t)
        out[name] = str(save_model(d / f"{name}.bin", g, p))
    rng = np.random.default_rng(2)
    a = rng.normal(size=6).astype(np.float32)
    np.save(d / "a.npy", a)
    np.save(d / "a2.npy", a * 3.0)  # the same direction: cosine 1 after the projection
    np.save(d / "b.npy", -a)  # the opposite: cosine -1
    out["dir"], out["w"] = d, _graph("embedding")[1]["w"]
    return out


def test_vectors_are_printed_and_saved(files, tmp_path):
    d = files["dir"]
    res = app.infer(files["emb"], [str(d / "a.npy"), str(d / "b.npy")],
                    output=str(tmp_path / "emb.npy"))
    emb = np.load(tmp_path / "emb.npy")
    h = np.load(d / "a.npy").astype(np.float64) @ files["w"].T.astype(np.float64)
    np.testing.assert_allclose(emb[0], h / np.linalg.norm(h), rtol=1e-5)
    np.testing.assert_allclose(emb[1], -emb[0], rtol=1e-6)
    assert res["task"] == "embedding"
    text = app.render(res)
    assert "a.npy: " in text and "saved outputs" in text


@pytest.mark.parametrize("other,verdict,cos", [("a2", "same", 1.0), ("b", "different", -1.0)])
def test_similarity_verdict(files, other, verdict, cos):
    d = files["dir"]
    res = app.infer(files["emb"], [str(d / "a.npy"), str(d / f"{other}.npy")], similarity=True)
    s = res["similarity"]
    assert s["cosine"] == pytest.approx(cos, abs=1e-6)
    assert s["verdict"] == verdict and s["threshold"] == 0.5
    json.dumps(res)
    assert f"-> {verdict} (threshold 0.5000)" in app.render(res)


def test_similarity_without_threshold_and_bad_counts(files):
    d = files["dir"]
    res = app.infer(files["nothr"], [str(d / "a.npy"), str(d / "b.npy")], similarity=True)
    assert res["similarity"]["verdict"] is None and "no verdict" in app.render(res)
    with pytest.raises(InputError, match="exactly two samples, got 3"):
        app.infer(files["emb"], [str(d / "a.npy")] * 3, similarity=True)


def test_similarity_on_a_classifier_is_one_clear_error(files):
    d = files["dir"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    env.pop("POCKET_DEBUG", None)
    r = subprocess.run([sys.executable, "-m", "pocket.cli", "infer", files["cls"],
                        str(d / "a.npy"), str(d / "b.npy"), "--similarity"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 3
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:") and "not an embedding model" in lines[0]
