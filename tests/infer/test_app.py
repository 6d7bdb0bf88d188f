"""`pocket infer`'s inputs and reports: arrays, images, CSV, classification and regression."""

from __future__ import annotations

import json

import numpy as np
import pytest
from models import Builder, cnn_mnist, save_model

from pocket.formats import reference as ref
from pocket.infer import app
from pocket.infer.inputs import InputError, load_inputs


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    rng = np.random.default_rng(5)
    g, p = cnn_mnist(rng)
    g.metadata["preprocessing"] = {"image_size": [28, 28], "mean": [0.5], "std": [0.25],
                                   "pixel_max": 1.0}
    path = save_model(tmp_path_factory.mktemp("c") / "c.bin", g, p)
    return g, p, path


def test_npy_classification(classifier, tmp_path):
    g, p, path = classifier
    x = np.random.default_rng(0).random((3, 1, 28, 28), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "one.npy", x[0])
    res = app.infer(str(path), [str(tmp_path / "x.npy"), str(tmp_path / "one.npy")], top_k=3,
                    output=str(tmp_path / "out.npy"), bench=2, warmup=True)
    json.dumps(res)
    logits = ref.run(g, p, x)[g.outputs[0]].astype(np.float64)
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    assert len(res["results"]) == 4
    for r, pr in zip(res["results"], [*probs, probs[0]]):
        assert r["label"] == str(int(np.argmax(pr)))
        assert r["probability"] == pytest.approx(pr.max(), rel=1e-4)
        assert len(r["top"]) == 3 and r["top"][1]["probability"] <= r["probability"]
    assert np.load(tmp_path / "out.npy").shape == (4, 10)
    assert res["timing"]["runs"] == 2
    text = app.render(res)
    assert f"x.npy[0]: {res['results'][0]['label']} (" in text and "latency" in text


def test_image_preprocessing(classifier, tmp_path):
    pil = pytest.importorskip("PIL.Image")
    g, p, path = classifier
    pixels = np.random.default_rng(1).integers(0, 256, (28, 28), dtype=np.uint8)
    pil.fromarray(pixels).save(tmp_path / "a.png")
    pil.fromarray(np.stack([pixels] * 3, -1)).resize((56, 40)).save(tmp_path / "b.png")
    batches = load_inputs([str(tmp_path / "a.png")], (1, 28, 28), g.metadata["preprocessing"])
    want = ((pixels / 255.0 * 1.0 - 0.5) / 0.25).astype(np.float32)
    np.testing.assert_allclose(batches[0].x[0, 0], want, rtol=1e-6)
    res = app.infer(str(path), [str(tmp_path)])
    assert [r["name"] for r in res["results"]] == [str(tmp_path / "a.png"), str(tmp_path / "b.png")]


@pytest.mark.parametrize("where", ["metadata", "preprocessing"])
def test_csv_regression(tmp_path, where):
    # The trainer records the target's standardization inside the preprocessing block.
    b = Builder((3,), np.random.default_rng(2))
    b.linear(3, 1)
    target = {"name": "price", "mean": 10.0, "std": 2.0}
    pre = {"columns": ["a", "b", "c"], "mean": [1, 2, 3], "std": [1, 2, 4]}
    meta = {"task": "regression", "preprocessing": pre}
    (meta if where == "metadata" else pre)["target"] = target
    g = b.graph(meta)
    path = save_model(tmp_path / "r.bin", g, b.params)
    (tmp_path / "t.csv").write_text("c,b,extra,a\n4,6,x,2\n3,2,y,1\n")
    res = app.infer(str(path), [str(tmp_path / "t.csv")])
    x = (np.array([[2, 6, 4], [1, 2, 3]]) - [1, 2, 3]) / [1, 2, 4]
    want = ref.run(g, b.params, x.astype(np.float32))[g.outputs[0]][:, 0] * 2.0 + 10.0
    assert [r["values"][0] for r in res["results"]] == pytest.approx(want, rel=1e-5)
    assert "price = " in app.render(res)
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    with pytest.raises(InputError, match="'c'"):
        app.infer(str(path), [str(tmp_path / "bad.csv")])


def test_input_errors(classifier, tmp_path):
    _, _, path = classifier
    with pytest.raises(InputError, match="does not exist"):
        app.infer(str(path), [str(tmp_path / "nope.npy")])
    np.save(tmp_path / "bad.npy", np.zeros((2, 3), np.float32))
    with pytest.raises(InputError, match=r"\(N, 1, 28, 28\)"):
        app.infer(str(path), [str(tmp_path / "bad.npy")])
    (tmp_path / "x.txt").write_text("1")
    with pytest.raises(InputError, match="unknown kind"):
        app.infer(str(path), [str(tmp_path / "x.txt")])
