"""Numba kernels of the exact (erf) GELU on the CPU, forward and backward, one pass each.

float32 runs on erfc32, a vectorizable erfc (NumPy has no erf, and Numba's math.erf is a libm
call an element, ~12 ns, which keeps a loop scalar: GELU's erf was half of its time in a
transformer's training step); float64 stays on math.erf, in the same order of operations as
the NumPy formula it replaces, so float64 training still matches torch to rounding.

NOTE: erf32/erfc32/exp32 are twins of pocket.infer.kernels_math's (pocket.train may not import
pocket.infer, nor the engine the trainer); tests/train/test_gelu_erf.py checks that both give
the same bits and both against math.erf.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

_INV_SQRT2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_LOG2E = 1.4426950408889634

# NOTE: coefficients fitted (Lawson's minimax on 2000 Chebyshev nodes against mpmath): erf(x)/x
# as a polynomial in x^2 on [0, 1] (relative error 1.2e-9), and erfc(x) = t exp(g(t) - x^2)
# with t = 1 / (1 + x/2) and g of degree 9 on x in [0.5, 10] (absolute error of g 1.2e-9, so
# relative of erfc), the form of Numerical Recipes' erfcc with a fit for the shorter range.
_ERF_SMALL = (1.1283791657283255, -0.3761262582863663, 0.11283585183115163,
              -0.02685381309907335, 0.005188329600206931, -0.0008010208778106132,
              7.853907563593205e-05)
_ERFC_G = (-1.265537209849443, 1.0007326329944506, 0.365684097188898, 0.15111676835889706,
           -0.39726688597077764, 0.7917813613159776, -1.920717135830387, 2.223916263129722,
           -1.206323394405576, 0.2566458781247586)
_S0, _S1, _S2, _S3, _S4, _S5, _S6 = (np.float32(c) for c in _ERF_SMALL)
_G0, _G1, _G2, _G3, _G4, _G5, _G6, _G7, _G8, _G9 = (np.float32(c) for c in _ERFC_G)


@intrinsic
def _f32_from_bits(typingctx, bits):
    """The float32 whose IEEE bits are the int32 `bits`."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@intrinsic
def fdiv(typingctx, a, b):
    """a / b as one IEEE division: Numba's `/` tests for a zero divisor, which keeps loops
    scalar (see pocket.infer.kernels_math.fdiv)."""
    if a != b or not isinstance(a, types.Float):
        return None
    sig = a(a, b)

    def codegen(context, builder, signature, args):
        return builder.fdiv(args[0], args[1])

    return sig, codegen


@njit(cache=True, inline="always")
def exp32(x):
    """exp(x) in float32 to about 1 ulp, vectorizable; pocket.infer.kernels_math.exp32's twin
    (its docstring says how and why)."""
    x = np.float32(-86.9) if x < np.float32(-86.9) else (np.float32(89.0) if x > np.float32(89.0) else x)
    n = np.floor((x if x == x else np.float32(0.0)) * np.float32(_LOG2E) + np.float32(0.5))
    r = (x - n * np.float32(0.693359375)) - n * np.float32(-2.12194440e-4)
    p = np.float32(0.0001984126984126984)
    p = p * r + np.float32(0.001388888888888889)
    p = p * r + np.float32(0.008333333333333333)
    p = p * r + np.float32(0.041666666666666664)
    p = p * r + np.float32(0.16666666666666666)
    p = p * r + np.float32(0.5)
    p = p * r + np.float32(1.0)
    p = p * r + np.float32(1.0)
    return (p * np.float32(2.0)) * _f32_from_bits((np.int32(n) + np.int32(126)) << np.int32(23))


@njit(cache=True, inline="always")
def _erf_small(x):
    # erf(x) for |x| <= 1
    u = x * x
    p = _S6
    p = p * u + _S5
    p = p * u + _S4
    p = p * u + _S3
    p = p * u + _S2
    p = p * u + _S1
    p = p * u + _S0
    return x * p


@njit(cache=True, inline="always")
def _erfc_large(a):
    # erfc(a) for a >= 0.5 (junk below; computed anyway so the caller selects branch-free)
    t = fdiv(np.float32(1.0), np.float32(1.0) + np.float32(0.5) * a)
    g = _G9
    g = g * t + _G8
    g = g * t + _G7
    g = g * t + _G6
    g = g * t + _G5
    g = g * t + _G4
    g = g * t + _G3
    g = g * t + _G2
    g = g * t + _G1
    g = g * t + _G0
    r = t * exp32(g - a * a)
    return np.float32(0.0) if a > np.float32(10.0) else r


@njit(cache=True, inline="always")
def erf32(x):
    """erf(x) in float32 within 2.4 ulp (NaN stays NaN, erf(+-inf) = +-1), vectorizable: both
    branches are computed and one selected, so a loop of it has no branch."""
    a = abs(x)
    s = _erf_small(x)
    c = np.float32(1.0) - _erfc_large(a)
    c = c if x >= np.float32(0.0) else -c
    return s if a < np.float32(1.0) else c


