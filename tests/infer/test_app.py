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


def _probs(g, p, x):
    logits = ref.run(g, p, x)[g.outputs[0]].astype(np.float64)
    e = np.exp(logits - logits.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def test_warmup_and_bench_without_inputs(classifier):
    _, _, path = classifier
    res = app.infer(str(path), [], warmup=True)
    assert res["results"] == [] and res["warmup_s"] > 0
    assert "warmed up" in app.render(res)
    res = app.infer(str(path), [], bench=3)
    assert res["timing"]["runs"] == 3 and res["timing"]["batch"] == 1
    assert res["timing"]["input"] == "synthetic"
    with pytest.raises(InputError, match="at least one input"):
        app.infer(str(path), [])


def test_stdin_by_content(classifier, tmp_path):
    import io

    g, p, path = classifier
    x = np.random.default_rng(4).random((2, 1, 28, 28), dtype=np.float32)
    want = _probs(g, p, x)
    buf = io.BytesIO()
    np.save(buf, x)
    res = app.infer(str(path), ["-"], stdin=io.BytesIO(buf.getvalue()))
    assert [r["name"] for r in res["results"]] == ["<stdin>[0]", "<stdin>[1]"]
    assert [r["probability"] for r in res["results"]] == pytest.approx(want.max(1), rel=1e-4)
    buf = io.BytesIO()
    np.savez(buf, x=x[:1], y=np.zeros(1))
    res = app.infer(str(path), ["-"], stdin=io.BytesIO(buf.getvalue()))
    assert res["results"][0]["probability"] == pytest.approx(want[0].max(), rel=1e-4)
    with pytest.raises(InputError, match="empty"):
        app.infer(str(path), ["-"], stdin=io.BytesIO(b""))
    with pytest.raises(InputError, match="once"):
        app.infer(str(path), ["-", "-"], stdin=io.BytesIO(b""))
    pil = pytest.importorskip("PIL.Image")
    pixels = np.random.default_rng(1).integers(0, 256, (28, 28), dtype=np.uint8)
    pil.fromarray(pixels).save(tmp_path / "a.png")
    from_file = app.infer(str(path), [str(tmp_path / "a.png")])["results"][0]
    piped = app.infer(str(path), ["-"], stdin=io.BytesIO((tmp_path / "a.png").read_bytes()))
    assert piped["results"][0]["top"] == from_file["top"]


def test_stdin_csv_and_the_dialects_training_reads(tmp_path):
    import io

    b = Builder((2,), np.random.default_rng(2))
    b.linear(2, 1)
    g = b.graph({"task": "regression", "preprocessing": {"columns": ["a", "b"]}})
    path = save_model(tmp_path / "r.bin", g, b.params)
    want = ref.run(g, b.params, np.array([[1, 2], [3, 4]], np.float32))[g.outputs[0]][:, 0]
    texts = ["a,b\n1,2\n3,4\n", "\ufeffa;b\r\n1;2\r\n3;4\r\n\r\n", 'b\ta\n"2"\t1\n\n4\t3\n\n']
    for i, text in enumerate(texts):
        (tmp_path / f"t{i}.csv").write_text(text, encoding="utf-8", newline="")
        res = app.infer(str(path), [str(tmp_path / f"t{i}.csv")])
        assert [r["values"][0] for r in res["results"]] == pytest.approx(want, rel=1e-5), text
        res = app.infer(str(path), ["-"], stdin=io.BytesIO(text.encode()))
        assert [r["values"][0] for r in res["results"]] == pytest.approx(want, rel=1e-5), text
    # a declared separator beats sniffing: '|' is not one of the sniffed three
    (tmp_path / "pipe.csv").write_text("a|b\n1|2\n3|4\n")
    res = app.infer(str(path), [str(tmp_path / "pipe.csv")], sep="|")
    assert [r["values"][0] for r in res["results"]] == pytest.approx(want, rel=1e-5)
    with pytest.raises(InputError, match="no column"):
        app.infer(str(path), [str(tmp_path / "pipe.csv")])
    with pytest.raises(InputError, match="one character"):
        app.infer(str(path), [str(tmp_path / "pipe.csv")], sep="||")


def test_folders_run_in_batches(classifier, tmp_path, monkeypatch):
    pil = pytest.importorskip("PIL.Image")
    g, p, path = classifier
    rng = np.random.default_rng(8)
    for i in range(5):
        pil.fromarray(rng.integers(0, 256, (28, 28), dtype=np.uint8)).save(tmp_path / f"{i}.png")
    seen = []
    real_run = app.Model.__init__

    def spy(self, *a, **kw):
        real_run(self, *a, **kw)
        run = self.engine.run
        self.engine.run = lambda x, **k: (seen.append(len(x)), run(x, **k))[1]

    monkeypatch.setattr(app.Model, "__init__", spy)
    res = app.infer(str(path), [str(tmp_path)], batch_size=2)
    assert seen == [2, 2, 1]
    assert [r["name"] for r in res["results"]] == [str(tmp_path / f"{i}.png") for i in range(5)]
    x = np.stack([load_inputs([str(tmp_path / f"{i}.png")], (1, 28, 28),
                              g.metadata["preprocessing"])[0].x[0] for i in range(5)])
    assert [r["probability"] for r in res["results"]] == pytest.approx(_probs(g, p, x).max(1), rel=1e-4)
