"""A small `ssm` forecaster trained by the real trainer on a synthetic seasonal CSV series ->
checkpoint (metrics beside the seasonal-naive baseline) -> .bin and .onnx -> `compare` against
the training model on the series' own test windows -> `pocket infer` in the series' units."""

import json

import numpy as np
import pytest

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from pocket.train.run import train_from_config

    root = tmp_path_factory.mktemp("ssm_forecast")
    t = np.arange(240)
    v = 20 + 0.05 * t + 2 * np.sin(2 * np.pi * t / 12) + 0.1 * np.random.default_rng(0).normal(size=240)
    csv = root / "series.csv"
    csv.write_text("month,v\n" + "".join(f"{2000 + i // 12}-{i % 12 + 1:02d}-01,{x:.4f}\n"
                                           for i, x in enumerate(v)))
    cfg = root / "f.toml"
    cfg.write_text(f"""
[run]
name = "f"
out = "{root / 'run'}"
[data]
source = "timeseries:{csv}"
task = "forecast"
window = 24
horizon = 6
season = 12
relative = true
val_fraction = 0.15
[model]
name = "ssm"
d_model = 8
d_state = 4
depth = 1
[train]
epochs = 1
batch_size = 16
lr = 1e-2
""")
    result = train_from_config(str(cfg), {}, quiet=True)
    return root, csv, result


def test_forecast_metrics_beside_the_baseline(run):
    root, _, result = run
    test = result["test"]
    for k in ("mae", "rmse", "mase", "baseline_mae", "baseline_rmse", "baseline_mase"):
        assert np.isfinite(test[k]), k
    summary = json.loads((root / "run" / "summary.json").read_text())
    assert summary["test"]["baseline_mase"] == test["baseline_mase"]
    last = json.loads((root / "run" / "metrics.jsonl").read_text().splitlines()[-1])
    assert "val_mase" in last and "val_baseline_mase" in last


def test_exports_match_and_infer_continues_the_series(run):
    from pocket.compare import compare
    from pocket.export.app import export
    from pocket.infer.app import infer

    root, csv, result = run
    ckpt = result["best_checkpoint"]
    export(ckpt, root / "m.bin")
    export(ckpt, root / "m.onnx")
    rep = compare(ckpt, bin_path=str(root / "m.bin"), onnx_path=str(root / "m.onnx"))
    assert rep["passed"], rep["failures"]
    assert all(p["metrics"]["max_abs"] < 1e-4 for p in rep["pairs"])
    out = infer(str(root / "m.bin"), [str(csv)])
    (r,) = out["results"]
    assert r["times"] == ["2020-01-01", "2020-02-01", "2020-03-01", "2020-04-01", "2020-05-01",
                          "2020-06-01"]
    assert len(r["values"]["v"]) == 6 and all(25 < a < 40 for a in r["values"]["v"])
