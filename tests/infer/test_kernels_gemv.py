"""The portable matrix-vector kernel (kernels_gemv) against float64 NumPy: outputs past a
multiple of ROWS, short and long K, batches, every activation kind (ReLU on the sums, the
others after), no bias, and the parallel kernel giving the serial one's bytes."""

from __future__ import annotations

import numpy as np
import pytest
from test_kernels_pw import _naive_act

from pocket.infer import kernels_fp32 as kf
from pocket.infer import kernels_gemv as kg

RNG = np.random.default_rng(11)
ACTS = {"none": 0.0, "relu": 0.0, "clip": 6.0, "silu": 0.0, "hardswish": 0.0, "leaky_relu": 0.1}
# (N, O, K)
SHAPES = [(1, 1, 1), (1, 8, 16), (1, kg.ROWS + 5, 7), (2, 3 * kg.ROWS, 144), (3, 37, 1000)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("act", ACTS)
def test_gemv_matches_a_float64_product(shape, act):
    n, o, k = shape
    w = RNG.standard_normal((o, k)).astype(np.float32)
    x = RNG.standard_normal((n, k)).astype(np.float32)
    b = RNG.standard_normal(o).astype(np.float32)
    y = np.full((n, o), np.nan, np.float32)
    kg.gemv.serial(y, w, x, b, kf.ACT[act], ACTS[act])
    w64, x64 = w.astype(np.float64), x.astype(np.float64)
    pre = x64 @ w64.T + b
    # float32 sums in any order: within K ulps of the sum of magnitudes; the activations'
    # slopes are at most ~1.1
    bound = k * 2.0 ** -24 * (np.abs(x64) @ np.abs(w64).T + np.abs(b)) + 1e-7
    assert np.all(np.abs(y - _naive_act(pre, act, ACTS[act])) <= 1.2 * bound + 2e-7 * np.abs(pre))
    par = np.full_like(y, np.nan)
    kg.gemv(par, w, x, b, kf.ACT[act], ACTS[act])
    assert np.array_equal(par, y, equal_nan=True)


def test_gemv_without_bias():
    w = RNG.standard_normal((70, 33)).astype(np.float32)
    x = RNG.standard_normal((1, 33)).astype(np.float32)
    y = np.full((1, 70), np.nan, np.float32)
    kg.gemv.serial(y, w, x, np.empty(0, np.float32), kf.ACT["relu"], 0.0)
    want = np.maximum(x.astype(np.float64) @ w.astype(np.float64).T, 0.0)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
