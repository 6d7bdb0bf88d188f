"""The vectorized float32 erf/erfc (train's kernels_gelu and the engine's kernels_fp32 twins)
against float64 math.erf/math.erfc on a dense grid and the tails, and the fused GELU kernels
against the closed form (float64) and torch."""

from __future__ import annotations

import math

import numpy as np
import pytest
from numba import njit

from pocket.infer import kernels_fp32 as kf
from pocket.train import functional as F
from pocket.train import kernels_gelu as kg
from pocket.train.tensor import Tensor


@njit
def _apply_train(x, out, which):
    for i in range(x.shape[0]):
        out[i] = kg.erf32(x[i]) if which == 0 else kg.erfc32(x[i])


@njit
def _apply_engine(x, out, which):
    for i in range(x.shape[0]):
        out[i] = kf.erf32(x[i]) if which == 0 else kf.erfc32(x[i])


SPECIAL = np.float32([0.0, -0.0, 1e-30, -1e-30, 1e-45, 0.5, -0.5, 1.0, -1.0, 10.0, -10.0,
                      np.inf, -np.inf, np.nan])


@pytest.fixture(scope="module")
def grid():
    x = np.linspace(-12, 12, 600_001, dtype=np.float32)
    return np.concatenate([x, SPECIAL, np.float32(np.random.default_rng(0).standard_normal(20_000))])


def _run(x, which):
    a, b = np.empty_like(x), np.empty_like(x)
    _apply_train(x, a, which)
    _apply_engine(x, b, which)
    np.testing.assert_array_equal(a.view(np.int32), b.view(np.int32))  # the twins agree bit for bit
    return a


def test_erf32_within_a_few_ulp(grid):
    got = _run(grid, 0)
    ref = np.array([math.erf(float(v)) for v in grid])
    fin = np.isfinite(grid)
    ulp = np.spacing(np.abs(ref[fin]).astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(got[fin] - ref[fin]) / ulp) <= 2.5
    sp = _run(SPECIAL, 0)
    np.testing.assert_array_equal(sp[-3:], [1.0, -1.0, np.nan])
    np.testing.assert_array_equal(np.signbit(sp[:2]), [False, True])  # erf(-0) = -0


@pytest.mark.parametrize(("lo", "hi", "rel"), [(-12, 1, 4e-7), (1, 3, 1.2e-6), (3, 9.19, 8e-6)])
def test_erfc32_relative_error(grid, lo, hi, rel):
    got = _run(grid, 1)
    m = np.isfinite(grid) & (grid >= lo) & (grid < hi)
    ref = np.array([math.erfc(float(v)) for v in grid[m]])
    assert np.max(np.abs(got[m] - ref) / ref) <= rel


def test_erfc32_far_tail_and_specials(grid):
    got = _run(grid, 1)
    m = np.isfinite(grid) & (grid > 9.19)
    assert np.all((got[m] >= 0) & (got[m] < 2e-38))
    np.testing.assert_array_equal(_run(SPECIAL, 1)[-3:], [0.0, 2.0, np.nan])


