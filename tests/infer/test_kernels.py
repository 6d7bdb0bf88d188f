"""Every engine kernel against its naive twin in formats/reference.py, on odd shapes.

Each case is a one- or two-node graph run by the Engine (so the kernel is exercised with the
views and scratch the plan gives it) and by the reference interpreter. fp32: rtol 1e-5 with an
atol scaled to the magnitude of the terms summed; int8: equal bit for bit.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from models import FakeContainer, naive_im2col

from pocket.formats import quant as qm
from pocket.formats import reference as ref
from pocket.formats.ir import Graph, Node, ValueInfo
from pocket.infer import kernels_fma as kfma
from pocket.infer import kernels_fp32 as kf
from pocket.infer import kernels_tile
from pocket.infer.engine import Engine

RNG = np.random.default_rng(7)


def _info(a):
    return ValueInfo({np.float32: "f32", np.int8: "i8", np.int32: "i32"}[a.dtype.type], a.shape)


def run_both(x, nodes, params, quant=None, outputs=None, max_batch=8):
    g = Graph({"x": ValueInfo("f32" if x.dtype == np.float32 else "i8", ("N", *x.shape[1:]))},
              outputs or [nodes[-1].outputs[0]], nodes, {k: _info(v) for k, v in params.items()})
    want = ref.run(g, params, x, quant)[g.outputs[0]]
    with Engine(FakeContainer(g, params, quant), max_batch=max_batch) as eng:
        got = eng.run(x, copy=True)
    assert got.dtype == want.dtype and got.shape == want.shape
    return got, want


def assert_close(got, want, scale=1.0):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * scale)


CONV_CASES = {  # (C, H, W, O, kh, kw, stride, padding, dilation, groups)
    "3x3-pad": (3, 7, 9, 5, 3, 3, [1, 1], [1, 1], [1, 1], 1),
    "1x1": (6, 5, 4, 7, 1, 1, [1, 1], [0, 0], [1, 1], 1),
    "1x1-stride2": (4, 7, 6, 3, 1, 1, [2, 2], [0, 0], [1, 1], 1),
    "nonsquare-stride": (2, 9, 8, 4, 3, 2, [2, 1], [1, 0], [1, 1], 1),
    "dilation": (3, 9, 10, 4, 3, 3, [1, 2], [2, 1], [2, 2], 1),
    "groups2": (4, 6, 7, 6, 3, 3, [1, 1], [1, 1], [1, 1], 2),
    "depthwise": (5, 8, 6, 5, 3, 3, [2, 2], [1, 1], [1, 1], 5),
    "depthwise-x2": (3, 6, 6, 6, 3, 2, [1, 1], [1, 0], [2, 1], 3),
    "5x5-stride2": (3, 11, 12, 8, 5, 5, [2, 2], [2, 2], [1, 1], 1),
}
ACTS = ["none", "relu", "leaky_relu", "sigmoid", "tanh", "gelu"]


def _conv_params(c, o, kh, kw, g, bias=True):
    p = {"w": RNG.standard_normal((o, c // g, kh, kw)).astype(np.float32)}
    if bias:
        p["b"] = RNG.standard_normal(o).astype(np.float32)
    return p


@pytest.mark.parametrize("name", CONV_CASES)
@pytest.mark.parametrize("n", [1, 7])
def test_conv2d_fp32(name, n, fp32_route):
    c, h, w, o, kh, kw, s, p, d, g = CONV_CASES[name]
    params = _conv_params(c, o, kh, kw, g, bias=n == 7)
    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    node = Node("conv", "conv2d", ["x", *params], ["y"],
                {"stride": s, "padding": p, "dilation": d, "groups": g, "activation": "relu"})
    got, want = run_both(x, [node], params)
    assert_close(got, want, scale=c * kh * kw)


@pytest.mark.parametrize("act", ACTS)
def test_conv2d_fp32_activations(act, fp32_route):
    params = _conv_params(3, 4, 3, 3, 1)
    x = RNG.standard_normal((2, 3, 5, 6)).astype(np.float32)
    node = Node("conv", "conv2d", ["x", "w", "b"], ["y"],
                {"padding": [1, 1], "activation": act, "alpha": 0.3})
    got, want = run_both(x, [node], params)
    assert_close(got, want, scale=27)


@pytest.mark.parametrize("act", ["none", "relu", "clip", "sigmoid", "silu", "hardswish", "gelu"])
@pytest.mark.parametrize("hw", [(1, 1), (5, 4)])
@pytest.mark.parametrize("n", [1, 3, 20])
def test_conv2d_1x1_fp32_activations(act, hw, n, fp32_route):
    """1x1 convs (AVX-512: conv_fma_1x1) with each activation fused: in the GEMM's registers
    (ReLU, relu6, sigmoid, SiLU), in a pass after (the others); on a 1x1 map at a small batch
    as dot products (gemv); without a bias at an odd batch."""
    params = _conv_params(6, 9, 1, 1, 1, bias=n != 3)
    x = (2 * RNG.standard_normal((n, 6, *hw))).astype(np.float32)
    node = Node("conv", "conv2d", ["x", *params], ["y"], {"activation": act, "max": 6.0})
    got, want = run_both(x, [node], params, max_batch=20)
    assert_close(got, want, scale=6)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("n", [1, 7, 17, 40])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_fp32(act, n, bias, fp32_route):
    """The linear routes: BLAS + bias_act_rows, and from FMA_LINEAR_ROWS rows on (with AVX-512)
    kernels_fma's transposed GEMM (17: one partial tile; 40: a full one and a partial one)."""
    params = {"w": RNG.standard_normal((37, 300)).astype(np.float32)}
    if bias:
        params["b"] = RNG.standard_normal(37).astype(np.float32)
    x = RNG.standard_normal((n, 300)).astype(np.float32)
    node = Node("fc", "linear", ["x", *params], ["y"], {"activation": act, "alpha": 0.05})
    got, want = run_both(x, [node], params, max_batch=64)
    assert_close(got, want, scale=300)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n", [16, 17, 64])
def test_linear_fp32_routes_by_threads(threads, n, fp32_route):
    """Two chained linears from 16 rows on (AVX-512): the first, from rows, runs as gemm_rows
    (each core transposes x for itself, a block of K at a time; on 1 thread too) and the
    second, its weights small, on 2 threads as gemm_pixels (split along the rows, when there
    are 2 tiles of them), else as gemm_t (with its transposing epilogue). The same results."""
    params = {"w1": RNG.standard_normal((300, 200)).astype(np.float32),
              "b1": RNG.standard_normal(300).astype(np.float32),
              "w2": RNG.standard_normal((37, 300)).astype(np.float32)}
    nodes = [Node("fc1", "linear", ["x", "w1", "b1"], ["h"], {"activation": "relu"}),
             Node("fc2", "linear", ["h", "w2"], ["y"], {"activation": "none"})]
    x = RNG.standard_normal((n, 200)).astype(np.float32)
    g = Graph({"x": ValueInfo("f32", ("N", 200))}, ["y"], nodes, {k: _info(v) for k, v in params.items()})
    with Engine(FakeContainer(g, params), max_batch=64, threads=threads) as eng:
        got = eng.run(x, copy=True)
        funcs = [getattr(getattr(f, "func", f), "__name__", "") for f in eng._bound[n].calls]
    assert_close(got, ref.run(g, params, x)[g.outputs[0]], scale=300 * np.sqrt(200))
    if fp32_route == "fma":
        pixels = threads == 2 and n > kfma.TILE_P
        assert any(f.startswith("gemm_rows") for f in funcs), funcs
        assert not any(f.startswith("transpose_in") for f in funcs), funcs
        assert any(f.startswith("gemm_pixels") for f in funcs) == pixels, funcs
        assert any(f.startswith("gemm_t") for f in funcs) == (not pixels), funcs


