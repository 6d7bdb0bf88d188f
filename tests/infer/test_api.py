"""The embedding API (pocket.infer.load -> Model) on the real digits model: the stored
preprocessing gives the trainer's inputs from raw data, results are the caller's to keep."""

from __future__ import annotations

import numpy as np
import pytest
from models import Builder, save_model

import pocket.infer as pi
from pocket.formats import reference as ref
from pocket.infer.inputs import InputError


@pytest.fixture(scope="module")
def digits_bins(digits_ckpt, tmp_path_factory):
    from pocket.export.app import export

    out = tmp_path_factory.mktemp("api")
    paths = {"fp32": str(out / "model.bin"), "int8": str(out / "model.int8.bin")}
    export(digits_ckpt, paths["fp32"])
    export(digits_ckpt, paths["int8"], int8=True)
    return paths


@pytest.fixture(scope="module")
def raw_digits():
    sklearn = pytest.importorskip("sklearn.datasets")
    d = sklearn.load_digits()
    return d.images, d.target  # (1797, 8, 8) float64 in 0..16


def _assert_rows_found(x_all: np.ndarray, rows: np.ndarray) -> None:
    """Every row of `rows` (the trainer's preprocessed test split) is one of x_all's."""
    a = x_all.reshape(len(x_all), -1).astype(np.float64)
    b = rows.reshape(len(rows), -1).astype(np.float64)
    d2 = (b**2).sum(1)[:, None] - 2 * b @ a.T + (a**2).sum(1)[None]
    assert np.sqrt(np.maximum(d2.min(1), 0)).max() < 1e-4


@pytest.mark.parametrize("kind", ["fp32", "int8"])
def test_raw_digits_and_pixels_give_the_right_answer(digits_bins, raw_digits, digits_test_data,
                                                     kind):
    raw_all, y_all = raw_digits
    with pi.load(digits_bins[kind]) as model:
        x_all = model.preprocess(raw_all)
        assert x_all.shape == (1797, 1, 8, 8) and x_all.dtype == np.float32
        # the trainer preprocessed its test split itself: those rows are among ours
        _assert_rows_found(x_all, digits_test_data[0])
        # the same images as 0..255 pixels, as a camera or a PNG would give them
        px = raw_all * (255.0 / 16.0)
        np.testing.assert_allclose(model.preprocess(px, pixels=True), x_all, rtol=1e-5, atol=1e-5)
        raw, y, x = raw_all[:300], y_all[:300], x_all[:300]
        pred = model.predict(x)
        acc = np.mean([int(label) for label in pred.labels] == y)
        assert acc >= 0.9, acc
        # sklearn's flat rows (64,) and one sample without its batch axis
        np.testing.assert_array_equal(model.preprocess(raw.reshape(300, 64)), x)
        one = model.preprocess(raw[7])
        assert one.shape == (1, 8, 8)
        assert model.predict(one).labels == [pred.labels[7]]
        np.testing.assert_allclose(model.predict(one).probs[0], pred.probs[7], rtol=1e-5, atol=1e-6)
        assert pred.probs.shape == (300, 10)
        np.testing.assert_allclose(pred.probs.sum(1), 1.0, rtol=1e-9)


def test_png_path_and_pil_image(digits_bins, raw_digits, tmp_path):
    pil = pytest.importorskip("PIL.Image")
    raw, _ = raw_digits
    pixels = np.round(raw[3] * (255.0 / 16.0)).astype(np.uint8)
    pil.fromarray(pixels).save(tmp_path / "d.png")
    with pi.load(digits_bins["fp32"]) as model:
        want = model.preprocess(pixels, pixels=True)
        np.testing.assert_allclose(model.preprocess(str(tmp_path / "d.png"))[0], want, rtol=1e-6)
        with pil.open(tmp_path / "d.png") as im:
            np.testing.assert_allclose(model.preprocess(im), want, rtol=1e-6)
        assert model.predict(tmp_path / "d.png").labels == model.predict(want).labels


def test_results_survive_the_next_call_and_out(digits_bins):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 5, 1, 8, 8)).astype(np.float32)
    with pi.load(digits_bins["fp32"]) as model:
        ya = model.run(a)
        keep = ya.copy()
        yb = model.run(b)
        np.testing.assert_array_equal(ya, keep)
        assert not np.shares_memory(ya, yb)
        out = np.empty_like(ya)
        assert model.run(a, out=out) is out
        np.testing.assert_array_equal(out, keep)
        # one sample: no batch axis (batch 1 may take other kernels: float32 rounding apart)
        np.testing.assert_allclose(model.run(a[2]), keep[2], rtol=1e-5, atol=1e-5)
        with pytest.raises(pi.EngineError, match="out must be"):
            model.run(a, out=np.empty((4, 10), np.float32))
        # the engine's zero-copy path: a view the next call overwrites, as documented
        view = model.engine.run(a)
        model.engine.run(b)
        np.testing.assert_array_equal(view, yb)
        with pytest.raises(InputError, match="one sample"):
            model.run(np.zeros((3, 8, 8), np.float32))


def test_regression_table_model(tmp_path):
    b = Builder((2,), np.random.default_rng(3))
    b.linear(2, 1)
    pre = {"columns": ["u", "v"], "mean": [1.0, -2.0], "std": [2.0, 4.0],
           "target": {"name": "t", "mean": 5.0, "std": 3.0}}
    g = b.graph({"task": "regression", "preprocessing": pre})
    path = save_model(tmp_path / "r.bin", g, b.params)
    rows = np.array([[3.0, 2.0], [1.0, -2.0], [0.0, 10.0]])
    x = ((rows - [1.0, -2.0]) / [2.0, 4.0]).astype(np.float32)
    want = ref.run(g, b.params, x)[g.outputs[0]][:, 0] * 3.0 + 5.0
    with pi.load(path) as model:
        np.testing.assert_allclose(model.preprocess(rows), x, rtol=1e-6)
        np.testing.assert_allclose(model.preprocess({"v": rows[:, 1], "u": rows[:, 0]}), x, rtol=1e-6)
        pred = model.predict(model.preprocess(rows))
        assert pred.labels is None and pred.probs is None
        np.testing.assert_allclose(pred.values[:, 0], want, rtol=1e-5)
        with pytest.raises(InputError, match="'v'"):
            model.preprocess({"u": 1.0})
        with pytest.raises(InputError, match="image models"):
            model.preprocess(rows, pixels=True)
