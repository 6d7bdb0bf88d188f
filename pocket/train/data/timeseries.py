"""`timeseries:PATH`: windows of a CSV time series for the `forecast` task, the seasonal-naive
baseline, and the forecast metrics (MAE, RMSE, MASE) beside the baseline's own.

The series (formats/timeseries.py reads it) is split in time, never shuffled across the split:
the last `test_fraction` of the steps is the test part, the `val_fraction` before it the
validation part, the rest the training part. Windows are cut inside each part only (`window`
input steps, then `horizon` target steps, every `stride` steps), so no value is both an input
or target of one part and a target of another. Each column is standardized with the mean and
std of the training part alone. The loader shuffles training windows within the training part.

Inputs are (window, columns) per sample (`layout = "NLC"`, time-major, as ssm and transformer
take them; `"NCL"`: (columns, window), as conv1d and tcn take them); the
targets are the next `horizon` values of the `target` column(s) (all value columns unless
named), step-major, flattened to (horizon * targets).

Scaling: by default each column is standardized with the training part's mean and std. With
`relative = true` each window is taken relative to its own last value (inputs and targets minus
the last input step, divided by the std of those deviations over the training windows), so a
model sees the shape of the recent past, not a level the training part may never have reached
(CO2 rises ~1.5 ppm a year: the test years lie above every training value). The exported
model's preprocessing says which; `pocket infer` adds the last value back.

The seasonal-naive forecast of step k of the horizon repeats the last season of the window:
y[t + k] = y[t + k - m * ceil(k / m)], m = `season` (1: the last value). MASE (Hyndman &
Koehler 2006) divides a forecast's MAE by the in-sample MAE of the one-step seasonal-naive
forecast on the training part, mean |y_t - y_(t-m)|; the baseline's MASE uses the same scale,
so a model beats the baseline exactly when its MASE is lower.
"""

from __future__ import annotations

import sys

import numpy as np

from pocket.errors import PocketError
from pocket.formats import csvio
from pocket.formats import timeseries as ts
from pocket.train.data.sources import DataError, Dataset, Split


def _windows(v: np.ndarray, window: int, horizon: int, stride: int) -> np.ndarray:
    # v (T, C) -> starts of every window that fits wholly inside v
    return np.arange(0, len(v) - window - horizon + 1, stride)


