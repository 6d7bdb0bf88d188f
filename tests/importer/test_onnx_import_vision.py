"""The vision importers (Clip, Mul, SiLU as Sigmoid * x, the channel shuffle's Reshape ->
Transpose -> Reshape, Slice and Split, ReduceMean over H and W) on small graphs, the engine
against onnxruntime."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from pocket.compare import exact_session_options  # noqa: E402
from pocket.importer.app import import_onnx  # noqa: E402
from pocket.importer.reader import ImportError_  # noqa: E402

RNG = np.random.default_rng(1)
F = np.float32


def _init(name, a):
    return numpy_helper.from_array(np.asarray(a), name)


def _model(nodes, inits, x_shape, y_shape):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
                          initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _check(model, x, tmp_path, want_ops=None):
    from pocket.formats.container import write_container
    from pocket.infer.engine import Engine

    imp = import_onnx(model)
    ops = [n.op for n in imp.graph.nodes]
    for op in want_ops or ():
        assert op in ops or any(n.attrs.get("activation") == op for n in imp.graph.nodes), ops
    path = tmp_path / "m.bin"
    write_container(path, kind="model", tensors=imp.params, graph=imp.graph, quant=imp.quant)
    want = ort.InferenceSession(model.SerializeToString(), exact_session_options(ort),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with Engine(path, max_batch=8) as eng:
        np.testing.assert_allclose(eng.run(x, copy=True), want, rtol=1e-5, atol=1e-5)
    return ops


def test_conv_relu6_se_block_and_silu(tmp_path):
    c = 8
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c1", "lo", "hi"], ["r6"]),
        helper.make_node("GlobalAveragePool", ["r6"], ["gap"]),
        helper.make_node("Conv", ["gap", "w_se1", "b_se1"], ["se1"]),
        helper.make_node("Sigmoid", ["se1"], ["se1s"]),
        helper.make_node("Mul", ["se1", "se1s"], ["se1a"]),  # SiLU
        helper.make_node("Conv", ["se1a", "w_se2", "b_se2"], ["se2"]),
        helper.make_node("HardSigmoid", ["se2"], ["gate"], alpha=1 / 6, beta=0.5),
        helper.make_node("Mul", ["r6", "gate"], ["y"]),
    ]
    inits = [_init("w", RNG.standard_normal((c, 3, 3, 3)).astype(F)),
             _init("b", RNG.standard_normal(c).astype(F)), _init("lo", F(0)), _init("hi", F(6)),
             _init("w_se1", RNG.standard_normal((4, c, 1, 1)).astype(F) * 0.3),
             _init("b_se1", RNG.standard_normal(4).astype(F)),
             _init("w_se2", RNG.standard_normal((c, 4, 1, 1)).astype(F) * 0.3),
             _init("b_se2", RNG.standard_normal(c).astype(F))]
    model = _model(nodes, inits, ["N", 3, 7, 6], ["N", c, 7, 6])
    x = RNG.standard_normal((3, 3, 7, 6)).astype(F) * 2
    ops = _check(model, x, tmp_path, ["clip", "silu", "mul"])
    assert "sigmoid" not in ops


def test_channel_shuffle_and_split(tmp_path):
    # ShuffleNetV2's unit as the TorchScript exporter writes it: Split (chunk) -> Concat ->
    # Reshape (N, g, C/g, H, W) -> Transpose -> Reshape (N, C, H, W), plus a Slice.
    c, g = 8, 2
    nodes = [
        helper.make_node("Split", ["x", "sizes"], ["a", "b"], axis=1),
        helper.make_node("Relu", ["b"], ["br"]),
        helper.make_node("Concat", ["a", "br"], ["cat"], axis=1),
        helper.make_node("Reshape", ["cat", "s5"], ["r5"]),
        helper.make_node("Transpose", ["r5"], ["t5"], perm=[0, 2, 1, 3, 4]),
        helper.make_node("Reshape", ["t5", "s4"], ["sh"]),
        helper.make_node("Slice", ["sh", "st", "en", "ax"], ["y"]),
    ]
    inits = [_init("sizes", np.array([4, 4], np.int64)),
             _init("s5", np.array([0, g, c // g, 5, 3], np.int64)),
             _init("s4", np.array([0, -1, 5, 3], np.int64)),
             _init("st", np.array([2], np.int64)), _init("en", np.array([7], np.int64)),
             _init("ax", np.array([1], np.int64))]
    model = _model(nodes, inits, ["N", c, 5, 3], ["N", 5, 5, 3])
    x = RNG.standard_normal((2, c, 5, 3)).astype(F)
    ops = _check(model, x, tmp_path, ["channel_shuffle", "slice"])
    assert ops.count("slice") == 3 and "channel_shuffle" in ops


def test_reduce_mean_without_keepdims(tmp_path):
    nodes = [helper.make_node("ReduceMean", ["x"], ["y"], axes=[2, 3], keepdims=0)]
    model = _model(nodes, [], ["N", 4, 3, 5], ["N", 4])
    _check(model, RNG.standard_normal((3, 4, 3, 5)).astype(F), tmp_path, ["global_avgpool"])


def test_an_unrelated_transpose_is_refused():
    nodes = [helper.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 1])]
    with pytest.raises(ImportError_, match="only the transpose of a channel shuffle"):
        import_onnx(_model(nodes, [], ["N", 3, 4], ["N", 4, 3]))
