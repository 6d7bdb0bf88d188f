"""The scalar math of the float32 kernels, written so that LLVM vectorizes the loops that use
it: `activate` (any activation in float64, the reference's), exp32 / erf32 / erfc32 (float32
exp and erf to about an ulp without libm calls), division without Numba's zero test (fdiv), and
the exact float64 division by 6 of hardswish (_div6) and its float32 steps (_div6_32,
_relu6_32). kernels_fp32 re-exports them.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT2 = 1.0 / math.sqrt(2.0)


@njit(cache=True, inline="always")
def activate(v, act, alpha):
    """One float64 value through activation code `act`; float64 so float32 rounds once.
    alpha is the activation's one parameter: leaky_relu's slope, clip's max."""
    if act == 1:
        return 0.0 if v < 0.0 else v  # NaN stays NaN, as in formats/reference.py
    if act == 2:
        return v if v >= 0.0 else alpha * v
    if act == 3:
        return 1.0 / (1.0 + math.exp(-v))
    if act == 4:
        return math.tanh(v)
    if act == 5:
        return 0.5 * v * (1.0 + math.erf(v * _INV_SQRT2))
    if act == 6:
        return 0.5 * v * (1.0 + math.tanh(_SQRT_2_OVER_PI * (v + 0.044715 * v * v * v)))
    if act == 7 or act == 8:
        # relu6(v + 3), NaN kept; then the reference's order of operations, so bit for bit
        t = v + 3.0
        t = 0.0 if t < 0.0 else (6.0 if t > 6.0 else t)
        return _div6(v * t) if act == 7 else _div6(t)
    if act == 9:
        # clip fused with min 0 (relu6): alpha is its max; NaN stays NaN
        t = 0.0 if v < 0.0 else v
        return alpha if t > alpha else t
    if act == 10:
        return v / (1.0 + math.exp(-v))  # silu; exp overflows to inf, so -0 far left
    return v


_LOG2E = 1.4426950408889634


