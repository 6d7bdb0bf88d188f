"""The state-space family's ONNX export (the equivalent convolution, Split+Sigmoid+Mul) run in
onnxruntime against the reference's recurrence."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from pocket.export.onnx_export import to_onnx
from pocket.formats import reference as ref
from pocket.formats.ir import Graph, Node, ValueInfo

sys.path.insert(0, str(Path(__file__).parents[1]))
from ssm_params import ssm_params  # noqa: E402

from pocket.compare import exact_session_options

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


def run_ort(model, x):
    opts = exact_session_options(ort)
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("length,h,s", [(1, 2, 1), (11, 4, 3)])
def test_ssm_glu_onnx_matches_reference(length, h, s, bidirectional):
    rng = np.random.default_rng(length + h)
    p = {f"s.{k}": v for k, v in ssm_params(rng, h, s, bidirectional, np.float32).items()}
    nodes = [Node("s", "ssm", ["x", *p], ["y0"], {"bidirectional": bidirectional}),
             Node("g", "glu", ["y0"], ["y"], {"axis": 2})]
    g = Graph({"x": ValueInfo("f32", ("N", length, h))}, ["y"], nodes,
              {k: ValueInfo("f32", v.shape) for k, v in p.items()}, {})
    model = to_onnx(g, p)  # onnx.checker and strict shape inference inside
    assert [n.op_type for n in model.graph.node] == ["Transpose", "Conv", "Transpose", "Split",
                                                      "Sigmoid", "Mul"]
    x = rng.normal(size=(3, length, h)).astype(np.float32)
    np.testing.assert_allclose(run_ort(model, x), ref.run(g, p, x)["y"], rtol=1e-5, atol=1e-5)
