"""int8 arithmetic shared by the exporter, the reference interpreter and the engine.

One definition, so that every producer and consumer rounds the same way:

- Weights: symmetric per output channel (axis 0). scale[o] = max|w[o]| / 127 (1.0 for an
  all-zero channel), w_q = clip(round_half_even(w / scale[o]), -127, 127), zero point 0.
- Scales are positive finite normal float32 values (`is_scale`), wherever they are stored.
- Activations: per tensor, asymmetric int8. scale > 0 and zero_point in [-128, 127] are stored
  as float32 / int in the node attrs. quantize(x) = clip(round_half_even(x / scale) + zp,
  -128, 127), computed in float32 as ONNX QuantizeLinear does; dequantize(q) = (q - zp) * scale
  in float32.
- Bias of an int8 conv/linear: int32, b_q[o] = round_half_even(b[o] / (x_scale * w_scale[o])),
  computed in float64 (as ONNX QDQ expects the bias scale to be x_scale * w_scale).
- Accumulation: acc[o] = sum((x_q - x_zp) * w_q) + b_q[o], exact in int32.
- Requantization to int8: y_q = clip(round_half_even(float32(acc) * float32(M[o])) + y_zp,
  lo, 127) with M[o] = x_scale * w_scale[o] / y_scale in float64, then the product of the two
  float32 values in float32 (one rounding), as onnxruntime's int8 kernels requantize: vector
  units hold twice as many float32 lanes as float64 ones (4 on NEON), and this epilogue is
  most of an int8 network's work after the dot products; lo = y_zp when
  the node fuses relu (relu(y) quantizes to max(y_q, y_zp)), else -128. A fused clip (min 0,
  max) clamps to [y_zp, hi] with hi = quantize(max): clip then quantize equals quantize then
  clamp, since rounding is monotone. hi is 127 otherwise.
- Output to float32: y = float32(acc * (x_scale * w_scale[o])) in float64, then the activation.
"""

from __future__ import annotations

import numpy as np

QMIN, QMAX = -128, 127
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def f32(v: float) -> float:
    """Round a Python float to the nearest float32, so JSON attrs hold exactly what runs."""
    return float(np.float32(v))


SCALE_RULE = "a positive finite float32 (normal: at least 1.18e-38, at most 3.4e38)"


def is_scale(v: float) -> bool:
    """Whether v is a usable quantization scale (SCALE_RULE) once rounded to float32.

    NOTE: finite as a JSON double is not enough: every consumer multiplies in float32, where
    1e39 is inf and 1e-46 is 0, and a subnormal scale has lost precision already.
    """
    try:
        with np.errstate(over="ignore"):
            v32 = np.float32(v)
    except (OverflowError, TypeError, ValueError):
        return False
    return bool(np.isfinite(v32) and v32 >= np.finfo(np.float32).tiny)


def quantize_weights(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """w (O, ...) f32 -> (w_q (O, ...) i8, scale (O,) f32), symmetric per output channel."""
    w = np.asarray(w, dtype=np.float32)
    flat = w.reshape(w.shape[0], -1)
    amax = np.abs(flat).max(axis=1) if flat.shape[1] else np.zeros(w.shape[0], np.float32)
    scale = (amax.astype(np.float64) / 127.0).astype(np.float32)
    scale[scale == 0] = 1.0
    shape = (-1,) + (1,) * (w.ndim - 1)
    q = np.rint(w.astype(np.float64) / scale.astype(np.float64).reshape(shape))
    return np.clip(q, -127, 127).astype(np.int8), scale


def dequantize_weights(w_q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    shape = (-1,) + (1,) * (w_q.ndim - 1)
    return (w_q.astype(np.float32) * np.asarray(scale, np.float32).reshape(shape)).astype(np.float32)


def quantize_bias(b: np.ndarray, x_scale: float, w_scale: np.ndarray) -> np.ndarray:
    """b (O,) f32 -> b_q (O,) i32 with scale x_scale * w_scale."""
    s = np.float64(x_scale) * np.asarray(w_scale, np.float64)
    q = np.rint(np.asarray(b, np.float64) / s)
    return np.clip(q, INT32_MIN, INT32_MAX).astype(np.int32)


def choose_activation_qparams(lo: float, hi: float) -> tuple[float, int]:
    """Scale and zero point that map [min(lo, 0), max(hi, 0)] onto [-128, 127]; 0 is exact."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if hi - lo < 1e-12:
        return 1.0, 0
    scale = f32((hi - lo) / 255.0)
    zp = int(np.clip(np.rint(QMIN - lo / scale), QMIN, QMAX))
    return scale, zp


def quantize(x: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    """f32 -> i8, as ONNX QuantizeLinear: division in float32, ties to even, saturate."""
    q = np.rint(np.asarray(x, np.float32) / np.float32(scale)).astype(np.float32)
    return np.clip(q + np.float32(zero_point), QMIN, QMAX).astype(np.int8)


def dequantize(q: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    """i8 -> f32: (q - zero_point) * scale in float32."""
    return ((q.astype(np.int32) - zero_point).astype(np.float32) * np.float32(scale)).astype(
        np.float32
    )


def requant_multiplier(x_scale: float, w_scale: np.ndarray, y_scale: float | None) -> np.ndarray:
    """M (O,) f64: acc * M gives the output in y units (or in real units when y_scale is None)."""
    m = np.float64(x_scale) * np.asarray(w_scale, np.float64)
    return m / np.float64(y_scale) if y_scale is not None else m


def requantize(acc: np.ndarray, m: np.ndarray, y_zero_point: int, relu: bool,
               axis: int = 1, hi: int = QMAX) -> np.ndarray:
    """acc (N, O, ...) i32 -> i8. m (O,) f64 along `axis`, used as float32 (see the module
    docstring); hi the highest code (a clip's)."""
    shape = [1] * acc.ndim
    shape[axis] = -1
    v = acc.astype(np.float32)
    v *= np.asarray(m, np.float64).astype(np.float32).reshape(shape)
    # NOTE: in float32, in place: rint(v) is an integer, exact in float32; adding the zero
    # point is exact below 2**24, and above it the rounded sum is still far outside the clip
    v = np.rint(v, out=v)
    v += y_zero_point
    lo = y_zero_point if relu else QMIN
    return np.clip(v, lo, hi, out=v).astype(np.int8)


def sqnr_db(ref: np.ndarray, approx: np.ndarray) -> float:
    """Signal-to-quantization-noise ratio in dB (inf when identical)."""
    ref = np.asarray(ref, np.float64)
    noise = float(np.sum((ref - np.asarray(approx, np.float64)) ** 2))
    signal = float(np.sum(ref**2))
    if noise == 0:
        return float("inf")
    if signal == 0:
        return float("-inf")
    return 10.0 * np.log10(signal / noise)
