"""The portable pointwise kernels (kernels_pw) against a naive NumPy twin and formats/reference.py:
every blocking edge (channels past a multiple of 8, inputs past a multiple of 4, pixels past a
block), batches, parts, NaN junk in the scratch and the output."""

from __future__ import annotations

import numpy as np
import pytest

from pocket.formats import quant as qm
from pocket.formats import reference as ref
from pocket.infer import kernels_fp32 as kf
from pocket.infer import kernels_int8 as ki
from pocket.infer import kernels_pw as kp

RNG = np.random.default_rng(41)
PB = kp.PB

# name: (N, O, K, H, W)
SHAPES = {
    "one-block": (1, 8, 4, 8, 8),
    "rows-left": (1, 13, 16, 16, 16),  # one pass of 8, then 5 single rows
    "fewer-than-8": (1, 3, 5, 4, 7),
    "k-left": (2, 16, 7, 17, 17),  # 289 pixels: a full block and 33
    "k-1": (1, 9, 1, 20, 13),
    "k-3": (1, 8, 3, 16, 32),  # no pass of 4 at all
    "blocks-3": (1, 24, 12, 1, 2 * PB + 5),
    "one-pixel": (3, 10, 6, 1, 1),
}
ACTS = {"none": 0.0, "relu": 0.0, "clip": 6.0, "silu": 0.0, "hardswish": 0.0, "leaky_relu": 0.1}


def _naive_act(y, act, alpha):
    if act == "relu":
        return np.where(y < 0, 0.0, y)
    if act == "clip":
        return np.minimum(np.where(y < 0, 0.0, y), alpha)
    if act == "silu":
        return y / (1.0 + np.exp(-y))
    if act == "hardswish":
        return y * np.clip(y + 3.0, 0.0, 6.0) / 6.0
    if act == "hardsigmoid":
        return np.clip(y + 3.0, 0.0, 6.0) / 6.0
    if act == "leaky_relu":
        return np.where(y >= 0, y, alpha * y)
    return y


def _scratch(parts):
    return np.full((parts, kp.ROWS * PB), np.nan, np.float32)


@pytest.mark.parametrize("name", SHAPES)
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("parts", [1, 3])
def test_pw_conv_matches_naive(name, act, parts):
    n, o, k, h, wd = SHAPES[name]
    x = RNG.standard_normal((n, k, h, wd)).astype(np.float32)
    w = RNG.standard_normal((o, k, 1, 1)).astype(np.float32)
    b = RNG.standard_normal(o).astype(np.float32)
    out = np.full((n, o, h, wd), np.nan, np.float32)
    alpha = ACTS[act]
    fn = kp.pw_conv if parts > 1 else kp.pw_conv.serial
    fn(out.reshape(n, o, -1), x.reshape(n, k, -1), w.reshape(o, k), b, kf.ACT[act], alpha, _scratch(parts))
    w64, x64 = w.reshape(o, k).astype(np.float64), x.reshape(n, k, -1).astype(np.float64)
    pre = np.einsum("ok,nkp->nop", w64, x64) + b.reshape(1, o, 1)
    bound = 1e-5 * (np.einsum("ok,nkp->nop", np.abs(w64), np.abs(x64)) + np.abs(b).reshape(1, o, 1))
    # every activation here has a slope of at most ~1.1: it does not grow the sum's error
    twin = _naive_act(pre, act, alpha).reshape(out.shape)
    assert np.all(np.abs(out - twin) <= 1.2 * bound.reshape(out.shape) + 1e-6), name
    attrs = {"stride": [1, 1], "padding": [0, 0], "dilation": [1, 1], "groups": 1, "activation": act}
    if act == "clip":
        attrs.update(min=0.0, max=alpha)
    if act == "leaky_relu":
        attrs["alpha"] = alpha
    want = ref.conv2d(attrs, x, w, b)
    assert np.all(np.abs(out - want) <= 1.2 * bound.reshape(out.shape) + 1e-6 + 1e-6 * np.abs(want))


def test_pw_conv_no_bias_nan_input():
    n, o, k, h, wd = 1, 9, 6, 3, 11
    x = RNG.standard_normal((n, k, h * wd)).astype(np.float32)
    x[0, 2, 5] = np.nan
    w = RNG.standard_normal((o, k)).astype(np.float32)
    out = np.full((n, o, h * wd), 7.0, np.float32)
    kp.pw_conv.serial(out, x, w, np.zeros(0, np.float32), kf.ACT["relu"], 0.0, _scratch(1))
    assert np.all(np.isnan(out[0, :, 5]))  # a NaN input poisons its pixel in every channel
    keep = np.delete(np.arange(h * wd), 5)
    twin = np.maximum(w.astype(np.float64) @ x[0][:, keep].astype(np.float64), 0)
    np.testing.assert_allclose(out[0][:, keep], twin, rtol=1e-5, atol=1e-5)


def _int8_case(n, o, k, p, x_zp):
    x = RNG.integers(-128, 128, (n, k, p)).astype(np.int8)
    w_q, w_s = qm.quantize_weights(RNG.standard_normal((o, k, 1, 1)).astype(np.float32))
    w_q[0, 0] = -128  # the extreme codes: x_q * w_q reaches -128 * -128
    x[0, 0, 0] = -128
    b_q = qm.quantize_bias(RNG.standard_normal(o).astype(np.float32), 0.05, w_s)
    return x, w_q, w_s, b_q


