"""The sequence ops' schemas (shape rules, clear errors) and references, the latter against
torch.nn.functional in float64 (skipped without torch) and against written-out formulas."""

import numpy as np
import pytest

from pocket.formats import reference_seqattn as R
from pocket.formats.errors import FormatError
from pocket.formats.ir import Graph, Node, ValueInfo


@pytest.fixture
def rng():
    return np.random.default_rng(24)


def _infer(op, shapes, attrs=None, dtypes=None):
    """The output info of one `op` node; its first input (and every input of attention) is
    a graph input with a batch dim, the others params."""
    dtypes = dtypes or ["f32"] * len(shapes)
    batched = len(shapes) if op == "attention" else 1
    ins = {f"i{k}": ValueInfo(d, ("N", *s) if k < batched else tuple(s))
           for k, (s, d) in enumerate(zip(shapes, dtypes))}
    names = list(ins)
    g = Graph({k: ins[k] for k in names[:batched]}, ["y"],
              [Node("n", op, names, ["y"], attrs or {})],
              {k: ins[k] for k in names[batched:]})
    return g.validate()["y"]


def test_shape_rules():
    assert _infer("layernorm", [(5, 4), (4,), (4,)]).shape == ("N", 5, 4)
    assert _infer("layernorm", [(5, 4), (5, 4), (5, 4)], {"axis": -2}).shape == ("N", 5, 4)
    assert _infer("embedding", [(7,), (11, 3)], dtypes=["i64", "f32"]).shape == ("N", 7, 3)
    assert _infer("embedding", [(7,), (11, 3)], dtypes=["i32", "f32"]).dtype == "f32"
    assert _infer("matmul", [(2, 3, 4), (4, 5)]).shape == ("N", 2, 3, 5)
    assert _infer("transpose", [(2, 3, 4)], {"perm": [0, 3, 1, 2]}).shape == ("N", 4, 2, 3)
    assert _infer("attention", [(2, 5, 4), (2, 7, 4), (2, 7, 3)]).shape == ("N", 2, 5, 3)
    assert _infer("linear", [(6, 5), (3, 5), (3,)]).shape == ("N", 6, 3)


@pytest.mark.parametrize("op,shapes,attrs,dtypes,msg", [
    ("layernorm", [(5, 4), (5,), (5,)], {}, None, r"shape \[4\]"),
    ("layernorm", [(5, 4), (5, 4), (5, 4)], {"axis": 0}, None, "batch axis"),
    ("embedding", [(7,), (11, 3)], {}, None, "must be i64 or i32"),
    ("matmul", [(3, 4), (5, 2)], {}, None, "inner dims"),
    ("transpose", [(2, 3)], {"perm": [1, 0, 2]}, None, "batch axis first"),
    ("transpose", [(2, 3)], {"perm": [0, 1]}, None, "permutation"),
    ("attention", [(2, 5, 4), (2, 7, 3), (2, 7, 3)], {}, None, "share D"),
    ("attention", [(2, 5, 4), (2, 7, 4), (2, 6, 4)], {}, None, "share the length"),
    ("attention", [(5, 4), (5, 4), (5, 4)], {}, None, "4-D"),
    ("attention", [(2, 5, 4), (3, 5, 4), (3, 5, 4)], {}, None, "number of heads"),
    ("linear", [(6, 5), (3, 4)], {}, None, "features"),
])
def test_shape_errors(op, shapes, attrs, dtypes, msg):
    with pytest.raises(FormatError, match=msg):
        _infer(op, shapes, attrs, dtypes)


def test_int8_linear_over_leading_dims():
    """An int8 linear takes (N, ..., in) like an fp32 one (issue 24); (N,) is no linear input."""
    q = {"x_scale": 0.1, "x_zero_point": 0}
    y = _infer("linear", [(6, 5), (3, 5)], {**q, "y_scale": 0.2, "y_zero_point": 1}, ["i8", "i8"])
    assert (y.dtype, y.shape) == ("i8", ("N", 6, 3))
    assert _infer("linear", [(2, 6, 5), (3, 5)], q, ["i8", "i8"]).shape == ("N", 2, 6, 3)
    with pytest.raises(FormatError, match=r"\(N, \.\.\., features\)"):
        _infer("linear", [(), (3, 5)], q, ["i8", "i8"])


def test_embedding_reference_rejects_out_of_range():
    w = np.arange(6, dtype=np.float32).reshape(3, 2)
    np.testing.assert_array_equal(R.embedding({}, np.array([[2, 0]]), w), [[[4, 5], [0, 1]]])
    for bad in (3, -1):
        with pytest.raises(FormatError, match=f"id {bad} is outside"):
            R.embedding({}, np.array([[0, bad]]), w)


def test_attention_reference_by_hand():
    # one head, two keys: the weights are a two-way softmax of the scaled dot products
    q = np.array([[[[1.0, 0.0]]]])
    k = np.array([[[[1.0, 0.0], [0.0, 2.0]]]])
    v = np.array([[[[1.0], [3.0]]]])
    p1 = 1 / (1 + np.exp(-1 / np.sqrt(2)))  # softmax([1/sqrt2, 0])[0]
    got = R.attention({}, q, k, v)
    np.testing.assert_allclose(got, [[[[p1 + 3 * (1 - p1)]]]], rtol=1e-6)
    # causal: the first query sees the first key only
    q2 = np.concatenate([q, q], axis=2)
    got = R.attention({"causal": True}, q2, k, v)
    np.testing.assert_allclose(got[0, 0, :, 0], [1.0, p1 + 3 * (1 - p1)], rtol=1e-6)


def test_references_match_torch(rng):
    torch = pytest.importorskip("torch")
    f = torch.nn.functional
    x = rng.standard_normal((2, 5, 6)) * 2
    w, b = rng.standard_normal((2, 5, 6))
    want = f.layer_norm(torch.tensor(x), (5, 6), torch.tensor(w), torch.tensor(b), 1e-5).numpy()
    np.testing.assert_allclose(R.layernorm({"axis": -2, "eps": 1e-5}, x, w, b), want,
                               atol=1e-6)
    q, k, v = (rng.standard_normal((2, 3, 4, 5)) for _ in range(3))
    for causal in (False, True):
        want = f.scaled_dot_product_attention(*map(torch.tensor, (q, k, v)), is_causal=causal,
                                              scale=0.3).numpy()
        np.testing.assert_allclose(R.attention({"causal": causal, "scale": 0.3}, q, k, v), want,
                                   atol=1e-6)
