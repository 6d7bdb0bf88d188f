"""The sequence-conv entries of the IR: shape rules, clear errors, the container round trip,
and the reference against torch (float64) and a naive loop where torch is absent."""

import numpy as np
import pytest

from pocket.formats import (
    FormatError,
    Graph,
    ops,
    reference,  # noqa: F401 (registers every op's reference)
)
from pocket.formats import reference_seqconv as ref
from pocket.formats.container import read_container, write_container
from pocket.formats.ir import Node, ValueInfo


def _g(nodes, params, shape=("N", 3, 10), dtype="f32"):
    return Graph({"x": ValueInfo(dtype, shape)}, [nodes[-1].outputs[0]], nodes,
                 {k: ValueInfo("f32", v) for k, v in params.items()})


def _conv(attrs, w=(4, 3, 3), x=("N", 3, 10)):
    return _g([Node("c", "conv1d", ["x", "w"], ["y"], attrs)], {"w": w}, x)


def test_shapes():
    infos = _conv({"padding": [4, 0], "dilation": 2}).validate()
    assert infos["y"].shape == ("N", 4, 10)
    assert _conv({"stride": 3, "padding": [1, 2]}).validate()["y"].shape == ("N", 4, 4)
    assert _conv({"groups": 3}, w=(6, 1, 2)).validate()["y"].shape == ("N", 6, 9)
    pools = [Node("m", "maxpool1d", ["x"], ["m"], {"kernel": 3, "stride": 2, "padding": 1}),
             Node("a", "avgpool1d", ["m"], ["a"], {"kernel": 2}),
             Node("g", "global_maxpool1d", ["a"], ["y"], {})]
    infos = _g(pools, {}).validate()
    assert infos["m"].shape == ("N", 3, 5) and infos["a"].shape == ("N", 3, 2)
    assert infos["y"].shape == ("N", 3)
    assert ops.OPS["conv1d"].attrs["activation"].choices == ops.OPS["conv2d"].attrs[
        "activation"].choices


@pytest.mark.parametrize("attrs,w,x,match", [
    ({}, (4, 3, 3), ("N", 3, 8, 8), r"input must be 3-D \(N, C, L\)"),
    ({}, (4, 3, 3, 3), ("N", 3, 10), "weight must be 3-D"),
    ({"padding": [1]}, (4, 3, 3), ("N", 3, 10), r"padding must be \[left, right\]"),
    ({"groups": 2}, (4, 3, 3), ("N", 3, 10), "divisible by groups"),
    ({}, (4, 3, 11), ("N", 3, 10), "output length would be 0"),
    ({"stride": 0}, (4, 3, 3), ("N", 3, 10), "stride and dilation must be >= 1"),
    ({"activation": "mish"}, (4, 3, 3), ("N", 3, 10), "must be one of"),
])
def test_conv1d_errors_name_the_problem(attrs, w, x, match):
    with pytest.raises(FormatError, match=match):
        _conv(attrs, w, x).validate()


def test_pool_errors():
    with pytest.raises(FormatError, match="at most half the kernel"):
        _g([Node("m", "maxpool1d", ["x"], ["y"], {"kernel": 2, "padding": 2})], {}).validate()
    with pytest.raises(FormatError, match="missing required attribute 'kernel'"):
        _g([Node("m", "avgpool1d", ["x"], ["y"], {})], {}).validate()
    with pytest.raises(FormatError, match="time axis must be a fixed"):
        _g([Node("g", "global_avgpool1d", ["x"], ["y"], {})], {}, ("N", 3, "L")).validate()


def test_container_roundtrip(tmp_path):
    g = _conv({"padding": [2, 0], "activation": "relu"})
    w = np.ones((4, 3, 3), np.float32)
    write_container(tmp_path / "c.bin", kind="model", graph=g, tensors={"w": w})
    with read_container(tmp_path / "c.bin") as c:
        a = c.graph.nodes[0].attrs
        assert c.graph.nodes[0].op == "conv1d"
        assert a["padding"] == [2, 0] and a["activation"] == "relu"
        assert c.graph.validate()["y"].shape == ("N", 4, 10)


def test_reference_matches_torch():
    torch = pytest.importorskip("torch")
    tf = torch.nn.functional
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 9)).astype(np.float32)
    w = rng.standard_normal((6, 2, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    got = ref.conv1d({"padding": [4, 1], "dilation": 2, "stride": 2, "groups": 2,
                      "activation": "relu"}, x, w, b)
    tx, tw, tb = (torch.tensor(a, dtype=torch.float64) for a in (x, w, b))
    want = tf.relu(tf.conv1d(tf.pad(tx, (4, 1)), tw, tb, stride=2, dilation=2, groups=2))
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ref.maxpool1d({"kernel": 3, "stride": 2, "padding": 1}, x),
                               tf.max_pool1d(tx, 3, 2, 1).numpy(), rtol=0, atol=0)
    np.testing.assert_allclose(
        ref.avgpool1d({"kernel": 3, "stride": 2, "padding": 1, "count_include_pad": False}, x),
        tf.avg_pool1d(tx, 3, 2, 1, count_include_pad=False).numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(ref.global_avgpool1d({}, x), tx.mean(2).numpy(), rtol=1e-6)
    np.testing.assert_array_equal(ref.global_maxpool1d({}, x), x.max(axis=2))


def test_int8_reference_is_the_shifted_integer_sum():
    # (x_q - x_zp) * w_q summed exactly, padded steps contributing 0, then scaled per channel
    rng = np.random.default_rng(1)
    xq = rng.integers(-128, 128, (1, 2, 5)).astype(np.int8)
    wq = rng.integers(-127, 128, (3, 2, 2)).astype(np.int8)
    bq = rng.integers(-500, 500, 3).astype(np.int32)
    a = {"padding": [1, 0], "x_scale": 0.5, "x_zero_point": 3}
    ws = np.array([0.01, 0.02, 0.03], np.float32)
    got = ref.conv1d(ops.normalize_attrs(Node("c", "conv1d", [], [], a), "c"), xq, wq, bq,
                     w_scale=ws)
    xs = np.pad(xq.astype(np.int64) - 3, ((0, 0), (0, 0), (1, 0)))
    acc = np.array([[[int((xs[0, :, t:t + 2] * wq[o]).sum()) + bq[o] for t in range(5)]
                     for o in range(3)]])
    want = (acc * (0.5 * ws.astype(np.float64))[None, :, None]).astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-6)