@njit(cache=True, inline="always")
def erfc32(x):
    """erfc(x) = 1 - erf(x) in float32 without the cancellation of 1 - erf32(x) for x > 0:
    within 7 ulp for x < 1, then relative 1.2e-6 to x = 3 and 7.8e-6 to x = 9.19 (the float32
    rounding of exp's argument -x^2, growing with x^2); below 1.2e-38 (x > 9.19) tiny or 0."""
    a = abs(x)
    s = np.float32(1.0) - _erf_small(x)
    e = _erfc_large(a)
    c = e if x >= np.float32(0.0) else np.float32(2.0) - e
    return s if a < np.float32(0.5) else c


# NOTE: GELU(x) = x Phi(x) with Phi(x) = erfc(-x/sqrt2) / 2: through erfc the left tail keeps
# its relative accuracy, where 1 + erf(x/sqrt2) cancels (float32 erf is 1 - 6e-8 at best).


@njit(cache=True)
def gelu_forward32(x, out):
    # x (M,) f32 -> out (M,) = x Phi(x)
    for i in range(x.shape[0]):
        v = x[i]
        out[i] = np.float32(0.5) * v * erfc32(-v * np.float32(_INV_SQRT2))


@njit(cache=True)
def gelu_backward32(x, gy, gx):
    # x, gy (M,) f32 -> gx (M,) = gy (Phi(x) + x phi(x))
    for i in range(x.shape[0]):
        v = x[i]
        cdf = np.float32(0.5) * erfc32(-v * np.float32(_INV_SQRT2))
        pdf = exp32(np.float32(-0.5) * v * v) * np.float32(_INV_SQRT_2PI)
        gx[i] = gy[i] * (cdf + v * pdf)


@njit(cache=True)
def gelu_forward_grad32(x, out, d):
    # x (M,) f32 -> out (M,) = x Phi(x), d (M,) = GELU'(x) = Phi(x) + x phi(x): the backward's
    # erfc and exp at the forward's cost of one more exp (the backward is then gy * d)
    for i in range(x.shape[0]):
        v = x[i]
        e = erfc32(-v * np.float32(_INV_SQRT2))
        out[i] = np.float32(0.5) * v * e
        pdf = exp32(np.float32(-0.5) * v * v) * np.float32(_INV_SQRT_2PI)
        d[i] = np.float32(0.5) * e + v * pdf


@njit(cache=True)
def gelu_forward64(x, out):
    # x (M,) f64 -> out (M,): 0.5 * x * (1 + erf(x / sqrt2)) in the NumPy formula's order
    for i in range(x.shape[0]):
        v = x[i]
        out[i] = 0.5 * v * (1.0 + math.erf(v * _INV_SQRT2))


@njit(cache=True)
def gelu_backward64(x, gy, gx):
    # x, gy (M,) f64 -> gx (M,) = gy (Phi(x) + x phi(x))
    for i in range(x.shape[0]):
        v = x[i]
        cdf = 0.5 * (1.0 + math.erf(v * _INV_SQRT2))
        pdf = math.exp(-0.5 * v * v) * _INV_SQRT_2PI
        gx[i] = gy[i] * (cdf + v * pdf)


@njit(cache=True)
def gelu_forward_grad64(x, out, d):
    # x (M,) f64 -> out (M,) as gelu_forward64, d (M,) = GELU'(x) as gelu_backward64's factor
    for i in range(x.shape[0]):
        v = x[i]
        cdf = 0.5 * (1.0 + math.erf(v * _INV_SQRT2))
        out[i] = 0.5 * v * (1.0 + math.erf(v * _INV_SQRT2))
        d[i] = cdf + v * (math.exp(-0.5 * v * v) * _INV_SQRT_2PI)


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU of a float32 or float64 array, a new array of x's shape."""
    xc = np.ascontiguousarray(x)
    out = np.empty_like(xc)
    (gelu_forward32 if xc.dtype == np.float32 else gelu_forward64)(xc.reshape(-1), out.reshape(-1))
    return out


def gelu_grad(x: np.ndarray, gy: np.ndarray) -> np.ndarray:
    """gy * GELU'(x), x and gy of one shape and dtype (float32 or float64)."""
    xc, gc = np.ascontiguousarray(x), np.ascontiguousarray(gy)
    gx = np.empty_like(xc)
    (gelu_backward32 if xc.dtype == np.float32 else gelu_backward64)(
        xc.reshape(-1), gc.reshape(-1), gx.reshape(-1))
    return gx


def gelu_and_grad(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact GELU of a float32 or float64 array and its derivative GELU'(x), two new arrays of
    x's shape, in one pass (the same values as gelu(x) and gelu_grad(x, 1))."""
    xc = np.ascontiguousarray(x)
    out, d = np.empty_like(xc), np.empty_like(xc)
    (gelu_forward_grad32 if xc.dtype == np.float32 else gelu_forward_grad64)(
        xc.reshape(-1), out.reshape(-1), d.reshape(-1))
    return out, d
