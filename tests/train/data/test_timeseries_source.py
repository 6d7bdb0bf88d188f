"""timeseries:PATH: chronological splits, train-only scaling, windows, the seasonal-naive
baseline and MASE (each checked against a hand computation), and sequence-classification."""

from __future__ import annotations

import numpy as np
import pytest

from pocket.formats import timeseries as ts
from pocket.formats.errors import FormatError
from pocket.train.data import DataError, load_dataset
from pocket.train.data.timeseries import forecast_metrics


def series_csv(tmp_path, n=120, gap=None, name="s.csv"):
    t = np.arange(n)
    a = 10 + 0.1 * t + np.sin(2 * np.pi * t / 12)
    b = np.cos(t / 5.0)
    lines = ["when,a,b"]
    for i in range(n):
        day = np.datetime64("2020-01-04") + 7 * i
        cell = "" if gap is not None and i in gap else f"{a[i]:.6f}"
        lines.append(f"{day},{cell},{b[i]:.6f}")
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path, np.stack([np.round(a, 6), np.round(b, 6)], axis=1)


def load(path, **kw):
    args = dict(task="forecast", target="a", window=24, horizon=6, season=12, stride=1,
                test_fraction=0.2, val_fraction=0.2)
    args.update(kw)
    return load_dataset(f"timeseries:{path}", **args)


