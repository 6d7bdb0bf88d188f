"""hardswish and hardsigmoid in train: forward against PyTorch's definitions, backward against
float64 finite differences, the layers, the layer list and the tracer."""

from __future__ import annotations

import numpy as np
import pytest

from pocket.formats import reference
from pocket.train import functional as F
from pocket.train import nn
from pocket.train.gradcheck import gradcheck
from pocket.train.models import build_model
from pocket.train.tensor import Tensor, no_grad
from pocket.train.trace import trace


def _hardswish(v: float) -> float:  # PyTorch's docs: x * ReLU6(x + 3) / 6
    return v * min(max(v + 3.0, 0.0), 6.0) / 6.0


def _hardsigmoid(v: float) -> float:  # ReLU6(x + 3) / 6
    return min(max(v + 3.0, 0.0), 6.0) / 6.0


NAIVE = {"hardswish": _hardswish, "hardsigmoid": _hardsigmoid}
FN = {"hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid}


def _points(rng, n=301) -> np.ndarray:
    # Both sides of each kink and the kinks themselves, plus the saturated tails.
    return np.concatenate([rng.uniform(-8, 8, n), [-3.0, 3.0, 0.0, -3.5, 3.5, -1.5, 1e4, -1e4]])


@pytest.mark.parametrize("name", sorted(NAIVE))
def test_forward_matches_the_definition(xp, rng, name):
    x = _points(rng)
    want = np.array([NAIVE[name](float(v)) for v in x])
    for dtype, tol in ((np.float64, 1e-15), (np.float32, 2e-7)):
        got = FN[name](Tensor(xp.asarray(x.astype(dtype))))
        assert got.dtype == dtype
        np.testing.assert_allclose(np.asarray(got.numpy()), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", sorted(NAIVE))
def test_matches_torch(rng, name):
    torch = pytest.importorskip("torch")
    x = _points(rng).astype(np.float32)
    tx = torch.tensor(x, requires_grad=True)
    ty = getattr(torch.nn.functional, name)(tx)
    gy = rng.standard_normal(x.shape).astype(np.float32)
    ty.backward(torch.tensor(gy))
    px = Tensor(x, requires_grad=True)
    py = FN[name](px)
    (py * Tensor(gy)).sum().backward()
    np.testing.assert_allclose(py.numpy(), ty.detach().numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(px.grad, tx.grad.numpy(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", sorted(NAIVE))
def test_gradcheck_away_from_the_kinks(xp, rng, name):
    x = rng.uniform(-5, 5, (4, 37))
    x[np.abs(np.abs(x) - 3) < 1e-2] += 0.05  # finite differences straddling a kink lie
    gradcheck(lambda a: FN[name](a), [xp.asarray(x)])


@pytest.mark.parametrize("name", sorted(NAIVE))
def test_nan_propagates(name):
    y = FN[name](Tensor(np.array([np.nan, 1.0], np.float32)))
    assert np.isnan(y.numpy()[0]) and not np.isnan(y.numpy()[1])


def test_layer_list_trace_and_reference_agree(rng):
    layers = [{"type": "conv2d", "out": 4, "kernel": 3, "padding": 1}, {"type": "hardswish"},
              {"type": "maxpool2d", "kernel": 2}, {"type": "hardsigmoid"}, {"type": "flatten"},
              {"type": "linear", "out": 6}, {"type": "hardswish"}, {"type": "linear"},
              {"type": "hardsigmoid"}]
    model = build_model({"layers": layers}, (2, 6, 6), 3, rng).eval()
    assert isinstance(model[1], nn.Hardswish) and isinstance(model[3], nn.Hardsigmoid)
    graph, params = trace(model, (2, 6, 6))
    assert [n.op for n in graph.nodes] == ["conv2d", "hardswish", "maxpool2d", "hardsigmoid",
                                           "flatten", "linear", "hardswish", "linear",
                                           "hardsigmoid"]
    x = rng.normal(0, 2, (5, 2, 6, 6)).astype(np.float32)
    with no_grad():
        want = model(Tensor(x)).numpy()
    got = reference.run(graph, params, x)["output"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_layer_list_refuses_attrs():
    from pocket.train.models import ModelError

    with pytest.raises(ModelError, match=r"layers\[0\] \(hardswish\): unknown key\(s\) alpha"):
        build_model({"layers": [{"type": "hardswish", "alpha": 1}]}, (3,), 2,
                    np.random.default_rng(0))
