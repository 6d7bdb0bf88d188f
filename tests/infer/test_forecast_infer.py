"""`pocket infer` on a forecasting model: the last window of a CSV in, the forecast out in the
series' units with the stamps continued (checked against the reference run by hand)."""

from __future__ import annotations

import numpy as np
import pytest
from models import save_model

from pocket.formats import reference as ref
from pocket.formats.ir import Graph, Node, ValueInfo
from pocket.infer.app import infer, render
from pocket.infer.inputs import InputError

WINDOW, HORIZON = 5, 3


def forecaster(tmp_path, relative):
    rng = np.random.default_rng(0)
    w = (rng.normal(size=(HORIZON, WINDOW * 2)) / 4).astype(np.float32)
    b = rng.normal(size=HORIZON).astype(np.float32)
    nodes = [Node("flat", "flatten", ["x"], ["f"], {}), Node("fc", "linear", ["f", "w", "b"], ["y"], {})]
    pre = {"layout": "NLC", "columns": ["a", "b"], "mean": [0.0, 0.0] if relative else [10.0, 1.0],
           "std": [2.0, 0.5],
           "target": {"name": "a", "mean": [0.0 if relative else 10.0] * HORIZON, "std": [2.0] * HORIZON},
           "timeseries": {"time_column": "day", "time_format": "date", "step": {"days": 7},
                          "window": WINDOW, "horizon": HORIZON, "targets": ["a"],
                          "relative": relative}}
    g = Graph({"x": ValueInfo("f32", ("N", WINDOW, 2))}, ["y"], nodes,
              {"w": ValueInfo("f32", w.shape), "b": ValueInfo("f32", b.shape)},
              {"task": "regression", "preprocessing": pre})
    params = {"w": w, "b": b}
    return save_model(tmp_path / "fc.bin", g, params), g, params, pre


@pytest.mark.parametrize("relative", [False, True])
def test_forecast_in_series_units(tmp_path, relative):
    path, g, params, pre = forecaster(tmp_path, relative)
    rows = [("2021-01-02", 11.0, 0.9), ("2021-01-09", 12.5, 1.2), ("2021-01-16", 9.0, ""),
            ("2021-01-23", 10.0, 1.0), ("2021-01-30", 13.0, 1.4), ("2021-02-06", 14.0, 0.8),
            ("2021-02-13", 12.0, 1.1)]
    csv = tmp_path / "series.csv"
    csv.write_text("day,a,b\n" + "".join(f"{d},{a},{b}\n" for d, a, b in rows))
    v = np.array([[a, 1.1 if b == "" else b] for _, a, b in rows])[-WINDOW:]  # (gap: 1.0..1.2)
    off = v[-1] if relative else np.array([10.0, 1.0])
    x = ((v - off) / np.array([2.0, 0.5]))[None].astype(np.float32)
    want = ref.run(g, params, x)["y"][0].astype(np.float64) * 2.0 + (v[-1, 0] if relative else 10.0)
    result = infer(str(path), [str(csv)])
    assert result["task"] == "forecast"
    (r,) = result["results"]
    assert r["times"] == ["2021-02-20", "2021-02-27", "2021-03-06"]
    np.testing.assert_allclose(r["values"]["a"], want, rtol=1e-5)
    text = render(result)
    assert "day,a" in text and text.splitlines()[-1].startswith("2021-03-06,")


def test_short_series_is_an_input_error(tmp_path):
    path, *_ = forecaster(tmp_path, False)
    csv = tmp_path / "short.csv"
    csv.write_text("day,a,b\n2021-01-02,1,2\n2021-01-09,1,2\n")
    with pytest.raises(InputError, match="has 2 rows; the model reads the last 5"):
        infer(str(path), [str(csv)])
