"""The sequence kernels (kernels_seqattn) against their naive twins in
formats/reference_seqattn.py on odd shapes, and the engine on graphs of the sequence ops:
batch 1 and batched, causal, integer token input, a bad token id."""

import numpy as np
import pytest

from pocket.formats import reference_seqattn as R
from pocket.formats.container import write_container
from pocket.formats.ir import Graph, Node, ValueInfo
from pocket.infer import kernels_seqattn as ks
from pocket.infer.engine import Engine, EngineError


@pytest.fixture
def rng():
    return np.random.default_rng(24)


@pytest.fixture(params=["parallel", "serial"])
def twin(request):
    return (lambda k: k) if request.param == "parallel" else (lambda k: k.serial)


@pytest.mark.parametrize("rows,d", [(1, 1), (3, 7), (5, 1), (2, 33)])
def test_layernorm_kernel(rng, twin, rows, d):
    x = (rng.standard_normal((rows, d)) * 3 + 2).astype(np.float32)
    w, b = rng.standard_normal((2, d)).astype(np.float32)
    out = np.empty_like(x)
    twin(ks.layernorm)(out, x, w, b, 1e-5)
    np.testing.assert_allclose(out, R.layernorm({"eps": 1e-5}, x, w, b), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("r,lq,ls", [(1, 1, 1), (6, 3, 5), (8, 4, 2), (7, 7, 7)])
def test_attention_probs_kernel(rng, twin, causal, r, lq, ls):
    s = (rng.standard_normal((r, ls)) * 4).astype(np.float32)
    want = s.astype(np.float64) * 0.7
    if causal:  # row r is query r % lq: it sees keys j <= r % lq
        want[np.arange(ls)[None, :] > (np.arange(r) % lq)[:, None]] = -np.inf
    want = np.exp(want - want.max(axis=1, keepdims=True))
    want /= want.sum(axis=1, keepdims=True)
    twin(ks.attention_probs)(s, 0.7, causal, lq)
    np.testing.assert_allclose(s, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n,h,lq,ls,d,dv", [(1, 1, 1, 1, 1, 1), (1, 3, 5, 5, 4, 4),
                                            (2, 2, 3, 7, 5, 2), (3, 1, 6, 4, 3, 5)])
def test_engine_attention(tmp_path, rng, causal, n, h, lq, ls, d, dv):
    """The engine's attention (GEMM, attention_probs, GEMM) against the reference, batch 1
    and batched, causal, L != S, odd D."""
    shapes = {"q": (h, lq, d), "k": (h, ls, d), "v": (h, ls, dv)}
    g = Graph({k: ValueInfo("f32", ("N", *s)) for k, s in shapes.items()}, ["y"],
              [Node("att", "attention", ["q", "k", "v"], ["y"], {"causal": causal, "scale": 0.6})],
              {})
    g.validate()
    xs = {k: rng.standard_normal((n, *s)).astype(np.float32) for k, s in shapes.items()}
    want = R.attention({"causal": causal, "scale": 0.6}, *xs.values())
    e = _engine(tmp_path, g, {})
    np.testing.assert_allclose(e.run_all(xs)["y"], want, rtol=1e-5, atol=2e-6)
    first = {k: x[:1] for k, x in xs.items()}
    np.testing.assert_allclose(e.run_all(first)["y"], want[:1], rtol=1e-5, atol=2e-6)
    e.close()


def test_gather_rows_reports_a_bad_id(rng):
    w = rng.standard_normal((4, 3)).astype(np.float32)
    out = np.empty((3, 3), np.float32)
    assert ks.gather_rows(out, np.array([3, 0, 1]), w) == -1
    np.testing.assert_array_equal(out, w[[3, 0, 1]])
    assert ks.gather_rows(out, np.array([1, 4, 0], np.int32), w) == 1
    assert ks.gather_rows(out, np.array([-1]), w) == 0


# --------------------------------------------------------------------------- whole graphs


def _p(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _attention_graph(rng, *, vocab=0, causal=False):
    """(N, 6) ids or (N, 6, 5) features -> a one-head-pair attention block -> (N, 6, 4)."""
    L, E, H = 6, 4, 2
    p = {"emb": _p(rng, 7, E), "w_in": _p(rng, E, 5), "wq": _p(rng, E, E), "bq": _p(rng, E),
         "wk": _p(rng, E, E), "wv": _p(rng, E, E), "ln_w": _p(rng, E), "ln_b": _p(rng, E),
         "m": _p(rng, E, E)}
    nodes = [Node("stem", "embedding", ["x", "emb"], ["t"], {}) if vocab else
             Node("stem", "linear", ["x", "w_in"], ["t"], {"activation": "gelu"})]
    for name in "qkv":
        ins = ["t", f"w{name}"] + (["bq"] if name == "q" else [])
        nodes += [Node(f"{name}", "linear", ins, [f"{name}0"], {}),
                  Node(f"{name}s", "reshape", [f"{name}0"], [f"{name}1"], {"shape": [L, H, E // H]}),
                  Node(f"{name}t", "transpose", [f"{name}1"], [f"{name}2"], {"perm": [0, 2, 1, 3]})]
    nodes += [Node("att", "attention", ["q2", "k2", "v2"], ["a"], {"causal": causal}),
              Node("merge", "transpose", ["a"], ["a1"], {"perm": [0, 2, 1, 3]}),
              Node("cat", "reshape", ["a1"], ["a2"], {"shape": [L, E]}),
              Node("ln", "layernorm", ["a2", "ln_w", "ln_b"], ["l"], {"eps": 1e-5}),
              Node("mm", "matmul", ["l", "m"], ["y"], {})]
    x = ValueInfo("i64", ("N", L)) if vocab else ValueInfo("f32", ("N", L, 5))
    params = {k: v for k, v in p.items() if not (k == "emb" and not vocab)
              and not (k == "w_in" and vocab)}
    g = Graph({"x": x}, ["y"], nodes, {k: ValueInfo("f32", v.shape) for k, v in params.items()})
    g.validate()
    return g, params


def _engine(tmp_path, g, params):
    path = tmp_path / "m.bin"
    write_container(path, kind="model", tensors=params, graph=g)
    return Engine(path)


@pytest.mark.parametrize("causal", [False, True])
def test_engine_runs_an_attention_block(tmp_path, rng, causal):
    from pocket.formats import reference

    g, params = _attention_graph(rng, causal=causal)
    e = _engine(tmp_path, g, params)
    x = _p(rng, 3, 6, 5)
    want = reference.run(g, params, x)["y"]
    np.testing.assert_allclose(e.run(x), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(e.run(x[1:2]), want[1:2], rtol=1e-5, atol=1e-5)
    e.close()


def test_engine_takes_token_ids_and_rejects_bad_ones(tmp_path, rng):
    from pocket.formats import reference

    g, params = _attention_graph(rng, vocab=7)
    e = _engine(tmp_path, g, params)
    assert e.input_dtype == np.int64
    ids = rng.integers(0, 7, (2, 6))
    want = reference.run(g, params, ids)["y"]
    np.testing.assert_allclose(e.run(ids), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(e.run(ids.astype(np.int32)), want, rtol=1e-5, atol=1e-5)
    bad = ids.copy()
    bad[1, 3] = 7
    with pytest.raises(EngineError, match="embedding id 7 is outside"):
        e.run(bad)
    with pytest.raises(EngineError, match="must be int64"):
        e.run(ids.astype(np.float32))
    e.close()
