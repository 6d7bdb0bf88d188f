"""csv: and npz: sources, stratified splits, and train-only normalization statistics."""

import numpy as np
import pytest

from pocket.train.data import DataError, load_dataset


def write_csv(path, header, rows, sep=","):
    with open(path, "w", newline="") as f:
        f.write(sep.join(header) + "\n")
        for r in rows:
            f.write(sep.join(str(v) for v in r) + "\n")
    return path


def recover(split_x, prep):
    return split_x.astype(np.float64) * np.array(prep["std"]) + np.array(prep["mean"])


@pytest.fixture
def species_csv(tmp_path):
    # 100 / 50 / 20 rows of three classes; 'id' makes every row identifiable
    rng = np.random.default_rng(0)
    names = ["setosa"] * 100 + ["versicolor"] * 50 + ["virginica"] * 20
    rows = [(i, round(rng.normal(5, 2), 3), round(rng.normal(-1, 0.5), 3), s) for i, s in enumerate(names)]
    return write_csv(tmp_path / "iris.csv", ["id", "length", "width", "species"], rows), rows


def test_csv_classification_stratified(species_csv):
    path, rows = species_csv
    d = load_dataset(f"csv:{path}", target="species", test_fraction=0.2, val_fraction=0.1)
    assert d.task == "classification" and d.labels == ["setosa", "versicolor", "virginica"]
    assert d.num_outputs == 3 and d.input_shape == (3,)
    assert d.preprocessing["layout"] == "NC" and d.preprocessing["columns"] == ["id", "length", "width"]
    # class proportions 100:50:20 are kept: test takes 20 % of each class, val 10 % of the rest
    assert np.bincount(d.test.y).tolist() == [20, 10, 4]
    assert np.bincount(d.val.y).tolist() == [8, 4, 2]
    assert np.bincount(d.train.y).tolist() == [72, 36, 14]
    ids = {k: np.round(recover(getattr(d, k).x, d.preprocessing)[:, 0]).astype(int)
           for k in ("train", "val", "test")}
    union = np.concatenate(list(ids.values()))
    assert sorted(union.tolist()) == list(range(170))  # disjoint and complete
    # each recovered row carries the label it had in the file
    for k in ids:
        assert [rows[i][3] for i in ids[k]] == [d.labels[c] for c in getattr(d, k).y]


