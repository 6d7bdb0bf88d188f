"""`export()` end to end: checkpoint in, .bin/.onnx out, judged by the reference and onnxruntime."""

import numpy as np
import pytest
from export_models import Net, residual_cnn, smooth_images, wide_cnn

from pocket.compare import exact_session_options
from pocket.errors import PocketError
from pocket.export import ExportError
from pocket.export.app import export, render
from pocket.formats import ops, reference
from pocket.formats.container import read_container, write_container
from pocket.formats.errors import FormatError


def write_ckpt(path, graph, params, calib=None, **extra):
    tensors = {**params, "optim/fc.m": np.zeros(3, np.float32), **extra}
    if calib is not None:
        tensors["calib/x"] = calib
    write_container(path, kind="checkpoint", tensors=tensors, graph=graph,
                    meta={"epoch": 3, "dataset": "synthetic"})
    return path


def run_ort(path, x):
    ort = pytest.importorskip("onnxruntime")
    opts = exact_session_options(ort)
    opts.log_severity_level = 3
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


@pytest.fixture(scope="module")
def res_ckpt(tmp_path_factory):
    graph, params = residual_cnn(seed=11)
    x = smooth_images(np.random.default_rng(11), 200, (1, 8, 8))
    path = write_ckpt(tmp_path_factory.mktemp("res") / "best.ckpt", graph, params, x)
    return path, graph, params, x


@pytest.fixture(scope="module")
def wide_ckpt(tmp_path_factory):
    graph, params = wide_cnn(seed=12)
    x = smooth_images(np.random.default_rng(12), 200, (3, 12, 12))
    path = write_ckpt(tmp_path_factory.mktemp("wide") / "best.ckpt", graph, params, x[:128])
    return path, graph, params, x[128:]


def test_fp32_bin_and_onnx_match_the_checkpoint_graph(res_ckpt):
    path, graph, params, x = res_ckpt
    want = reference.run(graph, params, x)["logits"]
    r = export(path)
    assert r["output"] == str(path.with_name("model.bin")) and not r["int8"]
    assert r["transforms"][:3] == ["dropped 2 dropout", "folded 5 batchnorm", "fused 4 activations"]
    m = read_container(r["output"], expect_kind="model")
    assert r["size"] == m.file_size
    assert m.graph.metadata["labels"] == graph.metadata["labels"]
    assert m.graph.metadata["export"] == {"int8": False, "calib_samples": 0, "layers_fp32": []}
    assert not any(n.startswith(("optim/", "calib/")) for n in m.tensors)
    assert {n.op for n in m.graph.nodes}.isdisjoint({"batchnorm", "dropout"})
    np.testing.assert_allclose(reference.run_container(m, x)["logits"], want, atol=1e-5)

    r = export(path, fmt="onnx")
    assert r["output"] == str(path.with_name("model.onnx"))
    np.testing.assert_allclose(run_ort(r["output"], x), want, atol=1e-4)
    assert "fp32 check" in render(r)


def test_int8_bin_and_onnx_agree(wide_ckpt, tmp_path):
    path, graph, params, x = wide_ckpt
    rb = export(path, tmp_path / "m.int8.bin", int8=True)
    ro = export(path, tmp_path / "m.int8.onnx", int8=True)   # format from the suffix
    assert ro["format"] == "onnx"
    assert rb["calib_samples"] == 128  # fewer than the default 256: all there are
    m = read_container(rb["output"])
    assert m.graph.metadata["export"] == {"int8": True, "calib_samples": 128, "layers_fp32": []}
    fp32 = reference.run(graph, params, x)["logits"]
    got_bin = reference.run_container(m, x)["logits"]
    got_onnx = run_ort(ro["output"], x)
    assert np.mean(got_bin.argmax(1) == got_onnx.argmax(1)) >= 0.99
    np.testing.assert_allclose(got_onnx, got_bin, atol=1e-3 * np.abs(got_bin).max())
    assert np.mean(got_bin.argmax(1) == fp32.argmax(1)) >= 0.95
    assert rb["agreement"]["top1_agreement"] >= 0.95

    # The ONNX initializers are the .bin tensors, bit for bit, and so are the scales.
    import onnx

    inits = {i.name: onnx.numpy_helper.to_array(i)
             for i in onnx.load(ro["output"]).graph.initializer}
    for name, t in m.tensors.items():
        assert np.array_equal(inits[name], t) and inits[name].dtype == t.dtype, name
    np.testing.assert_array_equal(inits["c3.w_scale"], np.float32(m.quant("c3.weight")["scale"]))
    # The int32 bias carries no table of its own: its scale is x_scale * w_scale (QDQ's rule).
    assert m.quant("c3.bias") is None
    x_scale = next(n for n in m.graph.nodes if n.name == "c3").attrs["x_scale"]
    np.testing.assert_allclose(inits["c3.b_scale"],
                               np.float32(m.quant("c3.weight")["scale"]) * x_scale, rtol=1e-6)
    assert m.quant("c3.weight")["axis"] == 0 and set(m.quant("c3.weight")["zero_point"]) == {0}


