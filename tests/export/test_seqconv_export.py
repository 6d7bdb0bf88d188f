"""The sequence convs through export: ONNX (opset 17, onnx.checker + onnxruntime) against the
reference, a traced `tcn` through the transforms into ONNX and the engine against the training
model, and its int8 export (conv1d as an int8 layer) through the engine and onnxruntime."""

import numpy as np
import pytest

from pocket.compare import exact_session_options
from pocket.export.onnx_export import to_onnx
from pocket.export.quantize import quantize_graph
from pocket.export.transforms import optimize
from pocket.formats import reference as ref
from pocket.formats.ir import Graph, Node, ValueInfo

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


def _ort(graph, params, x, quant=None):
    sess = ort.InferenceSession(to_onnx(graph, params, quant).SerializeToString(), exact_session_options(ort),
                                providers=["CPUExecutionProvider"])
    return sess.run(None, {next(iter(graph.inputs)): x})[0]


def _graph(nodes, params, c=3, length=11):
    infos = {k: ValueInfo("f32", v.shape) for k, v in params.items()}
    g = Graph({"x": ValueInfo("f32", ("N", c, length))}, [nodes[-1].outputs[0]], nodes, infos)
    g.validate()
    return g


def _w(rng, *shape):
    return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)


def test_every_seqconv_op_in_onnxruntime():
    rng = np.random.default_rng(0)
    p = {"c1.w": _w(rng, 4, 3, 3), "c1.b": _w(rng, 4), "c2.w": _w(rng, 6, 2, 2)}
    branch = [
        Node("c1", "conv1d", ["x", "c1.w", "c1.b"], ["c1:y"],
             {"padding": [4, 0], "dilation": 2, "activation": "leaky_relu", "alpha": 0.1}),
        Node("c2", "conv1d", ["c1:y", "c2.w"], ["c2:y"],
             {"padding": [0, 1], "stride": 2, "groups": 2}),
        Node("m", "maxpool1d", ["c2:y"], ["m:y"], {"kernel": 3, "stride": 1, "padding": 1}),
        Node("a", "avgpool1d", ["m:y"], ["a:y"], {"kernel": 2, "padding": 1,
                                                  "count_include_pad": False}),
    ]
    x = rng.standard_normal((2, 3, 11)).astype(np.float32)
    for tail in ("global_avgpool1d", "global_maxpool1d", None):
        nodes = branch + ([Node("g", tail, ["a:y"], ["g:y"], {})] if tail else [])
        g = _graph(nodes, p)
        want = ref.run(g, p, x)[g.outputs[0]]
        got = _ort(g, p, x)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _engine(tmp_path, graph, params, quant=None):
    from pocket.formats.container import write_container
    from pocket.infer import Engine

    path = tmp_path / "m.bin"
    write_container(path, kind="model", graph=graph, tensors=params, quant=quant)
    return Engine(path, max_batch=16)


def _tcn():
    from pocket.train import models, trace
    from pocket.train.tensor import Tensor

    rng = np.random.default_rng(1)
    m = models.build_model({"name": "tcn", "channels": [8, 8, 12], "kernel": 3, "dropout": 0.2},
                           (3, 20), 4, rng).eval()
    g, params = trace.trace(m, (3, 20))
    x = rng.standard_normal((16, 3, 20)).astype(np.float32)
    return g, params, x, m(Tensor(x)).data


def test_tcn_fp32_onnx_and_engine_match_the_training_model(tmp_path):
    g, params, x, want = _tcn()
    fg, fp, applied = optimize(g, params)
    assert "dropped 6 dropout" in applied and "fused 6 activations" in applied
    assert [n.op for n in fg.nodes].count("conv1d") == 8  # 6 + 2 shortcuts
    np.testing.assert_allclose(_ort(fg, fp, x), want, rtol=1e-4, atol=1e-4)
    with _engine(tmp_path, fg, fp) as eng:
        np.testing.assert_allclose(eng.run(x), want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(eng.run(x[:1]), want[:1], rtol=1e-4, atol=1e-4)


def test_tcn_int8_is_int8_in_the_engine_and_onnxruntime(tmp_path):
    g, params, x, want = _tcn()
    fg, fp, _ = optimize(g, params)
    q = quantize_graph(fg, fp, x)
    assert all(r["int8"] for r in q.layers if r["op"] == "conv1d"), q.layers
    # each block's first conv hands int8 to its second; the residual add reads f32
    assert sum(n.op == "conv1d" and "y_scale" in n.attrs for n in q.graph.nodes) == 3
    want_q = ref.run(q.graph, q.params, x, q.quant)[q.graph.outputs[0]]
    with _engine(tmp_path, q.graph, q.params, q.quant) as eng:
        np.testing.assert_array_equal(eng.run(x), want_q)
    got = _ort(q.graph, q.params, x, q.quant)
    # onnxruntime's QDQ kernels round the same way; allow a quantization step for its order
    np.testing.assert_allclose(got, want_q, rtol=0, atol=0.05 * np.abs(want_q).max())
    assert np.abs(want_q - want).max() < 0.1 * np.abs(want).max()


def test_int8_maxpool1d_passes_int8_between_conv1d(tmp_path):
    rng = np.random.default_rng(2)
    p = {"c1.w": _w(rng, 6, 3, 3), "c1.b": _w(rng, 6), "c2.w": _w(rng, 4, 6, 3), "c2.b": _w(rng, 4)}
    g = _graph([
        Node("c1", "conv1d", ["x", "c1.w", "c1.b"], ["c1:y"], {"padding": [2, 0],
                                                               "activation": "relu"}),
        Node("m", "maxpool1d", ["c1:y"], ["m:y"], {"kernel": 3, "stride": 2, "padding": 1}),
        Node("c2", "conv1d", ["m:y", "c2.w", "c2.b"], ["c2:y"], {"padding": [1, 1]}),
        Node("g", "global_maxpool1d", ["c2:y"], ["g:y"], {})], p)
    x = rng.standard_normal((8, 3, 11)).astype(np.float32)
    q = quantize_graph(g, p, x)
    infos = q.graph.validate()
    assert infos["m:y"].dtype == "i8" and infos["c1:y"].dtype == "i8"
    want = ref.run(q.graph, q.params, x, q.quant)["g:y"]
    with _engine(tmp_path, q.graph, q.params, q.quant) as eng:
        np.testing.assert_array_equal(eng.run(x), want)
    np.testing.assert_allclose(_ort(q.graph, q.params, x, q.quant), want, rtol=0,
                               atol=0.05 * np.abs(want).max())
    fp32 = ref.run(g, p, x)["g:y"]
    assert np.abs(want - fp32).max() < 0.1 * np.abs(fp32).max()
