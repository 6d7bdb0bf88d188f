"""The spiking ops' ONNX export (an unrolled graph) run in onnxruntime against the reference:
onnx.checker and strict shape inference pass, and the spikes are the reference's."""

from __future__ import annotations

import numpy as np
import pytest

from pocket.compare import exact_session_options
from pocket.formats import reference as ref
from tests.formats import spiking_graphs as sg

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


def _run(model, x):
    opts = exact_session_options(ort)
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


# fixed seeds: hash(kind) changes with each process's PYTHONHASHSEED
SEEDS = {"conv": 10, "rate": 11, "latency": 12}


@pytest.mark.parametrize("int8", [False, True], ids=["fp32", "int8"])
@pytest.mark.parametrize("kind", ["conv", "rate", "latency"])
def test_onnxruntime_matches_the_reference(kind, int8):
    from pocket.export.onnx_export import to_onnx

    rng = np.random.default_rng(SEEDS[kind])
    g, p, shape = sg.build(kind, rng)
    quant = None
    if int8:
        g, p, quant = sg.int8_weights(g, p)
    model = to_onnx(g, p, quant)  # checker (full) and strict shape inference inside
    x = sg.inputs(shape, 5, rng)
    want = ref.run(g, p, x, quant)[g.outputs[0]]
    got = _run(model, x)
    assert got.shape == want.shape
    if g.nodes[-1].attrs["output"] == "membrane":
        # NOTE: the spikes before the readout agree exactly; the float32 running sum of u and
        # onnxruntime's float32 GEMM round differently from the float64 reference sums
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_array_equal(got, want)
    types = {n.op_type for n in model.graph.node}
    assert ("DequantizeLinear" in types) == int8


def test_a_spiking_output_is_the_concatenated_steps():
    from pocket.export.onnx_export import to_onnx
    from pocket.formats.ir import Graph, Node, ValueInfo

    g = Graph({"x": ValueInfo("f32", ("N", 3))}, ["s"],
              [Node("e", "spike_encode", ["x"], ["e"], {"T": 4}),
               Node("l", "lif", ["e"], ["s"], {"decay": 0.5, "threshold": 0.6})], {}, {})
    x = np.array([[0.2, 0.5, 1.3]], np.float32)
    got = _run(to_onnx(g, {}), x)
    # constant input 0.2 never reaches 0.6 (0.2, 0.3, 0.35, ...); 0.5 fires at step 1
    # (0.5, 0.75 -> 0.15, 0.575, 0.7875 -> 0.1875); 1.3 fires every step
    np.testing.assert_array_equal(got[0], [[0, 0, 1], [0, 1, 1], [0, 0, 1], [0, 1, 1]])
    np.testing.assert_array_equal(got, ref.run(g, {}, x)["s"])
