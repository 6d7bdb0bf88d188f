"""The int8 plan: where quantize nodes go, what stays f32, and calibration options."""

import numpy as np
import pytest
from export_models import residual_cnn, smooth_images

from pocket.compare import exact_session_options
from pocket.export import transforms as T
from pocket.export.onnx_export import to_onnx
from pocket.export.quantize import calibrate, quantize_graph
from pocket.formats import reference


@pytest.fixture(scope="module")
def residual():
    graph, params = residual_cnn(seed=21)
    g, p, _ = T.optimize(graph, params)
    x = smooth_images(np.random.default_rng(21), 192, (1, 8, 8))
    return g, p, quantize_graph(g, p, x[:128]), x[128:]


def test_residual_plan(residual):
    _, _, qz, _ = residual
    nodes = {n.name: n for n in qz.graph.nodes}
    ops = [(n.op, "x_scale" in n.attrs, "y_scale" in n.attrs) for n in qz.graph.nodes]
    assert ops == [
        ("quantize", False, False),        # the input
        ("conv2d", True, False),           # stem: read by b1c1 (int8) and the add (f32) -> f32
        ("quantize", False, False),        # ... and quantized once for b1c1
        ("conv2d", True, True),            # b1c1 -> b1c2, int8 to int8
        ("conv2d", True, False),           # b1c2 -> add
        ("add", False, False), ("relu", False, False), ("maxpool2d", False, False),
        ("quantize", False, False),
        ("conv2d", True, False),           # c3 -> global_avgpool (f32)
        ("global_avgpool", False, False), ("flatten", False, False),
        ("quantize", False, False),
        ("linear", True, True), ("linear", True, False)]
    # An int8 layer reads exactly the qparams its producer wrote.
    assert nodes["b1c2"].attrs["x_scale"] == nodes["b1c1"].attrs["y_scale"]
    assert nodes["b1c2"].attrs["x_zero_point"] == nodes["b1c1"].attrs["y_zero_point"] == -128


def test_residual_int8_through_onnxruntime(residual):
    ort = pytest.importorskip("onnxruntime")
    g32, p32, qz, x = residual
    model = to_onnx(qz.graph, qz.params, qz.quant)
    sess = ort.InferenceSession(model.SerializeToString(), exact_session_options(ort),
                                providers=["CPUExecutionProvider"])
    got = sess.run(None, {"input": x})[0]
    want = reference.run(qz.graph, qz.params, x, qz.quant)["logits"]
    fp32 = reference.run(g32, p32, x)["logits"]
    assert np.mean(got.argmax(1) == want.argmax(1)) >= 0.99
    np.testing.assert_allclose(got, want, atol=1e-3 * np.abs(fp32).max())
    assert np.mean(want.argmax(1) == fp32.argmax(1)) >= 0.9


def test_percentile_calibration_clips_outliers(residual):
    g, p, _, _ = residual
    x = smooth_images(np.random.default_rng(1), 64, (1, 8, 8))
    x[0, 0, 0, 0] = 50.0
    mm = calibrate(g, p, x)
    pc = calibrate(g, p, x, method="percentile", percentile=99.9)
    assert mm["input"][1] == 50.0 and pc["input"][1] < 5.0
    assert pc["input"][0] >= mm["input"][0]
    with pytest.raises(ValueError):
        calibrate(g, p, x, method="kl")