def test_windows_split_in_time_and_scale_on_train_only(tmp_path):
    path, v = series_csv(tmp_path)
    d = load(path)
    # 120 steps: train 72, val 24, test 24; windows of 24 + 6 wholly inside each part
    assert d.input_shape == (24, 2) and d.num_outputs == 6 and d.task == "regression"
    assert [len(d.train), len(d.val), len(d.test)] == [72 - 29, 0, 0]  # parts shorter than 30
    d = load(path, val_fraction=0.3, test_fraction=0.3, window=12, horizon=3)
    n_train, n_val = 120 - 36 - 36, 36
    assert [len(d.train), len(d.val), len(d.test)] == [n_train - 14, n_val - 14, n_val - 14]
    mean, std = v[:n_train].mean(axis=0), v[:n_train].std(axis=0)
    prep = d.preprocessing
    np.testing.assert_allclose(prep["mean"], mean)
    np.testing.assert_allclose(prep["std"], std)
    # the first test window: steps 84..95 in, 96..98 (column a) out
    np.testing.assert_allclose(d.test.x[0], (v[84:96] - mean) / std, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(d.test.y[0], (v[96:99, 0] - mean[0]) / std[0], rtol=1e-5, atol=1e-6)
    info = prep["timeseries"]
    day = lambda i: str(np.datetime64("2020-01-04") + 7 * i)  # noqa: E731
    assert info["splits"]["val"] == [day(48), day(83)]
    assert info["step"] == {"days": 7} and info["last_time"] == day(119)
    # seasonal naive, season 12: step k repeats the value 12 steps before it
    np.testing.assert_allclose(d.test.baseline[0], (v[84:87, 0] - mean[0]) / std[0], rtol=1e-5,
                               atol=1e-6)


def test_relative_windows(tmp_path):
    path, v = series_csv(tmp_path)
    d = load(path, relative=True, val_fraction=0.3, test_fraction=0.3, window=12, horizon=3)
    s = d.preprocessing["std"]
    last = v[95]
    np.testing.assert_allclose(d.test.x[0], (v[84:96] - last) / s, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(d.test.y[0], (v[96:99, 0] - last[0]) / s[0], rtol=1e-5, atol=1e-6)
    assert d.preprocessing["target"]["mean"] == [0.0] * 3
    assert d.preprocessing["timeseries"]["relative"] is True
    dev = np.concatenate([v[i:i + 12] - v[i + 11] for i in range(48 - 14)])
    np.testing.assert_allclose(s, dev.std(axis=0), rtol=1e-9)


def test_mase_against_hand_computation(tmp_path):
    path, v = series_csv(tmp_path)
    d = load(path, val_fraction=0.3, test_fraction=0.3, window=12, horizon=3)
    train = v[:48, 0]
    scale = np.abs(train[12:] - train[:-12]).mean()
    assert d.preprocessing["timeseries"]["mase_scale"] == pytest.approx([scale])
    std = d.preprocessing["target"]["std"][0]
    rng = np.random.default_rng(0)
    pred = d.test.y + rng.normal(0, 0.1, d.test.y.shape).astype(np.float32)
    m = forecast_metrics(pred, d.test.y.astype(np.float64), d.test.baseline, d.preprocessing)
    err = (pred.astype(np.float64) - d.test.y) * std
    assert m["mase"] == pytest.approx(np.abs(err).mean() / scale, rel=1e-6)
    base = np.array([v[i + 84:i + 87, 0] for i in range(len(d.test))])  # 12 steps before
    truth = np.array([v[i + 96:i + 99, 0] for i in range(len(d.test))])
    assert m["baseline_mae"] == pytest.approx(np.abs(base - truth).mean(), rel=1e-5)
    assert m["baseline_mase"] == pytest.approx(np.abs(base - truth).mean() / scale, rel=1e-5)
    assert m["baseline_rmse"] == pytest.approx(np.sqrt(((base - truth) ** 2).mean()), rel=1e-5)


def test_gaps_are_interpolated(tmp_path, capsys):
    path, v = series_csv(tmp_path, gap={10, 11})
    s = ts.read_series(path)
    assert s.filled == 2 and s.time_format == "date"
    np.testing.assert_allclose(s.values[10:12, 0], v[9, 0] + (v[12, 0] - v[9, 0]) * np.array([1, 2]) / 3)
    load(path)
    assert "filled 2 empty value(s)" in capsys.readouterr().err


def test_bad_series_are_clear(tmp_path):
    path, _ = series_csv(tmp_path)
    with pytest.raises(DataError, match="give \\[data\\] window"):
        load(path, window=None)
    with pytest.raises(DataError, match="season = 30 is longer than the window"):
        load(path, season=30)
    with pytest.raises(DataError, match="no value column 'c'"):
        load(path, target="c")
    with pytest.raises(DataError, match="reads a time series"):
        load_dataset("digits", task="forecast")
    bad = tmp_path / "bad.csv"
    bad.write_text("t,v\n2020-01-02,1\n2020-01-01,2\n")
    with pytest.raises(DataError, match="does not come after 2020-01-02; sort the rows"):
        load(bad)
    bad.write_text("t,v\nmonday,1\n")
    with pytest.raises(DataError, match="not a date"):
        load(bad)


@pytest.mark.parametrize("fmt,stamps,more", [
    ("yyyymmdd", ["19580329", "19580405"], ["19580412", "19580419"]),
    ("date", ["2020-01-01", "2020-02-01"], ["2020-03-01", "2020-04-01"]),
    ("date", ["2020-01-15", "2020-02-15"], ["2020-03-15", "2020-04-15"]),
    ("datetime", ["2020-01-01T00:00:00", "2020-01-01T06:00:00"],
     ["2020-01-01T12:00:00", "2020-01-01T18:00:00"]),
    ("number", ["1.5", "2"], ["2.5", "3"]),
])
def test_time_stamps_continue(tmp_path, fmt, stamps, more):
    p = tmp_path / "t.csv"
    p.write_text("t,v\n" + "".join(f"{s},{i}\n" for i, s in enumerate(stamps)))
    s = ts.read_series(p)
    assert s.time_format == fmt
    assert ts.continue_times(s.times[-1], s.step, fmt, 2) == more


def test_time_series_reader_errors(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("t,v\n1,\n2,\n")
    with pytest.raises(FormatError, match="column 'v' has no values"):
        ts.read_series(p)


def test_sequence_classification_reads_rows():
    d = load_dataset("digits", task="sequence-classification", limit=50)
    img = load_dataset("digits", limit=50)
    assert d.input_shape == (8, 8) and d.task == "classification"
    np.testing.assert_array_equal(d.train.x, img.train.x[:, 0])
    assert d.preprocessing["sequence"] == "rows"
