"""The CPU-side parts of scripts/gpu_check.sh: arguments, the timeouts, the measuring code on
the CPU and under the CuPy stand-in, the PyTorch comparison path (torch on the CPU), and the
JSON/Markdown report."""

import importlib.util
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gc():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = mod
    spec.loader.exec_module(mod)
    return mod


TINY = ["--models", "vgg,resnet", "--batches", "4", "--warmup", "1", "--steps", "2",
        "--image-size", "8", "--channels", "4,4,4,4,4,4,4,4"]


def test_timeouts_add_up_to_under_8_minutes():
    text = (ROOT / "scripts" / "gpu_check.sh").read_text()
    secs = [int(m) for m in re.findall(r"^step \S+ (\d+) ", text, flags=re.M)]
    assert len(secs) >= 7 and sum(secs) < 8 * 60, secs
    pytest_line = next(ln for ln in text.splitlines() if "-m pytest" in ln)
    assert not re.search(r"\s-x\b", pytest_line) and "--junitxml" in text


def test_arguments(gc, tmp_path):
    a = gc.parse_args(["steps", "--out", str(tmp_path), "--batches", "128,256"])
    assert a.batches == [128, 256] and a.models == ["vgg", "resnet"] and not a.tf32
    for bad in (["steps", "--out", "x", "--models", "alexnet"],
                ["steps", "--out", "x", "--batches", "a"],
                ["steps", "--out", "x", "--precisions", "bf8"],
                ["steps", "--out", "x", "--steps", "0"],
                ["nope", "--out", "x"], ["steps"]):
        with pytest.raises(SystemExit) as e:
            gc.parse_args(bad)
        assert e.value.code == 2


def test_pocket_steps_on_the_cpu(gc, tmp_path):
    args = gc.parse_args(["steps", "--out", str(tmp_path), "--device", "cpu", *TINY])
    res = gc.steps(args)
    assert len(res["rows"]) == 4
    for r in res["rows"]:
        assert "error" not in r, r
        assert r["ms_per_step"] > 0 and r["peak_bytes"] > 0


def test_pocket_savers_steps_on_the_cpu(gc, tmp_path):
    args = gc.parse_args(["steps", "--out", str(tmp_path), "--device", "cpu", "--savers",
                          "--precisions", "fp32", *TINY])
    rows = gc.steps(args)["rows"]
    assert all("error" not in r and r["savers"] for r in rows), rows


@pytest.mark.gpu
def test_pocket_steps_on_cuda_time_with_events_and_measure_the_pool(gc, tmp_path):
    args = gc.parse_args(["steps", "--out", str(tmp_path), "--device", "cuda", *TINY])
    rows = gc.steps(args)["rows"]
    for r in rows:
        assert "error" not in r, r
        assert r["ms_per_step"] > 0 and r["peak_bytes"] >= r["tracked_peak_bytes"] > 0


def test_torch_comparison_path_on_the_cpu(gc, tmp_path):
    torch = pytest.importorskip("torch")
    args = gc.parse_args(["steps", "--framework", "torch", "--out", str(tmp_path), "--device",
                          "cpu", "--precisions", "fp32", *TINY])
    rows = gc.steps(args)["rows"]
    assert all("error" not in r and r["ms_per_step"] > 0 for r in rows), rows
    # the twins have the same parameter counts as pocket's models
    from pocket.train import models

    for name in ("vgg", "resnet"):
        kw = {"channels": [4] * 8} if name == "vgg" else {}
        ours = sum(p.data.size for p in getattr(models, name)((3, 8, 8), 10, **kw).parameters())
        theirs = sum(p.numel() for p in gc.build_torch(name, channels=kw.get("channels"))
                     .parameters())
        assert ours == theirs, name
    assert torch.backends.cudnn.allow_tf32 is False


def test_digits_losses_compared_with_the_cpu_run(gc, tmp_path):
    pytest.importorskip("sklearn")
    args = gc.parse_args(["digits", "--out", str(tmp_path), "--device", "cpu", "--precisions",
                          "fp32", "--epochs", "1", "--losses", "5", "--limit", "400"])
    res = gc.digits(args)
    ref = res["reference_cpu_fp32"]
    assert len(ref["losses"]) == 5 and all(np.isfinite(ref["losses"]))
    # the run on the same device repeats the reference exactly (same seed)
    again = res["cpu_fp32"]
    assert again["losses_vs_cpu"] == {"n": 5, "max_abs": 0.0, "max_rel": 0.0}
    assert again["accuracy_points_vs_cpu"] == 0.0


def test_compare_losses(gc):
    assert gc.compare_losses([1.0, 2.0], [1.5, 2.0, 9.0]) == {"n": 2, "max_abs": 0.5,
                                                             "max_rel": 0.5}
    assert gc.compare_losses([], [1.0])["n"] == 0


def test_report_joins_the_steps_and_writes_json_and_markdown(gc, tmp_path):
    row = {"model": "vgg", "batch": 128, "precision": "fp32"}
    gc.write_json(tmp_path, "steps_pocket", {"rows": [
        {**row, "framework": "pocket", "ms_per_step": 30.0, "peak_bytes": 300 << 20},
        {**row, "batch": 256, "framework": "pocket", "error": "OutOfMemoryError: x"}]})
    gc.write_json(tmp_path, "steps_torch", {"rows": [
        {**row, "framework": "torch", "ms_per_step": 24.0, "peak_bytes": 600 << 20}]})
    gc.write_json(tmp_path, "digits", {"reference_cpu_fp32": {"test": {"accuracy": 0.98},
                                                              "losses": [1.0]},
                                       "cuda_fp16": {"error": "PocketError: no GPU"}})
    gc.write_json(tmp_path, "budget", {"budget_bytes": 1 << 30, "pool_peak_bytes": 500 << 20,
                                       "with_context_bytes": 884 << 20, "fits": True})
    (tmp_path / "gpu_tests.xml").write_text(
        '<testsuites><testsuite name="pytest" tests="10" failures="1" errors="0" skipped="2">'
        "</testsuite></testsuites>")
    assert gc.main(["report", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "gpu_check.json").read_text())
    ok = res["steps"][0]
    assert ok["step_ratio"] == 1.25 and ok["memory_ratio"] == 0.5
    assert res["gpu_tests"] == {"tests": 10, "failures": 1, "errors": 0, "skipped": 2}
    md = (tmp_path / "gpu_check.md").read_text()
    assert "| vgg | 128 | fp32 | off | 30.00 | 24.00 | 1.25 | 300 | 600 | 0.50 |" in md
    assert "error: OutOfMemoryError" in md and "error: PocketError" in md
    assert "fits" in md and "10 run, 1 failed" in md


def test_report_with_nothing_measured_still_writes(gc, tmp_path):
    assert gc.main(["report", "--out", str(tmp_path)]) == 0
    assert "targets" in (tmp_path / "gpu_check.md").read_text()
