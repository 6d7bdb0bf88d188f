"""The depthwise kernels (kernels_dw) against a naive NumPy twin and formats/reference.py."""

from __future__ import annotations

import numpy as np
import pytest
from models import readonly

from pocket.formats import quant as qm
from pocket.formats import reference as ref
from pocket.infer import kernels_dw as kd
from pocket.infer import kernels_fp32 as kf

RNG = np.random.default_rng(23)

# name: (N, C, H, W, (kh, kw), (sh, sw), (ph, pw), (dh, dw))
CASES = {
    "1x1-map": (1, 3, 1, 1, (3, 3), (1, 1), (1, 1), (1, 1)),
    "1x1-map-s2-5x5": (3, 2, 1, 1, (5, 5), (2, 2), (2, 2), (1, 1)),
    "odd-width-37": (3, 5, 7, 37, (3, 3), (1, 1), (1, 1), (1, 1)),
    "wide-64-pad1": (1, 2, 6, 64, (3, 3), (1, 1), (1, 1), (1, 1)),
    "pad0": (1, 3, 6, 11, (3, 3), (1, 1), (0, 0), (1, 1)),
    "pad3-past-reach": (1, 2, 5, 6, (3, 3), (1, 1), (3, 3), (1, 1)),
    "s2-odd": (1, 4, 9, 21, (3, 3), (2, 2), (1, 1), (1, 1)),
    "s2-even-pad0": (1, 3, 8, 34, (3, 3), (2, 2), (0, 0), (1, 1)),
    "5x5-s1": (1, 3, 12, 18, (5, 5), (1, 1), (2, 2), (1, 1)),
    "5x5-s1-wide": (1, 2, 7, 64, (5, 5), (1, 1), (2, 2), (1, 1)),
    "5x5-s2": (3, 2, 10, 19, (5, 5), (2, 2), (2, 2), (1, 1)),
    "5x5-pad1": (1, 2, 9, 9, (5, 5), (1, 1), (1, 1), (1, 1)),
    "dil2": (1, 3, 11, 13, (3, 3), (1, 1), (2, 2), (2, 2)),
    "dil2-s2": (1, 2, 12, 17, (3, 3), (2, 2), (2, 2), (2, 2)),
    "7x7": (1, 2, 9, 10, (7, 7), (1, 1), (3, 3), (1, 1)),
    "1x3-asym": (2, 3, 5, 20, (1, 3), (2, 1), (0, 1), (1, 1)),
    "s2x1-3x3": (1, 2, 9, 13, (3, 3), (2, 1), (1, 2), (1, 1)),
}


def _geom(case):
    n, c, h, w, k, s, p, d = case
    ho = kd.out_size(h, k[0], s[0], p[0], d[0])
    wo = kd.out_size(w, k[1], s[1], p[1], d[1])
    return n, c, h, w, k, s, p, d, ho, wo


def _attrs(c, s, p, d, **extra):
    return {"stride": list(s), "padding": list(p), "dilation": list(d), "groups": c, **extra}


def naive_dw(x, w, s, p, d, pad, shift=0):
    """The naive twin: x (N, C, H, W) padded with `pad`, w (C, 1, kh, kw) -> float64 or int64
    sums of (x - shift) * w (N, C, Ho, Wo), one tap at a time over strided slices."""
    n, c, h, wd = x.shape
    kh, kw = w.shape[2:]
    big = np.int64 if x.dtype == np.int8 else np.float64
    xp = np.pad(x.astype(big), ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])), constant_values=pad)
    ho = (h + 2 * p[0] - d[0] * (kh - 1) - 1) // s[0] + 1
    wo = (wd + 2 * p[1] - d[1] * (kw - 1) - 1) // s[1] + 1
    out = np.zeros((n, c, ho, wo), big)
    for i in range(kh):
        for j in range(kw):
            r, q = i * d[0], j * d[1]
            tap = xp[:, :, r:r + s[0] * (ho - 1) + 1:s[0], q:q + s[1] * (wo - 1) + 1:s[1]]
            out += (tap - shift) * w[:, 0, i, j].astype(big).reshape(1, c, 1, 1)
    return out


def _naive_act(y, act):
    if act == "relu":
        return np.where(y < 0, 0.0, y)  # NaN stays NaN
    if act == "leaky_relu":
        return np.where(y >= 0, y, 0.01 * y)
    if act == "tanh":
        return np.tanh(y)
    return y


def _f32_bound(x, w, b, s, p, d):
    """|error| allowed: 1e-5 of the sum of the terms' magnitudes (float32 rounding of a sum of
    at most 49 products is well inside it)."""
    return 1e-5 * (naive_dw(np.abs(x), np.abs(w), s, p, d, 0.0) + np.abs(b).reshape(1, -1, 1, 1))


# --------------------------------------------------------------------------- float32


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("act", ["none", "relu", "leaky_relu", "tanh"])
def test_dw_conv_f32(name, act):
    n, c, h, wd, k, s, p, d, ho, wo = _geom(CASES[name])
    x = RNG.standard_normal((n, c, h, wd)).astype(np.float32)
    w = RNG.standard_normal((c, 1, *k)).astype(np.float32)
    b = RNG.standard_normal(c).astype(np.float32)
    out = np.full((n, c, ho, wo), np.nan, np.float32)
    kd.dw_conv.serial(out, x, w, b, *s, *p, *d, kf.ACT[act], 0.01)
    twin = _naive_act(naive_dw(x, w, s, p, d, 0.0) + b.reshape(1, -1, 1, 1), act)
    # relu and tanh do not grow an error, leaky ReLU shrinks it
    assert np.all(np.abs(out - twin) <= _f32_bound(x, w, b, s, p, d))
    want = ref.conv2d(_attrs(c, s, p, d, activation=act, alpha=0.01), x, w, b)
    assert np.all(np.abs(out - want) <= _f32_bound(x, w, b, s, p, d) + 1e-7 * np.abs(want))


