"""pocket compare on the real digits checkpoint: intact exports pass, a damaged one fails."""

import json
import subprocess
import sys

import numpy as np
import pytest

from pocket.compare import compare, pair_metrics
from pocket.formats.container import read_container, write_container

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def exports(digits_ckpt, tmp_path_factory):
    from pocket.export.app import export

    out = tmp_path_factory.mktemp("exports")
    paths = {}
    for name, kw in {"fp32.bin": {}, "fp32.onnx": {"fmt": "onnx"},
                     "int8.bin": {"int8": True}, "int8.onnx": {"fmt": "onnx", "int8": True}}.items():
        paths[name] = str(out / f"model.{name}")
        export(digits_ckpt, paths[name], **kw)
    return paths


def _pair(result, name):
    return next(p for p in result["pairs"] if p["pair"] == name)


def test_fp32_exports_match_the_training_model(digits_ckpt, exports):
    r = compare(digits_ckpt, bin_path=exports["fp32.bin"], onnx_path=exports["fp32.onnx"])
    assert r["passed"], r["failures"]
    assert r["samples"] == 359  # the digits test split: 20% of 1797
    for pair in ("train vs bin", "train vs onnx", "bin vs onnx"):
        m = _pair(r, pair)["metrics"]
        assert m["max_abs"] <= 1e-4, (pair, m)
        assert m["top1_agreement"] == 1.0
    accs = {e: r["engines"][e]["accuracy"] for e in ("train", "bin", "onnx")}
    assert accs["train"] >= 0.95 and accs["bin"] == accs["train"] == accs["onnx"]


def test_int8_exports_pass_the_int8_gates_and_keep_accuracy(digits_ckpt, exports):
    r = compare(digits_ckpt, bin_path=exports["int8.bin"], onnx_path=exports["int8.onnx"])
    assert r["passed"], r["failures"]
    assert all(p["precision"] == "int8" for p in r["pairs"])
    acc = {e: r["engines"][e]["accuracy"] for e in r["engines"]}
    assert acc["bin"] >= acc["train"] - 0.01 and acc["onnx"] >= acc["train"] - 0.01, acc
    # The engine and onnxruntime run the same int8 arithmetic.
    assert _pair(r, "bin vs onnx")["metrics"]["top1_agreement"] >= 0.99
    size = {k: __import__("os").path.getsize(v) for k, v in exports.items()}
    assert size["int8.bin"] <= 0.3 * size["fp32.bin"], size
    assert size["int8.onnx"] <= 0.3 * size["fp32.onnx"], size


def _damage(src: str, dst: str) -> None:
    """Copy a .bin with one weight changed."""
    with read_container(src) as c:
        tensors = {k: np.array(v) for k, v in c.tensors.items()}
        graph, meta = c.graph, c.meta
    name = next(k for k in tensors if k.endswith("weight"))
    tensors[name].flat[0] += 0.25
    write_container(dst, kind="model", tensors=tensors, graph=graph, meta=meta)


def test_a_damaged_model_fails_naming_pair_and_metric(digits_ckpt, exports, tmp_path):
    bad = str(tmp_path / "damaged.bin")
    _damage(exports["fp32.bin"], bad)
    out = subprocess.run([sys.executable, "-m", "pocket.cli", "compare", digits_ckpt, "--bin", bad],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stderr
    assert "FAIL train vs bin: max_abs" in out.stdout
    js = subprocess.run([sys.executable, "-m", "pocket.cli", "compare", digits_ckpt, "--bin", bad,
                         "--json"], capture_output=True, text=True, timeout=300)
    assert js.returncode == 1
    r = json.loads(js.stdout)
    assert not r["passed"] and r["failures"][0].startswith("train vs bin: max_abs")


def test_gates_can_be_set_and_inputs_chosen(digits_ckpt, exports, tmp_path):
    x = np.random.default_rng(1).standard_normal((5, 1, 8, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = compare(digits_ckpt, bin_path=exports["int8.bin"], inputs_path=str(tmp_path / "x.npy"),
                atol=1e-9)
    assert r["samples"] == 5 and not r["passed"]
    assert "atol" in r["failures"][0]
    r = compare(digits_ckpt, bin_path=exports["fp32.bin"], random_n=7)
    assert r["samples"] == 7 and r["passed"]


def test_pair_metrics_against_hand_computed_values():
    ref = np.array([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0]], np.float32)
    out = ref.copy()
    out[0, 1] = -1.5  # one change of 0.5
    m = pair_metrics(ref, out, classification=True)
    assert m["max_abs"] == pytest.approx(0.5)
    assert m["max_rel"] == pytest.approx(0.5 / 3.0)
    assert m["mean_abs"] == pytest.approx(0.5 / 6)
    a, b = ref.ravel().astype(float), out.ravel().astype(float)
    assert m["cosine"] == pytest.approx(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
    assert m["sqnr_db"] == pytest.approx(10 * np.log10((a**2).sum() / 0.25))
    assert m["top1_agreement"] == 1.0  # argmax of row 0 stays at index 0