@pytest.mark.parametrize("name", SHAPES)
@pytest.mark.parametrize("mode", ["i8", "i8-relu", "i8-clip", "f32", "f32-relu"])
def test_pw_conv_q_exact(name, mode):
    n, o, k, h, wd = SHAPES[name]
    p, x_zp = h * wd, 11
    x, w_q, w_s, b_q = _int8_case(n, o, k, p, x_zp)
    to_int8 = mode.startswith("i8")
    act = {"relu": "relu", "clip": "clip"}.get(mode.split("-")[-1], "none")
    relu = act != "none"
    y_zp, y_s = (-5, 0.07) if to_int8 else (0, None)
    m = qm.requant_multiplier(0.05, w_s, y_s)
    hi = float(qm.quantize(np.float32(6.0), y_s, y_zp)) if act == "clip" else 127.0
    lo = (float(y_zp if relu else -128), hi, 6.0 if act == "clip" else np.inf)
    wsum = ki.weight_sums(w_q.reshape(o, k))
    bias_adj = b_q.astype(np.int64) - np.int64(x_zp) * wsum.astype(np.int64)
    out = np.full((n, o, p), 99 if to_int8 else np.nan, np.int8 if to_int8 else np.float32)
    # the parallel twin for one mode (each compile of it takes seconds), two parts
    fn, parts = (kp.pw_conv_q, 2) if mode == "i8-relu" else (kp.pw_conv_q.serial, 1)
    fn(out, x, w_q.reshape(o, k), bias_adj, m, to_int8, float(y_zp), lo, relu, _scratch(parts))
    acc = np.einsum("ok,nkp->nop", w_q.reshape(o, k).astype(np.int64), x.astype(np.int64) - x_zp)
    acc += b_q.astype(np.int64).reshape(1, o, 1)
    if to_int8:
        v = acc.astype(np.float32) * m.astype(np.float32).reshape(1, o, 1)  # formats.quant
        twin = np.clip(np.rint(v) + y_zp, lo[0], lo[1]).astype(np.int8)
    else:
        twin = (acc * m.reshape(1, o, 1)).astype(np.float32)
        twin = np.maximum(twin, np.float32(0)) if relu else twin
    assert np.array_equal(out, twin)
    attrs = {"stride": [1, 1], "padding": [0, 0], "dilation": [1, 1], "groups": 1, "activation": act,
             "x_scale": 0.05, "x_zero_point": x_zp}
    if act == "clip":
        attrs.update(min=0.0, max=6.0)
    if to_int8:
        attrs.update(y_scale=y_s, y_zero_point=y_zp)
    want = ref.conv2d(attrs, x.reshape(n, k, h, wd), w_q, b_q, w_scale=w_s)
    assert np.array_equal(out.reshape(want.shape), want)


def test_pw_conv_q_exact_at_exact_k():
    """K = EXACT_K with every code at -128: each sum is 2**24, still exact in float32."""
    o, k, p = 9, ki.EXACT_K, 40
    x = np.full((1, k, p), -128, np.int8)
    w = np.full((o, k), -128, np.int8)
    w[1:] = RNG.integers(-128, 128, (o - 1, k))
    m = np.full(o, 2.0 ** -20)
    bias_adj = np.zeros(o, np.int64)
    out = np.empty((1, o, p), np.float32)
    kp.pw_conv_q.serial(out, x, w, bias_adj, m, False, 0.0, (-128.0, 127.0, np.inf), False, _scratch(1))
    acc = w.astype(np.int64) @ x[0].astype(np.int64)
    assert acc[0, 0] == 2 ** 24
    assert np.array_equal(out[0], (acc * m.reshape(o, 1)).astype(np.float32))


@pytest.mark.parametrize("name", ["rows-left", "one-block", "blocks-3", "one-pixel"])
def test_pw_conv_same_bytes_for_any_split(name):
    """Any number of parts (more than the pixel blocks too) writes the serial twin's bytes,
    float32 and int8: a part's channels sum in the same 8-row passes."""
    n, o, k, h, wd = SHAPES[name]
    x = RNG.standard_normal((n, k, h * wd)).astype(np.float32)
    w = RNG.standard_normal((o, k)).astype(np.float32)
    b = RNG.standard_normal(o).astype(np.float32)
    one = np.full((n, o, h * wd), np.nan, np.float32)
    kp.pw_conv.serial(one, x, w, b, kf.ACT["relu"], 0.0, _scratch(1))
    xq, w_q, w_s, b_q = _int8_case(n, o, k, h * wd, 11)
    wq = w_q.reshape(o, k)
    adj = b_q.astype(np.int64) - 11 * ki.weight_sums(wq).astype(np.int64)
    m = qm.requant_multiplier(0.05, w_s, 0.07)
    lo = (-5.0, 127.0, np.inf)
    qone = np.zeros((n, o, h * wd), np.int8)
    kp.pw_conv_q.serial(qone, xq, wq, adj, m, True, -5.0, lo, True, _scratch(1))
    for parts in (2, 3, 5):
        got = np.full_like(one, np.nan)
        kp.pw_conv(got, x, w, b, kf.ACT["relu"], 0.0, _scratch(parts))
        np.testing.assert_array_equal(got, one, err_msg=f"{name}, {parts} parts")
        qgot = np.zeros_like(qone)
        kp.pw_conv_q(qgot, xq, wq, adj, m, True, -5.0, lo, True, _scratch(parts))
        np.testing.assert_array_equal(qgot, qone, err_msg=f"int8 {name}, {parts} parts")
