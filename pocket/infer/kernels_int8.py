"""int8 kernels of the engine; their results must equal formats/reference.py bit for bit.

The arithmetic is pocket.formats.quant's:
    acc[o] = sum((x_q - x_zp) * w_q) + b_q[o]                       exact int32
           = sum(x_q * w_q) - x_zp * wsum[o] + b_q[o]               wsum[o] = sum(w_q[o])
The second form keeps the inner loop a pure int8 x int8 dot product; it stays exact because
int32 wrap-around is arithmetic modulo 2**32 and the true result fits int32. Padding must then
hold x_zp (not 0), which is what `im2row` writes.

Epilogue: to int8 y = clip(rint(acc * m[o]) + y_zp, lo, 127) with m in float64 (lo = y_zp when
relu is fused), or to float32 y = float32(acc * m[o]) then relu.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(cache=True, parallel=True, fastmath=False)
def quantize(out, x, scale, zp):
    """x (M,) f32 -> out (M,) i8; division in float32, ties to even, saturating."""
    s = np.float32(scale)
    for i in prange(x.shape[0]):
        v = np.rint(x[i] / s) + np.float32(zp)
        out[i] = np.int8(min(max(v, np.float32(-128.0)), np.float32(127.0)))


@njit(cache=True, parallel=True, fastmath=False)
def dequantize(out, x, scale, zp):
    """x (M,) i8 -> out (M,) f32 = (x - zp) * scale in float32."""
    s = np.float32(scale)
    for i in prange(x.shape[0]):
        out[i] = np.float32(np.int32(x[i]) - zp) * s


@njit(cache=True, parallel=True, fastmath=False)
def im2row(col, x, kh, kw, sh, sw, ph, pw, dh, dw, pad):
    """x (N, C, H, W) i8 -> col (N, Ho*Wo, C*kh*kw), column (c, i, j) as in OIHW; outside = pad.

    Rows hold one output pixel's receptive field contiguously, the layout the dot product wants.
    """
    n, c, h, w = x.shape
    wo = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    ho = col.shape[1] // wo
    for r in prange(n * ho):
        b, oh = r // ho, r % ho
        for ow in range(wo):
            row = col[b, oh * wo + ow]
            for ch in range(c):
                for i in range(kh):
                    ih = oh * sh - ph + i * dh
                    for j in range(kw):
                        iw = ow * sw - pw + j * dw
                        inside = 0 <= ih < h and 0 <= iw < w
                        row[(ch * kh + i) * kw + j] = x[b, ch, ih, iw] if inside else pad


@njit(cache=True)
def weight_sums(w):
    """w (O, K) i8 -> (O,) i32, the per-channel sums that fold x_zp out of the dot product."""
    o, k = w.shape
    out = np.zeros(o, np.int32)
    for i in range(o):
        for j in range(k):
            out[i] += np.int32(w[i, j])
    return out


@njit(cache=True, inline="always")
def _epilogue(acc, m, y_zp, lo, to_int8, relu):
    """One int32 accumulator -> int8 code or float32 value (see the module docstring)."""
    v = np.float64(acc) * m
    if to_int8:
        return min(max(np.rint(v) + y_zp, lo), 127.0)
    v = np.float64(np.float32(v))
    return max(v, 0.0) if relu else v


@njit(cache=True, parallel=True, fastmath=False)
def gemm_q(out, col, w, bias_adj, m, groups, to_int8, y_zp, lo, relu):
    """col (N, P, K) i8, w (O, K/groups) i8 -> out (N, O, P) i8 or f32.

    bias_adj (O,) i64 = b_q - x_zp * wsum; m (O,) f64 the requant multiplier (or the real
    scale x_scale * w_scale for a float32 output, to_int8 False).
    """
    n, p, k = col.shape
    o, kg = w.shape
    og = o // groups
    for r in prange(n * p):
        b, px = r // p, r % p
        row = col[b, px]
        for oc in range(o):
            k0 = (oc // og) * kg
            wr = w[oc]
            s = np.int32(0)
            for j in range(kg):
                s += np.int16(row[k0 + j]) * np.int16(wr[j])
            out[b, oc, px] = _epilogue(s + bias_adj[oc], m[oc], y_zp, lo, to_int8, relu)
