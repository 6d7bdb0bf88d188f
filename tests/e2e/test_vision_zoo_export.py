"""The edge zoo through every stage: each architecture (small widths, digits-sized input) traced
into a checkpoint, exported to an fp32 `.bin` that the engine runs like the training model, to
ONNX that onnxruntime runs like it, and to an int8 `.bin` that the engine runs bit for bit like
the reference interpreter (and onnxruntime's int8 run of the int8 ONNX export like the engine);
then one model from `pocket train` to `pocket export` on the CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from zoo_small import SMALL, randomize_bn

from pocket.compare import exact_session_options
from pocket.export import export
from pocket.formats import reference
from pocket.formats.container import read_container, write_container
from pocket.train import models
from pocket.train.tensor import Tensor, no_grad
from pocket.train.trace import trace

SHAPE = (1, 8, 8)


def _inputs(n: int, seed: int) -> np.ndarray:
    """Digits-like inputs: the real digits when scikit-learn is there, else smooth noise."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        rng = np.random.default_rng(seed)
        return np.clip(rng.normal(0.3, 0.4, (n, *SHAPE)), 0, 1).astype(np.float32)
    d = load_digits()
    idx = np.random.default_rng(seed).permutation(len(d.images))[:n]
    return (d.images[idx, None] / 16.0).astype(np.float32)


@pytest.fixture(scope="module", params=sorted(SMALL))
def zoo_ckpt(request, tmp_path_factory):
    """(name, checkpoint path, model in eval mode, held-out inputs, the model's outputs)."""
    name = request.param
    rng = np.random.default_rng(7)
    model = models.build_model({"name": name, **SMALL[name]}, SHAPE, 10, rng)
    randomize_bn(model, rng)
    model.eval()
    graph, params = trace(model, SHAPE, {"task": "classification"})
    path = tmp_path_factory.mktemp(name) / "best.ckpt"
    write_container(path, kind="checkpoint", tensors={**params, "calib/x": _inputs(64, 1)},
                    graph=graph, meta={"epoch": 1, "dataset": "digits"})
    x = _inputs(9, 2)
    with no_grad():
        want = np.asarray(model(Tensor(x)).data)
    return name, path, x, want


def _close(got, want, tol=1e-4):
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, np.abs(want).max()))


def test_fp32_bin_runs_like_the_training_model(zoo_ckpt):
    from pocket.infer import Engine

    name, path, x, want = zoo_ckpt
    out = path.with_name("model.bin")
    export(path, out)
    with Engine(out, threads=1) as eng:
        _close(eng.run(x, copy=True), want)
        _close(eng.run(x[:1], copy=True), want[:1])


def test_onnx_runs_like_the_training_model(zoo_ckpt):
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    name, path, x, want = zoo_ckpt
    out = path.with_name("model.onnx")
    export(path, out)
    opts = exact_session_options(ort)
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(out), opts, providers=["CPUExecutionProvider"])
    _close(sess.run(None, {sess.get_inputs()[0].name: x})[0], want)


def test_int8_bin_is_bit_exact_with_the_reference(zoo_ckpt):
    from pocket.infer import Engine

    name, path, x, _ = zoo_ckpt
    out = path.with_name("model.int8.bin")
    report = export(path, out, int8=True)
    assert report["int8"] and report["size"] < report["fp32_size"]
    with read_container(out) as c:
        assert any("x_scale" in n.attrs for n in c.graph.nodes), "no layer went int8"
        want = reference.run_container(c, x)["output"]
    with Engine(out, threads=1) as eng:
        got = eng.run(x, copy=True)
    np.testing.assert_array_equal(got, want)
    # onnxruntime's int8 (QDQ) run of the same export picks the same classes.
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    export(path, path.with_name("model.int8.onnx"), int8=True)
    sess = ort.InferenceSession(str(path.with_name("model.int8.onnx")), exact_session_options(ort),
                                providers=["CPUExecutionProvider"])
    y = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    assert (y.argmax(1) == got.argmax(1)).all()
    _close(y, got)


CONFIG = """
[run]
seed = 1
calib_samples = 32
[data]
source = "digits"
limit = 200
[model]
name = "mobilenet_v2"
width_mult = 0.25
[train]
epochs = 1
batch_size = 50
warmup_epochs = 0
"""


def _pocket(*args):
    out = subprocess.run([sys.executable, "-m", "pocket.cli", *map(str, args)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"{args}: exit {out.returncode}\n{out.stderr}"
    return out


@pytest.mark.slow
def test_cli_train_then_export_a_zoo_model(tmp_path):
    pytest.importorskip("sklearn")
    pytest.importorskip("onnxruntime")
    cfg = tmp_path / "mnv2.toml"
    cfg.write_text(CONFIG)
    run = tmp_path / "run"
    res = json.loads(_pocket("train", cfg, "--out", run, "--json").stdout)
    assert np.isfinite(res["test"]["loss"])
    ckpt = run / "best.ckpt"
    rep = json.loads(_pocket("export", ckpt, "-o", run / "m.int8.bin", "--int8", "--json").stdout)
    assert rep["int8"] and rep["size"] < rep["fp32_size"]
    _pocket("export", ckpt, "-o", run / "m.onnx")
    # The ONNX file computes what the checkpoint's graph computes (in-process: a `pocket
    # compare` subprocess would double the test's time).
    import onnxruntime as ort

    with read_container(ckpt) as c:
        x = np.asarray(c.tensors["calib/x"][:8])
        want = reference.run(c.graph, {n: np.array(c.tensors[n]) for n in c.graph.params},
                             {"input": x})["output"]
    sess = ort.InferenceSession(str(run / "m.onnx"), exact_session_options(ort),
                                providers=["CPUExecutionProvider"])
    _close(sess.run(None, {sess.get_inputs()[0].name: x})[0], want)
