"""ONNX export (opset 17) of the sequence ops, checked by onnx.checker inside to_onnx and run in
onnxruntime against the reference: layernorm, embedding, matmul, transpose, attention (causal
too), a linear over (N, L, in) with a fused activation, an add of a param."""

import numpy as np
import pytest

from pocket.compare import exact_session_options
from pocket.formats import reference
from pocket.formats.ir import Graph, Node, ValueInfo

ort = pytest.importorskip("onnxruntime")


@pytest.fixture
def rng():
    return np.random.default_rng(24)


def _run_both(g, params, x):
    from pocket.export.onnx_export import to_onnx

    model = to_onnx(g, params)  # onnx.checker + strict shape inference inside
    types = {n.op_type for n in model.graph.node}
    s = ort.InferenceSession(model.SerializeToString(), exact_session_options(ort),
                             providers=["CPUExecutionProvider"])
    got = s.run(None, {next(iter(g.inputs)): x})[0]
    return got, reference.run(g, params, x)[g.outputs[0]], types


def _p(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _graph(inputs, nodes, params, out):
    g = Graph(inputs, [out], nodes, {k: ValueInfo("f32", v.shape) for k, v in params.items()})
    g.validate()
    return g


@pytest.mark.parametrize("causal", [False, True])
def test_attention_block(rng, causal):
    p = {"w": _p(rng, 6, 5), "b": _p(rng, 6), "ln_w": _p(rng, 3), "ln_b": _p(rng, 3),
         "pe": _p(rng, 4, 6), "m": _p(rng, 3, 2)}
    nodes = [Node("fc", "linear", ["x", "w", "b"], ["h"], {"activation": "gelu"}),
             Node("pe", "add", ["h", "pe"], ["h1"], {}),
             Node("split", "reshape", ["h1"], ["h2"], {"shape": [4, 2, 3]}),
             Node("heads", "transpose", ["h2"], ["q"], {"perm": [0, 2, 1, 3]}),
             Node("att", "attention", ["q", "q", "q"], ["a"], {"causal": causal, "scale": 0.4}),
             Node("ln", "layernorm", ["a", "ln_w", "ln_b"], ["l"], {"eps": 1e-5}),
             Node("mm", "matmul", ["l", "m"], ["y"], {})]
    g = _graph({"x": ValueInfo("f32", ("N", 4, 5))}, nodes, p, "y")
    got, want, types = _run_both(g, p, _p(rng, 3, 4, 5))
    assert {"LayerNormalization", "Softmax", "MatMul", "Transpose"} <= types
    assert "Gemm" not in types  # a Gemm is 2-D only
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_embedding_is_gather(rng):
    p = {"emb": _p(rng, 9, 4)}
    g = _graph({"ids": ValueInfo("i64", ("N", 5))},
               [Node("emb", "embedding", ["ids", "emb"], ["y"], {})], p, "y")
    ids = rng.integers(0, 9, (2, 5))
    got, want, types = _run_both(g, p, ids)
    assert types == {"Gather"}
    np.testing.assert_array_equal(got, want)
