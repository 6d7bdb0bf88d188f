"""`pocket infer` on a forecasting model: a CSV of the series in, the forecast out in the
series' own units, with the time stamps continued.

The model's preprocessing (written by train/data/timeseries.py) says everything needed: the
value columns and their scaling, the window, the horizon, the target column(s), the time
column and its format and step, and whether windows are relative to their last value. The
CSV (formats/timeseries.read_series, as training reads it) must hold at least `window` rows;
the last `window` of them are the model's input, so the whole history can be passed as is.
"""

from __future__ import annotations

import os

import numpy as np

from pocket.errors import PocketError
from pocket.formats import csvio
from pocket.formats import timeseries as ts
from pocket.infer.inputs import InputError, display_name


def window_of(path: str, pre: dict) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(x (1, window, C) model-ready, the offset to add back per output, the next stamps)."""
    info = pre["timeseries"]
    window, horizon, cols = info["window"], info["horizon"], pre["columns"]
    try:
        s = ts.read_series(path, time_column=info["time_column"] or None, columns=cols,
                           time_format=info["time_format"])
    except (csvio.CsvError, PocketError) as e:
        raise InputError(str(e)) from None
    if len(s.values) < window:
        raise InputError(f"'{path}' has {len(s.values)} rows; the model reads the last {window} "
                         "(its window): give at least that many")
    v = s.values[-window:]
    mean, std = np.asarray(pre["mean"], np.float64), np.asarray(pre["std"], np.float64)
    ti = [cols.index(t) for t in info["targets"]]
    if info.get("relative"):
        off = v[-1]
        x = (v - off) / std
        back = np.tile(off[ti], horizon)
    else:
        x = (v - mean) / std
        back = np.zeros(horizon * len(ti))
    times = ts.continue_times(s.times[-1], s.step, s.time_format, horizon)
    if pre.get("layout") == "NCL":  # (columns, time), as conv1d/tcn models take it
        x = x.T
    return x[None].astype(np.float32), back, times


def forecast(model, inputs: list[str]) -> list[dict]:
    """One result per CSV: {"name", "times", "values" {target: [...]}, "target"}."""
    pre = model.preprocessing
    info = pre["timeseries"]
    t = pre["target"]
    mean, std = np.asarray(t["mean"], np.float64), np.asarray(t["std"], np.float64)
    rows = []
    for path in inputs:
        if path == "-" or not os.path.isfile(path):
            raise InputError(f"input '{path}': a forecasting model reads a CSV file of the series")
        x, back, times = window_of(path, pre)
        y = model.engine.run(x, copy=True).reshape(-1).astype(np.float64) * std + mean + back
        per = y.reshape(info["horizon"], len(info["targets"]))
        rows.append({"name": display_name(path), "times": times, "target": info["targets"],
                     "values": {name: [float(a) for a in per[:, j]]
                                for j, name in enumerate(info["targets"])}})
    return rows


def render(rows: list[dict], time_column: str) -> list[str]:
    lines = []
    for r in rows:
        lines.append(f"{r['name']}: forecast of {', '.join(r['target'])}, "
                     f"{len(r['times'])} steps")
        lines.append(",".join([time_column or "time", *r["target"]]))
        for i, stamp in enumerate(r["times"]):
            lines.append(",".join([stamp, *(f"{r['values'][n][i]:.6g}" for n in r["target"])]))
    return lines