@pytest.mark.parametrize("name", ["odd-width-37", "s2-odd", "5x5-s2", "7x7"])
def test_dw_conv_f32_parallel_no_bias(name):
    """The parallel twin, and an empty bias."""
    n, c, h, wd, k, s, p, d, ho, wo = _geom(CASES[name])
    x = RNG.standard_normal((n, c, h, wd)).astype(np.float32)
    w = RNG.standard_normal((c, 1, *k)).astype(np.float32)
    out = np.full((n, c, ho, wo), np.nan, np.float32)
    kd.dw_conv(out, x, w, np.zeros(0, np.float32), *s, *p, *d, kf.ACT["relu"], 0.0)
    want = ref.conv2d(_attrs(c, s, p, d, activation="relu"), x, w)
    assert np.all(np.abs(out - want) <= _f32_bound(x, w, np.zeros(c), s, p, d))


@pytest.mark.parametrize("name", ["wide-64-pad1", "s2-odd", "5x5-s1-wide", "7x7"])
def test_dw_conv_f32_nan(name):
    """A NaN input pixel makes NaN exactly the outputs whose taps read it, through ReLU too;
    the junk the widened interior reads (neighbouring rows) never reaches an output."""
    n, c, h, wd, k, s, p, d, ho, wo = _geom(CASES[name])
    x = RNG.standard_normal((n, c, h, wd)).astype(np.float32)
    x[0, 0, h // 2, 0] = np.nan
    x[0, c - 1, 0, wd - 1] = np.nan
    w = RNG.standard_normal((c, 1, *k)).astype(np.float32)
    b = RNG.standard_normal(c).astype(np.float32)
    out = np.empty((n, c, ho, wo), np.float32)
    kd.dw_conv.serial(out, x, w, b, *s, *p, *d, kf.ACT["relu"], 0.0)
    want = ref.conv2d(_attrs(c, s, p, d, activation="relu"), x, w, b)
    assert np.isnan(want).any()
    assert np.array_equal(np.isnan(out), np.isnan(want))


# --------------------------------------------------------------------------- int8


def _int8_case(name, x_zp):
    n, c, h, wd, k, s, p, d, ho, wo = _geom(CASES[name])
    x = RNG.integers(-128, 128, (n, c, h, wd)).astype(np.int8)
    w_q, w_s = qm.quantize_weights(RNG.standard_normal((c, 1, *k)).astype(np.float32))
    w_q[0, 0, 0, 0] = -128  # the extreme codes: (x - x_zp) * w reaches -255 * -128
    x[0, 0, 0, 0] = 127
    b_q = qm.quantize_bias(RNG.standard_normal(c).astype(np.float32), 0.05, w_s)
    return x, w_q, w_s, b_q, (c, s, p, d, ho, wo)


def _naive_requant(acc, m, y_zp, relu):
    # formats.quant: the product of float32(acc) and float32(m), in float32
    y = np.rint(acc.astype(np.float32) * m.astype(np.float32).reshape(1, -1, 1, 1)) + y_zp
    return np.clip(y, y_zp if relu else -128, 127).astype(np.int8)


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("mode", ["i8-relu", "i8", "f32", "f32-relu"])
def test_dw_conv_int8_exact(name, mode):
    x_zp = -128 if name == "pad0" else 9  # non-zero x_zp checks that padding holds x_zp
    x, w_q, w_s, b_q, (c, s, p, d, ho, wo) = _int8_case(name, x_zp)
    relu, to_int8 = mode.endswith("relu"), mode.startswith("i8")
    a = _attrs(c, s, p, d, x_scale=0.05, x_zero_point=x_zp, activation="relu" if relu else "none")
    if to_int8:
        a.update(y_scale=0.07, y_zero_point=-5)
    m = qm.requant_multiplier(0.05, w_s, a.get("y_scale"))
    y_zp = -5 if to_int8 else 0
    out = np.empty((x.shape[0], c, ho, wo), np.int8 if to_int8 else np.float32)
    kd.dw_conv_q.serial(out, x, w_q, b_q, m, x_zp, to_int8, float(y_zp),
                        (float(y_zp if relu else -128), 127.0, np.inf), relu, *s, *p, *d)
    # the int8 padding holds x_zp, which the shift then cancels
    acc = naive_dw(x, w_q, s, p, d, x_zp, x_zp) + b_q.astype(np.int64).reshape(1, -1, 1, 1)
    if to_int8:
        twin = _naive_requant(acc, m, y_zp, relu)
    else:
        twin = (acc * m.reshape(1, -1, 1, 1)).astype(np.float32)
        twin = np.maximum(twin, np.float32(0)) if relu else twin
    assert np.array_equal(out, twin)
    assert np.array_equal(out, ref.conv2d(a, x, w_q, b_q, w_scale=w_s))


@pytest.mark.parametrize("name", ["odd-width-37", "5x5-s2", "1x3-asym"])
def test_dw_conv_int8_parallel_no_bias(name):
    x, w_q, w_s, _, (c, s, p, d, ho, wo) = _int8_case(name, 3)
    a = _attrs(c, s, p, d, x_scale=0.05, x_zero_point=3, activation="relu", y_scale=0.03,
               y_zero_point=4)
    out = np.empty((x.shape[0], c, ho, wo), np.int8)
    kd.dw_conv_q(out, x, w_q, np.zeros(0, np.int32), qm.requant_multiplier(0.05, w_s, 0.03), 3,
                 True, 4.0, (4.0, 127.0, np.inf), True, *s, *p, *d)
    assert np.array_equal(out, ref.conv2d(a, x, w_q, w_scale=w_s))


# --------------------------------------------------------------------------- padded planes

# the geometries of the padded-plane kernels (kd.padded_fast), with small maps and odd sizes
# (from pw = 2 the stride-1 rows share one padding: narrower than it, and ph != pw)
PADDED = [name for name, case in CASES.items() if kd.padded_fast(*case[4], *case[5], *case[7])] + [
    "4x4-s1", "s2-pad2-odd", "5x5-s1-narrow", "5x5-s1-ph1-pw2", "s2-w8", "5x5-s2-w14",
    "direct-narrowest", "direct-3-rows", "direct-30-rows"]
CASES_PADDED = {**CASES, "4x4-s1": (2, 7, 4, 4, (3, 3), (1, 1), (1, 1), (1, 1)),
                "s2-pad2-odd": (2, 3, 15, 13, (5, 5), (2, 2), (2, 2), (1, 1)),
                "5x5-s1-narrow": (2, 3, 3, 1, (5, 5), (1, 1), (2, 2), (1, 1)),
                "5x5-s1-ph1-pw2": (1, 2, 6, 9, (5, 5), (1, 1), (1, 2), (1, 1)),
                # rows of 8-15 columns split 4 pairs a vector step (kd._split_quads)
                "s2-w8": (1, 3, 8, 8, (3, 3), (2, 2), (1, 1), (1, 1)),
                "5x5-s2-w14": (2, 3, 14, 14, (5, 5), (2, 2), (2, 2), (1, 1)),
                # 3x3 stride-1 planes padded by 1 from DIRECT_W columns on: no padded copy
                # (kd._direct_3x3): the narrowest, the fewest rows (one inner row), a last
                # flat run that ends in single outputs
                "direct-narrowest": (2, 3, 24, kd.DIRECT_W, (3, 3), (1, 1), (1, 1), (1, 1)),
                "direct-3-rows": (1, 2, 3, kd.DIRECT_W + 9, (3, 3), (1, 1), (1, 1), (1, 1)),
                "direct-30-rows": (1, 2, 30, kd.DIRECT_W + 1, (3, 3), (1, 1), (1, 1), (1, 1))}


def _padded_scratch(case, parts, x_dtype, t_dtype, fill):
    n, c, h, wd, k, s, p, d, ho, wo = _geom(case)
    a, t = kd.padded_sizes(h, wd, ho, wo, s[0], *p)
    # junk in the scratch: the kernel must write every element it reads
    return np.full((parts, a), fill, x_dtype), np.full((parts, t), fill, t_dtype)


@pytest.mark.parametrize("name", PADDED)
@pytest.mark.parametrize("act", ["relu6", "relu", "none", "tanh"])
def test_dw_conv_padded_f32(name, act):
    """Against the naive twin, on one part (serial) and on two (the parallel twin). ReLU and
    relu6 run in the copy-out, tanh as a pass over the flat outputs, none in neither."""
    case = CASES_PADDED[name]
    n, c, h, wd, k, s, p, d, ho, wo = _geom(case)
    x = RNG.standard_normal((n, c, h, wd)).astype(np.float32)
    w = RNG.standard_normal((c, 1, *k)).astype(np.float32)
    b = RNG.standard_normal(c).astype(np.float32)
    y = naive_dw(x, w, s, p, d, 0.0) + b.reshape(1, -1, 1, 1)
    twin = {"relu6": lambda: np.clip(y, 0.0, 6.0), "relu": lambda: np.maximum(y, 0.0),
            "none": lambda: y, "tanh": lambda: np.tanh(y)}[act]()
    code = kf.ACT["clip"] if act == "relu6" else kf.ACT[act]
    for parts, fn in ((1, kd.dw_conv_padded.serial), (2, kd.dw_conv_padded)):
        xp, tmp = _padded_scratch(case, parts, np.float32, np.float32, np.nan)
        out = np.full((n, c, ho, wo), np.nan, np.float32)
        fn(out, x, readonly(w), readonly(b), xp, tmp, s[0], *p, code, 6.0)
        assert np.all(np.abs(out - twin) <= _f32_bound(x, w, b, s, p, d)), parts


@pytest.mark.parametrize("name", ["s2-pad2-odd", "5x5-s1-narrow", "4x4-s1", "direct-30-rows"])
@pytest.mark.parametrize("act", ["relu", "relu6"])
def test_dw_conv_padded_f32_nan(name, act):
    """A NaN input pixel makes NaN exactly the outputs whose taps read it, through the
    copy-out's ReLU and clip too (as in formats/reference.py)."""
    case = CASES_PADDED[name]
    n, c, h, wd, k, s, p, d, ho, wo = _geom(case)
    x = RNG.standard_normal((n, c, h, wd)).astype(np.float32)
    x[0, 0, h // 2, 0] = np.nan
    x[0, c - 1, h // 2, wd // 2] = np.nan  # an inner pixel (the flat loop's, direct or padded)
    x[-1, c - 1, h - 1, wd - 1] = np.nan
    w = RNG.standard_normal((c, 1, *k)).astype(np.float32)
    b = RNG.standard_normal(c).astype(np.float32)
    xp, tmp = _padded_scratch(case, 1, np.float32, np.float32, 0.0)
    out = np.empty((n, c, ho, wo), np.float32)
    code = kf.ACT["clip" if act == "relu6" else act]
    kd.dw_conv_padded.serial(out, x, readonly(w), readonly(b), xp, tmp, s[0], *p, code, 6.0)
    attrs = _attrs(c, s, p, d, activation="clip", min=0.0, max=6.0) if act == "relu6" else _attrs(
        c, s, p, d, activation=act)
    want = ref.conv2d(attrs, x, w, b)
    assert np.isnan(want).any()
    assert np.array_equal(np.isnan(out), np.isnan(want))


def _extreme_int8(n, c, h, wd, k):
    """(x, w_q, b_q, m) of a padded-plane int8 case with the extreme codes: the top half of
    the rows -128, the first channel's weights 127 and the last's -127 (5x5's sums near their
    largest, 406,400), requantized from tiny scales to int8."""
    x = RNG.integers(-128, 128, (n, c, h, wd)).astype(np.int8)
    x[..., : h // 2, :] = -128
    w_q, w_s = qm.quantize_weights(RNG.standard_normal((c, 1, *k)).astype(np.float32))
    w_q[0] = 127
    w_q[-1] = -127
    b_q = qm.quantize_bias(RNG.standard_normal(c).astype(np.float32), 0.05, w_s)
    return x, w_q, b_q, qm.requant_multiplier(0.0001, w_s, 0.07)


@pytest.mark.parametrize("name", PADDED)
@pytest.mark.parametrize("sums", ["int32", "float32"])
def test_dw_conv_padded_int8_exact(name, sums):
    """Bit for bit with the naive twin (x_zp in the padding, requantized to int8 with ReLU), with
    the sums in int32 (dw_conv_padded_q) and in float32 (dw_conv_padded_qf). The extreme codes
    (-128 inputs and +-127 weights) put 5x5's sums near their largest, 406,400."""
    case = CASES_PADDED[name]
    n, c, h, wd, k, s, p, d, ho, wo = _geom(case)
    x, w_q, b_q, m = _extreme_int8(n, c, h, wd, k)
    acc = naive_dw(x, w_q, s, p, d, 11, 11) + b_q.astype(np.int64).reshape(1, -1, 1, 1)
    twin = _naive_requant(acc, m, -5, True)
    kern = kd.dw_conv_padded_q if sums == "int32" else kd.dw_conv_padded_qf
    x_dt, acc_dt = (np.int8, np.int32) if sums == "int32" else (np.float32, np.float32)
    for parts, fn in ((1, kern.serial), (2, kern)):
        xp, tmp = _padded_scratch(case, parts, x_dt, np.int8, 77)
        acc = np.full(tmp.shape, 2**31 - 1, acc_dt)
        out = np.empty((n, c, ho, wo), np.int8)
        fn(out, x, readonly(w_q), readonly(b_q), xp, acc, tmp, m, 11, True, -5.0, (-5.0, 127.0, np.inf), True,
           s[0], *p)
        assert np.array_equal(out, twin), parts


# --------------------------------------------------------------------------- AVX-512 rows

# the padded-plane cases, and rows of several 16-output chunks, heights that leave a partial
# block of rows (kernels_fma_dw.R_S1, R_S2: 4 a call), padding past the reach
FMA_DW = PADDED + ["wide-s1-ho5", "wide-s2-ho3", "5x5-s2-wide", "3x3-s1-pad2"]
CASES_FMA = {**CASES_PADDED, "wide-s1-ho5": (1, 3, 5, 70, (3, 3), (1, 1), (1, 1), (1, 1)),
             "wide-s2-ho3": (2, 2, 6, 67, (3, 3), (2, 2), (1, 1), (1, 1)),
             "5x5-s2-wide": (1, 2, 11, 81, (5, 5), (2, 2), (2, 2), (1, 1)),
             "3x3-s1-pad2": (1, 2, 6, 19, (3, 3), (1, 1), (2, 2), (1, 1))}
FMA_ACTS = {"none": (0, lambda y: y), "relu": (1, lambda y: np.where(y < 0, 0.0, y)),
            "relu6": (None, lambda y: np.clip(y, 0.0, 6.0)), "silu": (None, lambda y: y / (1 + np.exp(-y))),
            "sigmoid": (None, lambda y: 1 / (1 + np.exp(-y))), "tanh": (-1, np.tanh),
            "hardswish": (None, lambda y: y * np.clip(y + 3, 0, 6) / 6),
            "hardsigmoid": (None, lambda y: np.clip(y + 3, 0, 6) / 6)}


@pytest.mark.parametrize("name", FMA_DW)
@pytest.mark.parametrize("act", list(FMA_ACTS))
def test_dw_conv_fma(name, act):
    """kernels_fma_dw (AVX-512) against the naive twin, every activation in registers (tanh:
    the pass after), on one part and two; junk (NaN) in the scratch and the output, and inputs
    near +-80 where SiLU and sigmoid run into exp's ends."""
    from pocket.infer import kernels_fma as kfma

    if not kfma.AVAILABLE:
        pytest.skip("this CPU has no AVX-512")
    from pocket.infer import kernels_fma_dw as kfd

    case = CASES_FMA[name]
    n, c, h, wd, k, s, p, d, ho, wo = _geom(case)
    assert kfd.fast(*k, *s, *d)
    x = RNG.standard_normal((n, c, h, wd)).astype(np.float32)
    x[0, 0, 0, : min(3, wd)] = [80.0, -80.0, 30.0][: min(3, wd)]
    w = RNG.standard_normal((c, 1, *k)).astype(np.float32)
    b = RNG.standard_normal(c).astype(np.float32)
    mode, f = FMA_ACTS[act]
    mode = {"relu6": kfma.MODE_RELU6, "silu": kfma.MODE_SILU, "sigmoid": kfma.MODE_SIGMOID,
            "hardswish": kfma.MODE_HSWISH, "hardsigmoid": kfma.MODE_HSIGMOID}.get(act, mode)
    code = kf.ACT["clip"] if act == "relu6" else kf.ACT[act]
    y = naive_dw(x, w, s, p, d, 0.0) + b.reshape(1, -1, 1, 1)
    with np.errstate(over="ignore"):
        twin = f(y)
    # the activations grow an error by at most their slope (<= 1.5 here: hardswish) and a few ulp
    bound = 1.5 * _f32_bound(x, w, b, s, p, d) + 4 * np.spacing(np.abs(twin).astype(np.float32))
    for parts, fn in ((1, kfd.dw_conv_fma.serial), (2, kfd.dw_conv_fma)):
        scratch = np.full((parts, kfd.scratch_size(wd, wo)), np.nan, np.float32)
        out = np.full((n, c, ho, wo), np.nan, np.float32)
        fn(out, x, w, b, scratch, s[0], *p, mode, code, 6.0)
        assert np.all(np.abs(out - twin) <= bound), parts
    fn(out, x, w, np.zeros(0, np.float32), scratch, s[0], *p, 0, 0, 0.0)  # no bias
    assert np.all(np.abs(out - naive_dw(x, w, s, p, d, 0.0)) <= _f32_bound(x, w, 0 * b, s, p, d))


# small 3x3 planes at stride 1 with "same" padding (kernels_fma_dw.dw_conv_fma_flat): 1-4 vectors
FLAT = {"4x4": (2, 5, 4, 4, 3), "8x8": (1, 3, 8, 8, 3), "7x7": (2, 3, 7, 7, 3),
        "1x1": (1, 4, 1, 1, 3), "2x3": (1, 3, 2, 3, 3), "3x11": (1, 2, 3, 11, 3),
        "16x4": (1, 2, 16, 4, 3), "1x64": (1, 2, 1, 64, 3), "5x9": (2, 2, 5, 9, 3),
        "14x14": (1, 3, 14, 14, 3), "13x13": (2, 2, 13, 13, 3), "5x13": (1, 2, 5, 13, 3)}


@pytest.mark.parametrize("name", FLAT)
@pytest.mark.parametrize("act", ["none", "relu", "relu6", "silu", "hardswish", "tanh"])
def test_dw_conv_fma_flat(name, act):
    """The small planes' kernel against the naive twin, every activation in registers (tanh:
    the pass after), one part and two, with and without a bias: each tap's mask zeroes the
    padding lanes, whatever the plane's shape (rows of 1 to 64 columns), in blocks of 4 vectors
    and the rest (14x14, 13x13); NaN in the output buffer shows a lane not written."""
    from pocket.infer import kernels_fma as kfma

    if not kfma.AVAILABLE:
        pytest.skip("this CPU has no AVX-512")
    from pocket.infer import kernels_fma_dw as kfd

    n, c, h, wd, k = FLAT[name]
    s, p, d = (1, 1), (k // 2, k // 2), (1, 1)
    assert kfd.flat_fast(h, wd, h, wd, k, 1)
    x = RNG.standard_normal((n, c, h, wd)).astype(np.float32)
    x[0, 0, 0, 0] = 30.0
    w = RNG.standard_normal((c, 1, k, k)).astype(np.float32)
    b = RNG.standard_normal(c).astype(np.float32)
    mode, f = FMA_ACTS[act]
    mode = {"relu6": kfma.MODE_RELU6, "silu": kfma.MODE_SILU,
            "hardswish": kfma.MODE_HSWISH}.get(act, mode)
    code = kf.ACT["clip"] if act == "relu6" else kf.ACT[act]
    from pocket.infer import kernels_fma_im2col as kfi

    masks = kfi.same_masks(kf.same_valid(h, wd, k, k, *p, 1, 1))
    y = naive_dw(x, w, s, p, d, 0.0) + b.reshape(1, -1, 1, 1)
    twin = f(y)
    bound = 1.5 * _f32_bound(x, w, b, s, p, d) + 4 * np.spacing(np.abs(twin).astype(np.float32))
    for parts, fn in ((1, kfd.dw_conv_fma_flat.serial), (2, kfd.dw_conv_fma_flat)):
        out = np.full((n, c, h, wd), np.nan, np.float32)
        fn(out, x, w, b, masks, parts, *p, mode, code, 6.0)
        assert np.all(np.abs(out - twin) <= bound), parts
    out = np.full((n, c, h, wd), np.nan, np.float32)
    fn(out, x, w, np.zeros(0, np.float32), masks, 2, *p, 0, 0, 0.0)  # no bias
    assert np.all(np.abs(out - naive_dw(x, w, s, p, d, 0.0)) <= _f32_bound(x, w, 0 * b, s, p, d))


@pytest.mark.parametrize("h,w,k,kernel", [(4, 4, 3, "dw_conv_fma_flat"), (7, 7, 5, "dw_conv_fma_cv"),
                                          (8, 8, 3, "dw_conv_fma_flat"), (9, 9, 5, "dw_conv_fma_cv"),
                                          (14, 14, 3, "dw_conv_fma_flat"), (15, 15, 3, "dw_conv_fma"),
                                          (15, 15, 5, "dw_conv_fma")])
def test_small_planes_take_the_flat_kernel(tmp_path, h, w, k, kernel):
    """On AVX-512 a 3x3 depthwise conv of at most 196 outputs a plane at stride 1, "same"
    padding, binds dw_conv_fma_flat, a 5x5 one of at most 196 kernels_fma_dwcv's (16 channels
    a vector; the row kernels declined 5x5 on 7x7), and each matches the reference; 15x15
    keeps the row kernels."""
    from models import Builder, matches_reference

    from pocket.infer import kernels_fma
    from pocket.infer.engine import Engine

    if not kernels_fma.AVAILABLE:
        pytest.skip("this CPU has no AVX-512")
    rng = np.random.default_rng(13)
    b = Builder((24, h, w), rng)
    b.conv(24, 24, k, groups=24, padding=[k // 2, k // 2], activation="relu")
    path = tmp_path / "dw.bin"
    from models import save_model

    save_model(path, b.graph(), b.params, None)
    x = rng.standard_normal((2, 24, h, w)).astype(np.float32)
    with Engine(path, max_batch=2, threads=1) as eng:
        eng._arena.fill(255)
        got = eng.run(x, copy=True)
        names = [c.func.__name__.removesuffix("_serial") for c in eng._bound[2].calls]
    assert names == [kernel], names
    matches_reference(path, x, got, False)


@pytest.mark.parametrize("name", FMA_DW)
@pytest.mark.parametrize("relu", [False, True])
def test_dw_conv_fma_q_exact(name, relu):
    """kernels_fma_dw.dw_conv_fma_q (AVX-512, int8 rows in place, float32 sums) bit for bit with
    the naive twin: x_zp in the padding, the extreme codes (-128 inputs, +-127 weights: 5x5's
    sums near 406,400), a bias near exact_bias' limit, on one part and two, junk in the
    scratch; and exact_bias refuses a bias past it."""
    from pocket.infer import kernels_fma as kfma

    if not kfma.AVAILABLE:
        pytest.skip("this CPU has no AVX-512")
    from pocket.infer import kernels_fma_dw as kfd

    case = CASES_FMA[name]
    n, c, h, wd, k, s, p, d, ho, wo = _geom(case)
    x, w_q, b_q, m = _extreme_int8(n, c, h, wd, k)
    b_q[0] = -kfd.EXACT_BIAS
    assert kfd.exact_bias(b_q) and not kfd.exact_bias(b_q - 1)
    x_zp, y_zp = 11, -5
    acc = naive_dw(x, w_q, s, p, d, x_zp, x_zp) + b_q.astype(np.int64).reshape(1, -1, 1, 1)
    twin = _naive_requant(acc, m, y_zp, relu)
    taps = w_q.reshape(c, -1).astype(np.int64)
    wf = taps.astype(np.float32)
    badj = (b_q.astype(np.int64) - x_zp * taps.sum(axis=1)).astype(np.float32)
    lo = np.float32(y_zp if relu else -128) - np.float32(y_zp)
    hi = np.float32(127) - np.float32(y_zp)
    for parts, fn in ((1, kfd.dw_conv_fma_q.serial), (2, kfd.dw_conv_fma_q)):
        scratch = np.full((parts, kfd.scratch_size_q(wd, wo)), 77, np.int8)
        out = np.full((n, c, ho, wo), 99, np.int8)
        fn(out, x, wf, badj, m.astype(np.float32), scratch, s[0], *p, x_zp, lo, hi, np.float32(y_zp))
        assert np.array_equal(out, twin), parts


# --------------------------------------------------------------------------- channels innermost

# the padded-plane cases (1-7 channels: one partial block of 16), and whole blocks of 16
# channels with maps of whole 16-pixel blocks (4x4, 8x8) or not (7x7, 9x13), several blocks
# split over parts
CL = PADDED + ["cl-16x4x4", "cl-37x8x8-s2", "cl-48x7x7-5x5", "cl-33x9x13", "cl-64x8x8-5x5-s2"]
CASES_CL = {**CASES_PADDED, "cl-16x4x4": (1, 16, 4, 4, (3, 3), (1, 1), (1, 1), (1, 1)),
            "cl-37x8x8-s2": (2, 37, 8, 8, (3, 3), (2, 2), (1, 1), (1, 1)),
            "cl-48x7x7-5x5": (1, 48, 7, 7, (5, 5), (1, 1), (2, 2), (1, 1)),
            "cl-33x9x13": (3, 33, 9, 13, (3, 3), (1, 1), (1, 1), (1, 1)),
            "cl-64x8x8-5x5-s2": (1, 64, 8, 8, (5, 5), (2, 2), (2, 2), (1, 1))}


@pytest.mark.parametrize("name", CL)
@pytest.mark.parametrize("relu", [False, True])
def test_dw_conv_cl_q_exact(name, relu):
    """kernels_dwcl.dw_conv_cl_q (channels innermost, LLVM vectors) bit for bit with the naive
    twin: x_zp in the padding, the extreme codes (-128 inputs, +-127 weights: two taps'
    products at 2 * 16,256 in 16 bits), on one part, two and three, junk in the scratch."""
    from pocket.infer import kernels_dwcl as kc

    case = CASES_CL[name]
    n, c, h, wd, k, s, p, d, ho, wo = _geom(case)
    x, w_q, b_q, m = _extreme_int8(n, c, h, wd, k)
    x_zp, y_zp = 11, -5
    acc = naive_dw(x, w_q, s, p, d, x_zp, x_zp) + b_q.astype(np.int64).reshape(1, -1, 1, 1)
    twin = _naive_requant(acc, m, y_zp, relu)
    badj = b_q.astype(np.int64) - x_zp * w_q.reshape(c, -1).astype(np.int64).sum(axis=1)
    wt, bl, ml = kc.prepare_weights(w_q), kc.lanes(badj, np.int32), kc.lanes(m, np.float32)
    lo = np.float32(y_zp if relu else -128) - np.float32(y_zp)
    hi = np.float32(127) - np.float32(y_zp)
    for parts, fn in ((1, kc.dw_conv_cl_q.serial), (2, kc.dw_conv_cl_q), (3, kc.dw_conv_cl_q)):
        a, t = kc.scratch_sizes(c, h, wd, ho, wo, *p, parts)
        out = np.full((n, c, ho, wo), 99, np.int8)
        fn(out, x, readonly(wt), readonly(bl), readonly(ml), np.full((parts, a), 77, np.int8),
           np.full((parts, t), 66, np.int8), x_zp, lo, hi, np.float32(y_zp), s[0], *p)
        assert np.array_equal(out, twin), parts


@pytest.mark.parametrize("name", CL)
@pytest.mark.parametrize("act", ["none", "relu", "relu6", "silu"])
def test_dw_conv_cl_f32(name, act):
    """kernels_dwcl.dw_conv_cl (float32, channels innermost) against the float64 naive twin to
    float32 rounding, and bit for bit with the padded planes (the same FMA chain in the same tap
    order), on one part, two and three, NaN in the scratch and a NaN input (which every
    activation, ReLU too, passes on)."""
    from pocket.infer import kernels_dwcl as kc

    codes = {"none": (0, lambda y: y), "relu": (1, lambda y: np.where(y < 0, 0.0, y)),
             "relu6": (9, lambda y: np.clip(y, 0.0, 6.0)),
             "silu": (kf.ACT["silu"], lambda y: y / (1 + np.exp(-y)))}
    code, twin_act = codes[act]
    case = CASES_CL[name]
    n, c, h, wd, k, s, p, d, ho, wo = _geom(case)
    x = RNG.standard_normal((n, c, h, wd)).astype(np.float32) * 3
    x[0, 0, 0, 0] = np.nan
    w = RNG.standard_normal((c, 1, *k)).astype(np.float32)
    b = RNG.standard_normal(c).astype(np.float32)
    twin = twin_act(naive_dw(x, w, s, p, d, 0.0) + b.astype(np.float64).reshape(1, -1, 1, 1))
    xp, tmp = _padded_scratch(case, 1, np.float32, np.float32, 0.0)
    planes = np.empty((n, c, ho, wo), np.float32)
    kd.dw_conv_padded.serial(planes, x, readonly(w), readonly(b), xp, tmp, s[0], *p, code, 6.0)
    wt, bl = kc.prepare_f32(w, b)
    for parts, fn in ((1, kc.dw_conv_cl.serial), (2, kc.dw_conv_cl), (3, kc.dw_conv_cl)):
        a, t = kc.scratch_sizes_f32(c, h, wd, ho, wo, *p, parts)
        out = np.full((n, c, ho, wo), 7.0, np.float32)
        fn(out, x, readonly(wt), readonly(bl), np.full((parts, a), np.nan, np.float32),
           np.full((parts, t), np.nan, np.float32), s[0], *p, code, 6.0)  # (a Python float)
        np.testing.assert_allclose(out, twin, rtol=1e-4, atol=1e-4, equal_nan=True)
        assert np.array_equal(out, planes, equal_nan=True), parts


def test_engine_small_map_f32_takes_channels_innermost(tmp_path, monkeypatch):
    """The portable fp32 depthwise route (forced here: AVX-512 hosts take kernels_fma_dw) runs a
    4x4 map's conv on kernels_dwcl, within float32 rounding of the reference."""
    from models import Builder, matches_reference, save_model

    from pocket.infer.engine import Engine

    monkeypatch.setenv("POCKET_ROUTE", "conv_depthwise")
    rng = np.random.default_rng(13)
    b = Builder((40, 4, 4), rng)
    b.conv(40, 40, 3, groups=40, padding=[1, 1], activation="relu")
    path = save_model(tmp_path / "dw.bin", b.graph(), b.params)
    x = rng.standard_normal((2, 40, 4, 4)).astype(np.float32)
    with Engine(path, max_batch=2, threads=2) as eng:
        eng._arena.fill(255)
        got = eng.run(x, copy=True)
        names = [c.func.__name__.removesuffix("_serial") for c in eng._bound[2].calls]
    assert names == ["dw_conv_cl"], names
    matches_reference(path, x, got, False)


@pytest.mark.parametrize("low", [-127, -128])
def test_engine_small_map_takes_channels_innermost(tmp_path, low):
    """An int8 depthwise conv on a 4x4 map runs kernels_dwcl (on every CPU: `pays`), bit for
    bit with the reference; a weight of -128 (which our quantizer never writes, an imported
    model may) would overflow two taps' 16-bit sum, and keeps the planes."""
    from models import Builder, matches_reference, quantize_sequential, save_model

    from pocket.infer.engine import Engine

    rng = np.random.default_rng(12)
    b = Builder((40, 4, 4), rng)
    b.conv(40, 40, 3, groups=40, padding=[1, 1], activation="relu")
    b.conv(40, 8, 1)
    g, params = b.graph(), b.params
    x = rng.standard_normal((2, 40, 4, 4)).astype(np.float32)
    g, params, quant = quantize_sequential(g, params, rng.standard_normal((4, 40, 4, 4)).astype(np.float32))
    wname = next(n for n in g.nodes if n.op == "conv2d").inputs[1]
    params[wname][0, 0, 0, 0] = low
    path = save_model(tmp_path / "dw.bin", g, params, quant)
    with Engine(path, max_batch=2, threads=2) as eng:
        eng._arena.fill(255)
        got = eng.run(x, copy=True)
        names = [c.func.__name__.removesuffix("_serial") for c in eng._bound[2].calls]
    assert ("dw_conv_cl_q" in names) == (low == -127), names
    matches_reference(path, x, got, True)


# --------------------------------------------------------------------------- engine


def _mobilenet_block(stride, rng):
    """pointwise (expand, ReLU) -> depthwise 3x3 (ReLU) -> pointwise (project): MobileNetV2's
    inverted residual without its residual add."""
    from models import Builder

    b = Builder((8, 40, 37), rng)
    b.conv(8, 32, 1, activation="relu")
    b.conv(32, 32, 3, groups=32, stride=[stride, stride], padding=[1, 1], activation="relu")
    b.conv(32, 8, 1)
    return b.graph(), b.params


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("n,threads", [(1, 1), (3, 2)])
def test_engine_mobilenet_block(tmp_path, stride, int8, n, threads):
    """The engine routes the depthwise conv to kernels_dw (fp32 and int8, from a real .bin) and
    matches the reference: fp32 to float32 rounding, int8 bit for bit. At batch 3 on 2 threads
    the depthwise call has the work to run on the pool (the parallel twin)."""
    from models import matches_reference, quantize_sequential, save_model

    from pocket.infer.engine import Engine

    rng = np.random.default_rng(5 + stride)
    g, p = _mobilenet_block(stride, rng)
    x = rng.standard_normal((n, 8, 40, 37)).astype(np.float32)
    quant = None
    if int8:
        g, p, quant = quantize_sequential(g, p, rng.standard_normal((4, 8, 40, 37)).astype(np.float32))
    path = save_model(tmp_path / "block.bin", g, p, quant)
    with Engine(path, max_batch=4, threads=threads) as eng:
        eng._arena.fill(255)  # NaN as float32: a read of memory no call wrote shows
        got = eng.run(x, copy=True)
        table = {r["node"]: r["route"] for r in eng.routes()}
    from pocket.infer import kernels_fma

    fp32 = "conv_fma_depthwise" if kernels_fma.AVAILABLE else "conv_depthwise"
    assert table["conv2d1"] == ("conv_depthwise_int8" if int8 else fp32)
    matches_reference(path, x, got, int8)


def _parts(call) -> int:
    """The parts a depthwise or max pool call splits its planes into (its scratch rows, or its
    `parts` argument)."""
    name = call.func.__name__
    if name.startswith("maxpool_fma"):
        return call.args[2]
    if name.startswith("maxpool_sep"):
        return call.args[2].shape[0]
    if name.startswith("dw_conv_fma_q"):
        return call.args[5].shape[0]
    if name.startswith("dw_conv_fma_flat"):
        return call.args[5]
    if name.startswith("dw_conv_cl_q"):
        return call.args[5].shape[0]
    return call.args[4].shape[0]  # dw_conv_fma / dw_conv_padded*: their scratch


@pytest.mark.parametrize("spinning", [False, True])
@pytest.mark.parametrize("int8", [False, True])
def test_parts_follow_the_engines_choice(tmp_path, monkeypatch, spinning, int8):
    """A depthwise conv or max pool that the engine runs on the pool (its parallel twin) is
    split into one part a thread, and one it runs serially into one: the route sizes its parts
    with the engine's measure of its work. 96 planes of 32x32 are pool work only where the
    threads spin (pools.element_work), where a route once bound them one part."""
    from models import Builder, two_thread_calls

    from pocket.infer import engine as engine_mod
    from pocket.infer import kernels_fma, pools

    monkeypatch.setattr(pools, "spin_policy", lambda graph, sample, threads: (spinning, False))
    rng = np.random.default_rng(9)
    b = Builder((96, 32, 32), rng)
    b.conv(96, 96, 3, groups=96, padding=[1, 1], activation="relu")
    b.op("maxpool2d", kernel=[3, 3], stride=[2, 2], padding=[1, 1])
    b.conv(96, 8, 1)  # int8: the depthwise conv then gives int8 codes (dw_conv_fma_q on AVX-512)
    _, calls = two_thread_calls(tmp_path / "dw.bin", b, rng, (96, 32, 32), int8,
                                lambda name: "dw_conv" in name or "maxpool" in name)
    assert len(calls) == 2
    if int8 and kernels_fma.AVAILABLE:
        assert calls[0].func.__name__.startswith("dw_conv_fma_q")
    for c in calls:
        serial = c.func.__name__.endswith("_serial")
        assert serial != spinning, c.func.__name__  # 16 vs 64 per element around the threshold
        assert _parts(c) == (1 if serial else 2), c.func.__name__
    assert engine_mod._PARALLEL_WORK // 64 <= 96 * 32 * 32 < engine_mod._PARALLEL_WORK // 16


@pytest.mark.parametrize("k,h,parallel,kernel", [(5, 16, True, "dw_conv_fma"), (3, 16, False, "dw_conv_fma"),
                                                 (5, 7, True, "dw_conv_fma_cv"),
                                                 (5, 6, False, "dw_conv_fma_cv")])
def test_5x5_counts_its_taps(tmp_path, monkeypatch, k, h, parallel, kernel):
    """On AVX-512 a 5x5 depthwise conv counts 25/9 of a 3x3's work (pools.depthwise_work):
    64 planes of 16x16 (16,384 outputs, under the 3x3 threshold) run on the pool in one part
    a thread, the row kernels and kernels_fma_dwcv (7x7) alike; the same planes at 3x3, and
    5x5 on 6x6, stay on the calling thread in one part."""
    from models import Builder, two_thread_calls

    from pocket.infer import engine as engine_mod
    from pocket.infer import kernels_fma, pools

    if not kernels_fma.AVAILABLE:
        pytest.skip("this CPU has no AVX-512")
    monkeypatch.setattr(pools, "spin_policy", lambda graph, sample, threads: (True, False))
    c = 64 if h == 16 else 256
    rng = np.random.default_rng(10)
    b = Builder((c, h, h), rng)
    b.conv(c, c, k, groups=c, padding=[k // 2, k // 2], activation="silu")
    _, calls = two_thread_calls(tmp_path / "dw.bin", b, rng, (c, h, h), False,
                                lambda name: "dw_conv" in name)
    assert len(calls) == 1
    name = calls[0].func.__name__
    assert name.removesuffix("_serial") == kernel, name
    assert name.endswith("_serial") != parallel, name
    assert _parts(calls[0]) == (2 if parallel else 1), name
    assert c * h * h < engine_mod._PARALLEL_WORK // 64
