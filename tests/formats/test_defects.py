"""Regression set for format defects found by fuzzing (issue 21): inputs without a batch axis or
with a size-0 dimension, int8 scales that are finite in JSON but not as float32, and NaN
through relu."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from test_corruption import edit_entry, emit, expect, good, load, split  # noqa: F401 - fixtures

from pocket.compare import exact_session_options
from pocket.formats import FormatError, Graph
from pocket.formats import reference as ref
from pocket.formats.container import write_container


def _graph(input_shape, *, nodes=None, params=None) -> dict:
    return {
        "inputs": [{"name": "x", "dtype": "f32", "shape": input_shape}],
        "outputs": ["y"],
        "params": params or {},
        "nodes": nodes or [{"name": "r", "op": "relu", "inputs": ["x"], "outputs": ["y"]}],
    }


# --------------------------------------------------------------------------- input shapes


@pytest.mark.parametrize("shape, match", [
    ([], r"graph.inputs\['x'\].shape: an input needs a batch axis"),
    ([0, 4], r"graph.inputs\['x'\].shape: every size must be at least 1, got \[0, 4\]"),
    (["N", 0], r"graph.inputs\['x'\].shape: every size must be at least 1"),
    (["N", 3, 0, 5], r"graph.inputs\['x'\].shape: every size must be at least 1"),
])
def test_bad_input_shapes_fail_validation(shape, match):
    with pytest.raises(FormatError, match=match):
        Graph.from_dict(_graph(shape))
    # The same through the other entry points: a graph built in Python, then validated.
    g = Graph.from_dict(_graph(["N", 4]))
    g.inputs["x"].shape = tuple(shape)
    with pytest.raises(FormatError, match=match):
        g.validate()


def test_reshape_and_flatten_of_a_0d_input_are_format_errors():
    for node in ({"name": "f", "op": "flatten", "inputs": ["x"], "outputs": ["y"]},
                 {"name": "s", "op": "reshape", "inputs": ["x"], "outputs": ["y"],
                  "attrs": {"shape": [-1]}}):
        with pytest.raises(FormatError, match="batch axis"):
            Graph.from_dict(_graph([], nodes=[node]))


def _with_input_shape(raw: bytes, shape) -> bytes:
    h, sec, data = split(raw)
    sec = copy.deepcopy(sec)
    sec["graph"]["inputs"][0]["shape"] = shape
    return emit(h, sec, data)


@pytest.mark.parametrize("shape", [[0, 4], ["N", 0], []])
def test_engine_refuses_such_a_container_cleanly(good, load, shape):  # noqa: F811
    """Was `ValueError: range() arg 3 must not be zero` (batch 0) or IndexError (0-d)."""
    from pocket.infer import Engine

    load.path.write_bytes(_with_input_shape(good, shape))
    with pytest.raises(FormatError, match=r"graph.inputs\['x'\].shape"):
        Engine(load.path)
    assert load(_with_input_shape(good, [1, 4])) == "ok"  # the surgery itself is sound


# --------------------------------------------------------------------------- int8 scales

BAD_SCALES = [(1e39, "overflows float32 to inf"), (1e-46, "underflows float32 to 0"),
              (1e-40, "a float32 subnormal"), (3.5e38, "past float32's largest")]


def _qdq(scale, zp=0) -> dict:
    return _graph(["N", 4], nodes=[
        {"name": "q", "op": "quantize", "inputs": ["x"], "outputs": ["y"],
         "attrs": {"scale": scale, "zero_point": zp}}])


def _int8_linear(**attrs) -> dict:
    base = {"x_scale": 0.1, "x_zero_point": 0, "y_scale": 0.2, "y_zero_point": 0}
    return {
        "inputs": [{"name": "x", "dtype": "i8", "shape": ["N", 4]}], "outputs": ["y"],
        "params": {"w": {"dtype": "i8", "shape": [3, 4]}},
        "nodes": [{"name": "fc", "op": "linear", "inputs": ["x", "w"], "outputs": ["y"],
                   "attrs": {**base, **attrs}}],
    }


@pytest.mark.parametrize("value, why", BAD_SCALES)
def test_node_scales_must_be_float32(value, why):
    with pytest.raises(FormatError, match="attribute 'scale' must be a positive finite float32"):
        Graph.from_dict(_qdq(value))
    for attr in ("x_scale", "y_scale"):
        with pytest.raises(FormatError, match=f"node 'fc' \\(linear\\): attribute '{attr}' must be"):
            Graph.from_dict(_int8_linear(**{attr: value}))
    # The smallest normal and the largest float32 are fine.
    Graph.from_dict(_qdq(float(np.finfo(np.float32).tiny)))
    Graph.from_dict(_int8_linear(y_scale=float(np.finfo(np.float32).max)))


@pytest.mark.parametrize("value, why", BAD_SCALES)
def test_weight_scales_must_be_float32(good, load, value, why):  # noqa: F811
    quant = {"scale": [0.1, value], "zero_point": [0, 0], "axis": 0}
    expect(load, edit_entry(good, "q", quant=quant), r"tensors\[\d\].quant.scale\[1\]: must be a "
                                                     "positive finite float32")


@pytest.mark.parametrize("value, why", BAD_SCALES)
def test_writer_refuses_them_too(tmp_path, value, why):
    with pytest.raises(FormatError, match=r"scale\[0\]: must be a positive finite float32"):
        write_container(tmp_path / "m.bin", kind="model",
                        tensors={"q": np.zeros((1, 3), np.int8)},
                        quant={"q": {"scale": [value], "zero_point": [0], "axis": 0}})
    assert not list(tmp_path.iterdir())


# --------------------------------------------------------------------------- NaN through relu


def test_nan_through_relu_stays_nan():
    """The meaning written in formats/reference.py: NaN in, NaN out, standalone or fused."""
    x = np.array([[np.nan, -1.0, 2.0, -0.0]], np.float32)
    got = ref.relu({}, x)
    assert np.isnan(got[0, 0]) and list(got[0, 1:]) == [0.0, 2.0, 0.0]
    # Fused: a NaN in a row reaches every output of that row (NaN * 0 is NaN), and relu keeps
    # it; the other row is untouched.
    w = np.eye(4, dtype=np.float32)
    rows = np.concatenate([x, np.array([[1.0, -1.0, 2.0, -3.0]], np.float32)])
    y = ref.linear({"activation": "relu"}, rows, w)
    assert np.isnan(y[0]).all() and list(y[1]) == [1.0, 0.0, 2.0, 0.0]
    xc = np.zeros((1, 1, 3, 3), np.float32)
    xc[0, 0, 1, 1] = np.nan
    yc = ref.conv2d({"activation": "relu", "padding": [0, 0]}, xc, np.ones((2, 1, 2, 2),
                                                                      np.float32))
    assert np.isnan(yc).all()  # every 2x2 window sees the centre
    yc = ref.conv2d({"activation": "relu", "padding": [1, 1], "stride": [2, 2]}, xc,
                    np.ones((1, 1, 1, 1), np.float32))
    assert np.isnan(yc[0, 0, 1, 1]) and np.isnan(yc).sum() == 1


def test_nan_through_the_engines_activation_kernel():
    from pocket.infer import kernels_fp32 as kf

    x = np.array([np.nan, -1.0, 3.0, -4.0], np.float32)
    for act in ("relu", "leaky_relu", "hardswish", "hardsigmoid", "sigmoid", "tanh", "gelu"):
        out = np.empty_like(x)
        kf.unary(out, x, kf.ACT[act], 0.1)
        want = ref.__dict__[act]({"alpha": 0.1}, x)
        np.testing.assert_allclose(out[1:], want[1:], rtol=1e-6, err_msg=act)
        assert np.isnan(out[0]) and np.isnan(want[0]), act


def test_nan_through_relu_in_onnxruntime():
    """NaN propagation is also what onnxruntime does with the exported Relu."""
    pytest.importorskip("onnxruntime")
    import onnxruntime as ort

    from pocket.export.onnx_export import to_onnx

    g = Graph.from_dict(_graph(["N", 4]))
    sess = ort.InferenceSession(to_onnx(g, {}).SerializeToString(), exact_session_options(ort),
                                providers=["CPUExecutionProvider"])
    x = np.array([[np.nan, -1.0, 2.0, -3.0]], np.float32)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_array_equal(y, ref.run(g, {}, x)["y"])