@intrinsic
def _f32_from_bits(typingctx, bits):
    """The float32 whose IEEE bits are the int32 `bits`."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


@intrinsic
def fdiv(typingctx, a, b):
    """a / b as one IEEE division (x / 0 = inf or NaN), for float32 or float64 operands of
    one type. NOTE: Numba's `/` tests the divisor for ZeroDivisionError first, and that
    branch kept every loop with a division scalar (SiLU: 10 ns an element, 1.2 vectorized)."""
    if a != b or not isinstance(a, types.Float):
        return None
    sig = a(a, b)

    def codegen(context, builder, signature, args):
        return builder.fdiv(args[0], args[1])

    return sig, codegen


@intrinsic
def _fma64(typingctx, a, b, c):
    """a * b + c rounded once (llvm.fma: one instruction with FMA, a libm call without)."""
    if not all(t == types.float64 for t in (a, b, c)):
        return None
    sig = types.float64(types.float64, types.float64, types.float64)

    def codegen(context, builder, signature, args):
        d = ir.DoubleType()
        f = cgutils.get_or_insert_function(builder.module, ir.FunctionType(d, [d] * 3),
                                           "llvm.fma.f64")
        return builder.call(f, args)

    return sig, codegen


_SIXTH = 1.0 / 6.0


@njit(cache=True, inline="always")
def _div6(p):
    """p / 6.0 in float64, correctly rounded, without a division (a vector division cost
    hardswish 0.77 ns an element): q = p * (1/6), then one correction by the exact residual
    p - 6q (an FMA), Markstein's step; tests/infer/test_act_vector.py checks it against `/`
    on millions of values. Where the residual is 0 (q exact, signed zeros) or NaN (p = inf)
    q stands."""
    q = p * _SIXTH
    r = _fma64(-q, 6.0, p)
    return q if (r == 0.0 or r != r) else _fma64(r, _SIXTH, q)


@njit(cache=True, inline="always")
def _relu6_32(t):
    """min(max(t, 0), 6) in float32, NaN kept."""
    t = np.float32(0.0) if t < np.float32(0.0) else t
    return np.float32(6.0) if t > np.float32(6.0) else t


@njit(cache=True, inline="always")
def _div6_32(p):
    """p / 6 in float32 as q = p * (1/6) and one correction by the residual p - 6q, both
    contracted to FMAs where the CPU has them (kernels_fma._div6's step): correctly rounded
    there, within an ulp without FMA; NaN stays NaN, inf gives NaN (hardswish takes its
    inputs from 3 on as they are)."""
    q = p * np.float32(1.0 / 6.0)
    r = p - q * np.float32(6.0)
    return q + r * np.float32(1.0 / 6.0)


@njit(cache=True, inline="always")
def exp32(x):
    """exp(x) in float32 to about 1 ulp, written so that LLVM vectorizes it (math.exp is a libm
    call an element, which keeps a loop scalar; a float64 twin on 8 lanes ran SiLU at 1.9 ns an
    element, this one at 0.85): x = n ln2 + r, |r| <= ln2/2, with Cody-Waite
    ln2 in two parts, Taylor to degree 7 (truncation 5e-9 relative on |r| <= ln2/2), times
    2 * 2**(n-1) so that n = 128 (x in [88.38, 88.72]) stays finite. x is clamped to
    [-86.9, 89]: below, values of 1e-38 where exp is (near) denormal; from 88.73 on inf, as
    float32 exp overflows; NaN stays NaN. Float32 activations built on it (sigmoid, SiLU)
    differ from float64's beyond rounding only where they are below 1e-36 in size."""
    x = np.float32(-86.9) if x < np.float32(-86.9) else (np.float32(89.0) if x > np.float32(89.0) else x)
    return _exp32_clamped(x, x if x == x else np.float32(0.0))


@njit(cache=True, inline="always")
def _exp32_silu(x):
    """exp32(x) for SiLU's exp(-v), NaN not kept: x clamped as max and min (a NaN goes to
    -86.9), one instruction each where exp32's NaN-keeping compares and blends took seven of
    the loop's forty; v / (1 + e) is NaN for a NaN v whatever e is. Otherwise exp32's
    value, bit for bit."""
    # NOTE: Python's max and min: LLVM makes them vmaxps / vminps, where the two selects
    # (`x if x > c else c`) became compares and blends, 7 instructions of the loop's 36
    # (SiLU 1.03 -> 0.92 ns an element, same bytes). The bound first: Numba's max(a, b) is
    # `b if b > a else a`, so a NaN x gives the bound, never a NaN into n's integer conversion
    x = min(np.float32(89.0), max(np.float32(-86.9), x))
    return _exp32_clamped(x, x)


@njit(cache=True, inline="always")
def _exp32_clamped(x, xn):
    """exp32's steps for x in [-86.9, 89]; xn: x, or 0 where x is NaN (n must be a number)."""
    n = np.floor(xn * np.float32(_LOG2E) + np.float32(0.5))
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


# NOTE: fitted coefficients (Lawson's minimax on 2000 Chebyshev nodes against mpmath): erf(x)/x
# as a polynomial in x^2 on [0, 1] (relative error 1.2e-9), and erfc(x) = t exp(g(t) - x^2),
# t = 1 / (1 + x/2), g of degree 9 on x in [0.5, 10] (absolute error of g 1.2e-9: relative of
# erfc), the form of Numerical Recipes' erfcc fitted to the shorter range. Twins of these live
# in pocket/train/kernels_gelu.py (train may not import the engine); a test keeps them equal.
_ERF_S = tuple(np.float32(c) for c in (
    1.1283791657283255, -0.3761262582863663, 0.11283585183115163, -0.02685381309907335,
    0.005188329600206931, -0.0008010208778106132, 7.853907563593205e-05))
_ERFC_G = tuple(np.float32(c) for c in (
    -1.265537209849443, 1.0007326329944506, 0.365684097188898, 0.15111676835889706,
    -0.39726688597077764, 0.7917813613159776, -1.920717135830387, 2.223916263129722,
    -1.206323394405576, 0.2566458781247586))
_S0, _S1, _S2, _S3, _S4, _S5, _S6 = _ERF_S
_G0, _G1, _G2, _G3, _G4, _G5, _G6, _G7, _G8, _G9 = _ERFC_G


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
    # erfc(a) for a >= 0.5 (junk below: computed anyway, so that callers select branch-free)
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
    """erf(x) in float32 within 2.4 ulp (NaN stays NaN, erf(+-inf) = +-1), vectorizable (as
    exp32: math.erf is a libm call an element, ~12 ns; in a vector loop this is ~1): both
    pieces are computed and one selected, so a loop of it has no branch."""
    a = abs(x)
    s = _erf_small(x)
    c = np.float32(1.0) - _erfc_large(a)
    c = c if x >= np.float32(0.0) else -c
    return s if a < np.float32(1.0) else c


@njit(cache=True, inline="always")
def erfc32(x):
    """erfc(x) in float32 without 1 - erf's cancellation for x > 0: within 7 ulp for x < 1,
    then relative 1.2e-6 to x = 3 and 7.8e-6 to x = 9.19 (the float32 rounding of exp's
    argument -x^2, growing with x^2); below 1.2e-38 (x > 9.19) tiny or 0. GELU is
    x * erfc32(-x / sqrt2) / 2: its left tail keeps its relative accuracy."""
    a = abs(x)
    s = np.float32(1.0) - _erf_small(x)
    e = _erfc_large(a)
    c = e if x >= np.float32(0.0) else np.float32(2.0) - e
    return s if a < np.float32(0.5) else c
