"""The engine's vectorized GELU (act_run on erfc32) against float64 math.erfc, NaN and
infinities included, in unary and in a linear's bias epilogue; and the sequence models' fast
kernels (kernels_seqattn: rows_bias_act, linear_rows_small, swap_mid, swap_last) against
NumPy."""

from __future__ import annotations

import math

import numpy as np

from pocket.infer import kernels_fp32 as kf

RNG = np.random.default_rng(43)
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30, 40.0, -40.0], np.float32)
X = np.concatenate([RNG.standard_normal(6000).astype(np.float32) * s for s in (0.5, 3, 30)]
                   + [np.linspace(-13, 13, 4001, dtype=np.float32), SPECIAL])


def _gelu64(v):
    # through erfc: 1 + erf(v / sqrt2) cancels left of 0, in float64 too; GELU(-inf) is NaN
    # (-inf * 0), as in formats/reference.py
    with np.errstate(invalid="ignore"):
        return 0.5 * v * np.array([math.erfc(-t / math.sqrt(2)) if t == t else np.nan for t in v])


def _check(out, x):
    exact = _gelu64(x.astype(np.float64))
    assert np.array_equal(np.isnan(out), np.isnan(exact))
    ok = np.isfinite(exact)
    assert np.array_equal(out[~ok], exact[~ok].astype(np.float32), equal_nan=True)
    rel = np.abs(out[ok] - exact[ok]) / np.maximum(np.abs(exact[ok]), 1e-300)
    near = x[ok] >= -4.2
    assert rel[near].max(initial=0) < 2e-6  # a few ulp on the right, erfc's 1.2e-6 on the left
    tail = ~near & (np.abs(exact[ok]) > 1e-30)
    assert rel[tail].max(initial=0) < 2e-5  # (the float32 rounding of exp's argument -x^2/2)
    assert np.abs(out[ok][np.abs(exact[ok]) <= 1e-30]).max(initial=0) < 1e-30


def test_unary_gelu():
    out = np.full_like(X, 7.0)
    kf.unary.serial(out, X, kf.ACT["gelu"], 0.0)
    _check(out, X)
    inplace = X.copy()
    kf.unary.serial(inplace, inplace, kf.ACT["gelu"], 0.0)
    assert np.array_equal(inplace, out, equal_nan=True)


def test_bias_gelu_rows():
    y = RNG.standard_normal((5, 67)).astype(np.float32) * 3
    b = RNG.standard_normal(67).astype(np.float32)
    out = np.empty_like(y)
    kf.bias_act_rows.serial(out, y, b, kf.ACT["gelu"], 0.0)
    _check(out.reshape(-1), (y + b).reshape(-1))


def test_rows_bias_act_in_place():
    """kernels_seqattn.rows_bias_act, the rank-3 linear's epilogue on one buffer, against the
    float64 formulas: none and ReLU exact, GELU as above, SiLU within 4 ulp; with no bias."""
    from pocket.infer import kernels_seqattn as ks

    y0 = RNG.standard_normal((7, 37)).astype(np.float32) * 3
    b = RNG.standard_normal(37).astype(np.float32)
    for bias in (b, np.empty(0, np.float32)):
        z = (y0 + bias) if bias.size else y0
        for fn in (ks.rows_bias_act, ks.rows_bias_act.serial):
            for name in ("none", "relu", "gelu", "silu"):
                y = y0.copy()
                fn(y, bias, kf.ACT[name], 0.0)
                if name == "gelu":
                    _check(y.reshape(-1), z.reshape(-1))
                elif name == "silu":
                    exact = z.astype(np.float64) / (1 + np.exp(-z.astype(np.float64)))
                    assert np.all(np.abs(y - exact) <= 4 * np.spacing(np.abs(exact).astype(np.float32)))
                else:
                    np.testing.assert_array_equal(y, np.maximum(z, 0) if name == "relu" else z)


def test_linear_rows_small_and_swap_mid():
    """linear_rows_small (x @ wt + b, then the activation) and swap_mid (transpose(0, 2, 1, 3))
    against NumPy, serial and parallel, with and without a bias."""
    from pocket.infer import kernels_seqattn as ks

    x = RNG.standard_normal((9, 3)).astype(np.float32)
    wt = RNG.standard_normal((3, 11)).astype(np.float32)
    b = RNG.standard_normal(11).astype(np.float32)
    for fn in (ks.linear_rows_small, ks.linear_rows_small.serial):
        for bias in (b, np.empty(0, np.float32)):
            z = x.astype(np.float64) @ wt + (bias if bias.size else 0.0)
            for name in ("none", "relu", "gelu"):
                y = np.full((9, 11), np.nan, np.float32)
                fn(y, x, wt, bias, kf.ACT[name], 0.0)
                if name == "gelu":
                    np.testing.assert_allclose(y, _gelu64(z.reshape(-1)).reshape(z.shape),
                                               rtol=2e-6, atol=1e-6)
                else:
                    np.testing.assert_allclose(y, np.maximum(z, 0) if name == "relu" else z,
                                               rtol=1e-6, atol=1e-6)
        a = RNG.standard_normal((2, 3, 5, 4)).astype(np.float32)
        out = np.empty((2, 5, 3, 4), np.float32)
        (ks.swap_mid if fn is ks.linear_rows_small else ks.swap_mid.serial)(out, a)
        np.testing.assert_array_equal(out, a.transpose(0, 2, 1, 3))


def test_swap_last():
    from pocket.infer import kernels_seqattn as ks

    x = RNG.standard_normal((3, 5, 2)).astype(np.float32)
    for fn in (ks.swap_last, ks.swap_last.serial):
        out = np.empty((3, 2, 5), np.float32)
        fn(out, x)
        np.testing.assert_array_equal(out, x.transpose(0, 2, 1))
