"""The embedding family's ONNX export (ReduceL2, Max, Div) run in onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from pocket.compare import exact_session_options
from pocket.export.onnx_export import to_onnx
from pocket.formats import reference as ref
from pocket.formats.ir import Graph, Node, ValueInfo

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("axis,shape", [(-1, (6,)), (1, (3, 4))])
def test_l2norm_onnx_matches_reference(axis, shape):
    rng = np.random.default_rng(7)
    w = rng.normal(size=(shape[-1], shape[-1])).astype(np.float32)
    nodes = [Node("fc", "linear", ["x", "w"], ["h"], {}),
             Node("norm", "l2norm", ["h"], ["y"], {"axis": axis, "eps": 1e-12})]
    g = Graph({"x": ValueInfo("f32", ("N", *shape))}, ["y"], nodes,
              {"w": ValueInfo("f32", w.shape)}, {})
    model = to_onnx(g, {"w": w})  # onnx.checker and strict shape inference inside
    assert [n.op_type for n in model.graph.node][-3:] == ["ReduceL2", "Max", "Div"]
    x = rng.normal(size=(4, *shape)).astype(np.float32)
    x[2] = 0.0  # a zero row: zeros, where LpNormalization would give NaN
    opts = exact_session_options(ort)
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    got = sess.run(None, {"x": x})[0]
    want = ref.run(g, {"w": w}, x)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert np.all(got[2] == 0)
    np.testing.assert_allclose(np.linalg.norm(got[[0, 1, 3]], axis=axis), 1.0, rtol=1e-5)
