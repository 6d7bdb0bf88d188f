"""The sequence-conv kernels against naive NumPy twins, and the engine's conv1d / pool1d /
global pools against formats/reference.py on odd shapes: batch 1 and batched, causal,
dilated, grouped, strided, fused activations, fp32 and int8 (bit for bit)."""

import numpy as np
import pytest
from models import FakeContainer

from pocket.formats import reference as ref
from pocket.formats.ir import Graph, Node, ValueInfo
from pocket.infer import Engine, lowering_seqconv
from pocket.infer import kernels_seqconv as ks

# --------------------------------------------------------------------------- naive twins


def naive_im2col1d(x, k, s, pl, d, lo, pad):
    n, c, length = x.shape
    col = np.full((c * k, n * lo), pad, np.float32)
    for b in range(n):
        for ch in range(c):
            for j in range(k):
                for t in range(lo):
                    i = t * s - pl + j * d
                    if 0 <= i < length:
                        col[ch * k + j, b * lo + t] = x[b, ch, i]
    return col


def naive_conv1d(x, w, b, s, pl, d, lo):
    n, c, length = x.shape
    o, cg, k = w.shape
    og = o // (c // cg)
    out = np.zeros((n, o, lo))
    for bi in range(n):
        for oc in range(o):
            for t in range(lo):
                for ci in range(cg):
                    for j in range(k):
                        i = t * s - pl + j * d
                        if 0 <= i < length:
                            out[bi, oc, t] += x[bi, (oc // og) * cg + ci, i] * w[oc, ci, j]
                out[bi, oc, t] += b[oc] if b.size else 0.0
    return out


@pytest.mark.parametrize("k,s,pl,pr,d", [(3, 1, 2, 0, 1), (2, 2, 1, 2, 3), (1, 3, 0, 0, 1),
                                         (4, 1, 0, 5, 2)])
def test_im2col1d_matches_its_twin(k, s, pl, pr, d):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 7)).astype(np.float32)
    lo = (7 + pl + pr - d * (k - 1) - 1) // s + 1
    col = np.empty((3 * k, 2 * lo), np.float32)
    ks.im2col1d(col, x, k, s, pl, d, 0.0)  # the parallel twin once; the engine binds the serial
    # one for small calls
    np.testing.assert_array_equal(col, naive_im2col1d(x, k, s, pl, d, lo, 0.0))
    xq = rng.integers(-128, 128, (2, 3, 7)).astype(np.int8)
    ks.im2col1d.serial(col, xq, k, s, pl, d, -7.0)
    np.testing.assert_array_equal(col, naive_im2col1d(xq, k, s, pl, d, lo, -7.0))


def test_pad_rows_matches_its_twin():
    x = np.random.default_rng(6).standard_normal((3, 2, 5)).astype(np.float32)
    xpad = np.full((2, 3 * 8 + 4), np.nan, np.float32)
    ks.pad_rows.serial(xpad, x, 2, 8, 0.0)  # 2 zeros, 5 steps, 1 zero per sequence, then zeros
    want = np.zeros_like(xpad)
    for b in range(3):
        want[:, b * 8 + 2:b * 8 + 7] = x[b]
    np.testing.assert_array_equal(xpad, want)
    xq = np.arange(30, dtype=np.int8).reshape(3, 2, 5)
    ks.pad_rows.serial(xpad, xq, 2, 8, -5.0)
    want = np.full_like(xpad, -5.0)
    for b in range(3):
        want[:, b * 8 + 2:b * 8 + 7] = xq[b]
    np.testing.assert_array_equal(xpad, want)