def test_int8_file_is_under_a_third(wide_ckpt, tmp_path):
    path, *_ = wide_ckpt
    for fmt in ("bin", "onnx"):
        r = export(path, tmp_path / f"m.{fmt}", fmt=fmt, int8=True, calib_samples=32)
        assert r["calib_samples"] == 32
        fp32 = export(path, tmp_path / f"f.{fmt}", fmt=fmt)
        assert r["fp32_size"] == pytest.approx(fp32["size"], rel=0.02)
        assert r["size"] <= 0.3 * fp32["size"], (fmt, r["size"], fp32["size"])


def test_onnxruntime_runs_int8_kernels(wide_ckpt, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    import onnx

    r = export(wide_ckpt[0], tmp_path / "m.onnx", int8=True, calib_samples=32)
    opts = ort.SessionOptions()  # the kernels onnxruntime fuses by default
    opts.log_severity_level = 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    opts.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(r["output"], opts, providers=["CPUExecutionProvider"])
    ops = [n.op_type for n in onnx.load(tmp_path / "opt.onnx").graph.node]
    assert ops.count("QLinearConv") == 3 and ops.count("QGemm") == 2
    assert "Conv" not in ops and "DequantizeLinear" not in ops


def _outlier_ckpt(tmp_path):
    n = Net((3, 8, 8), seed=2)
    h = n.conv(n.input, 8, name="c1", activation="relu")
    h = n.conv(h, 8, name="bad", activation="relu")
    # One weight 1000x the others: its channel's range swamps the per-tensor output scale.
    n.params["bad.weight"][0, 0, 1, 1] = 300.0
    h = n.conv(h, 8, name="c3", activation="relu")
    h = n.linear(n.op("flatten", h), 10, name="head", out="logits")
    x = smooth_images(np.random.default_rng(0), 96, (3, 8, 8))
    return write_ckpt(tmp_path / "outlier.ckpt", n.graph([h]), n.params, x)


def test_guard_keeps_a_bad_layer_fp32(tmp_path):
    path = _outlier_ckpt(tmp_path)
    r = export(path, tmp_path / "m.bin", int8=True)
    assert [x["name"] for x in r["layers_fp32"]] == ["bad"]
    assert "exceeds max_layer_error" in r["layers_fp32"][0]["reason"]
    assert "kept fp32: bad" in render(r)
    m = read_container(r["output"])
    assert m.graph.metadata["export"]["layers_fp32"] == ["bad"]
    kinds = {n.name: n.attrs.get("x_scale") is not None for n in m.graph.nodes}
    assert kinds["bad"] is False and kinds["c1"] and kinds["c3"] and kinds["head"]
    assert m.tensors["bad.weight"].dtype == np.float32 and m.tensors["c3.weight"].dtype == np.int8
    # Raising the limit takes it back to int8: the guard, not something else, kept it.
    r = export(path, tmp_path / "m2.bin", int8=True, max_layer_error=10.0)
    assert r["layers_fp32"] == []


def test_non_relu_activation_stays_fp32_and_exports(tmp_path):
    n = Net((6,))
    h = n.linear(n.input, 16, name="fc1", activation="relu")
    h = n.op("sigmoid", n.linear(h, 8, name="fc2"))
    out = n.linear(h, 1, name="head", out="value")
    x = np.random.default_rng(0).normal(size=(64, 6)).astype(np.float32)
    path = write_ckpt(tmp_path / "reg.ckpt", n.graph([out], task="regression"), n.params, x)
    for fmt in ("bin", "onnx"):
        r = export(path, tmp_path / f"m.{fmt}", fmt=fmt, int8=True)
        assert r["layers_fp32"] == [{"name": "fc2", "reason": "fused activation 'sigmoid' has "
                                     "no int8 form (only relu and clip fuse into int8)"}]
        assert "top1_agreement" not in r["agreement"]
        assert r["agreement"]["max_abs_error"] < 0.05 * np.abs(reference.run(
            n.graph([out]), n.params, x)["value"]).max()
    want = reference.run_container(read_container(tmp_path / "m.bin"), x)["value"]
    np.testing.assert_allclose(run_ort(tmp_path / "m.onnx", x), want, atol=1e-4)


def test_calib_npz_overrides(res_ckpt, tmp_path):
    path, *_ = res_ckpt
    npz = tmp_path / "calib.npz"
    np.savez(npz, x=smooth_images(np.random.default_rng(3), 40, (1, 8, 8)))
    r = export(path, tmp_path / "m.bin", int8=True, calib_path=npz)
    assert r["calib_samples"] == 40 and r["calib_source"] == str(npz)
    np.savez(npz, y=np.zeros(3))
    with pytest.raises(ExportError, match="no array named 'x'"):
        export(path, tmp_path / "m.bin", int8=True, calib_path=npz)
    np.savez(npz, x=np.zeros((4, 1, 9, 9), np.float32))
    with pytest.raises(ExportError, match="calibration samples have shape"):
        export(path, tmp_path / "m.bin", int8=True, calib_path=npz)


def test_unsupported_op_names_node_and_op(tmp_path, monkeypatch):
    # An op the IR knows but export does not (the IR grows first).
    monkeypatch.setitem(ops.OPS, "mish", ops.Op("mish", 1, 1, {}, ops.infer_unary_f32))
    n = Net((4,))
    out = n.op("mish", n.linear(n.input, 4, name="fc"), name="act1")
    path = write_ckpt(tmp_path / "mish.ckpt", n.graph([out]), n.params)
    with pytest.raises(ExportError, match=r"node 'act1' \(op 'mish'\): export cannot "
                                          r"handle this op yet; supported: add, ") as e:
        export(path)
    assert isinstance(e.value, PocketError) and "\n" not in str(e.value)


def test_bad_inputs(res_ckpt, tmp_path):
    path, graph, params, _ = res_ckpt
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 0xFF
    bad = tmp_path / "corrupt.ckpt"
    bad.write_bytes(bytes(raw))
    with pytest.raises(FormatError):
        export(bad)
    with pytest.raises(FormatError):
        export(tmp_path / "missing.ckpt")

    model = tmp_path / "model.bin"
    export(path, model)
    with pytest.raises(ExportError, match="exported model, not a training checkpoint"):
        export(model)

    nocalib = write_ckpt(tmp_path / "nocalib.ckpt", graph, params)
    export(nocalib, tmp_path / "ok.bin")  # fp32 needs no samples
    with pytest.raises(ExportError, match="no calibration samples"):
        export(nocalib, int8=True)
    with pytest.raises(ExportError, match="format is bin"):
        export(path, tmp_path / "m.onnx", fmt="bin")


def test_digits_checkpoint(request, tmp_path):
    """The trained digits model: parity in fp32, accuracy kept in int8, size under 0.3x."""
    try:
        ckpt = request.getfixturevalue("digits_ckpt")
    except pytest.FixtureLookupError:
        pytest.skip("needs the digits_ckpt fixture (a trained digits checkpoint)")
    c = read_container(ckpt, expect_kind="checkpoint")
    graph, params = c.graph, {n: np.array(c.tensors[n]) for n in c.graph.params}
    try:
        x, y = request.getfixturevalue("digits_test_data")
    except pytest.FixtureLookupError:
        x, y = np.array(c.tensors["calib/x"]), np.array(c.tensors["calib/y"])
    out = graph.outputs[0]
    want = reference.run(graph, params, x)[out]

    fb = export(ckpt, tmp_path / "model.bin")
    fo = export(ckpt, tmp_path / "model.onnx", fmt="onnx")
    np.testing.assert_allclose(reference.run_container(read_container(fb["output"]), x)[out],
                               want, atol=1e-4)
    np.testing.assert_allclose(run_ort(fo["output"], x), want, atol=1e-4)

    acc32 = np.mean(want.argmax(1) == y)
    qb = export(ckpt, tmp_path / "model.int8.bin", int8=True)
    qo = export(ckpt, tmp_path / "model.int8.onnx", fmt="onnx", int8=True)
    acc_bin = np.mean(reference.run_container(read_container(qb["output"]), x)[out].argmax(1) == y)
    acc_onnx = np.mean(run_ort(qo["output"], x).argmax(1) == y)
    assert acc_bin >= acc32 - 0.01 and acc_onnx >= acc32 - 0.01, (acc32, acc_bin, acc_onnx)
    assert qb["size"] <= 0.3 * fb["size"] and qo["size"] <= 0.3 * fo["size"]