def _gelu64(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def _gelu_grad64(x):
    cdf = 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    return cdf + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def test_gelu_float32_against_float64():
    x64 = np.concatenate([np.linspace(-13, 13, 20_001), [0.0, 1e-20, -1e-20]])
    x = x64.astype(np.float32)
    xr = x.astype(np.float64)
    y = kg.gelu(x.reshape(-1, 3))
    assert y.dtype == np.float32 and y.shape == (20_004 // 3, 3)
    # NOTE: through erfc: 1 + erf(x / sqrt2) cancels in float64 too (half wrong at x = -8.3)
    want = 0.5 * xr * np.vectorize(math.erfc)(-xr / math.sqrt(2))
    rel = np.abs(y.reshape(-1) - want) / np.maximum(np.abs(want), 1e-300)
    assert rel[xr >= -4.2].max() < 2e-6
    big = np.abs(want) > 1e-30  # the far tail: exp's float32 argument -x^2/2 rounds
    assert rel[big].max() < 2e-5
    assert np.max(np.abs(y.reshape(-1)[~big] - want[~big])) < 1e-30
    gy = np.float32(np.random.default_rng(1).standard_normal(x.size))
    gx = kg.gelu_grad(x, gy)
    np.testing.assert_allclose(gx, gy * _gelu_grad64(xr), rtol=1e-5, atol=1e-6)


def test_gelu_float64_keeps_math_erf():
    x = np.random.default_rng(2).standard_normal((5, 7)) * 3
    np.testing.assert_allclose(kg.gelu(x), _gelu64(x), rtol=1e-15, atol=1e-300)
    gy = np.random.default_rng(3).standard_normal((5, 7))
    np.testing.assert_allclose(kg.gelu_grad(x, gy), gy * _gelu_grad64(x), rtol=1e-14, atol=1e-300)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gelu_matches_torch(dtype):
    torch = pytest.importorskip("torch")
    x = (np.random.default_rng(4).standard_normal((6, 33)) * 3).astype(dtype)
    gy = np.random.default_rng(5).standard_normal((6, 33)).astype(dtype)
    t = Tensor(x, requires_grad=True)
    y = F.gelu(t)
    y.backward(gy)
    tx = torch.from_numpy(x.copy()).requires_grad_(True)
    ty = torch.nn.functional.gelu(tx)
    ty.backward(torch.from_numpy(gy))
    # NOTE: torch's float32 GELU is x/2 (1 + erf(x/sqrt2)), which cancels left of 0: its own
    # error there is up to ~6e-8 |x| (5% at x = -4.6), ours follows float64 (the test above)
    tol = {"rtol": 1e-15, "atol": 1e-15} if dtype == np.float64 else {"rtol": 2e-6, "atol": 1e-6}
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), **tol)
    np.testing.assert_allclose(np.asarray(t.grad), tx.grad.numpy(), **tol)


def _gelu_and_grad_naive(x):
    # the twin of kernels_gelu.gelu_forward_grad32/64: math.erf and math.exp an element
    xs = x.reshape(-1).astype(np.float64)
    y = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in xs])
    d = np.array([0.5 * (1 + math.erf(v / math.sqrt(2))) + v * math.exp(-0.5 * v * v)
                  / math.sqrt(2 * math.pi) for v in xs])
    return y.reshape(x.shape), d.reshape(x.shape)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1,), (1, 1), (3, 7), (2, 5, 9)])
def test_gelu_and_grad_against_naive_twin(dtype, shape):
    x = (np.random.default_rng(6).standard_normal(shape) * 4).astype(dtype)
    x.reshape(-1)[0] = -7.5  # deep in the left tail, where 1 + erf cancels in float32
    y, d = kg.gelu_and_grad(x)
    assert y.shape == d.shape == x.shape and y.dtype == d.dtype == dtype
    want_y, want_d = _gelu_and_grad_naive(x)
    tol = {"rtol": 1e-14, "atol": 1e-300} if dtype == np.float64 else {"rtol": 2e-6, "atol": 1e-7}
    np.testing.assert_allclose(d, want_d, **tol)
    big = np.abs(want_y) > 1e-6  # float64's own 1 + erf cancels in the far left tail
    np.testing.assert_allclose(y[big], want_y[big], **tol)
    # one pass gives the same values as the separate forward and backward kernels
    np.testing.assert_array_equal(y, kg.gelu(x))
    np.testing.assert_array_equal(d, kg.gelu_grad(x, np.ones_like(x)))


def test_gelu_saves_its_derivative_not_its_input():
    x = np.random.default_rng(7).standard_normal((4, 6)).astype(np.float32)
    t = Tensor(x, requires_grad=True)
    y = F.gelu(t)
    (saved,) = y.saved_arrays()
    np.testing.assert_array_equal(saved, kg.gelu_grad(x, np.ones_like(x)))
    gy = np.random.default_rng(8).standard_normal(x.shape).astype(np.float32)
    y.backward(gy)
    np.testing.assert_allclose(np.asarray(t.grad), gy * _gelu_grad64(x.astype(np.float64)),
                               rtol=1e-5, atol=1e-6)