def test_csv_normalization_from_train_only(species_csv):
    path, rows = species_csv
    d = load_dataset(f"csv:{path}", target="species")
    ids = np.round(recover(d.train.x, d.preprocessing)[:, 0]).astype(int)
    raw_train = np.array([rows[i][:3] for i in ids], np.float64)
    np.testing.assert_allclose(d.preprocessing["mean"], raw_train.mean(axis=0), rtol=1e-10)
    np.testing.assert_allclose(d.preprocessing["std"], raw_train.std(axis=0), rtol=1e-10)
    all_raw = np.array([r[:3] for r in rows], np.float64)
    assert not np.allclose(d.preprocessing["mean"], all_raw.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(d.train.x.mean(axis=0), 0, atol=1e-6)
    np.testing.assert_allclose(d.train.x.std(axis=0), 1, atol=1e-5)


def test_csv_test_split_independent_of_seed(species_csv):
    path, _ = species_csv
    a = load_dataset(f"csv:{path}", target="species", seed=0)
    b = load_dataset(f"csv:{path}", target="species", seed=7)
    ida = np.sort(np.round(recover(a.test.x, a.preprocessing)[:, 0]))
    idb = np.sort(np.round(recover(b.test.x, b.preprocessing)[:, 0]))
    assert np.array_equal(ida, idb)
    va = np.sort(np.round(recover(a.val.x, a.preprocessing)[:, 0]))
    vb = np.sort(np.round(recover(b.val.x, b.preprocessing)[:, 0]))
    assert not np.array_equal(va, vb)


def test_csv_regression_standardizes_target(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(60, 2))
    y = 3 * x[:, 0] - x[:, 1] + 10 + rng.normal(0, 0.1, 60)
    rows = [(round(a, 6), round(b, 6), round(t, 6)) for (a, b), t in zip(x, y)]
    path = write_csv(tmp_path / "r.csv", ["a", "b", "price"], rows, sep=";")
    d = load_dataset(f"csv:{path}", target="price", val_fraction=0.0, test_fraction=0.25)
    assert d.task == "regression" and d.labels is None and d.num_outputs == 1
    assert d.train.y.dtype == np.float32 and d.train.y.shape == (45,)
    t = d.preprocessing["target"]
    assert t["name"] == "price"
    raw_y = d.train.y.astype(np.float64) * t["std"] + t["mean"]
    np.testing.assert_allclose(t["mean"], raw_y.mean(), rtol=1e-6)
    np.testing.assert_allclose(t["std"], raw_y.std(), rtol=1e-5)
    assert abs(d.train.y.mean()) < 1e-5 and abs(d.train.y.std() - 1) < 1e-4
    # each (features, target) pair still belongs together after the split
    feats = recover(d.test.x, d.preprocessing)
    got = d.test.y * t["std"] + t["mean"]
    table = {(round(a, 4), round(b, 4)): v for a, b, v in rows}
    for (a, b), v in zip(feats, got):
        assert table[(round(a, 4), round(b, 4))] == pytest.approx(v, abs=1e-3)


def test_csv_integer_target_guess_and_override(tmp_path):
    rows = [(i * 0.5, i % 3) for i in range(30)]
    path = write_csv(tmp_path / "c.csv", ["f", "grade"], rows)
    d = load_dataset(f"csv:{path}", target="grade")
    assert d.task == "classification" and d.labels == ["0", "1", "2"]
    r = load_dataset(f"csv:{path}", target="grade", task="regression")
    assert r.task == "regression" and r.train.y.dtype == np.float32
    many = [(i, i * 7) for i in range(30)]  # 30 distinct integers: a quantity, not classes
    path = write_csv(tmp_path / "m.csv", ["f", "n"], many)
    assert load_dataset(f"csv:{path}", target="n").task == "regression"


@pytest.mark.parametrize("body, kw, needle", [
    ("a,b,y\n1,2,3\n", {"target": "label"}, r"no column 'label'.*a, b, y"),
    ("a,b,y\n1,2,3\n", {}, r"no target column given.*a, b, y"),
    ("a,colour,y\n1,red,0\n2,blue,1\n", {"target": "y"}, r"column 'colour' is not numeric"),
    ("a,b,y\n1,2,0\n3,,1\n", {"target": "y"}, r"line 3, column 'b'"),
    ("a,b,y\n1,2,0\n3,4,1\nNaN,5,0\n", {"target": "y"}, r"line 4, column 'a'"),
    ("a,b,y\n1,2,0\n3,inf,1\n", {"target": "y"}, r"line 3, column 'b' is not finite"),
    ("a,b,y\n1,2,0\n3,4\n", {"target": "y"}, r"line 3 has 2 fields"),
    ("", {"target": "y"}, "empty file"),
    ("a,b,y\n", {"target": "y"}, "no data rows"),
    ("a,a,y\n1,2,3\n", {"target": "y"}, "duplicate column"),
    ("a,y\n1,cat\n2,dog\n", {"target": "y", "task": "regression"}, "not numeric"),
])
def test_csv_errors(tmp_path, body, kw, needle):
    p = tmp_path / "bad.csv"
    p.write_text(body)
    with pytest.raises(DataError, match=needle) as e:
        load_dataset(f"csv:{p}", **kw)
    assert "\n" not in str(e.value)


def test_csv_missing_file(tmp_path):
    with pytest.raises(DataError, match="file not found"):
        load_dataset(f"csv:{tmp_path / 'nope.csv'}", target="y")


# ---- NPZ -------------------------------------------------------------------------------------


def test_npz_tabular(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.normal(3, 2, (80, 4))
    y = rng.integers(0, 2, 80)
    np.savez(tmp_path / "t.npz", x=x, y=y, columns=np.array(["a", "b", "c", "d"]))
    d = load_dataset(f"npz:{tmp_path / 't.npz'}")
    assert d.task == "classification" and d.labels == ["0", "1"]
    assert d.preprocessing["columns"] == ["a", "b", "c", "d"] and d.input_shape == (4,)


def test_npz_images_official_test_stats_from_train_only(tmp_path):
    rng = np.random.default_rng(2)
    x = rng.integers(0, 100, (30, 3, 6, 5), dtype=np.uint8)  # dark training images
    xt = rng.integers(150, 256, (10, 3, 6, 5), dtype=np.uint8)  # bright test images
    y, yt = np.arange(30) % 3, np.arange(10) % 3
    np.savez(tmp_path / "i.npz", x=x, y=y, x_test=xt, y_test=yt, labels=np.array(["a", "b", "c"]))
    d = load_dataset(f"npz:{tmp_path / 'i.npz'}", val_fraction=0.0)
    assert d.labels == ["a", "b", "c"] and d.input_shape == (3, 6, 5)
    assert d.preprocessing["pixel_max"] == 255
    scaled = x / 255.0
    mean, std = scaled.mean(axis=(0, 2, 3)), scaled.std(axis=(0, 2, 3))
    np.testing.assert_allclose(d.preprocessing["mean"], mean, rtol=1e-10)
    np.testing.assert_allclose(d.preprocessing["std"], std, rtol=1e-10)
    want = (xt / 255.0 - mean[:, None, None]) / std[:, None, None]
    np.testing.assert_allclose(d.test.x, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(d.test.y, yt)
    assert d.test.x.mean() > 2  # test stats were not mixed in


def test_npz_channels_last_and_float_regression(tmp_path):
    rng = np.random.default_rng(4)
    x = rng.random((20, 6, 6, 3)).astype(np.float32)
    y = rng.normal(size=(20, 2)).astype(np.float32)
    np.savez(tmp_path / "h.npz", x=x, y=y)
    d = load_dataset(f"npz:{tmp_path / 'h.npz'}")
    assert d.input_shape == (3, 6, 6) and d.task == "regression" and d.num_outputs == 2
    assert d.preprocessing["pixel_max"] == 1.0 and len(d.preprocessing["target"]["mean"]) == 2
    assert d.train.y.shape[1] == 2


@pytest.mark.parametrize("arrays, needle", [
    ({"x": np.zeros((4, 2))}, "no array 'y'"),
    ({"x": np.zeros((4, 2)), "y": np.zeros(3)}, "must match"),
    ({"x": np.array([[1.0, np.nan]] * 4), "y": np.zeros(4)}, "NaN or inf"),
    ({"x": np.array([[1.0, np.inf]] * 4), "y": np.zeros(4)}, "NaN or inf"),
    ({"x": np.zeros((4, 2)), "y": np.array([0.0, np.nan, 1, 1])}, "NaN or inf"),
    ({"x": np.zeros((4, 2)), "y": np.zeros(4), "x_test": np.zeros((2, 2))}, "together"),
    ({"x": np.zeros((4, 2, 2, 2, 2)), "y": np.zeros(4)}, "has shape"),
    ({"x": np.zeros((4, 2)), "y": np.arange(4), "labels": np.array(["a", "b"])}, "ids 0..1"),
])
def test_npz_errors(tmp_path, arrays, needle):
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(DataError, match=needle):
        load_dataset(f"npz:{tmp_path / 'bad.npz'}")


def test_npz_refuses_pickled_arrays(tmp_path):
    obj = np.empty(4, dtype=object)
    obj[:] = [{}, {}, {}, {}]
    np.savez(tmp_path / "p.npz", x=obj, y=np.zeros(4))
    with pytest.raises(DataError, match="plain arrays"):
        load_dataset(f"npz:{tmp_path / 'p.npz'}")


def test_npz_not_a_zip(tmp_path):
    (tmp_path / "junk.npz").write_bytes(b"not a zip file at all")
    with pytest.raises(DataError, match="junk.npz"):
        load_dataset(f"npz:{tmp_path / 'junk.npz'}")


def test_too_small_to_split(tmp_path):
    np.savez(tmp_path / "two.npz", x=np.ones((2, 2)), y=np.array([1.5, 2.5]))
    with pytest.raises(DataError, match="no training samples"):
        load_dataset(f"npz:{tmp_path / 'two.npz'}", test_fraction=0.9)


def test_data_error_is_one_line():
    assert str(DataError("bad\nthing  here")) == "bad thing here"