@pytest.mark.parametrize("op,attrs", [("relu", {}), ("leaky_relu", {"alpha": 0.2}), ("sigmoid", {}),
                                      ("tanh", {}), ("gelu", {}), ("gelu", {"approximate": "tanh"}),
                                      ("softmax", {"axis": 1}), ("softmax", {"axis": -1}),
                                      ("softmax", {"axis": 2}), ("global_avgpool", {}),
                                      ("dropout", {}), ("flatten", {}), ("reshape", {"shape": [15, -1]})])
@pytest.mark.parametrize("n", [1, 7])
def test_unary_ops(op, attrs, n):
    x = (3 * RNG.standard_normal((n, 3, 5, 4))).astype(np.float32)
    got, want = run_both(x, [Node("u", op, ["x"], ["y"], attrs)], {})
    assert_close(got, want, scale=10)


POOLS = [([2, 2], None, [0, 0]), ([3, 3], [2, 2], [1, 1]), ([3, 2], [1, 2], [1, 1]),
         ([1, 1], [2, 2], [0, 0]), ([2, 3], [2, 1], [0, 1])]


@pytest.mark.parametrize("k,s,p", POOLS)
@pytest.mark.parametrize("n", [1, 7])
def test_pools_fp32(k, s, p, n):
    x = RNG.standard_normal((n, 3, 7, 9)).astype(np.float32)
    got, want = run_both(x, [Node("m", "maxpool2d", ["x"], ["y"],
                                  {"kernel": k, "stride": s, "padding": p})], {})
    np.testing.assert_array_equal(got, want)
    for cip in (True, False):
        got, want = run_both(x, [Node("a", "avgpool2d", ["x"], ["y"], {
            "kernel": k, "stride": s, "padding": p, "count_include_pad": cip})], {})
        assert_close(got, want, scale=1)


@pytest.mark.parametrize("shape", [(7, 6), (1, 4, 3, 5)])
def test_batchnorm(shape):
    c = shape[1]
    params = {"g": RNG.random(c).astype(np.float32) + 0.5, "b": RNG.standard_normal(c).astype(np.float32),
              "m": RNG.standard_normal(c).astype(np.float32), "v": RNG.random(c).astype(np.float32)}
    x = RNG.standard_normal(shape).astype(np.float32)
    got, want = run_both(x, [Node("bn", "batchnorm", ["x", "g", "b", "m", "v"], ["y"],
                                  {"eps": 1e-3})], params)
    assert_close(got, want, scale=10)


def test_add_concat():
    x = RNG.standard_normal((7, 4, 3, 2)).astype(np.float32)
    params = {"c": RNG.standard_normal((4, 1, 1)).astype(np.float32)}
    nodes = [Node("r", "relu", ["x"], ["r"]), Node("a", "add", ["x", "r"], ["a"]),
             Node("b", "add", ["a", "c"], ["b"]),
             Node("cat", "concat", ["b", "x", "a"], ["cat"], {"axis": 2}),
             Node("cat2", "concat", ["cat", "cat"], ["y"], {"axis": 1})]
    got, want = run_both(x, nodes, params)
    assert_close(got, want, scale=10)


