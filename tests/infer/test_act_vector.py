"""kernels_fp32's vectorized activations (act_run, exp32) against float64 NumPy formulas
written here: float32 results equal to the formula rounded once (sigmoid and SiLU, on exp32:
within 4 ulp; hardswish and hardsigmoid in float32 steps: within 2), NaN and infinities
included."""

from __future__ import annotations

import numpy as np
import pytest

from pocket.infer import kernels_fp32 as kf

RNG = np.random.default_rng(41)
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 3.0, -3.0, 88.7, -88.7, -103.9, -745.0,
                    800.0, -800.0, 1e-30, -1e-30], np.float32)
X = np.concatenate([RNG.standard_normal(4000).astype(np.float32) * s for s in (0.5, 4, 40, 400)]
                   + [SPECIAL])


def _formula(name, v):
    with np.errstate(over="ignore", invalid="ignore"):
        return {"sigmoid": lambda: 1.0 / (1.0 + np.exp(-v)),
                "silu": lambda: v / (1.0 + np.exp(-v)),
                "hardswish": lambda: v * np.clip(v + 3.0, 0.0, 6.0) / 6.0,
                "hardsigmoid": lambda: np.clip(v + 3.0, 0.0, 6.0) / 6.0,
                "tanh": lambda: np.tanh(v),
                "relu": lambda: np.where(v < 0, 0.0, v)}[name]()


@pytest.mark.parametrize("name", ["sigmoid", "silu", "hardswish", "hardsigmoid", "tanh", "relu"])
def test_unary_equals_the_float64_formula(name):
    out = np.full_like(X, 7.0)
    kf.unary.serial(out, X, kf.ACT[name], 0.0)
    exact = _formula(name, X.astype(np.float64))
    want = exact.astype(np.float32)
    if name in ("sigmoid", "silu"):
        assert np.array_equal(np.isnan(out), np.isnan(want))
        assert np.array_equal(np.isinf(out), np.isinf(want))
        # (float32 exp over- or underflows where the result is below 1e-36)
        ok = np.isfinite(want)
        ulp = np.spacing(np.abs(want[ok])).astype(np.float64)
        assert np.all(np.abs(out[ok] - exact[ok]) <= 4 * ulp + 1e-36)
        return
    if name in ("hardswish", "hardsigmoid"):
        # float32 steps (v + 3, the product, the division by 6): within 2 ulp
        assert np.array_equal(np.isnan(out), np.isnan(want))
        assert np.array_equal(np.isinf(out), np.isinf(want))
        ok = np.isfinite(want)
        ulp = np.spacing(np.abs(want[ok])).astype(np.float64)
        assert np.all(np.abs(out[ok] - exact[ok]) <= 2 * ulp)
        return
    assert np.array_equal(out, want, equal_nan=True)


def test_bias_act_rows_with_bias():
    """The linear epilogue: the bias added in float32 first, then the activation."""
    y = RNG.standard_normal((3, 37)).astype(np.float32) * 5
    b = RNG.standard_normal(37).astype(np.float32)
    out = np.empty_like(y)
    kf.bias_act_rows.serial(out, y, b, kf.ACT["silu"], 0.0)
    exact = _formula("silu", (y + b).astype(np.float64))
    assert np.all(np.abs(out - exact) <= 4 * np.spacing(np.abs(exact).astype(np.float32)))


def test_exp32_relative_error():
    from numba import njit

    @njit
    def run(out, x):
        for i in range(x.shape[0]):
            out[i] = kf.exp32(x[i])

    x = np.concatenate([np.linspace(-86.5, 88.72, 20001), RNG.uniform(-10, 10, 5000)]).astype(np.float32)
    out = np.empty_like(x)
    run(out, x)
    exact = np.exp(x.astype(np.float64))
    assert np.max(np.abs(out - exact) / exact) < 3 * 2.0 ** -24
    edge = np.array([np.nan, np.inf, -np.inf, 89.5], np.float32)
    out = np.empty_like(edge)
    run(out, edge)
    assert np.isnan(out[0]) and out[1] == np.inf and 0 < out[2] < 3e-38 and out[3] == np.inf