def load_timeseries(path: str, *, task: str, target: str | None, time_column: str | None,
                    window: int | None, horizon: int | None, stride: int, season: int | None,
                    relative: bool = False, layout: str = "NLC", val_fraction: float,
                    test_fraction: float, limit: int | None) -> Dataset:
    if task not in (None, "forecast"):
        raise DataError(f"timeseries:{path}: [data] task = {task!r}; a time series source trains "
                        "task = \"forecast\" (sequence-classification takes digits, images or npz)")
    if window is None or horizon is None:
        raise DataError(f"timeseries:{path}: give [data] window (input steps) and horizon "
                        "(steps to forecast), e.g. window = 104, horizon = 13")
    if window < 1 or horizon < 1 or stride < 1:
        raise DataError("[data] window, horizon and stride must be positive, got "
                        f"{window}, {horizon}, {stride}")
    if layout not in ("NLC", "NCL"):
        raise DataError(f"[data] layout must be \"NLC\" (time, columns: ssm, transformer) or "
                        f"\"NCL\" (columns, time: conv1d, tcn), got {layout!r}")
    m = season or 1
    if m > window:
        raise DataError(f"[data] season = {m} is longer than the window ({window}); the "
                        "seasonal-naive baseline needs a whole season inside the window")
    try:
        series = ts.read_series(path, time_column=time_column)
    except (csvio.CsvError, PocketError) as e:
        raise DataError(str(e)) from None
    targets = [target] if target else list(series.columns)
    unknown = [t for t in targets if t not in series.columns]
    if unknown:
        raise DataError(f"timeseries:{path}: no value column {unknown[0]!r}; value columns: "
                        f"{', '.join(series.columns)}")
    if series.filled:
        print(f"pocket: {path}: filled {series.filled} empty value(s) by linear interpolation",
              file=sys.stderr)
    v = series.values
    n = len(v)
    n_test = int(round(n * test_fraction))
    n_val = int(round(n * val_fraction))
    bounds = {"train": (0, n - n_test - n_val), "val": (n - n_test - n_val, n - n_test),
              "test": (n - n_test, n)}
    train_v = v[slice(*bounds["train"])]
    if len(train_v) < window + horizon:
        raise DataError(f"timeseries:{path}: the training part has {len(train_v)} steps, fewer "
                        f"than one window + horizon ({window + horizon}); lower window/horizon "
                        "or val_fraction/test_fraction")
    ti = [series.columns.index(t) for t in targets]
    # MASE scale in the series' units: the in-sample one-step seasonal-naive MAE (training part)
    scale = np.abs(train_v[m:, ti] - train_v[:-m, ti]).mean(axis=0)
    scale[scale < 1e-12] = 1.0
    steps = np.arange(1, horizon + 1)
    naive_at = window - m + (steps - 1) % m  # index in the window of each step's naive value
    raw, spans = {}, {}
    for name, (a, b) in bounds.items():
        part = v[a:b]
        starts = _windows(part, window, horizon, stride)
        if limit is not None:
            starts = starts[:limit]
        idx = starts[:, None] + np.arange(window)
        x = part[idx].reshape(len(starts), window, v.shape[1])
        y = part[starts[:, None] + window + steps - 1].reshape(len(starts), horizon, v.shape[1])[:, :, ti]
        raw[name] = (x, y, x[:, naive_at][:, :, ti])
        spans[name] = [series.times[a], series.times[b - 1]] if b > a else None
    if len(raw["train"][0]) == 0:
        raise DataError(f"timeseries:{path}: no training windows; lower window or horizon")
    if relative:
        # each window minus its own last value; the scale of those deviations on the training
        # windows (what a window looks like, wherever the series' level has moved since)
        dev = raw["train"][0] - raw["train"][0][:, -1:]
        mean, std = np.zeros(v.shape[1]), dev.reshape(-1, v.shape[1]).std(axis=0)
    else:
        mean, std = train_v.mean(axis=0), train_v.std(axis=0)
    std[std < 1e-12] = 1.0
    splits = {}
    for name, (x, y, base) in raw.items():
        off = x[:, -1:] if relative else mean
        off_y = off[..., ti] if relative else mean[ti]
        flat = (len(x), horizon * len(ti))
        xz = (x - off) / std
        splits[name] = Split(np.ascontiguousarray(xz if layout == "NLC" else xz.transpose(0, 2, 1),
                                                  np.float32),
                             np.ascontiguousarray(((y - off_y) / std[ti]).reshape(flat), np.float32),
                             np.ascontiguousarray(((base - off_y) / std[ti]).reshape(flat), np.float32))
    t_mean = np.tile(mean[ti], horizon)
    t_std = np.tile(std[ti], horizon)
    prep = {
        "layout": layout, "columns": list(series.columns),
        "mean": [float(a) for a in mean], "std": [float(a) for a in std],
        "target": {"name": ",".join(targets), "mean": [float(a) for a in t_mean],
                   "std": [float(a) for a in t_std]},
        "timeseries": {
            "time_column": time_column or "", "time_format": series.time_format,
            "step": series.step, "window": window, "horizon": horizon, "stride": stride,
            "season": m, "targets": targets, "relative": bool(relative),
            "mase_scale": [float(a) for a in scale], "last_time": series.times[-1],
            "splits": spans, "filled": series.filled,
        },
    }
    return Dataset(name=f"timeseries:{path}", task="regression", labels=None,
                   input_shape=(window, v.shape[1]) if layout == "NLC" else (v.shape[1], window),
                   preprocessing=prep, num_outputs=horizon * len(ti),
                   **splits)


def forecast_metrics(pred: np.ndarray, y: np.ndarray, baseline: np.ndarray,
                     prep: dict) -> dict:
    """MAE, RMSE, MASE of `pred` and of the seasonal-naive `baseline` in the series' units.

    pred, y, baseline (N, horizon * targets), standardized as the model sees them."""
    info = prep["timeseries"]
    std = np.asarray(prep["target"]["std"], np.float64)
    scale = np.tile(np.asarray(info["mase_scale"], np.float64), info["horizon"])
    out = {}
    for key, p in (("", pred), ("baseline_", baseline)):
        err = (np.asarray(p, np.float64) - y) * std
        out[f"{key}mae"] = float(np.abs(err).mean())
        out[f"{key}rmse"] = float(np.sqrt((err**2).mean()))
        out[f"{key}mase"] = float((np.abs(err) / scale).mean())
    del out["mae"], out["rmse"]  # the regression metrics already hold these
    return out