def test_conv2d_direct_groups2():
    """The direct kernel serves depthwise in the plan; check it on a general grouped conv too."""
    x = RNG.standard_normal((2, 4, 7, 6)).astype(np.float32)
    w = RNG.standard_normal((6, 2, 3, 2)).astype(np.float32)
    b = RNG.standard_normal(6).astype(np.float32)
    out = np.empty((2, 6, 4, 7), np.float32)
    kf.conv2d_direct(out, x, w, b, 2, 1, 1, 1, 1, 1, kf.ACT["tanh"], 0.0)
    a = {"stride": [2, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 2, "activation": "tanh"}
    assert_close(out, ref.conv2d(a, x, w, b), scale=12)


# --------------------------------------------------------------------------- int8


def _int8_conv_params(c, o, kh, kw, g, x_scale, rng=RNG):
    w_q, w_s = qm.quantize_weights(rng.standard_normal((o, c // g, kh, kw)).astype(np.float32))
    b_q = qm.quantize_bias(rng.standard_normal(o).astype(np.float32), x_scale, w_s)
    return {"w": w_q, "b": b_q}, {"w": {"scale": w_s.tolist(), "zero_point": [0] * o, "axis": 0}}


@pytest.mark.parametrize("name", CONV_CASES)
@pytest.mark.parametrize("n", [1, 7])
@pytest.mark.parametrize("mode", ["i8-relu", "i8", "f32"])
def test_conv2d_int8_exact(name, n, mode, int8_route):
    c, h, w, o, kh, kw, s, p, d, g = CONV_CASES[name]
    xs, xzp = 0.05, 9  # a non-zero x_zp checks that padding holds x_zp
    params, quant = _int8_conv_params(c, o, kh, kw, g, xs)
    x_q = RNG.integers(-128, 128, (n, c, h, w)).astype(np.int8)
    attrs = {"stride": s, "padding": p, "dilation": d, "groups": g, "x_scale": xs,
             "x_zero_point": xzp, "activation": "relu" if mode == "i8-relu" else "none"}
    if mode != "f32":
        attrs.update(y_scale=0.07, y_zero_point=-5)
    got, want = run_both(x_q, [Node("conv", "conv2d", ["x", "w", "b"], ["y"], attrs)], params, quant)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("n", [1, 7])
@pytest.mark.parametrize("mode", ["i8-relu", "i8", "f32-relu"])
def test_linear_int8_exact(n, mode, int8_route):
    w_q, w_s = qm.quantize_weights(RNG.standard_normal((9, 37)).astype(np.float32))
    params = {"w": w_q, "b": qm.quantize_bias(RNG.standard_normal(9).astype(np.float32), 0.1, w_s)}
    quant = {"w": {"scale": w_s.tolist(), "zero_point": [0] * 9, "axis": 0}}
    attrs = {"x_scale": 0.1, "x_zero_point": -20, "activation": "relu" if "relu" in mode else "none"}
    if mode.startswith("i8"):
        attrs.update(y_scale=0.3, y_zero_point=11)
    x_q = RNG.integers(-128, 128, (n, 37)).astype(np.int8)
    got, want = run_both(x_q, [Node("fc", "linear", ["x", "w", "b"], ["y"], attrs)], params, quant)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("n", [1, 7])
def test_quantize_maxpool_dequantize_exact(n):
    # values on exact .5 steps check ties-to-even; large ones check saturation
    x = np.concatenate([RNG.standard_normal((n, 2, 5, 7)) * 3,
                        np.full((n, 1, 5, 7), 0.125), np.full((n, 1, 5, 7), 100.0)], axis=1)
    x = x.astype(np.float32)
    nodes = [Node("q", "quantize", ["x"], ["q"], {"scale": 0.05, "zero_point": 3}),
             Node("m", "maxpool2d", ["q"], ["m"], {"kernel": [3, 2], "stride": [2, 2], "padding": [1, 1]}),
             Node("f", "flatten", ["m"], ["f"])]
    got, want = run_both(x, nodes, {})
    assert got.dtype == np.int8 and np.array_equal(got, want)
    nodes.append(Node("d", "dequantize", ["f"], ["y"], {"scale": 0.05, "zero_point": 3}))
    got, want = run_both(x, nodes, {})
    assert np.array_equal(got, want)


# --------------------------------------------------------------------------- planned fusions
# and the exact float32 route of int8 GEMMs (kernels_int8.requant_sum)

FUSED_POOLS = [([2, 2], None), ([3, 3], [2, 2]), ([3, 2], [2, 1]), ([1, 1], [2, 2])]


@pytest.mark.parametrize("k,s", FUSED_POOLS)
@pytest.mark.parametrize("n", [1, 7])
@pytest.mark.parametrize("act", ["relu", "none", "leaky_relu", "gelu"])
def test_conv_maxpool_fused_fp32(k, s, n, act, fp32_route):
    params = _conv_params(3, 5, 3, 2, 1)
    x = RNG.standard_normal((n, 3, 9, 8)).astype(np.float32)
    nodes = [Node("conv", "conv2d", ["x", "w", "b"], ["c"],
                  {"padding": [1, 0], "stride": [1, 1], "activation": act, "alpha": 0.1}),
             Node("pool", "maxpool2d", ["c"], ["y"], {"kernel": k, "stride": s, "padding": [0, 0]})]
    got, want = run_both(x, nodes, params)
    assert_close(got, want, scale=18)


@pytest.mark.parametrize("k,s", FUSED_POOLS)
@pytest.mark.parametrize("n", [1, 7])
@pytest.mark.parametrize("mode", ["i8-relu", "i8", "f32"])
def test_conv_maxpool_fused_int8_exact(k, s, n, mode, int8_route):
    params, quant = _int8_conv_params(4, 6, 3, 3, 1, 0.05)
    x_q = RNG.integers(-128, 128, (n, 4, 10, 7)).astype(np.int8)
    attrs = {"padding": [1, 1], "stride": [1, 1], "x_scale": 0.05, "x_zero_point": -7,
             "activation": "relu" if mode == "i8-relu" else "none"}
    if mode != "f32":
        attrs.update(y_scale=0.07, y_zero_point=4)
    nodes = [Node("conv", "conv2d", ["x", "w", "b"], ["c"], attrs),
             Node("pool", "maxpool2d", ["c"], ["y"], {"kernel": k, "stride": s, "padding": [0, 0]})]
    got, want = run_both(x_q, nodes, params, quant)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("n", [1, 7])
@pytest.mark.parametrize("shape", [(120, 4, 5, 3, 3), (1100, 3, 2, 1, 1)])
def test_conv2d_int8_long_k_exact(n, shape, int8_route):
    """K > EXACT_K splits the float32 GEMM; extreme codes give the largest partial sums."""
    c, h, w, kh, kw = shape
    params, quant = _int8_conv_params(c, 8, kh, kw, 1, 0.01)
    params["w"][:4] = -127
    x_q = RNG.integers(-128, 128, (n, c, h, w)).astype(np.int8)
    x_q[0] = -128
    attrs = {"padding": [kh // 2, kw // 2], "x_scale": 0.01, "x_zero_point": 0,
             "y_scale": 50.0, "y_zero_point": 0}
    got, want = run_both(x_q, [Node("conv", "conv2d", ["x", "w", "b"], ["y"], attrs)], params, quant)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("n", [1, 7, 17])
@pytest.mark.parametrize("k", [37, 1100, 2100])
@pytest.mark.parametrize("mode", ["i8-relu", "f32"])
def test_linear_int8_float_route_exact(n, k, mode, int8_route):
    """Batches of 16+ rows take the float32 GEMM route; 1 and 7 the int8 dot kernel."""
    w_q, w_s = qm.quantize_weights(RNG.standard_normal((9, k)).astype(np.float32))
    w_q[:3] = 127
    params = {"w": w_q, "b": qm.quantize_bias(RNG.standard_normal(9).astype(np.float32), 0.1, w_s)}
    quant = {"w": {"scale": w_s.tolist(), "zero_point": [0] * 9, "axis": 0}}
    attrs = {"x_scale": 0.1, "x_zero_point": 3, "activation": "relu" if "relu" in mode else "none"}
    if mode.startswith("i8"):
        attrs.update(y_scale=500.0, y_zero_point=-2)
    x_q = RNG.integers(-128, 128, (n, k)).astype(np.int8)
    x_q[0] = 127
    g = Graph({"x": ValueInfo("i8", ("N", k))}, ["y"],
              [Node("fc", "linear", ["x", "w", "b"], ["y"], attrs)],
              {name: _info(v) for name, v in params.items()})
    want = ref.run(g, params, x_q, quant)["y"]
    with Engine(FakeContainer(g, params, quant), max_batch=32) as eng:
        assert np.array_equal(eng.run(x_q), want)


@pytest.mark.parametrize("kc", [1, 3])
@pytest.mark.parametrize("mode", ["i8-relu", "i8", "f32-relu", "f32"])
def test_requant_rows_matches_requant_sum(kc, mode):
    """kernels_int8.requant_rows (the linear epilogue) equals requant_sum on P = 1 rows."""
    from pocket.infer import kernels_int8 as ki

    n, o = 5, 11
    yf = RNG.integers(-2 ** 23, 2 ** 23, (kc, n, o)).astype(np.float32)
    bias_adj = RNG.integers(-2 ** 20, 2 ** 20, o).astype(np.int64)
    to_int8 = mode.startswith("i8")
    m = qm.requant_multiplier(0.1, RNG.uniform(1e-3, 1e-2, o).astype(np.float32), 500.0 if to_int8 else None)
    relu = "relu" in mode
    lo = (-2.0 if relu else -128.0) if to_int8 else -128.0
    epi = (bias_adj, m, to_int8, -2.0 if to_int8 else 0.0, (lo, 127.0, math.inf), relu)
    dtype = np.int8 if to_int8 else np.float32
    got, want = np.empty((n, o), dtype), np.empty((n, o), dtype)
    ki.requant_rows(got, yf, *epi)
    ki.requant_sum(want.reshape(n, o, 1), yf.reshape(kc, n * o, 1), o, 0, *epi)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("k,s", FUSED_POOLS)
def test_requant_sum_pool_one_chunk_matches_split(k, s):
    """The one-chunk fast path of requant_sum_pool equals its general path (the same integer
    sums split over two chunks), for both row layouts the engine uses."""
    from pocket.infer import kernels_int8 as ki

    n, o, h, w = 3, 5, 7, 6
    ho, wo = (h - k[0]) // (s or k)[0] + 1, (w - k[1]) // (s or k)[1] + 1
    geom = (w, k[0], k[1], (s or k)[0], (s or k)[1])
    bias_adj = RNG.integers(-2 ** 20, 2 ** 20, o).astype(np.int64)
    m = qm.requant_multiplier(0.1, RNG.uniform(1e-3, 1e-2, o).astype(np.float32), 500.0)
    epi = (bias_adj, m, True, -2.0, (-2.0, 127.0, math.inf), True)
    whole = RNG.integers(-2 ** 23, 2 ** 23, (o, n * h * w)).astype(np.float32)
    part = RNG.integers(-2 ** 22, 2 ** 22, whole.shape).astype(np.float32)
    split = np.stack([part, whole - part])
    for rb, cb, shape in [(0, h * w, (o, n * h * w)), (o, 0, (n * o, h * w))]:
        y1 = whole.reshape(o, n, h * w).transpose(1, 0, 2).reshape(shape) if rb else whole
        y2 = split.reshape(2, o, n, h * w).transpose(0, 2, 1, 3).reshape(2, *shape) if rb else split
        got, want = np.empty((n, o, ho, wo), np.int8), np.empty((n, o, ho, wo), np.int8)
        ki.requant_sum_pool(got, y1[None], rb, cb, *geom, *epi)
        ki.requant_sum_pool(want, y2, rb, cb, *geom, *epi)
        assert np.array_equal(got, want)


@pytest.mark.parametrize("int8", [False, True])
def test_fused_pool_with_batch_chunks(int8, monkeypatch, int8_route, fp32_route):
    """A fused conv writes the pool's output while later chunks still read the conv's input:
    the arena must keep them apart (a tiny scratch budget forces one image per chunk)."""
    from pocket.infer import lowering_common

    for budget in ("SCRATCH_BYTES", "FMA_SCRATCH_BYTES", "VNNI_SCRATCH_BYTES"):
        monkeypatch.setattr(lowering_common, budget, 256)
    pool = {"kernel": [2, 2], "padding": [0, 0]}
    # int8 with VNNI: the first conv reads its four-channel words in place (10 columns), the
    # second packs them by pixel table (5 columns, see routes.conv_vnni_quad)
    x = RNG.standard_normal((7, 4, 12, 10)).astype(np.float32)
    if int8:
        p1, q1 = _int8_conv_params(4, 8, 3, 3, 1, 0.05)
        p2, q2 = _int8_conv_params(8, 5, 3, 3, 1, 0.04)
        params = {"w1": p1["w"], "b1": p1["b"], "w2": p2["w"], "b2": p2["b"]}
        quant = {"w1": q1["w"], "w2": q2["w"]}
        i8 = {"y_scale": 0.04, "y_zero_point": -3}
        nodes = [Node("q", "quantize", ["x"], ["q"], {"scale": 0.05, "zero_point": 2}),
                 Node("c1", "conv2d", ["q", "w1", "b1"], ["c1"], {
                     "padding": [1, 1], "x_scale": 0.05, "x_zero_point": 2, "activation": "relu",
                     **i8}),
                 Node("p1", "maxpool2d", ["c1"], ["p1"], pool),
                 Node("c2", "conv2d", ["p1", "w2", "b2"], ["c2"], {
                     "padding": [1, 1], "x_scale": 0.04, "x_zero_point": -3, **i8}),
                 Node("p2", "maxpool2d", ["c2"], ["y"], pool)]
    else:
        quant = None
        params = {"w1": RNG.standard_normal((6, 4, 3, 3)).astype(np.float32),
                  "w2": RNG.standard_normal((5, 6, 3, 3)).astype(np.float32)}
        nodes = [Node("c1", "conv2d", ["x", "w1"], ["c1"], {"padding": [1, 1], "activation": "relu"}),
                 Node("p1", "maxpool2d", ["c1"], ["p1"], pool),
                 Node("c2", "conv2d", ["p1", "w2"], ["c2"], {"padding": [1, 1]}),
                 Node("p2", "maxpool2d", ["c2"], ["y"], pool)]
    got, want = run_both(x, nodes, params, quant)
    if int8:
        assert np.array_equal(got, want)
    else:
        assert_close(got, want, scale=300)


# --------------------------------------------------------------------------- thread plan


@pytest.mark.parametrize("work", [0, 1 << 60])
@pytest.mark.parametrize("n", [1, 7])
@pytest.mark.parametrize("int8", [False, True])
def test_serial_and_parallel_plans_agree(work, n, int8, monkeypatch, int8_route):
    """Every call parallel (work 0) or every call on the calling thread: same results, and
    run() leaves Numba's thread count as it found it."""
    import numba

    from pocket.infer import engine as engine_mod

    monkeypatch.setattr(engine_mod, "_PARALLEL_WORK", work)
    c, h, w, o = 5, 9, 11, 7
    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    pool = {"kernel": [2, 2], "padding": [0, 0]}
    if int8:
        params, quant = _int8_conv_params(c, o, 3, 3, 1, 0.05)
        nodes = [Node("q", "quantize", ["x"], ["q"], {"scale": 0.05, "zero_point": 2}),
                 Node("conv", "conv2d", ["q", "w", "b"], ["c"], {
                     "padding": [1, 1], "x_scale": 0.05, "x_zero_point": 2, "activation": "relu",
                     "y_scale": 0.04, "y_zero_point": -3}),
                 Node("p", "maxpool2d", ["c"], ["y"], pool)]
    else:
        params, quant = _conv_params(c, o, 3, 3, 1), None
        nodes = [Node("conv", "conv2d", ["x", "w", "b"], ["c"], {"padding": [1, 1], "activation": "relu"}),
                 Node("p", "maxpool2d", ["c"], ["y"], pool)]
    before = numba.get_num_threads()
    got, want = run_both(x, nodes, params, quant)
    assert numba.get_num_threads() == before
    if int8:
        assert np.array_equal(got, want)
    else:
        assert_close(got, want, scale=45)


@pytest.mark.parametrize("act,bias", [("relu", True), ("none", True), ("none", False), ("relu", False),
                                      ("silu", True), ("gelu", True)])
@pytest.mark.parametrize("hw,stride", [(4, 1), (9, 2)])
@pytest.mark.parametrize("n", [1, 2])
def test_conv2d_cols_writes_output(act, bias, hw, stride, n, fp32_route, monkeypatch):
    """An im2col conv of one image takes the GEMM's bias and activation in registers (ReLU,
    SiLU; zeros for a missing bias) and writes the output itself (no epilogue call) on AVX-512,
    also where its pixels do not fill whole GEMM tiles (stride 2 to 5x5: the last 9 masked); other batches
    and activations keep the epilogue."""
    c, o = 16, 41  # enough channels for im2col over the pitch's junk columns
    params = _conv_params(c, o, 3, 3, 1, bias=bias)
    x = RNG.standard_normal((n, c, hw, hw)).astype(np.float32)
    node = Node("conv", "conv2d", ["x", "w", "b"] if bias else ["x", "w"], ["y"],
                {"padding": [1, 1], "stride": [stride, stride], "activation": act})
    if fp32_route == "fma":  # (a stride-2 conv would take conv_fma_phase)
        monkeypatch.setenv("POCKET_ROUTE", "conv_fma_cols")
    with Engine(FakeContainer(Graph({"x": ValueInfo("f32", ("N", c, hw, hw))}, ["y"], [node],
                                    {k: _info(v) for k, v in params.items()}), params), threads=1) as eng:
        eng.run(x)
        funcs = [getattr(getattr(f, "func", f), "__name__", "") for f in eng._bound[n].calls]
        if fp32_route == "fma":
            assert [r["route"] for r in eng.routes()] == ["conv_fma_cols"]
    direct = fp32_route == "fma" and n == 1 and act != "gelu"
    # x86's portable path: conv_tile_cols (bias and activation in the tiles, or its own pass)
    tiles = fp32_route == "tile" and not kernels_tile.W_VECTORS
    assert (not any(f.startswith("bias_act") for f in funcs)) == (direct or tiles), funcs
    got, want = run_both(x, [node], params)
    assert_close(got, want, scale=3 * np.sqrt(9 * c))


@pytest.mark.parametrize("c,hw,k,pad", [(3, (23, 20), 7, 3), (3, (9, 8), 3, 1), (5, (7, 11), 3, 0),
                                         (2, (12, 13), 5, 2), (4, (6, 6), 2, 0), (3, (10, 9), 4, 3),
                                         (3, (30, 30), 3, 1)])
@pytest.mark.parametrize("act", ["relu", "silu", "gelu"])
@pytest.mark.parametrize("n,pool", [(1, None), (3, None), (1, [3, 3]), (1, [2, 2]), (2, [3, 3])])
def test_conv2d_phase(c, hw, k, pad, act, n, pool):
    """Stride-2 convs on AVX-512 (routes.conv_fma_phase): the input's four phases read in
    place; odd and even sizes, kernels 1-7, padding past the kernel's reach, register and
    pass activations, and a fused max pool (the AVX-512 pool over the pitch for one image,
    bias_act_pool_pitch otherwise) against the reference."""
    from pocket.infer import kernels_fma

    if not kernels_fma.AVAILABLE:
        pytest.skip("this CPU has no AVX-512")
    params = _conv_params(c, 12, k, k, 1)
    x = RNG.standard_normal((n, c, *hw)).astype(np.float32)
    nodes = [Node("conv", "conv2d", ["x", "w", "b"], ["y"],
                  {"stride": [2, 2], "padding": [pad, pad], "activation": act})]
    if pool is not None:
        nodes.append(Node("pool", "maxpool2d", ["y"], ["z"], {"kernel": pool, "stride": [2, 2]}))
    got, want = run_both(x, nodes, params)
    assert_close(got, want, scale=c * k * k)
    g = Graph({"x": ValueInfo("f32", ("N", *x.shape[1:]))}, [nodes[-1].outputs[0]], nodes,
              {kk: _info(v) for kk, v in params.items()})
    with Engine(FakeContainer(g, params), max_batch=8) as eng:
        assert eng.routes()[0]["route"] == "conv_fma_phase"
        eng.run(x)
        names = {getattr(getattr(f, "func", f), "__name__", "") for f in eng._bound[n].calls}
    # (30 x 30: 15 rows of 16 at the phases' pitch, whole tiles: the planes are whole)
    if pool is not None and pool[0] == 3 and n == 1 and hw == (30, 30) and act != "gelu":
        assert "maxpool_fma_serial" in names or "maxpool_fma" in names, names


# --------------------------------------------------------------------------- Winograd F(2x2, 3x3)
# fp32 3x3 stride-1 convs with WINOGRAD_MIN_C+ input channels (kernels_winograd)


@pytest.mark.parametrize("hw,pad", [((8, 8), [1, 1]), ((7, 9), [1, 1]), ((6, 5), [0, 0]),
                                    ((5, 7), [2, 1])])
@pytest.mark.parametrize("n", [1, 7])
@pytest.mark.parametrize("act", ["relu", "none", "gelu"])
def test_conv2d_winograd(hw, pad, n, act, monkeypatch, fp32_route):
    """Even and odd output sizes (partial last tiles), paddings 0-2, batch chunks of one image."""
    from pocket.infer import lowering_common
    from pocket.infer.routes import conv_winograd, conv_winograd_fused

    monkeypatch.setattr(lowering_common, "SCRATCH_BYTES", 1)  # one image a chunk
    monkeypatch.setattr(conv_winograd_fused, "WINOGRAD_SCRATCH_BYTES", 1)  # ... fused too
    monkeypatch.setattr(conv_winograd_fused, "WINOGRAD_CHUNK_TILES", 1)
    monkeypatch.setattr(conv_winograd, "WINOGRAD_MIN_TILES", 1)
    c, o = conv_winograd.WINOGRAD_MIN_C, 5
    params = _conv_params(c, o, 3, 3, 1, bias=act != "none")
    x = RNG.standard_normal((n, c, *hw)).astype(np.float32)
    node = Node("conv", "conv2d", ["x", "w", "b"] if act != "none" else ["x", "w"], ["y"],
                {"padding": pad, "activation": act})
    with Engine(FakeContainer(Graph({"x": ValueInfo("f32", ("N", c, *hw))}, ["y"], [node],
                                    {k: _info(v) for k, v in params.items()}), params), threads=2) as eng:
        assert eng._prep[0]["route"] == ("conv_winograd_fused" if fp32_route == "fma" else "conv_winograd")
        eng.run(x)
        funcs = [getattr(getattr(f, "func", f), "__name__", "") for f in eng._bound[n].calls]
    # the fused conv (a thread's images in chunks) on AVX-512 with ReLU or none, 2+ images a thread
    fused = fp32_route == "fma" and act != "gelu" and n >= 4
    assert any(f.startswith("fused_conv") for f in funcs) == fused, funcs
    got, want = run_both(x, [node], params)
    assert_close(got, want, scale=3 * np.sqrt(9 * c))


@pytest.mark.parametrize("k,s", [([2, 2], None), ([3, 3], [2, 2])])
@pytest.mark.parametrize("hw", [(8, 8), (7, 9)])
def test_conv_maxpool_winograd(k, s, hw, monkeypatch, fp32_route):
    """A 2x2/2 pool fuses into the output transform (the max of each tile); other pools run
    after an unfused Winograd conv."""
    from pocket.infer.routes import conv_winograd, conv_winograd_fused

    monkeypatch.setattr(conv_winograd, "WINOGRAD_MIN_C", 4)
    monkeypatch.setattr(conv_winograd, "WINOGRAD_MIN_C_PORTABLE", 4)
    monkeypatch.setattr(conv_winograd_fused, "WINOGRAD_FUSED_MIN_C", 4)
    monkeypatch.setattr(conv_winograd, "WINOGRAD_MIN_TILES", 1)
    params = _conv_params(4, 6, 3, 3, 1)
    x = RNG.standard_normal((3, 4, *hw)).astype(np.float32)
    nodes = [Node("conv", "conv2d", ["x", "w", "b"], ["c"], {"padding": [1, 1], "activation": "relu"}),
             Node("pool", "maxpool2d", ["c"], ["y"], {"kernel": k, "stride": s, "padding": [0, 0]})]
    got, want = run_both(x, nodes, params)
    assert_close(got, want, scale=20)


def test_winograd_only_where_it_applies(monkeypatch, fp32_route):
    """Winograd takes 3x3, stride 1, dilation 1, groups 1 and enough channels; nothing else."""
    from pocket.infer import kernels_tile
    from pocket.infer.routes import conv_tile, conv_winograd, conv_winograd_fused

    monkeypatch.setattr(conv_winograd, "WINOGRAD_MIN_C", 4)
    monkeypatch.setattr(conv_winograd, "WINOGRAD_MIN_C_PORTABLE", 4)
    monkeypatch.setattr(conv_winograd_fused, "WINOGRAD_FUSED_MIN_C", 4)
    gemm = {"fma": "conv_fma_cols", "tile": "conv_tile_cols", "blas": "conv_gemm"}[fp32_route]
    pointwise = {"fma": "conv_fma_1x1", "tile": "conv_tile", "blas": "conv_pointwise"}[fp32_route]
    winograd = {"fma": "conv_winograd_fused", "tile": "conv_winograd", "blas": "conv_winograd"}[fp32_route]
    # (x86's portable path: a stride-2 conv of few input channels over its phases)
    phase = "conv_tile_phase" if CONV_CASES["5x5-stride2"][0] <= conv_tile.PHASE_MAX_C else gemm
    strided = {"fma": "conv_fma_phase", "tile": phase if not kernels_tile.W_VECTORS else gemm}
    for name, want in (("3x3-pad", winograd), ("dilation", gemm), ("1x1", pointwise),
                       ("5x5-stride2", strided.get(fp32_route, gemm)),
                       ("groups2", "conv_im2col")):
        c, h, w, o, kh, kw, s, p, d, g = CONV_CASES[name]
        x = RNG.standard_normal((2, max(c, 4) if name == "3x3-pad" else c, h, w)).astype(np.float32)
        params = _conv_params(x.shape[1], o, kh, kw, g)
        node = Node("conv", "conv2d", ["x", "w", "b"], ["y"],
                    {"stride": s, "padding": p, "dilation": d, "groups": g})
        graph = Graph({"x": ValueInfo("f32", ("N", *x.shape[1:]))}, ["y"], [node],
                      {k: _info(v) for k, v in params.items()})
        with Engine(FakeContainer(graph, params)) as eng:
            kind = eng._prep[0]["route"]
        assert kind == want, name
        got, want_y = run_both(x, [node], params)
        assert_close(got, want_y, scale=20)


@pytest.mark.parametrize("c", [31, 32, 63, 64])
def test_winograd_channel_threshold(c, fp32_route):
    """Winograd from WINOGRAD_FUSED_MIN_C input channels on AVX-512 (conv_winograd_fused, ahead
    of conv_winograd's WINOGRAD_MIN_C), from WINOGRAD_MIN_C_PORTABLE on the portable path;
    below, the pitch routes."""
    from pocket.infer.routes import conv_winograd, conv_winograd_fused

    least = (conv_winograd_fused.WINOGRAD_FUSED_MIN_C if fp32_route == "fma"
             else conv_winograd.WINOGRAD_MIN_C_PORTABLE)
    params = _conv_params(c, 8, 3, 3, 1)
    node = Node("conv", "conv2d", ["x", "w", "b"], ["y"], {"padding": [1, 1]})
    graph = Graph({"x": ValueInfo("f32", ("N", c, 16, 16))}, ["y"], [node],
                  {k: _info(v) for k, v in params.items()})
    with Engine(FakeContainer(graph, params)) as eng:
        assert eng._prep[0]["route"].startswith("conv_winograd") == (c >= least), (c, eng._prep[0]["route"])


@pytest.mark.parametrize("c", [31, 32, 63])
def test_winograd_at_batch_one_from_32_channels(c):
    """On AVX-512 a call of one image runs Winograd from WINOGRAD_MIN_C_ONE input channels; a
    call of three on two threads (under conv_winograd_fused's two images a thread) from
    WINOGRAD_MIN_C; both against the reference."""
    from pocket.infer import kernels_fma
    from pocket.infer.routes import conv_winograd

    if not kernels_fma.AVAILABLE:
        pytest.skip("this CPU has no AVX-512")
    # (the cases straddle these: 31 below both, 32 and 63 between)
    assert (conv_winograd.WINOGRAD_MIN_C_ONE, conv_winograd.WINOGRAD_MIN_C) == (32, 64)
    params = _conv_params(c, 8, 3, 3, 1)
    node = Node("conv", "conv2d", ["x", "w", "b"], ["y"], {"padding": [1, 1], "activation": "relu"})
    graph = Graph({"x": ValueInfo("f32", ("N", c, 16, 16))}, ["y"], [node],
                  {k: _info(v) for k, v in params.items()})
    x = RNG.standard_normal((3, c, 16, 16)).astype(np.float32)
    with Engine(FakeContainer(graph, params), threads=2, max_batch=3) as eng:
        for n, least in ((1, conv_winograd.WINOGRAD_MIN_C_ONE), (3, conv_winograd.WINOGRAD_MIN_C)):
            got = eng.run(x[:n], copy=True)
            names = [getattr(f.func, "__name__", "") for f in eng._bound[n].calls]
            assert any("input_transform" in f for f in names) == (c >= least), (n, names)
            assert_close(got, ref.run(graph, params, x[:n])["y"], scale=100)  # sums of c*9 N(0,1) terms


def test_winograd_falls_back_on_few_tiles(monkeypatch):
    """Below WINOGRAD_MIN_TILES a call runs the pitch GEMM path; both give the same outputs."""
    from pocket.infer.routes import conv_winograd, conv_winograd_fused

    monkeypatch.setattr(conv_winograd, "WINOGRAD_MIN_C", 4)
    monkeypatch.setattr(conv_winograd, "WINOGRAD_MIN_C_PORTABLE", 4)
    monkeypatch.setattr(conv_winograd_fused, "WINOGRAD_FUSED_MIN_C", 4)
    monkeypatch.setattr(conv_winograd, "WINOGRAD_MIN_TILES", 20)  # 4x4 tiles an image: n=1 falls back
    params = _conv_params(4, 3, 3, 3, 1)
    node = Node("conv", "conv2d", ["x", "w", "b"], ["y"], {"padding": [1, 1]})
    graph = Graph({"x": ValueInfo("f32", ("N", 4, 8, 8))}, ["y"], [node],
                  {k: _info(v) for k, v in params.items()})
    x = RNG.standard_normal((2, 4, 8, 8)).astype(np.float32)
    # NOTE: 2 threads: batch 2 is then under conv_winograd_fused's 2 images a thread (with the
    # process's thread count, which earlier tests set, it took the fused route one run in five)
    with Engine(FakeContainer(graph, params), threads=2) as eng:
        one, two = eng.run(x[:1], copy=True), eng.run(x, copy=True)
        kinds = {n: [getattr(c.func, "__name__", "") for c in eng._bound[n].calls] for n in (1, 2)}
    assert not any("transform" in f for f in kinds[1]) and any("input_transform" in f for f in kinds[2])
    assert_close(one[0], two[0], scale=10)
    assert_close(two, ref.run(graph, params, x)["y"], scale=10)


def test_winograd_filter_transform():
    """filter_transform equals FILTER (the Kronecker product G x G) applied in float64."""
    from pocket.infer import kernels_winograd as kwg

    w9 = RNG.standard_normal((37, 9)).astype(np.float32)
    u = np.zeros((16, 37), np.float32)
    kwg.filter_transform(u, w9)
    want = kwg.FILTER.astype(np.float64) @ w9.T.astype(np.float64)
    np.testing.assert_allclose(u, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("scale,zp", [(0.05, 3), (1.0, 0), (0.1, 127), (0.1, -128), (3e-5, 5)])
def test_quantize_ties_and_extremes_exact(scale, zp):
    """kernels_int8.quantize (rounding by adding 1.5 * 2**23, after clamping) equals
    formats/quant.quantize on exact ties, both signs of zero, huge values and denormals."""
    from pocket.formats import quant as qm
    from pocket.infer import kernels_int8 as ki

    s = np.float32(scale)
    ties = ((np.arange(-300, 300) + 0.5) * s).astype(np.float32)
    x = np.concatenate([ties, RNG.standard_normal(5000).astype(np.float32) * 50,
                        np.array([0.0, -0.0, 1e30, -1e30, 5e-39, -5e-39], np.float32)])
    out = np.zeros(x.shape, np.int8)
    ki.quantize(out, x, scale, zp)
    assert np.array_equal(out, qm.quantize(x, scale, zp))


@pytest.mark.parametrize("geom", [(3, 3, 1, 1, 1, 1), (1, 1, 0, 0, 1, 1), (5, 3, 2, 1, 1, 1),
                                  (3, 3, 2, 2, 2, 2), (3, 5, 1, 4, 1, 2)])
@pytest.mark.parametrize("hw", [(4, 4), (8, 8), (3, 7), (1, 5)])
@pytest.mark.parametrize("n", [1, 3])
def test_im2col_same(geom, hw, n):
    """im2col_same (one masked run a row) equals a naive im2col from a padded copy, in both
    layouts (one wide GEMM: rows K, images side by side; per image: rows b*K + k), int8 in
    with a zero-point pad too."""
    kh, kw, ph, pw, dh, dw = geom
    x = RNG.standard_normal((n, 2, *hw)).astype(np.float32)
    valid = kf.same_valid(*hw, kh, kw, ph, pw, dh, dw)
    k, p = 2 * kh * kw, hw[0] * hw[1]
    want = naive_im2col(x, kh, kw, ph, pw, dh, dw, 0.0)
    wide = np.full((k, n * p + 5), np.nan, np.float32)
    kf.im2col_same(wide, x, valid, kh, kw, ph, pw, dh, dw, np.float32(0), 0, p)
    assert np.array_equal(wide[:, :n * p], want.transpose(1, 0, 2).reshape(k, n * p))
    per = np.full((n * k, p), np.nan, np.float32)
    kf.im2col_same.serial(per, x, valid, kh, kw, ph, pw, dh, dw, np.float32(0), k, 0)
    assert np.array_equal(per, want.reshape(n * k, p))
    xq = RNG.integers(-128, 128, x.shape).astype(np.int8)
    kf.im2col_same(wide, xq, valid, kh, kw, ph, pw, dh, dw, np.float32(-7), 0, p)
    want = naive_im2col(xq, kh, kw, ph, pw, dh, dw, -7.0)
    assert np.array_equal(wide[:, :n * p], want.transpose(1, 0, 2).reshape(k, n * p))


@pytest.mark.parametrize("pool", [(2, 2, 2, 2), (3, 3, 2, 2), (3, 2, 1, 2), (2, 2, 1, 1)])
@pytest.mark.parametrize("hw", [(4, 4), (9, 8), (5, 3)])
@pytest.mark.parametrize("act", ["relu", "none", "leaky_relu"])
@pytest.mark.parametrize("layout", ["rows", "wide", "halves"])
def test_bias_act_pool(pool, hw, act, layout):
    """The fused epilogue bias_act_pool (the 2x2/2 window unrolled, others by loops) equals
    NumPy's maxpool of act(y + b), from each layout of the GEMM result: (N*O, P), one wide
    (O, N*P), and a wide one in two halves of K that bias_act_pool_sum adds (in float32)."""
    kh, kw, sh, sw = pool
    n, o, (h, w) = 3, 5, hw
    y = RNG.standard_normal((n, o, h, w)).astype(np.float32)
    second = RNG.standard_normal((n, o, h, w)).astype(np.float32)
    b = RNG.standard_normal(o).astype(np.float32)
    v = ((y + second if layout == "halves" else y) + b[:, None, None]).astype(np.float64)
    z = {"relu": np.maximum(v, 0), "none": v, "leaky_relu": np.where(v >= 0, v, 0.1 * v)}[act]
    ho, wo = (h - kh) // sh + 1, (w - kw) // sw + 1
    want = np.full((n, o, ho, wo), -np.inf, np.float32)
    for i in range(kh):
        for j in range(kw):
            want = np.maximum(want, z[:, :, i:i + sh * (ho - 1) + 1:sh, j:j + sw * (wo - 1) + 1:sw])
    got = np.full((n, o, ho, wo), np.nan, np.float32)

    def wide_of(a):
        return np.ascontiguousarray(a.transpose(1, 0, 2, 3)).reshape(o, n * h * w)

    if layout == "halves":
        kf.bias_act_pool_sum(got, np.concatenate([wide_of(y), wide_of(second)]), h * w, w, kh, kw, sh, sw,
                             b, kf.ACT[act], 0.1)
    elif layout == "wide":
        kf.bias_act_pool(got, wide_of(y), 0, h * w, w, kh, kw, sh, sw, b, kf.ACT[act], 0.1)
    else:
        kf.bias_act_pool(got, y.reshape(n * o, h * w), o, 0, w, kh, kw, sh, sw, b, kf.ACT[act], 0.1)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("act", ["relu", "none", "gelu"])
@pytest.mark.parametrize("bias", [True, False])
def test_bias_act_sum(act, bias):
    """A GEMM's two halves of K (2*O, N*P), summed in float32, then the bias and activation,
    laid out (N, O, P); the halves' padding columns past N*P are not read."""
    n, o, p = 3, 7, 20
    halves = np.full((2 * o, n * p + 16), np.nan, np.float32)
    halves[:, :n * p] = RNG.standard_normal((2 * o, n * p))
    b = RNG.standard_normal(o).astype(np.float32) if bias else np.zeros(0, np.float32)
    total = (halves[:o, :n * p] + halves[o:, :n * p]).reshape(o, n, p).transpose(1, 0, 2)
    v = (total + (b[:, None] if bias else 0)).astype(np.float64)
    want = {"relu": np.maximum(v, 0), "none": v,
            "gelu": 0.5 * v * (1 + np.vectorize(math.erf)(v / np.sqrt(2)))}[act]
    got = np.full((n, o, p), np.nan, np.float32)
    kf.bias_act_sum(got, halves, p, b, kf.ACT[act], 0.0)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("act", ["relu", "none", "sigmoid"])
@pytest.mark.parametrize("n,m", [(1, 16), (17, 32), (64, 64)])
def test_bias_act_cols(act, n, m):
    """A chained linear's epilogue: act(c + b) on the first n columns of each row, in place,
    and zeros after them (the next GEMM's last tile), against NumPy."""
    o = 5
    c = RNG.standard_normal((o, m)).astype(np.float32)
    c[:, n:] = np.nan  # junk the GEMM wrote past the rows
    b = RNG.standard_normal(o).astype(np.float32)
    v = (c[:, :n] + b[:, None]).astype(np.float64)
    z = {"relu": np.maximum(v, 0), "none": v, "sigmoid": 1 / (1 + np.exp(-v))}[act]
    kf.bias_act_cols(c, n, b, kf.ACT[act], 0.0)
    np.testing.assert_allclose(c[:, :n], z, rtol=1e-6, atol=1e-7)
    assert not c[:, n:].any()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("act2", ["relu", "gelu"])
def test_conv_pool_writes_next_convs_padding(threads, act2, fp32_route):
    """conv -> 2x2 maxpool -> conv at a pitch (AVX-512): the first conv's pooled epilogue
    writes the second's padded images (kernels_fma.gemm_pool2_padded), which then pads
    nothing; at every batch size the results are the reference's (the arena keeps the second
    conv's scratch live from the first on), and the pair falls back to pad_images where the
    second conv runs another way (a Winograd conv's fused kernel at larger batches)."""
    from pocket.infer.routes.conv_fma_pitch import pads_into

    params = {**{k + "1": v for k, v in _conv_params(3, 32, 3, 3, 1).items()},
              **{k + "2": v for k, v in _conv_params(32, 16, 3, 3, 1).items()}}
    nodes = [Node("c1", "conv2d", ["x", "w1", "b1"], ["h"], {"padding": [1, 1], "activation": "relu"}),
             Node("p", "maxpool2d", ["h"], ["hp"], {"kernel": [2, 2], "padding": [0, 0]}),
             Node("c2", "conv2d", ["hp", "w2", "b2"], ["y"], {"padding": [1, 1], "activation": act2})]
    g = Graph({"x": ValueInfo("f32", ("N", 3, 14, 18))}, ["y"], nodes,
              {k: _info(v) for k, v in params.items()})
    with Engine(FakeContainer(g, params), max_batch=8, threads=threads) as eng:
        for n in (1, 2, 5, 8):
            x = RNG.standard_normal((n, 3, 14, 18)).astype(np.float32)
            got = eng.run(x, copy=True)
            # (sums of 288 terms of up to ~40: float32 rounding reaches ~1e-4)
            assert_close(got, ref.run(g, params, x)["y"], scale=1000)
            names = [getattr(getattr(f, "func", f), "__name__", "") for f in eng._bind(n).calls]
            padded = pads_into(eng._ctx, 0, n) == 2
            assert any(f.startswith("gemm_pool2_padded") for f in names) == padded, names
            if padded:  # only the first conv's input is padded
                assert sum(f.startswith("pad_images") for f in names) == -(-n // eng._prep[0]["chunk"])
        if fp32_route == "fma":
            assert eng._pad_after == {0: 2} and pads_into(eng._ctx, 0, 1) == 2


@pytest.mark.parametrize("act", ["relu", "gelu"])
@pytest.mark.parametrize("hw,n,split", [((8, 8), 1, True), ((8, 8), 2, True), ((4, 4), 3, True),
                                        ((4, 4), 1, False), ((8, 8), 3, False)])
def test_conv2d_fp32_k_halves(hw, n, split, act):
    """On two threads an im2col conv of 32..128 columns a chunk runs two GEMMs over the halves
    of K and sums them in its epilogue (routes.conv_fma_cols.FMA_KSPLIT_COLS, kernels_fp32.bias_act_sum
    and bias_act_pool_sum): still the convolution, with and without a fused maxpool (2x2/2 and
    3x3/2)."""
    from pocket.infer import kernels_fma

    if not kernels_fma.AVAILABLE:
        pytest.skip("this CPU has no AVX-512")
    import numba

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs two threads")
    c, o = 16, 96  # enough channels that the pitch's junk columns lose to im2col
    params = _conv_params(c, o, 3, 3, 1)
    x = RNG.standard_normal((n, c, *hw)).astype(np.float32)
    conv = Node("conv", "conv2d", ["x", "w", "b"], ["y"], {
        "stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1, "activation": act})
    pool = Node("pool", "maxpool2d", ["y"], ["z"], {"kernel": [2, 2], "padding": [0, 0]})
    pool3 = Node("pool", "maxpool2d", ["y"], ["z"], {"kernel": [3, 3], "stride": [2, 2], "padding": [0, 0]})
    for nodes in ([conv], [conv, pool], [conv, pool3]):
        g = Graph({"x": ValueInfo("f32", ("N", c, *hw))}, [nodes[-1].outputs[0]], nodes,
                  {k: _info(v) for k, v in params.items()})
        want = ref.run(g, params, x)[g.outputs[0]]
        with Engine(FakeContainer(g, params), max_batch=4, threads=2) as eng:
            got = eng.run(x, copy=True)
            names = [getattr(getattr(call, "func", call), "__name__", "") for call in eng._bind(n).calls]
        halves = any(f.startswith(("bias_act_sum", "bias_act_pool_sum")) for f in names)
        assert halves == split, names
        assert_close(got, want, scale=c * 9)
