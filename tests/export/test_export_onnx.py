"""Every ONNX export is checked by onnxruntime against the reference interpreter."""

import numpy as np
import pytest
from export_models import Net, smooth_images, wide_cnn

from pocket.compare import exact_session_options
from pocket.export import transforms as T
from pocket.export.onnx_export import to_onnx
from pocket.export.quantize import quantize_graph
from pocket.formats import quant as Q
from pocket.formats import reference

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


def run_ort(model, x: np.ndarray) -> list[np.ndarray]:
    opts = exact_session_options(ort)
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x})


def _zoo():
    """(id, builder) pairs: each graph exercises a few ops and attribute corners."""
    def conv_geometry(n):
        h = n.conv(n.input, 6, 3, stride=2, padding=1, name="s2")
        h = n.conv(h, 6, 3, padding=2, dilation=2, groups=3, name="dil_groups")
        h = n.conv(h, 4, 1, padding=0, bias=False, name="pointwise")
        return n.conv(h, 5, 2, padding=0, name="k2", out="y")

    def activations(n):
        outs = []
        for act, attrs in [("relu", {}), ("leaky_relu", {"alpha": 0.1}), ("sigmoid", {}),
                           ("tanh", {}), ("gelu", {})]:
            outs.append(n.conv(n.input, 3, name=f"conv_{act}", activation=act, **attrs))
            outs.append(n.linear(n.op("flatten", n.input), 4, name=f"fc_{act}", activation=act,
                                 **attrs))
            outs.append(n.op(act, n.input, name=f"node_{act}", **attrs))
        outs.append(n.op("gelu", n.input, name="gelu_tanh", approximate="tanh"))
        return outs

    def pools(n):
        return [n.op("maxpool2d", n.input, kernel=[3, 3], stride=[2, 2], padding=[1, 1]),
                n.op("maxpool2d", n.input, kernel=[2, 3]),
                n.op("avgpool2d", n.input, kernel=[3, 3], stride=[2, 2], padding=[1, 1],
                     count_include_pad=True),
                n.op("avgpool2d", n.input, kernel=[3, 3], stride=[1, 2], padding=[1, 1],
                     count_include_pad=False),
                n.op("global_avgpool", n.input)]

    def shapes(n):
        f = n.op("flatten", n.input)
        r = n.op("reshape", f, shape=[-1, 6])
        c = n.op("concat", n.input, n.op("relu", n.input), axis=1)
        c2 = n.op("concat", n.input, n.input, axis=-1)
        a = n.op("add", n.input, n.op("global_avgpool", n.input))   # broadcast
        s = n.op("softmax", n.linear(f, 5, name="fc"), axis=-1)
        s1 = n.op("softmax", n.input, axis=1)
        return [r, c, c2, a, s, s1, n.op("dropout", n.input, p=0.5)]

    def batchnorm(n):
        h = n.bn(n.input, name="bn2d", eps=1e-3)
        return [h, n.bn(n.linear(n.op("flatten", h), 7, name="fc"), name="bn1d")]

    return [("conv_geometry", conv_geometry), ("activations", activations), ("pools", pools),
            ("shapes", shapes), ("batchnorm", batchnorm)]


@pytest.mark.parametrize("build", [b for _, b in _zoo()], ids=[i for i, _ in _zoo()])
def test_fp32_ops_match_reference(build):
    n = Net((3, 7, 6), seed=3)
    outs = build(n)
    graph = n.graph(outs if isinstance(outs, list) else [outs])
    x = np.random.default_rng(0).normal(0, 1.5, (5, 3, 7, 6)).astype(np.float32)
    model = to_onnx(graph, n.params)
    assert [o.name for o in model.graph.output] == graph.outputs
    assert {i.name for i in model.graph.initializer} >= set(n.params)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    want = reference.run(graph, n.params, x)
    for name, got in zip(graph.outputs, run_ort(model, x)):
        assert got.shape == want[name].shape
        np.testing.assert_allclose(got, want[name], atol=1e-4, rtol=1e-4, err_msg=name)


