"""ReduceL2 imports as the norm of an L2 normalisation, fused back to one `l2norm`: pocket's own
export (ReduceL2 -> Max -> Div) and torch's F.normalize (ReduceL2 -> Clip -> Expand -> Div),
the engine against onnxruntime; a ReduceL2 used any other way is refused with the reason."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from pocket.compare import exact_session_options  # noqa: E402
from pocket.importer.app import import_onnx  # noqa: E402
from pocket.importer.reader import ImportError_  # noqa: E402

RNG = np.random.default_rng(3)
F = np.float32


def _model(nodes, inits, x_shape, y_shape, opset=17):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
                          initializer=[numpy_helper.from_array(np.asarray(a), k)
                                       for k, a in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _check(model, x, tmp_path):
    from pocket.formats.container import write_container
    from pocket.infer.engine import Engine

    imp = import_onnx(model)
    ops = [n.op for n in imp.graph.nodes]
    path = tmp_path / "m.bin"
    write_container(path, kind="model", tensors=imp.params, graph=imp.graph, quant=imp.quant)
    want = ort.InferenceSession(model.SerializeToString(), exact_session_options(ort),
                                providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    with Engine(path, max_batch=8) as eng:
        np.testing.assert_allclose(eng.run(x, copy=True), want, rtol=1e-5, atol=1e-6)
    return ops, imp


def test_pockets_own_l2norm_export_fuses_back(tmp_path):
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["e"], transB=1),
             helper.make_node("ReduceL2", ["e"], ["n"], axes=[1], keepdims=1),
             helper.make_node("Max", ["n", "eps"], ["d"]),
             helper.make_node("Div", ["e", "d"], ["y"])]
    inits = {"w": RNG.standard_normal((6, 5)).astype(F), "b": RNG.standard_normal(6).astype(F),
             "eps": F(1e-12)}
    x = RNG.standard_normal((4, 5)).astype(F)
    ops, imp = _check(_model(nodes, inits, ["N", 5], ["N", 6]), x, tmp_path)
    assert ops == ["linear", "l2norm"]
    norm = imp.graph.nodes[1].attrs
    assert norm["axis"] == 1 and norm["eps"] == pytest.approx(1e-12)


def test_torch_normalize_with_clip_and_expand_fuses_back(tmp_path):
    # torch.nn.functional.normalize(x, dim=1) as torch.onnx.export writes it at opset 17
    nodes = [helper.make_node("ReduceL2", ["x"], ["n"], axes=[1], keepdims=1),
             helper.make_node("Clip", ["n", "eps", ""], ["c"]),
             helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Expand", ["c", "s"], ["ce"]),
             helper.make_node("Div", ["x", "ce"], ["y"])]
    x = RNG.standard_normal((3, 4, 2, 5)).astype(F)
    ops, _ = _check(_model(nodes, {"eps": F(1e-12)}, ["N", 4, 2, 5], ["N", 4, 2, 5]), x, tmp_path)
    assert ops == ["l2norm"]


def test_opset18_axes_input_and_a_bare_div(tmp_path):
    nodes = [helper.make_node("ReduceL2", ["x", "axes"], ["n"], keepdims=1),
             helper.make_node("Div", ["x", "n"], ["y"])]
    x = RNG.standard_normal((2, 3, 7)).astype(F) + 0.5
    model = _model(nodes, {"axes": np.array([-1], np.int64)}, ["N", 3, 7], ["N", 3, 7], opset=18)
    ops, imp = _check(model, x, tmp_path)
    assert ops == ["l2norm"] and imp.graph.nodes[0].attrs["axis"] == 2


@pytest.mark.parametrize("tail, match", [
    ([], "only as the norm of an L2 normalisation"),
    ([helper.make_node("Relu", ["n"], ["y"])], "reads the ReduceL2 norm 'n'"),
])
def test_a_reduce_l2_not_normalising_is_refused(tail, match):
    nodes = [helper.make_node("ReduceL2", ["x"], ["n" if tail else "y"], axes=[1], keepdims=1),
             *tail]
    with pytest.raises(ImportError_, match=match):
        import_onnx(_model(nodes, {}, ["N", 4], ["N", 1]))


@pytest.mark.parametrize("axis,shape", [(-1, (6,)), (1, (3, 4))])
def test_pockets_exporter_round_trips_l2norm(axis, shape, tmp_path):
    # pocket's own exporter writes l2norm as ReduceL2 -> Max -> Div (and an N-D linear as
    # Transpose -> MatMul); the import gives both back.
    from pocket.export.onnx_export import to_onnx
    from pocket.formats import reference
    from pocket.formats.container import write_container
    from pocket.formats.ir import Graph, Node, ValueInfo
    from pocket.infer.engine import Engine

    w = RNG.standard_normal((shape[-1], shape[-1])).astype(F)
    g = Graph({"x": ValueInfo("f32", ("N", *shape))}, ["y"],
              [Node("fc", "linear", ["x", "w"], ["h"], {}),
               Node("norm", "l2norm", ["h"], ["y"], {"axis": axis, "eps": 1e-12})],
              {"w": ValueInfo("f32", w.shape)}, {})
    imp = import_onnx(to_onnx(g, {"w": w}))
    assert [n.op for n in imp.graph.nodes] == ["linear", "l2norm"]
    assert imp.graph.nodes[1].attrs["axis"] == 1
    x = RNG.standard_normal((4, *shape)).astype(F)
    x[2] = 0.0  # a zero row stays zero (the eps), as in the IR
    write_container(tmp_path / "m.bin", kind="model", tensors=imp.params, graph=imp.graph,
                    quant=imp.quant)
    with Engine(tmp_path / "m.bin", max_batch=8) as eng:
        got = eng.run(x, copy=True)
    np.testing.assert_allclose(got, reference.run(g, {"w": w}, x)["y"], rtol=1e-5, atol=1e-6)
    assert np.all(got[2] == 0)
