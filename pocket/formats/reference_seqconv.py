"""The reference (executable meaning) of the sequence-convolution ops, fp32 and int8.

conv1d zero-pads (possibly asymmetrically) and sums every tap in float64; int8 follows
reference.py's conv2d exactly: (x_q - x_zp) padded with 0 (a padded x_q equals x_zp), summed in
int64, then the int8 epilogue of `pocket.formats.quant`. The pools pad explicitly and reduce
the taps, as reference.py's 2-D pools do. Standard library + NumPy only.
"""

from __future__ import annotations

import numpy as np

from pocket.formats import ops
from pocket.formats import quant as q
from pocket.formats.errors import FormatError


def _f64(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float64)


def _pad_time(x: np.ndarray, left: int, right: int, value) -> np.ndarray:
    return np.pad(x, ((0, 0), (0, 0), (left, right)), constant_values=value)


def _conv1d64(x: np.ndarray, w: np.ndarray, a) -> np.ndarray:
    """x (N, C, L) float64 (already shifted by x_zp for int8), w (O, C/g, K) -> (N, O, Lo).

    The zero-padded input viewed (no copy) as cols[n, g, c, k, t] = xp[n, g*cg + c, t*s + k*d],
    then per group out[n, g] = w[g] (O/g, cg*K) @ cols[n, g] (cg*K, Lo), summed in float64.
    """
    left, right = a.get("padding", [0, 0])
    s, d, g = a.get("stride", 1), a.get("dilation", 1), a.get("groups", 1)
    xp = np.ascontiguousarray(_pad_time(x, left, right, 0))
    n, c, length = xp.shape
    o, cg, k = w.shape
    lo = (length - d * (k - 1) - 1) // s + 1
    s0, s1, s2 = xp.strides
    cols = np.lib.stride_tricks.as_strided(xp, (n, g, cg, k, lo), (s0, cg * s1, s1, d * s2, s * s2),
                                           writeable=False).reshape(n, g, cg * k, lo)
    return np.matmul(w.reshape(g, o // g, cg * k), cols).reshape(n, o, lo)


def _int8_epilogue(a, acc: np.ndarray, w_scale) -> np.ndarray:
    """acc (N, O, Lo) int64 -> int8 (requantized) or float32, per pocket.formats.quant."""
    if w_scale is None:
        raise FormatError("an int8 conv1d needs the weight's per-channel scales")
    if acc.min(initial=0) < q.INT32_MIN or acc.max(initial=0) > q.INT32_MAX:
        raise FormatError("int8 accumulator overflows int32")
    acc = acc.astype(np.int32)
    relu = a.get("activation", "none") == "relu"
    if a.get("y_scale") is not None:
        m = q.requant_multiplier(a["x_scale"], w_scale, a["y_scale"])
        return q.requantize(acc, m, a["y_zero_point"], relu, axis=1)
    m = q.requant_multiplier(a["x_scale"], w_scale, None)
    y = (acc.astype(np.float64) * m.reshape(1, -1, 1)).astype(np.float32)
    return np.where(y < 0, np.float32(0), y) if relu else y


@ops.register("reference", "conv1d")
def conv1d(a, x, w, b=None, *, w_scale=None):
    """x (N, C, L), w (O, C/groups, K), b (O,) -> (N, O, Lo)."""
    if a.get("x_scale") is not None:
        # NOTE: int8 products summed in float64 are exact integers (see reference.EXACT_F32_TERMS)
        acc = _conv1d64(_f64(x.astype(np.int64) - a["x_zero_point"]), _f64(w), a).astype(np.int64)
        if b is not None:
            acc = acc + b.astype(np.int64).reshape(1, -1, 1)
        return _int8_epilogue(a, acc, w_scale)
    y = _conv1d64(_f64(x), _f64(w), a)
    if b is not None:
        y = y + _f64(b).reshape(1, -1, 1)
    act = a.get("activation", "none")
    if act != "none":
        y = ops.impl("reference", act).f64(y, a)
    return y.astype(np.float32)


def _taps(x: np.ndarray, a, pad_value) -> list[np.ndarray]:
    """The strided slice of the padded input under each kernel tap (floor mode)."""
    k, p = a["kernel"], a.get("padding", 0)
    s = a.get("stride") or k
    lo = (x.shape[2] + 2 * p - k) // s + 1
    xp = _pad_time(x, p, p, pad_value)
    return [xp[:, :, i:i + s * (lo - 1) + 1:s] for i in range(k)]


@ops.register("reference", "maxpool1d")
def maxpool1d(a, x, **_):
    """x (N, C, L) f32 or i8 -> (N, C, Lo); padding never wins (-inf, or -128 for i8)."""
    pad = -128 if x.dtype == np.int8 else -np.inf
    return np.maximum.reduce(_taps(x, a, pad)).astype(x.dtype)


@ops.register("reference", "avgpool1d")
def avgpool1d(a, x, **_):
    """x (N, C, L) -> (N, C, Lo); count_include_pad picks the divisor."""
    total = sum(_taps(_f64(x), a, 0.0))
    if a.get("count_include_pad", True):
        count = a["kernel"]
    else:
        count = sum(_taps(np.ones((1, 1, x.shape[2])), a, 0.0))
    return (total / count).astype(np.float32)


@ops.register("reference", "global_avgpool1d")
def global_avgpool1d(a, x, **_):
    """x (N, C, L) -> (N, C)."""
    return _f64(x).mean(axis=2).astype(np.float32)


@ops.register("reference", "global_maxpool1d")
def global_maxpool1d(a, x, **_):
    """x (N, C, L) -> (N, C); a NaN anywhere in a row gives NaN (np.max), as torch.amax."""
    return np.asarray(x, np.float32).max(axis=2)