@pytest.mark.parametrize("pitch_pad", [0, 2])
def test_bias_act_pitch_planes_and_rows(pitch_pad):
    """The pitch epilogue: at pitch == Wo (a 1x1 conv) one call a plane, else one a row."""
    n, o, ho, wo = 2, 3, 5, 7
    pitch = wo + pitch_pad
    istride = ho * pitch + 3  # each image's columns, then junk up to the next one
    y = RNG.standard_normal((o, n * istride)).astype(np.float32) * 4
    b = RNG.standard_normal(o).astype(np.float32)
    out = np.full((n, o, ho, wo), np.nan, np.float32)
    kf.bias_act_pitch.serial(out, y, pitch, istride, b, kf.ACT["silu"], 0.0)
    rows = np.stack([y[:, i * istride:i * istride + ho * pitch].reshape(o, ho, pitch)[:, :, :wo]
                     for i in range(n)])
    exact = _formula("silu", (rows + b.reshape(1, o, 1, 1)).astype(np.float64))
    assert np.all(np.abs(out - exact) <= 4 * np.spacing(np.abs(exact).astype(np.float32)) + 1e-36)


def test_div6_equals_division():
    """hardswish/hardsigmoid divide by 6 as a multiply and one FMA correction: it must equal
    IEEE division everywhere, exact quotients (ties for the float32 cast), zeros, inf and NaN
    included."""
    from numba import njit

    @njit
    def run(out, p):
        for i in range(p.shape[0]):
            out[i] = kf._div6(p[i])

    rng = np.random.default_rng(7)
    v = np.concatenate([(rng.standard_normal(200_000) * s).astype(np.float32)
                        for s in (1e-3, 1, 4, 1e4, 1e30)]).astype(np.float64)
    t = np.clip(v + 3.0, 0.0, 6.0)
    p = np.concatenate([v * t, t, np.arange(1, 200_001) * 0.375, -np.arange(1, 1000) * 1.5,
                        [np.inf, -np.inf, np.nan, 0.0, -0.0, 5e-324, -5e-324, 1.7e308]])
    out = np.empty_like(p)
    run(out, p)
    want = p / 6.0
    assert np.array_equal(out, want, equal_nan=True)
    assert np.array_equal(np.signbit(out), np.signbit(want))


@pytest.mark.parametrize("name", ["sigmoid", "silu", "hardswish", "hardsigmoid"])
def test_vector_runs_any_start_and_length(name):
    """kernels_actvec's runs (whole steps, then the tail through a block on the stack): an
    element's bytes do not depend on where its run starts or ends, in place or not, the bias
    added first; past a run nothing is written."""
    from pocket.infer import kernels_actvec as kav

    if not kav.AVAILABLE:
        pytest.skip("kernels_actvec needs Numba's JIT")
    act, bo = kf.ACT[name], np.float32(0.375)
    src = np.concatenate([RNG.standard_normal(157).astype(np.float32) * 6, SPECIAL])
    whole = np.empty_like(src)
    kf.act_run(whole, 0, src, 0, src.shape[0], bo, act, 0.0)
    exact = _formula(name, src.astype(np.float64) + np.float64(bo))
    ok = np.isfinite(exact) & (np.abs(exact) > 1e-36)
    ulp = np.spacing(np.abs(exact[ok]).astype(np.float32)).astype(np.float64)
    assert np.all(np.abs(whole[ok] - exact[ok]) <= 4 * ulp)
    assert np.array_equal(np.isnan(whole), np.isnan(exact))
    for start, n in [(0, 1), (3, 31), (5, kav.STEP), (1, kav.STEP + 1), (7, 2 * kav.STEP + 13),
                     (0, src.shape[0]), (40, src.shape[0] - 40)]:
        out = np.full(src.shape[0] + 8, 7.0, np.float32)
        kf.act_run(out, 4, src, start, n, bo, act, 0.0)
        np.testing.assert_array_equal(out[4:4 + n], whole[start:start + n])
        assert np.all(out[:4] == 7.0) and np.all(out[4 + n:] == 7.0)
        inplace = src.copy()
        kf.act_inplace(inplace, start, n, bo, act, 0.0)
        np.testing.assert_array_equal(inplace[start:start + n], whole[start:start + n])
        np.testing.assert_array_equal(np.delete(inplace, np.s_[start:start + n]),
                                      np.delete(src, np.s_[start:start + n]))
