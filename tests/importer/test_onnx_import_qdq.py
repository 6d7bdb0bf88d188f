"""QDQ models as onnxruntime's quantize_static writes them, beyond conv chains: a Q/DQ pair on
every edge, also inside ShuffleNetV2's channel shuffle (Reshape -> Q -> DQ -> Transpose)."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from pocket.compare import exact_session_options  # noqa: E402
from pocket.importer.app import import_onnx  # noqa: E402

RNG = np.random.default_rng(5)
F = np.float32


def _init(name, a):
    return numpy_helper.from_array(np.asarray(a), name)


def _quantize(model, tmp_path, shape):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    onnx.save(model, str(tmp_path / "f.onnx"))

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": RNG.standard_normal((1, *shape)).astype(F)} for _ in range(4)])

        def get_next(self):
            return next(self.it, None)

    quantize_static(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), Reader(),
                    quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8, per_channel=True)
    return tmp_path / "q.onnx"


def test_a_qdq_channel_shuffle_imports_and_agrees_with_onnxruntime(tmp_path):
    from pocket.formats.container import write_container
    from pocket.infer.engine import Engine

    c, g = 8, 2
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Split", ["c", "sizes"], ["a", "bb"], axis=1),
        helper.make_node("Conv", ["bb", "w2", "b2"], ["b2c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["b2c"], ["br"]),
        helper.make_node("Concat", ["a", "br"], ["cat"], axis=1),
        helper.make_node("Reshape", ["cat", "s5"], ["r5"]),
        helper.make_node("Transpose", ["r5"], ["t5"], perm=[0, 2, 1, 3, 4]),
        helper.make_node("Reshape", ["t5", "s4"], ["sh"]),
        helper.make_node("Conv", ["sh", "w3", "b3"], ["y"]),
    ]
    inits = [_init("w", RNG.standard_normal((c, 3, 3, 3)).astype(F) * 0.3),
             _init("b", RNG.standard_normal(c).astype(F) * 0.1),
             _init("sizes", np.array([4, 4], np.int64)),
             _init("w2", RNG.standard_normal((4, 4, 3, 3)).astype(F) * 0.3),
             _init("b2", RNG.standard_normal(4).astype(F) * 0.1),
             _init("s5", np.array([0, g, c // g, 5, 6], np.int64)),
             _init("s4", np.array([0, -1, 5, 6], np.int64)),
             _init("w3", RNG.standard_normal((5, c, 1, 1)).astype(F) * 0.3),
             _init("b3", RNG.standard_normal(5).astype(F) * 0.1)]
    gr = helper.make_graph(nodes, "g",
                           [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 5, 6])],
                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5, 5, 6])],
                           initializer=inits)
    m = helper.make_model(gr, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path = _quantize(m, tmp_path, (3, 5, 6))
    imp = import_onnx(path)
    ops = [n.op for n in imp.graph.nodes]
    assert "channel_shuffle" in ops and "reshape" not in ops, ops
    shuffle = next(n for n in imp.graph.nodes if n.op == "channel_shuffle")
    assert imp.graph.validate()[shuffle.inputs[0]].dtype == "i8"  # it moves the int8 codes
    write_container(tmp_path / "m.bin", kind="model", tensors=imp.params, graph=imp.graph,
                    quant=imp.quant)
    x = RNG.standard_normal((4, 3, 5, 6)).astype(F)
    want = ort.InferenceSession(str(path), exact_session_options(ort),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with Engine(tmp_path / "m.bin", max_batch=8) as eng:
        got = eng.run(x, copy=True)
    # onnxruntime runs int8 convolutions in float on x86 (see bench/onnx_models.py): a code may
    # round the other way, one output step; the channels must not be permuted differently.
    step = float(next(n for n in reversed(imp.graph.nodes) if n.op == "dequantize")
                 .attrs["scale"]) if "dequantize" in ops else 0.05
    assert np.abs(got - want).max() <= 1.01 * step + 1e-6
    assert np.mean(got == want) > 0.98


def test_a_qdq_matmul_over_the_last_axis_stays_float(tmp_path):
    # (N, T, K) @ (K, O): the IR's linear over the last axis; an int8 linear takes (N, K) only,
    # so the import keeps it float between the file's Q/DQ pairs.
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    gr = helper.make_graph(nodes, "g",
                           [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4])],
                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, 5])],
                           initializer=[_init("w", RNG.standard_normal((4, 5)).astype(F))])
    m = helper.make_model(gr, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path = _quantize(m, tmp_path, (3, 4))
    imp = import_onnx(path)
    lin = next(n for n in imp.graph.nodes if n.op == "linear")
    assert "x_scale" not in lin.attrs
    x = RNG.standard_normal((2, 3, 4)).astype(F)
    from pocket.formats import reference

    got = reference.run(imp.graph, imp.params, x, imp.quant)[imp.graph.outputs[0]]
    want = ort.InferenceSession(str(path), exact_session_options(ort),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    step = float(next(n for n in imp.graph.nodes if n.op == "dequantize"
                      and n.outputs[0] == imp.graph.outputs[0]).attrs["scale"])
    assert np.abs(got - want).max() <= 1.01 * step


def test_the_per_layer_bench_finds_onnxruntimes_fused_codes(tmp_path):
    # bench/onnx_qdq_layers.py reads the codes of the graph onnxruntime runs (its saved
    # optimized model, QLinearConv on uint8 on x86) back onto the file's Q outputs: on a residual
    # block every int8 layer must be compared, and agree but for a rare one-code rounding.
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "onnx_qdq_layers", Path(__file__).resolve().parents[2] / "bench" / "onnx_qdq_layers.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    c = 6
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "r1"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    inits = [_init("w", RNG.standard_normal((c, 3, 3, 3)).astype(F) * 0.3),
             _init("b", RNG.standard_normal(c).astype(F) * 0.1),
             _init("w2", RNG.standard_normal((c, c, 3, 3)).astype(F) * 0.2),
             _init("b2", RNG.standard_normal(c).astype(F) * 0.1)]
    gr = helper.make_graph(nodes, "g",
                           [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 9, 8])],
                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", c, 9, 8])],
                           initializer=inits)
    m = helper.make_model(gr, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    r = bench.layers(_quantize(m, tmp_path, (3, 9, 8)), 4)
    assert {"conv2d(quantize)", "conv2d(conv2d)", "quantize(add)"} <= set(r["alone"])
    assert r["alone_agreement"] > 0.999
    assert all(v["differ_by_more_than_1"] == 0 for v in r["alone"].values())
    assert [c["op"] for c in r["chained"]][:3] == ["quantize", "conv2d", "conv2d"]


def _conv_graph(tail, outs):
    """x -> Conv c (and Conv d) -> the nodes of `tail`, outputs `outs`, shapes (N, 4, 5, 6)."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["x", "w2", "b2"], ["d"], pads=[1, 1, 1, 1]), *tail]
    inits = [_init("w", RNG.standard_normal((4, 3, 3, 3)).astype(F) * 0.5),
             _init("b", RNG.standard_normal(4).astype(F) * 0.2),
             _init("w2", RNG.standard_normal((4, 3, 3, 3)).astype(F) * 0.5),
             _init("b2", RNG.standard_normal(4).astype(F) * 0.2)]
    gr = helper.make_graph(nodes, "g",
                           [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 5, 6])],
                           [helper.make_tensor_value_info(o, TensorProto.FLOAT, ["N", 4, 5, 6])
                            for o in outs], initializer=inits)
    m = helper.make_model(gr, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_qdq_elementwise_functions_of_one_code_become_lookup_tables(tmp_path):
    """Q(sigmoid(DQ c)) and Q(DQ d * DQ Q(sigmoid(DQ d))) (a QDQ SiLU) are functions of one
    conv's 256 codes: one lut each. c * d of two different convs is not; quantize_static
    leaves HardSwish unquantized, so it stays a float op after its dequantize."""
    from pocket.formats import reference
    from pocket.formats.container import write_container
    from pocket.infer.engine import Engine

    tail = [helper.make_node("Sigmoid", ["c"], ["sig"]),
            helper.make_node("Sigmoid", ["d"], ["sd"]),
            helper.make_node("Mul", ["d", "sd"], ["silu"]),
            helper.make_node("HardSwish", ["c"], ["hs"]),
            helper.make_node("Mul", ["c", "d"], ["prod"])]
    path = _quantize(_conv_graph(tail, ["sig", "silu", "hs", "prod"]), tmp_path, (3, 5, 6))
    imp = import_onnx(path)
    ops = [n.op for n in imp.graph.nodes]
    assert ops.count("lut") == 2 and "sigmoid" not in ops and ops.count("hardswish") == 1, ops
    assert ops.count("mul") == 1, ops  # c * d: two sources, stays float between its Q/DQ
    write_container(tmp_path / "m.bin", kind="model", tensors=imp.params, graph=imp.graph,
                    quant=imp.quant)
    x = RNG.standard_normal((3, 3, 5, 6)).astype(F)
    want = ort.InferenceSession(str(path), exact_session_options(ort),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})
    ref = reference.run(imp.graph, imp.params, x, imp.quant)
    with Engine(tmp_path / "m.bin", max_batch=4) as eng:
        got = eng.run_all(x, copy=True)
    outs = imp.graph.outputs
    for o, w in zip(outs, want):
        if o == "hs":
            np.testing.assert_allclose(got[o], w, atol=1e-5)
            continue
        np.testing.assert_array_equal(got[o], ref[o])  # the engine's lut kernel is the reference's
        # onnxruntime's convs round a code the other way now and then (see above), and its
        # sigmoid is float32: one output step, rarely
        dq = next(n for n in imp.graph.nodes if n.op == "dequantize" and n.outputs[0] == o)
        assert np.abs(got[o] - w).max() <= 1.01 * float(dq.attrs["scale"]) + 1e-6, o
        assert np.mean(got[o] == w) > 0.97, o


