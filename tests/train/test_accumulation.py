"""Gradient accumulation as the trainer does it: loss / k over k micro-batches of b/k must
give the gradient of one batch of b. The oracle is the full-batch backward."""

import numpy as np
import pytest

from pocket.train import functional as F
from pocket.train import models, nn
from pocket.train.tensor import Tensor


def _digits_mlp(dtype):
    m = models.mlp((1, 8, 8), 10, hidden=[32, 16], rng=np.random.default_rng(0))
    return _cast(m, dtype)


def _conv_net(dtype):
    rng = np.random.default_rng(0)
    m = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, rng=rng), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(4, 6, 3, rng=rng), nn.Tanh(), nn.Flatten(),
                      nn.Linear(6 * 2 * 2, 10, rng=rng))
    return _cast(m, dtype)


def _cast(model, dtype):
    for p in model.parameters():
        p.data = p.data.astype(dtype)
    return model


def _grads(model, x, y, k, loss_fn):
    model.zero_grad()
    n = len(x) // k
    for i in range(k):
        loss = loss_fn(model(Tensor(x[i * n:(i + 1) * n])), y[i * n:(i + 1) * n])
        (loss * (1.0 / k)).backward()
    return {name: p.grad.copy() for name, p in model.named_parameters()}


def _ce(out, y):
    return F.cross_entropy(out, y)


def _mse(out, y):
    return F.mse_loss(out, Tensor(y))


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 1e-6)])
@pytest.mark.parametrize("build", [_digits_mlp, _conv_net])
@pytest.mark.parametrize("k", [2, 4, 8])
def test_k_micro_batches_equal_one_batch(build, k, dtype, tol):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((32, 1, 8, 8)).astype(dtype)
    y = rng.integers(0, 10, 32)
    model = build(dtype)
    full = _grads(model, x, y, 1, _ce)
    acc = _grads(model, x, y, k, _ce)
    for name, g in full.items():
        assert acc[name].dtype == dtype
        err = np.abs(acc[name] - g).max() / np.abs(g).max()
        assert err <= tol, (name, err)


def test_regression_loss_accumulates_too():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((24, 1, 8, 8))
    y = rng.standard_normal((24, 10))
    model = _digits_mlp(np.float64)
    full, acc = _grads(model, x, y, 1, _mse), _grads(model, x, y, 3, _mse)
    for name, g in full.items():
        np.testing.assert_allclose(acc[name], g, rtol=1e-12, atol=1e-15)


def test_sum_without_dividing_by_k_is_caught():
    """The check above can fail: forgetting the 1/k gives k times the gradient."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 1, 8, 8))
    y = rng.integers(0, 10, 8)
    model = _digits_mlp(np.float64)
    full = _grads(model, x, y, 1, _ce)
    model.zero_grad()
    for i in range(2):
        _ce(model(Tensor(x[i * 4:(i + 1) * 4])), y[i * 4:(i + 1) * 4]).backward()
    g = model[1].weight.grad
    assert np.abs(g - full["1.weight"]).max() / np.abs(full["1.weight"]).max() > 0.5
