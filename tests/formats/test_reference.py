"""formats/reference.py against independent math: loops, closed forms, quant.py, onnxruntime."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pocket.compare import exact_session_options
from pocket.formats import quant as qm
from pocket.formats import reference as ref
from pocket.formats.errors import FormatError
from pocket.formats.ir import Graph, Node, ValueInfo

RNG = np.random.default_rng(1234)


def _attrs(op, inputs, outputs, **attrs):
    """Attrs with the schema's defaults filled in, as a validated graph carries them."""
    from pocket.formats.ir import normalize_attrs

    return normalize_attrs(Node("n", op, inputs, outputs, attrs), "test")


def conv_loops(x, w, b, stride, padding, dilation, groups):
    """The textbook definition, seven nested loops, float64."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    ho = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (wd + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, o, ho, wo))
    og = o // groups
    for bi in range(n):
        for oc in range(o):
            g = oc // og
            for y in range(ho):
                for xx in range(wo):
                    s = 0.0 if b is None else float(b[oc])
                    for ci in range(cg):
                        for i in range(kh):
                            for j in range(kw):
                                ih = y * stride[0] - padding[0] + i * dilation[0]
                                iw = xx * stride[1] - padding[1] + j * dilation[1]
                                if 0 <= ih < h and 0 <= iw < wd:
                                    s += float(x[bi, g * cg + ci, ih, iw]) * float(w[oc, ci, i, j])
                    out[bi, oc, y, xx] = s
    return out


CONV_CASES = [  # (N, C, H, W, O, kh, kw, stride, padding, dilation, groups)
    (1, 3, 5, 7, 4, 3, 3, [1, 1], [1, 1], [1, 1], 1),
    (2, 4, 6, 5, 6, 1, 1, [1, 1], [0, 0], [1, 1], 1),
    (2, 4, 7, 8, 4, 2, 3, [2, 1], [1, 0], [1, 2], 2),
    (1, 3, 9, 9, 6, 3, 3, [2, 2], [2, 1], [2, 1], 3),
    (3, 2, 4, 4, 2, 3, 3, [1, 1], [1, 1], [1, 1], 2),
    (2, 6, 7, 5, 6, 3, 3, [2, 1], [3, 2], [1, 1], 6),  # depthwise, padding past the kernel
    (1, 4, 6, 6, 8, 3, 3, [1, 1], [1, 3], [1, 1], 1),  # padding past the kernel's reach
    (2, 4, 5, 6, 8, 5, 1, [1, 2], [2, 0], [1, 1], 4),  # 2 outputs per group
]


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d_matches_loops(case):
    n, c, h, w_, o, kh, kw, s, p, d, g = case
    x = RNG.standard_normal((n, c, h, w_)).astype(np.float32)
    w = RNG.standard_normal((o, c // g, kh, kw)).astype(np.float32)
    b = RNG.standard_normal(o).astype(np.float32)
    a = _attrs("conv2d", ["x", "w", "b"], ["y"], stride=s, padding=p, dilation=d, groups=g)
    got = ref.conv2d(a, x, w, b)
    want = conv_loops(x, w, b, s, p, d, g)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("act", ["relu", "leaky_relu", "sigmoid", "tanh", "gelu"])
def test_conv2d_fused_activation(act):
    x = RNG.standard_normal((2, 2, 4, 4)).astype(np.float32)
    w = RNG.standard_normal((3, 2, 3, 3)).astype(np.float32)
    a = _attrs("conv2d", ["x", "w"], ["y"], padding=[1, 1], activation=act, alpha=0.2)
    z = conv_loops(x, w, None, [1, 1], [1, 1], [1, 1], 1)
    closed = {"relu": np.maximum(z, 0), "leaky_relu": np.where(z > 0, z, 0.2 * z),
              "sigmoid": 1 / (1 + np.exp(-z)), "tanh": np.tanh(z),
              "gelu": z * 0.5 * (1 + np.vectorize(math.erf)(z / math.sqrt(2)))}[act]
    np.testing.assert_allclose(ref.conv2d(a, x, w), closed, rtol=1e-6, atol=1e-6)


def test_linear():
    x = RNG.standard_normal((5, 7)).astype(np.float32)
    w = RNG.standard_normal((3, 7)).astype(np.float32)
    b = RNG.standard_normal(3).astype(np.float32)
    want = np.array([[sum(float(x[i, k]) * float(w[o, k]) for k in range(7)) + b[o]
                      for o in range(3)] for i in range(5)])
    np.testing.assert_allclose(ref.linear(_attrs("linear", ["x", "w", "b"], ["y"]), x, w, b), want,
                               rtol=1e-6, atol=1e-6)


def pool_loops(x, k, s, p, kind, count_include_pad=True):
    n, c, h, w = x.shape
    ho = (h + 2 * p[0] - k[0]) // s[0] + 1
    wo = (w + 2 * p[1] - k[1]) // s[1] + 1
    out = np.zeros((n, c, ho, wo))
    for bi in range(n):
        for ch in range(c):
            for y in range(ho):
                for xx in range(wo):
                    vals = [float(x[bi, ch, y * s[0] - p[0] + i, xx * s[1] - p[1] + j])
                            for i in range(k[0]) for j in range(k[1])
                            if 0 <= y * s[0] - p[0] + i < h and 0 <= xx * s[1] - p[1] + j < w]
                    if kind == "max":
                        out[bi, ch, y, xx] = max(vals)
                    else:
                        out[bi, ch, y, xx] = sum(vals) / (k[0] * k[1] if count_include_pad
                                                          else len(vals))
    return out


POOL_CASES = [([2, 2], None, [0, 0]), ([3, 3], [2, 2], [1, 1]), ([3, 2], [1, 2], [1, 0]),
              ([2, 2], [1, 1], [1, 1])]


@pytest.mark.parametrize("k,s,p", POOL_CASES)
def test_maxpool_matches_loops(k, s, p):
    x = RNG.standard_normal((2, 3, 7, 6)).astype(np.float32)
    a = _attrs("maxpool2d", ["x"], ["y"], kernel=k, stride=s, padding=p)
    np.testing.assert_array_equal(ref.maxpool2d(a, x), pool_loops(x, k, s or k, p, "max"))
    xq = RNG.integers(-128, 128, (2, 3, 7, 6)).astype(np.int8)
    got = ref.maxpool2d(a, xq)
    assert got.dtype == np.int8
    np.testing.assert_array_equal(got, pool_loops(xq, k, s or k, p, "max"))


@pytest.mark.parametrize("k,s,p", POOL_CASES)
@pytest.mark.parametrize("cip", [True, False])
def test_avgpool_matches_loops(k, s, p, cip):
    x = RNG.standard_normal((2, 3, 7, 6)).astype(np.float32)
    a = _attrs("avgpool2d", ["x"], ["y"], kernel=k, stride=s, padding=p, count_include_pad=cip)
    np.testing.assert_allclose(ref.avgpool2d(a, x), pool_loops(x, k, s or k, p, "avg", cip),
                               rtol=1e-6, atol=1e-7)


def test_global_avgpool_and_batchnorm():
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    # (the sums in float64: a float32 sum's own rounding reached 3e-6 of a mean near zero)
    np.testing.assert_allclose(ref.global_avgpool({}, x)[:, :, 0, 0],
                               [[x[i, c].astype(np.float64).sum() / 20 for c in range(3)]
                                for i in range(2)], rtol=1e-6)
    g, b, m, v = (RNG.random(3).astype(np.float32) + 0.5 for _ in range(4))
    y = ref.batchnorm({"eps": 1e-3}, x, g, b, m, v)
    for c in range(3):
        np.testing.assert_allclose(y[:, c], (x[:, c] - m[c]) / math.sqrt(v[c] + 1e-3) * g[c] + b[c],
                                   rtol=1e-5, atol=1e-6)


def test_closed_forms():
    x = np.array([-3.0, -1.0, 0.0, 0.5, 1.0, 2.0], np.float32)
    # gelu(x) = x * Phi(x); Phi(1) = 0.8413447460685429, Phi(-1) = 0.15865525393145707
    g = ref.gelu({"approximate": "none"}, x)
    np.testing.assert_allclose(g[[1, 2, 4]], [-0.15865525393145707, 0.0, 0.8413447460685429],
                               rtol=1e-6)
    t = ref.gelu({"approximate": "tanh"}, x)
    np.testing.assert_allclose(t, [0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi)
                                                            * (v + 0.044715 * v**3))) for v in x],
                               rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(ref.sigmoid({}, x), [1 / (1 + math.exp(-v)) for v in x], rtol=1e-6)
    np.testing.assert_allclose(ref.leaky_relu({"alpha": 0.1}, x), [v if v > 0 else 0.1 * v for v in x],
                               rtol=1e-6)
    big = np.array([[1000.0, 1001.0, 1002.0], [0.0, 0.0, math.log(2.0)]], np.float32)
    e = np.exp([0.0, 1.0, 2.0])
    np.testing.assert_allclose(ref.softmax({"axis": 1}, big), [e / e.sum(), [0.25, 0.25, 0.5]],
                               rtol=1e-6)
    np.testing.assert_allclose(ref.softmax({"axis": 0}, big).sum(axis=0), 1.0, rtol=1e-6)


# --------------------------------------------------------------------------- int8


def _int8_conv_case(relu, out_int8, padding=(1, 1), groups=1):
    x = RNG.standard_normal((2, 4, 5, 6)).astype(np.float32)
    w = RNG.standard_normal((6, 4 // groups, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(6).astype(np.float32)
    xs, xzp = qm.choose_activation_qparams(x.min(), x.max())
    x_q = qm.quantize(x, xs, xzp)
    w_q, w_s = qm.quantize_weights(w)
    b_q = qm.quantize_bias(b, xs, w_s)
    attrs = {"padding": list(padding), "groups": groups, "activation": "relu" if relu else "none",
             "x_scale": xs, "x_zero_point": xzp}
    if out_int8:
        attrs.update(y_scale=0.05, y_zero_point=-7)
    a = _attrs("conv2d", ["x", "w", "b"], ["y"], **attrs)
    return a, x_q, w_q, b_q, w_s, xs, xzp


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("out_int8", [False, True])
@pytest.mark.parametrize("groups", [1, 2])
def test_int8_conv_follows_quant(relu, out_int8, groups):
    a, x_q, w_q, b_q, w_s, xs, xzp = _int8_conv_case(relu, out_int8, groups=groups)
    got = ref.conv2d(a, x_q, w_q, b_q, w_scale=w_s)
    # padded x_q equals x_zp: pad, then the loop sum with zero padding is the same sum.
    acc = conv_loops(x_q.astype(np.float64) - xzp, w_q.astype(np.float64), None, [1, 1], [1, 1],
                     [1, 1], groups).astype(np.int64) + b_q.reshape(1, -1, 1, 1)
    if out_int8:
        m = np.float64(xs) * w_s.astype(np.float64) / np.float64(0.05)
        v = acc.astype(np.float32) * m.astype(np.float32).reshape(1, -1, 1, 1)  # in float32
        want = np.clip(np.rint(v) - 7, -7 if relu else -128, 127)
        assert got.dtype == np.int8
        np.testing.assert_array_equal(got, want.astype(np.int8))
    else:
        want = (acc * (np.float64(xs) * w_s.astype(np.float64)).reshape(1, -1, 1, 1)).astype(np.float32)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, np.maximum(want, 0) if relu else want)


def test_int8_conv_close_to_float():
    """dequantize -> float conv -> quantize stays within a step or two of the int8 op."""
    a, x_q, w_q, b_q, w_s, xs, xzp = _int8_conv_case(False, True)
    fa = _attrs("conv2d", ["x", "w", "b"], ["y"], padding=[1, 1])
    yf = ref.conv2d(fa, qm.dequantize(x_q, xs, xzp), qm.dequantize_weights(w_q, w_s),
                    (b_q * (xs * w_s.astype(np.float64))).astype(np.float32))
    y8 = ref.conv2d(a, x_q, w_q, b_q, w_scale=w_s)
    err = np.abs(y8.astype(np.int32) - qm.quantize(yf, 0.05, -7).astype(np.int32))
    assert err.max() <= 1


def test_int8_linear_and_qdq():
    x = RNG.standard_normal((3, 10)).astype(np.float32)
    w = RNG.standard_normal((4, 10)).astype(np.float32)
    xs, xzp = qm.choose_activation_qparams(x.min(), x.max())
    x_q = qm.quantize(x, xs, xzp)
    w_q, w_s = qm.quantize_weights(w)
    a = _attrs("linear", ["x", "w"], ["y"], x_scale=xs, x_zero_point=xzp)
    got = ref.linear(a, x_q, w_q, w_scale=w_s)
    acc = np.array([[sum((int(x_q[i, k]) - xzp) * int(w_q[o, k]) for k in range(10))
                     for o in range(4)] for i in range(3)])
    np.testing.assert_array_equal(got, (acc * (np.float64(xs) * w_s.astype(np.float64))).astype(np.float32))
    np.testing.assert_allclose(got, x @ w.T, atol=0.1)
    np.testing.assert_array_equal(ref.quantize({"scale": xs, "zero_point": xzp}, x), x_q)
    back = ref.dequantize({"scale": xs, "zero_point": xzp}, x_q)
    assert np.abs(back - x).max() <= xs / 2 + 1e-6


@pytest.mark.parametrize("lead", [(1, 1), (3, 7), (2, 3, 2)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("act,out_int8", [("none", False), ("relu", False), ("none", True),
                                          ("relu", True), ("clip", True)])
def test_int8_linear_over_leading_dims(lead, bias, act, out_int8):
    """x (N, ..., K) int8: every row of the leading dims is the 2-D int8 linear, by loops."""
    k, o = 5, 6
    x_q = RNG.integers(-128, 128, (*lead, k)).astype(np.int8)
    w_q = RNG.integers(-127, 128, (o, k)).astype(np.int8)
    b_q = RNG.integers(-2000, 2001, o).astype(np.int32) if bias else None
    w_s = (0.01 * (0.5 + RNG.random(o))).astype(np.float32)
    xs, xzp, ys, yzp = 0.03, 9, 0.2, -5
    extra = {"y_scale": ys, "y_zero_point": yzp} if out_int8 else {}
    a = _attrs("linear", ["x", "w"], ["y"], x_scale=xs, x_zero_point=xzp, activation=act,
               **({"max": 4.0} if act == "clip" else {}), **extra)
    got = ref.linear(a, x_q, w_q, b_q, w_scale=w_s)
    assert got.shape == (*lead, o) and got.dtype == (np.int8 if out_int8 else np.float32)
    m = np.float64(xs) * w_s.astype(np.float64) / (np.float64(ys) if out_int8 else 1.0)
    for idx in np.ndindex(*lead):
        for j in range(o):
            acc = sum((int(x_q[idx][i]) - xzp) * int(w_q[j, i]) for i in range(k))
            acc += int(b_q[j]) if bias else 0
            if out_int8:
                q = int(np.rint(np.float32(acc) * np.float32(m[j]))) + yzp  # in float32
                hi = int(np.rint(4.0 / ys)) + yzp if act == "clip" else 127
                want = min(max(q, yzp if act != "none" else -128), hi)
            else:
                want = np.float32(acc * m[j])
                want = max(want, np.float32(0)) if act == "relu" else want
            assert got[idx][j] == want, (idx, j, got[idx][j], want)


@pytest.mark.parametrize("op", ["conv2d", "linear"])
def test_int8_sums_exact_past_float32s_integers(op):
    """Long dot products of the largest int8 terms (x - x_zp = 255, w near 127): the sums pass
    2**24, where float32 stops holding every integer, and the op must still give int64's. The
    bias takes each channel's sum back to a small known number, so the float32 output shows
    an error of one in the sum."""
    xzp, k = -128, 1600
    w_q = RNG.integers(100, 128, (3, k)).astype(np.int8)
    w_q[1] *= -1
    dot = 255 * w_q.astype(np.int64).sum(axis=1)
    assert np.abs(dot).min() > 2**25 and (dot % 2).any()  # partial sums past float32's integers
    offset = np.array([3, -5, 7])
    b_q = (offset - dot).astype(np.int32)
    if op == "conv2d":
        x_q, w_q = np.full((2, 64, 6, 7), 127, np.int8), w_q.reshape(3, 64, 5, 5)
        want = np.broadcast_to(offset.reshape(1, 3, 1, 1), (2, 3, 2, 3))
    else:
        x_q, want = np.full((4, k), 127, np.int8), np.broadcast_to(offset, (4, 3))
    a = _attrs(op, ["x", "w", "b"], ["y"], x_scale=1.0, x_zero_point=xzp)
    got = getattr(ref, op)(a, x_q, w_q, b_q, w_scale=np.ones(3, np.float32))
    np.testing.assert_array_equal(got, want.astype(np.float32))


def test_int8_needs_weight_scale():
    a, x_q, w_q, b_q, *_ = _int8_conv_case(False, True)
    with pytest.raises(FormatError, match="scales"):
        ref.conv2d(a, x_q, w_q, b_q)


# --------------------------------------------------------------------------- the interpreter


def test_run_graph_with_shape_ops():
    x = RNG.standard_normal((2, 3, 4, 4)).astype(np.float32)
    params = {"w": RNG.standard_normal((5, 24)).astype(np.float32)}
    g = Graph({"x": ValueInfo("f32", ("N", 3, 4, 4))}, ["p"], [
        Node("a", "maxpool2d", ["x"], ["m"], {"kernel": [2, 2]}),
        Node("b", "dropout", ["m"], ["d"]),
        Node("c", "concat", ["m", "d"], ["cat"], {"axis": 1}),
        Node("r", "reshape", ["cat"], ["r"], {"shape": [6, -1]}),
        Node("f", "flatten", ["r"], ["f"]),
        Node("s", "add", ["f", "f"], ["s"]),
        Node("l", "linear", ["s", "w"], ["l"]),
        Node("p", "softmax", ["l"], ["p"], {"axis": 1}),
    ], {"w": ValueInfo("f32", (5, 24))})
    out = ref.run(g, params, x)["p"]
    m = x.reshape(2, 3, 2, 2, 2, 2).max(axis=(3, 5))
    z = 2 * np.concatenate([m, m], axis=1).reshape(2, -1).astype(np.float64) @ params["w"].T
    e = np.exp(z - z.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out, e / e.sum(axis=1, keepdims=True), rtol=1e-5)
    with pytest.raises(FormatError, match="must be f32"):
        ref.run(g, params, x.astype(np.float64))


# --------------------------------------------------------------------------- onnxruntime


def _ort(node, x, inits=()):
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [node], "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    sess = ort.InferenceSession(model.SerializeToString(), exact_session_options(ort),
                                providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d_vs_onnxruntime(case):
    from onnx import helper

    n, c, h, w_, o, kh, kw, s, p, d, g = case
    x = RNG.standard_normal((n, c, h, w_)).astype(np.float32)
    w = RNG.standard_normal((o, c // g, kh, kw)).astype(np.float32)
    b = RNG.standard_normal(o).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], strides=s, pads=[p[0], p[1], p[0], p[1]],
                            dilations=d, group=g)
    a = _attrs("conv2d", ["x", "w", "b"], ["y"], stride=s, padding=p, dilation=d, groups=g)
    np.testing.assert_allclose(ref.conv2d(a, x, w, b), _ort(node, x, [("w", w), ("b", b)]),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("k,s,p", POOL_CASES)
def test_pools_vs_onnxruntime(k, s, p):
    from onnx import helper

    x = RNG.standard_normal((2, 3, 7, 6)).astype(np.float32)
    pads = [p[0], p[1], p[0], p[1]]
    mp = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=k, strides=s or k, pads=pads)
    a = _attrs("maxpool2d", ["x"], ["y"], kernel=k, stride=s, padding=p)
    np.testing.assert_array_equal(ref.maxpool2d(a, x), _ort(mp, x))
    for cip in (0, 1):
        ap = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=k, strides=s or k, pads=pads,
                              count_include_pad=cip)
        a = _attrs("avgpool2d", ["x"], ["y"], kernel=k, stride=s, padding=p,
                   count_include_pad=bool(cip))
        np.testing.assert_allclose(ref.avgpool2d(a, x), _ort(ap, x), rtol=1e-5, atol=1e-6)


def test_gemm_and_softmax_vs_onnxruntime():
    from onnx import helper

    x = RNG.standard_normal((4, 9)).astype(np.float32)
    w = RNG.standard_normal((5, 9)).astype(np.float32)
    b = RNG.standard_normal(5).astype(np.float32)
    gemm = helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)
    np.testing.assert_allclose(ref.linear(_attrs("linear", ["x", "w", "b"], ["y"]), x, w, b),
                               _ort(gemm, x, [("w", w), ("b", b)]), rtol=1e-5, atol=1e-5)
    sm = helper.make_node("Softmax", ["x"], ["y"], axis=0)
    np.testing.assert_allclose(ref.softmax({"axis": 0}, x), _ort(sm, x), rtol=1e-5, atol=1e-7)