def test_a_lut_exports_to_onnx_as_a_gather(tmp_path):
    """quantize -> lut -> dequantize through export/onnx_export.py, run by onnxruntime, equals
    the reference interpreter exactly (Cast + Add + Gather of the table)."""
    from pocket.export.onnx_export import to_onnx
    from pocket.formats import reference
    from pocket.formats.ir import Graph, Node, ValueInfo

    g = Graph(inputs={"x": ValueInfo("f32", ("N", 7))}, outputs=["y"],
              params={"t": ValueInfo("i8", (256,))},
              nodes=[Node("q", "quantize", ["x"], ["xq"], {"scale": 0.03, "zero_point": -5}),
                     Node("l", "lut", ["xq", "t"], ["yq"], {}),
                     Node("dq", "dequantize", ["yq"], ["y"], {"scale": 0.05, "zero_point": 3})])
    params = {"t": RNG.integers(-128, 128, 256).astype(np.int8)}
    x = (RNG.standard_normal((5, 7)) * 3).astype(F)  # past the codes' range at both ends
    model = to_onnx(g, params, {})
    sess = ort.InferenceSession(model.SerializeToString(), exact_session_options(ort),
                                providers=["CPUExecutionProvider"])
    got = sess.run(None, {"x": x})[0]
    want = reference.run(g, params, x, {})["y"]
    np.testing.assert_array_equal(got, want)