def test_conv1d_direct_and_global_max_match_their_twins():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 4, 9)).astype(np.float32)
    w = rng.standard_normal((8, 1, 3)).astype(np.float32)  # a channel multiplier of 2
    b = rng.standard_normal(8).astype(np.float32)
    for bias, (s, pl, d) in ((b, (1, 4, 2)), (np.zeros(0, np.float32), (2, 1, 1))):
        lo = (9 + pl - d * 2 - 1) // s + 1
        out = np.empty((2, 8, lo), np.float32)
        ks.conv1d_direct.serial(out, x, w, bias, s, pl, d, 0, 0.0)
        np.testing.assert_allclose(out, naive_conv1d(x, w, bias, s, pl, d, lo), rtol=1e-5,
                                   atol=1e-5)
    x[1, 2, 4] = np.nan
    got = np.empty((2, 4), np.float32)
    ks.global_maxpool1d.serial(got, x)
    np.testing.assert_array_equal(got, x.max(axis=2))


# --------------------------------------------------------------------------- the engine


def _graph(c, length, nodes, params):
    infos = {k: ValueInfo({np.float32: "f32", np.int8: "i8", np.int32: "i32"}[v.dtype.type],
                          v.shape) for k, v in params.items()}
    g = Graph({"x": ValueInfo("f32", ("N", c, length))}, [nodes[-1].outputs[0]], nodes, infos)
    g.validate()
    return g