def test_metadata_props_are_json():
    import json

    n = Net((4,))
    graph = n.graph([n.linear(n.input, 3, name="fc")], labels=["a", "b", "c"],
                    preprocessing={"layout": "NC", "mean": [0.5], "std": [2.0]})
    props = {p.key: json.loads(p.value) for p in to_onnx(graph, n.params).metadata_props}
    assert props["labels"] == ["a", "b", "c"] and props["task"] == "classification"
    assert props["preprocessing"]["std"] == [2.0]


def test_int8_passthrough_and_qdq_are_exact():
    """quantize -> int8 maxpool (padded) -> flatten -> reshape -> dequantize: no rounding left."""
    n = Net((2, 5, 5))
    q = n.op("quantize", n.input, scale=0.037, zero_point=-7)
    h = n.op("maxpool2d", q, kernel=[3, 3], stride=[2, 2], padding=[1, 1])
    h = n.op("reshape", n.op("flatten", h), shape=[2, -1])
    out = n.op("dequantize", h, scale=0.037, zero_point=-7)
    graph = n.graph([out, h])
    k = np.arange(-200, 200, dtype=np.float32)
    x = np.resize((k + 0.5) * np.float32(0.037), (8, 2, 5, 5)).astype(np.float32)  # ties
    x[0, 0, 0, 0] = 1e6  # saturates
    got = run_ort(to_onnx(graph, {}), x)
    want = reference.run(graph, {}, x)
    np.testing.assert_array_equal(got[1], want[h])
    np.testing.assert_array_equal(got[0], want[out])


@pytest.fixture(scope="module")
def int8_wide():
    graph, params = wide_cnn(seed=7)
    g, p, _ = T.optimize(graph, params)
    rng = np.random.default_rng(7)
    x = smooth_images(rng, 160, (3, 12, 12))
    return g, p, quantize_graph(g, p, x[:96]), x[96:]


def test_int8_qdq_matches_reference(int8_wide):
    g32, p32, qz, x = int8_wide
    assert not qz.layers_fp32
    model = to_onnx(qz.graph, qz.params, qz.quant)
    got = run_ort(model, x)[0]
    want = reference.run(qz.graph, qz.params, x, qz.quant)["logits"]
    fp32 = reference.run(g32, p32, x)["logits"]
    assert np.mean(got.argmax(1) == want.argmax(1)) >= 0.99
    # The two int8 paths differ only in requantization rounding, far below the int8 error.
    spread = np.abs(fp32).max()
    assert np.abs(got - want).max() <= 0.02 * spread
    assert np.abs(want - fp32).max() <= 0.1 * spread


def test_int8_initializers_are_the_int8_tensors(int8_wide):
    _, _, qz, _ = int8_wide
    model = to_onnx(qz.graph, qz.params, qz.quant)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    for name, a in qz.params.items():
        assert inits[name].dtype == a.dtype and np.array_equal(inits[name], a), name
    conv = next(n for n in qz.graph.nodes if n.name == "c2")
    np.testing.assert_array_equal(inits["c2.w_scale"], np.float32(qz.quant[conv.inputs[1]]["scale"]))
    assert conv.inputs[2] not in qz.quant  # the bias scale is derived, not stored
    assert inits["c2.x.scale"] == np.float32(conv.attrs["x_scale"])
    # The bias scale is x_scale * w_scale, as QDQ requires.
    np.testing.assert_allclose(inits["c2.b_scale"], inits["c2.x.scale"] * inits["c2.w_scale"],
                               rtol=1e-6)
    assert inits[conv.inputs[1]].dtype == np.int8 and inits[conv.inputs[2]].dtype == np.int32


def test_int8_weights_follow_quant_module(int8_wide):
    g32, p32, qz, _ = int8_wide
    w_q, scale = Q.quantize_weights(p32["fc1.weight"])
    np.testing.assert_array_equal(qz.params["fc1.weight"], w_q)
    assert qz.quant["fc1.weight"]["scale"] == scale.tolist()
    assert np.abs(w_q).max() == 127
