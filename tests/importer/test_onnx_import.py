"""`pocket import`: small ONNX graphs built with onnx.helper, imported and run by the engine,
checked against onnxruntime (the independent oracle); the error that lists every unsupported
node; QDQ -> int8 layers; the commands that take an ONNX file."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from pocket.compare import exact_session_options  # noqa: E402
from pocket.importer.app import import_onnx  # noqa: E402
from pocket.importer.reader import ImportError_  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(0)


def _init(name, a):
    return numpy_helper.from_array(np.asarray(a), name)


def _model(nodes, inits, x_shape, y_name="y", y_shape=None, opset=17):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info(y_name, TensorProto.FLOAT, y_shape or x_shape)],
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _cnn():
    """conv -> BN -> relu -> maxpool -> conv (no bias) + Add bias -> residual Add -> GAP ->
    flatten -> Gemm(transB=0, alpha) -> softmax, with a dynamic batch and Identity/Dropout."""
    f = np.float32
    w1 = RNG.standard_normal((6, 3, 3, 3)).astype(f) * 0.3
    w2 = RNG.standard_normal((6, 6, 3, 3)).astype(f) * 0.2
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("BatchNormalization", ["c1", "g", "be", "mu", "var"], ["bn"],
                         epsilon=1e-3, name="bn1"),
        helper.make_node("Relu", ["bn"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Identity", ["p1"], ["p1i"]),
        helper.make_node("Conv", ["p1i", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Add", ["c2", "b2"], ["c2b"]),
        helper.make_node("Add", ["c2b", "p1i"], ["res"]),
        helper.make_node("GlobalAveragePool", ["res"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["flat"]),
        helper.make_node("Dropout", ["flat"], ["drop"]),
        helper.make_node("Gemm", ["drop", "fc_w", "fc_b"], ["logits"], alpha=0.5, name="fc"),
        helper.make_node("Softmax", ["logits"], ["y"], axis=1),
    ]
    inits = [_init("w1", w1), _init("b1", RNG.standard_normal(6).astype(f)),
             _init("g", RNG.uniform(0.5, 1.5, 6).astype(f)), _init("be", RNG.standard_normal(6).astype(f)),
             _init("mu", RNG.standard_normal(6).astype(f)), _init("var", RNG.uniform(0.5, 2, 6).astype(f)),
             _init("w2", w2), _init("b2", RNG.standard_normal((1, 6, 1, 1)).astype(f)),
             _init("fc_w", RNG.standard_normal((6, 5)).astype(f)),
             _init("fc_b", RNG.standard_normal(5).astype(f))]
    return _model(nodes, inits, ["batch", 3, 9, 11], y_shape=["batch", 5])


def _engine(imp, tmp_path):
    from pocket.formats.container import write_container
    from pocket.infer.engine import Engine

    path = tmp_path / "m.bin"
    write_container(path, kind="model", tensors=imp.params, graph=imp.graph, quant=imp.quant)
    return Engine(path, max_batch=8)


def _ort(model, x):
    s = ort.InferenceSession(model.SerializeToString(), exact_session_options(ort),
                             providers=["CPUExecutionProvider"])
    return s.run(None, {"x": x})[0]


def test_a_cnn_imports_folded_and_matches_onnxruntime(tmp_path):
    model = _cnn()
    imp = import_onnx(model)
    ops = [n.op for n in imp.graph.nodes]
    # BN folded into conv1, relu fused, Identity/Dropout gone, the Add of a constant is a bias.
    assert "batchnorm" not in ops and "dropout" not in ops and "relu" not in ops
    assert ops.count("add") == 1 and ops.count("conv2d") == 2
    assert imp.graph.inputs["x"].shape == ("N", 3, 9, 11)
    assert imp.graph.outputs == ["y"]
    with _engine(imp, tmp_path) as eng:
        for n in (1, 3):
            x = RNG.standard_normal((n, 3, 9, 11)).astype(np.float32)
            np.testing.assert_allclose(eng.run(x, copy=True), _ort(model, x), rtol=1e-5, atol=1e-6)


def test_shape_arithmetic_keeps_the_batch_symbolic(tmp_path):
    # x.view(x.size(0), -1) as the TorchScript exporter writes it: Shape -> Gather -> Unsqueeze
    # -> Concat -> Reshape, then MatMul + Add (a Linear).
    f = np.float32
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "ax0"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w"], ["mm"]),
        helper.make_node("Add", ["mm", "b"], ["y"]),
    ]
    inits = [_init("zero", np.int64(0)), _init("ax0", np.array([0], np.int64)),
             _init("minus1", np.array([-1], np.int64)),
             _init("w", RNG.standard_normal((12, 4)).astype(f)), _init("b", RNG.standard_normal(4).astype(f))]
    model = _model(nodes, inits, ["N", 3, 2, 2], y_shape=["N", 4])
    imp = import_onnx(model)
    assert [n.op for n in imp.graph.nodes] == ["reshape", "linear"]
    x = RNG.standard_normal((5, 3, 2, 2)).astype(np.float32)
    with _engine(imp, tmp_path) as eng:
        np.testing.assert_allclose(eng.run(x, copy=True), _ort(model, x), rtol=1e-5, atol=1e-6)


def test_every_unsupported_node_is_listed():
    nodes = [helper.make_node("Cos", ["x"], ["a"], name="cos1"),
             helper.make_node("Relu", ["a"], ["b"], name="relu1"),
             helper.make_node("Conv", ["b", "w"], ["c"], pads=[0, 0, 1, 1], name="asym"),
             helper.make_node("Sin", ["c"], ["y"], name="sin2")]
    model = _model(nodes, [_init("w", np.ones((2, 2, 1, 1), np.float32))], ["N", 2, 4, 4])
    with pytest.raises(ImportError_) as e:
        import_onnx(model)
    msg = str(e.value)
    assert "cannot import 2 nodes" in msg
    assert "Cos 'cos1': op type Cos is not supported" in msg
    assert "Sin 'sin2': op type Sin is not supported" in msg  # downstream of Cos: still named
    asym = helper.make_node("Conv", ["x", "w"], ["c"], pads=[0, 0, 1, 1], name="asym")
    model2 = _model([asym], [_init("w", np.ones((2, 2, 1, 1), np.float32))], ["N", 2, 4, 4],
                    y_name="c")
    with pytest.raises(ImportError_, match=r"Conv 'asym': pads \[0, 0, 1, 1\] are asymmetric"):
        import_onnx(model2)


def test_a_dynamic_non_batch_dim_needs_an_input_shape(tmp_path):
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [], ["N", "C"], y_shape=["N", "C"])
    with pytest.raises(ImportError_, match="dim 1 is dynamic"):
        import_onnx(model)
    imp = import_onnx(model, input_shapes=["N,7"])
    assert imp.graph.inputs["x"].shape == ("N", 7)


def _qdq_model(tmp_path):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    src = tmp_path / "fp32.onnx"
    onnx.save(_cnn(), str(src))

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": RNG.standard_normal((1, 3, 9, 11)).astype(np.float32)}
                            for _ in range(8)])

        def get_next(self):
            return next(self.it, None)

    dst = tmp_path / "qdq.onnx"
    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, per_channel=True)
    return dst


def test_qdq_imports_as_int8_layers_that_agree_with_onnxruntime(tmp_path):
    path = _qdq_model(tmp_path)
    imp = import_onnx(path)
    layers = [n for n in imp.graph.nodes if "x_scale" in n.attrs]
    assert len(layers) >= 2, [n.op for n in imp.graph.nodes]
    assert all(imp.params[n.inputs[1]].dtype == np.int8 for n in layers)
    model = onnx.load(str(path))
    x = RNG.standard_normal((16, 3, 9, 11)).astype(np.float32)
    with _engine(imp, tmp_path) as eng:
        got = eng.run(x, copy=True)
    want = _ort(model, x)
    # Softmax outputs in [0, 1]: one int8 step of the logits moves them by far less than 0.05.
    assert np.abs(got - want).max() < 0.05
    assert (got.argmax(1) == want.argmax(1)).mean() >= 0.9


def _pocket(args, cwd):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("POCKET_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "pocket.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_cli_import_compare_and_errors(tmp_path):
    onnx.save(_cnn(), str(tmp_path / "m.onnx"))
    r = _pocket(["import", "m.onnx", "-o", "m.bin", "--json"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "m.bin").is_file()
    r = _pocket(["compare", "m.onnx", "--bin", "m.bin", "--random", "4"], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "onnx vs bin" in r.stdout and "PASS" in r.stdout
    r = _pocket(["inspect", "m.onnx"], tmp_path)
    assert r.returncode == 0 and "in memory" in r.stderr
    bad = _model([helper.make_node("Cos", ["x"], ["a"]), helper.make_node("Sin", ["a"], ["y"])],
                 [], ["N", 4])
    onnx.save(bad, str(tmp_path / "bad.onnx"))
    r = _pocket(["import", "bad.onnx", "-o", "bad.bin"], tmp_path)
    assert r.returncode == 3 and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and "Cos" in r.stderr and "Sin" in r.stderr
    assert not (tmp_path / "bad.bin").exists()


def test_a_missing_onnx_says_how_to_install(monkeypatch):
    from pocket.importer import reader

    monkeypatch.setitem(sys.modules, "onnx", None)
    with pytest.raises(ImportError_, match=r"pip install 'pocketnn\[onnx\]'"):
        reader.onnx_module()


def test_the_core_ops_have_importers():
    from pocket.formats import ops
    from pocket.importer import ops_core  # noqa: F401

    have = ops.implementations("onnx_import")
    core = ["conv2d", "linear", "batchnorm", "relu", "leaky_relu", "sigmoid", "tanh", "gelu",
            "hardswish", "hardsigmoid", "maxpool2d", "avgpool2d", "global_avgpool", "flatten",
            "reshape", "add", "concat", "dropout", "softmax", "quantize", "dequantize"]
    assert [op for op in core if op not in have] == []


def test_cli_int8_quantizes_an_fp32_import_with_pocket_calibration(tmp_path):
    onnx.save(_cnn(), str(tmp_path / "m.onnx"))
    x = RNG.standard_normal((32, 3, 9, 11)).astype(np.float32)
    np.savez(tmp_path / "calib.npz", x=x)
    r = _pocket(["import", "m.onnx", "--int8", "--calib", "calib.npz", "-o", "m8.bin", "--json"],
                tmp_path)
    assert r.returncode == 0, r.stderr
    import json

    rep = json.loads(r.stdout)
    assert rep["int8_layers"] >= 1 and rep["calib_samples"] == 32
    r = _pocket(["import", "m.onnx", "--int8", "-o", "m8.bin"], tmp_path)
    assert r.returncode == 3 and "--calib" in r.stderr


def test_a_qdq_conv_chain_is_bit_exact_with_onnxruntime(tmp_path):
    # onnxruntime fuses DQ -> Conv -> Relu -> Q into QLinearConv; the imported int8 layers
    # carry the file's integers and scales, so the codes must agree exactly.
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    f = np.float32
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Conv", ["r", "w2", "b2"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])]
    inits = [_init("w", RNG.standard_normal((12, 5, 3, 3)).astype(f) * 0.2),
             _init("b", RNG.standard_normal(12).astype(f) * 0.1),
             _init("w2", RNG.standard_normal((6, 12, 3, 3)).astype(f) * 0.2),
             _init("b2", RNG.standard_normal(6).astype(f) * 0.1)]
    onnx.save(_model(nodes, inits, ["N", 5, 9, 7], y_shape=["N", 6, 5, 4]), str(tmp_path / "f.onnx"))

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": RNG.standard_normal((1, 5, 9, 7)).astype(f)} for _ in range(4)])

        def get_next(self):
            return next(self.it, None)

    quantize_static(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), Reader(),
                    quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8, per_channel=True)
    imp = import_onnx(tmp_path / "q.onnx")
    assert [n.op for n in imp.graph.nodes] == ["quantize", "conv2d", "conv2d", "dequantize"]
    x = RNG.standard_normal((4, 5, 9, 7)).astype(f)
    with _engine(imp, tmp_path) as eng:
        got = eng.run(x, copy=True)
    np.testing.assert_array_equal(got, _ort(onnx.load(str(tmp_path / "q.onnx")), x))