def _conv(rng, name, x, c, o, k, groups=1, bias=True, **attrs):
    w = (rng.standard_normal((o, c // groups, k)) / np.sqrt(c // groups * k)).astype(np.float32)
    params = {f"{name}.w": w}
    ins = [x, f"{name}.w"]
    if bias:
        params[f"{name}.b"] = (0.1 * rng.standard_normal(o)).astype(np.float32)
        ins.append(f"{name}.b")
    return Node(name, "conv1d", ins, [f"{name}:y"], dict(attrs, groups=groups)), params


CASES = [
    # (C, L, O, K, attrs)
    (3, 11, 5, 3, {"padding": [2, 0]}),  # causal
    (4, 9, 6, 3, {"padding": [4, 0], "dilation": 2, "activation": "relu"}),
    (4, 10, 4, 2, {"padding": [1, 3], "stride": 2, "groups": 2, "activation": "leaky_relu",
                   "alpha": 0.2}),
    (3, 7, 6, 3, {"padding": [1, 1], "groups": 3, "activation": "gelu"}),  # direct loops
    (5, 6, 2, 1, {"stride": 3}),
    (3, 32, 5, 3, {"padding": [2, 0], "activation": "relu"}),  # whole tiles: GEMM epilogue
]


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_conv1d_engine_matches_reference(case, fp32_route):
    c, length, o, k, attrs = case
    rng = np.random.default_rng(2)
    attrs = dict(attrs)
    groups = attrs.pop("groups", 1)
    node, params = _conv(rng, "c", "x", c, o, k, groups, bias=o != 2, **attrs)
    g = _graph(c, length, [node], params)
    with Engine(FakeContainer(g, params), max_batch=8) as eng:
        for n in (1, 3, 8):
            x = rng.standard_normal((n, c, length)).astype(np.float32)
            want = ref.run(g, params, x)[g.outputs[0]]
            np.testing.assert_allclose(eng.run(x), want, rtol=1e-5, atol=1e-5)
        if fp32_route == "fma" and length % 16 == 0:
            names = [getattr(c.func, "__name__", "") for c in eng._bind(1).calls]
            assert not any("bias_act" in s for s in names), names


def test_conv1d_engine_splits_the_batch_into_chunks(monkeypatch, fp32_route):
    monkeypatch.setattr(lowering_seqconv, "SCRATCH_BYTES", 1000)
    monkeypatch.setattr(lowering_seqconv, "FMA_SCRATCH_BYTES", 1000)
    rng = np.random.default_rng(3)
    node, params = _conv(rng, "c", "x", 3, 4, 3, padding=[2, 0])
    g = _graph(3, 13, [node], params)
    x = rng.standard_normal((5, 3, 13)).astype(np.float32)
    with Engine(FakeContainer(g, params), max_batch=5) as eng:
        assert eng._prep[0]["chunk"] < 5
        assert eng._prep[0].get("fma", False) == (fp32_route == "fma")
        np.testing.assert_allclose(eng.run(x), ref.run(g, params, x)[g.outputs[0]], rtol=1e-5,
                                   atol=1e-5)


def test_pools_engine_matches_reference():
    rng = np.random.default_rng(4)
    nodes = [Node("m", "maxpool1d", ["x"], ["m:y"], {"kernel": 3, "stride": 2, "padding": 1}),
             Node("a", "avgpool1d", ["m:y"], ["a:y"], {"kernel": 3, "stride": 1, "padding": 1,
                                                       "count_include_pad": False}),
             Node("a2", "avgpool1d", ["a:y"], ["a2:y"], {"kernel": 2}),
             Node("g", "global_maxpool1d", ["a2:y"], ["g:y"], {})]
    g = _graph(3, 13, nodes, {})
    g2 = _graph(3, 13, [Node("g", "global_avgpool1d", ["x"], ["g:y"], {})], {})
    for graph in (g, g2):
        with Engine(FakeContainer(graph, {}), max_batch=4) as eng:
            for n in (1, 4):
                x = rng.standard_normal((n, 3, 13)).astype(np.float32)
                want = ref.run(graph, {}, x)[graph.outputs[0]]
                np.testing.assert_allclose(eng.run(x), want, rtol=1e-6, atol=1e-6)


def _int8_tcn_like(rng, c, length, k_big=False):
    from pocket.export.quantize import quantize_graph

    c1, p1 = _conv(rng, "c1", "x", c, 6, 3, padding=[2, 0], activation="relu")
    c2, p2 = _conv(rng, "c2", "c1:y", 6, 4, 2, padding=[2, 0], dilation=2, groups=2)
    nodes = [c1, c2, Node("g", "global_avgpool1d", ["c2:y"], ["g:y"], {})]
    g = _graph(c, length, nodes, {**p1, **p2})
    calib = rng.standard_normal((16, c, length)).astype(np.float32)
    return quantize_graph(g, {**p1, **p2}, calib)


@pytest.mark.parametrize("c", [3, 350])  # 350 * 3 taps: GEMMs in chunks of EXACT_K
def test_int8_conv1d_engine_matches_reference_exactly(c, fp32_route):
    rng = np.random.default_rng(5)
    q = _int8_tcn_like(rng, c, 9)
    assert [r["int8"] for r in q.layers] == [True, True]
    with Engine(FakeContainer(q.graph, q.params, q.quant), max_batch=4) as eng:
        conv = eng.graph.nodes[1]
        assert conv.op == "conv1d" and "y_scale" in conv.attrs
        assert eng._prep[1].get("fma", False) == (fp32_route == "fma" and c == 3)
        if c == 350:
            assert eng._prep[1]["kc"] == 2
        for n in (1, 4):
            x = rng.standard_normal((n, c, 9)).astype(np.float32)
            want = ref.run(q.graph, q.params, x, q.quant)[q.graph.outputs[0]]
            np.testing.assert_array_equal(eng.run(x), want)


@pytest.mark.parametrize("to_int8,relu", [(True, False), (True, True), (False, True)])
def test_requant_one_equals_requant_sum(to_int8, relu):
    """requant_one (one chunk of K, the sum in float64) gives requant_sum's codes bit for bit."""
    from pocket.infer import kernels_int8 as ki

    rng = np.random.default_rng(9)
    n, o, p, cb = 3, 5, 7, 9
    y = rng.integers(-2**23, 2**23, (o, n * cb)).astype(np.float32)  # exact integer sums
    bias_adj = rng.integers(-2**20, 2**20, o).astype(np.int64)
    m = rng.uniform(1e-7, 1e-5, o)
    lo = np.array([-128.0, 127.0, 3.4e38]) if to_int8 else np.array([0.0, 0.0, 50.0])
    dt = np.int8 if to_int8 else np.float32
    want, got = np.empty((n, o, p), dt), np.empty((n, o, p), dt)
    ki.requant_sum.serial(want, y.reshape(1, o, -1), 0, cb, bias_adj, m, to_int8, 3.0, lo, relu)
    for fn in (ks.requant_one, ks.requant_one.serial):
        fn(got, y, cb, bias_adj, m, to_int8, 3.0, lo, relu)
        np.testing.assert_array_equal(got, want)
