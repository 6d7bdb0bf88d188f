"""The vision ops in train: clip (relu6), silu, broadcast mul, channel_shuffle and slice, forward
against naive definitions and PyTorch (float64), backward against float64 finite differences,
the layers, the layer list and the tracer."""

from __future__ import annotations

import numpy as np
import pytest

from pocket.formats import ops
from pocket.train import functional as F
from pocket.train import functional_vision as FV
from pocket.train import nn
from pocket.train.gradcheck import gradcheck
from pocket.train.models import ModelError, build_model
from pocket.train.tensor import Tensor, no_grad
from pocket.train.trace import Builder, register_module, trace, trace_module


def _points(rng, n=200) -> np.ndarray:
    # both sides of relu6's kinks, the kinks themselves, saturated tails
    return np.concatenate([rng.uniform(-8, 8, n), [0.0, 6.0, -0.5, 6.5, 1e4, -1e4, -1.0, 1.0]])


def _naive_clip(v: float, lo: float, hi: float) -> float:
    return lo if v < lo else (hi if v > hi else v)


def _naive_silu(v: float) -> float:
    return v / (1.0 + np.exp(-v)) if v > -700 else 0.0


def _naive_shuffle(x: np.ndarray, g: int) -> np.ndarray:
    n, c, h, w = x.shape
    out = np.empty_like(x)
    for j in range(c):  # output channel j = i * g + k reads input channel k * (c / g) + i
        i, k = divmod(j, g)
        out[:, j] = x[:, k * (c // g) + i]
    return out


def test_forward_matches_the_definitions(xp, rng):
    x = _points(rng)
    for lo, hi in ((0.0, 6.0), (-1.5, 0.25)):
        got = FV.clip(Tensor(xp.asarray(x)), lo, hi).numpy()
        np.testing.assert_array_equal(got, [_naive_clip(float(v), lo, hi) for v in x])
    np.testing.assert_array_equal(FV.relu6(Tensor(xp.asarray(x))).numpy(),
                                  [_naive_clip(float(v), 0.0, 6.0) for v in x])
    for dtype, tol in ((np.float64, 1e-15), (np.float32, 3e-7)):
        got = FV.silu(Tensor(xp.asarray(x.astype(dtype))))
        assert got.dtype == dtype
        np.testing.assert_allclose(got.numpy(), [_naive_silu(float(v)) for v in x], rtol=tol,
                                   atol=tol)
    a = rng.standard_normal((2, 6, 3, 5))
    for g in (1, 2, 3, 6):
        np.testing.assert_array_equal(FV.channel_shuffle(Tensor(xp.asarray(a)), g).numpy(),
                                      _naive_shuffle(a, g))
    np.testing.assert_array_equal(FV.slice(Tensor(xp.asarray(a)), 1, 2, 5).numpy(), a[:, 2:5])
    np.testing.assert_array_equal(FV.slice(Tensor(xp.asarray(a)), -1, 0, 1).numpy(), a[..., :1])


def test_nan_propagates():
    x = Tensor(np.array([np.nan, 7.0, -1.0], np.float32))
    for y in (FV.relu6(x), FV.clip(x, -0.5, 0.5), FV.silu(x)):
        assert np.isnan(y.numpy()[0]) and not np.isnan(y.numpy()[1:]).any()


def test_matches_torch_float64(rng):
    torch = pytest.importorskip("torch")
    tf = torch.nn.functional
    x = _points(rng)
    gy = rng.standard_normal(x.shape)
    cases = [(lambda t: tf.relu6(t), FV.relu6), (lambda t: tf.hardtanh(t, -1.0, 1.0),
                                                 lambda t: FV.clip(t, -1.0, 1.0)),
             (lambda t: tf.silu(t), FV.silu)]
    for tfn, fn in cases:
        tx = torch.tensor(x, requires_grad=True)
        ty = tfn(tx)
        ty.backward(torch.tensor(gy))
        px = Tensor(x.copy(), requires_grad=True)
        py = fn(px)
        (py * Tensor(gy)).sum().backward()
        np.testing.assert_allclose(py.numpy(), ty.detach().numpy(), rtol=1e-14, atol=1e-300)
        np.testing.assert_allclose(px.grad, tx.grad.numpy(), rtol=1e-12, atol=1e-300)
    # broadcast mul (squeeze-and-excitation), shuffle and slice, forward and backward
    a, s = rng.standard_normal((2, 6, 3, 5)), rng.standard_normal((2, 6, 1, 1))
    g = rng.standard_normal((2, 6, 3, 5))
    ta, ts = torch.tensor(a, requires_grad=True), torch.tensor(s, requires_grad=True)
    (tf.channel_shuffle(ta * ts, 3)[:, 1:4] * torch.tensor(g[:, 1:4])).sum().backward()
    pa, ps = Tensor(a.copy(), requires_grad=True), Tensor(s.copy(), requires_grad=True)
    (FV.slice(FV.channel_shuffle(F.mul(pa, ps), 3), 1, 1, 4) * Tensor(g[:, 1:4])).sum().backward()
    np.testing.assert_allclose(pa.grad, ta.grad.numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(ps.grad, ts.grad.numpy(), rtol=1e-12, atol=1e-14)


def test_gradchecks(xp, rng):
    x = rng.uniform(-3, 9, (3, 7))
    x[np.abs(x) < 1e-2] += 0.05  # finite differences straddling a kink lie
    x[np.abs(x - 6) < 1e-2] += 0.05
    gradcheck(FV.relu6, [xp.asarray(x)])
    gradcheck(lambda t: FV.clip(t, -1.0, 2.5), [xp.asarray(x)])
    gradcheck(FV.silu, [xp.asarray(rng.uniform(-6, 6, (4, 5)))])
    gradcheck(F.mul, [xp.asarray(rng.standard_normal((2, 4, 3, 5))),
                      xp.asarray(rng.standard_normal((2, 4, 1, 1)))])
    gradcheck(lambda t: FV.channel_shuffle(t, 2), [xp.asarray(rng.standard_normal((2, 6, 1, 3)))])
    gradcheck(lambda t: FV.slice(t, 1, 1, 3), [xp.asarray(rng.standard_normal((2, 4, 3, 2)))])
    gradcheck(lambda t: FV.slice(t, 3, 0, 1), [xp.asarray(rng.standard_normal((1, 2, 3, 2)))])


def test_bad_arguments():
    x = Tensor(np.zeros((1, 6, 2, 2), np.float32))
    with pytest.raises(ValueError, match="not divisible by groups 4"):
        FV.channel_shuffle(x, 4)
    with pytest.raises(ValueError, match="non-batch axis"):
        FV.slice(x, 0, 0, 1)
    with pytest.raises(ValueError, match="0 <= start < end <= 6"):
        FV.slice(x, 1, 3, 7)
    with pytest.raises(ValueError, match="min .* at most max"):
        nn.Clip(2.0, 1.0)
    with pytest.raises(ValueError, match="groups must be a positive integer"):
        nn.ChannelShuffle(0)


def test_registry_names_these_implementations():
    for name in ("clip", "silu", "mul", "channel_shuffle", "slice"):
        assert "train" in ops.OPS[name].impls, name
    assert "trace" in ops.OPS["channel_shuffle"].impls and "trace" in ops.OPS["slice"].impls
    assert nn.ELEMENTWISE["clip"] is nn.Clip and nn.ELEMENTWISE["silu"] is nn.SiLU
    assert isinstance(nn.ReLU6(), nn.Clip) and nn.ReLU6().ir_attrs() == {"min": 0.0, "max": 6.0}


def test_layer_list_trace_and_reference_agree(rng):
    from pocket.formats import reference

    layers = [{"type": "conv2d", "out": 6, "kernel": 3, "padding": 1}, {"type": "relu6"},
              {"type": "channel_shuffle", "groups": 3}, {"type": "slice", "start": 1, "end": 5},
              {"type": "clip", "min": -0.5, "max": 0.75}, {"type": "silu"},
              {"type": "slice", "axis": 3, "start": 0, "end": 3}, {"type": "flatten"},
              {"type": "linear"}]
    model = build_model({"layers": layers}, (2, 5, 4), 3, rng).eval()
    assert isinstance(model[1], nn.ReLU6) and isinstance(model[4], nn.Clip)
    graph, params = trace(model, (2, 5, 4))
    assert [n.op for n in graph.nodes] == ["conv2d", "clip", "channel_shuffle", "slice", "clip",
                                           "silu", "slice", "flatten", "linear"]
    assert graph.nodes[6].attrs == {"axis": 3, "start": 0, "end": 3}
    x = rng.normal(0, 2, (3, 2, 5, 4)).astype(np.float32)
    with no_grad():
        want = model(Tensor(x)).numpy()
    got = reference.run(graph, params, x)["output"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("spec, match", [
    ({"type": "channel_shuffle", "groups": 4}, "not divisible by groups 4"),
    ({"type": "channel_shuffle"}, "give 'groups'"),
    ({"type": "slice", "start": 0, "end": 9}, "past the size 6 of axis 1"),
    ({"type": "slice", "axis": 0, "start": 0, "end": 1}, "0 is the batch"),
    ({"type": "relu6", "max": 3}, r"unknown key\(s\) max"),
])
def test_layer_list_errors(spec, match):
    with pytest.raises(ModelError, match=match):
        build_model({"layers": [spec]}, (6, 3, 3), 2, np.random.default_rng(0))


class _SE(nn.Module):
    """A squeeze-and-excitation gate as a user writes one: x * hardsigmoid(fc2(relu(fc1(gap))))."""

    def __init__(self, c, r, rng):
        super().__init__()
        self.pool = nn.GlobalAvgPool2d()
        self.fc1 = nn.Conv2d(c, r, 1, rng=rng)
        self.relu = nn.ReLU()
        self.fc2 = nn.Conv2d(r, c, 1, rng=rng)
        self.gate = nn.Hardsigmoid()
        self.mul = nn.Mul()

    def forward(self, x):
        return self.mul(x, self.gate(self.fc2(self.relu(self.fc1(self.pool(x))))))


@register_module(_SE)
def _trace_se(b: Builder, m, prefix, x):
    s = x
    for name in ("pool", "fc1", "relu", "fc2", "gate"):
        s = trace_module(b, getattr(m, name), f"{prefix}.{name}", s)
    return b.node(f"{prefix}.mul", "mul", [x, s])


def test_mul_traces_as_a_merge(rng):
    from pocket.formats import reference

    model = nn.Sequential(nn.Conv2d(3, 4, 3, rng=rng), _SE(4, 2, rng), nn.SiLU()).eval()
    graph, params = trace(model, (3, 6, 5))
    assert [n.op for n in graph.nodes] == ["conv2d", "global_avgpool", "conv2d", "relu", "conv2d",
                                           "hardsigmoid", "mul", "silu"]
    x = rng.standard_normal((2, 3, 6, 5)).astype(np.float32)
    with no_grad():
        want = model(Tensor(x)).numpy()
    np.testing.assert_allclose(reference.run(graph, params, x)["output"], want, rtol=1e-5,
                               atol=1e-6)
