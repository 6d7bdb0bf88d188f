"""Numba kernels for the CPU hot loops: im2col/col2im, pooling, erf.

Each kernel writes into an output the caller allocated; shapes are in the comments. The naive
NumPy twins live in the tests.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange


@njit(parallel=True, cache=True)
def im2col(x, kh, kw, sh, sw, ph, pw, dh, dw, col):
    # x (N, C, H, W) -> col (N, Ho, Wo, C, kh, kw), zeros where the window leaves x
    N, C, H, W = x.shape
    Ho, Wo = col.shape[1], col.shape[2]
    flat = col.reshape(N * Ho * Wo, C * kh * kw)
    for nh in prange(N * Ho):
        n = nh // Ho
        oh = nh - n * Ho
        for ow in range(Wo):
            r = nh * Wo + ow
            k = 0
            for c in range(C):
                for i in range(kh):
                    h = oh * sh - ph + i * dh
                    if h < 0 or h >= H:
                        for _ in range(kw):
                            flat[r, k] = 0.0
                            k += 1
                        continue
                    for j in range(kw):
                        w = ow * sw - pw + j * dw
                        flat[r, k] = x[n, c, h, w] if 0 <= w < W else 0.0
                        k += 1


@njit(parallel=True, cache=True)
def col2im(col, kh, kw, sh, sw, ph, pw, dh, dw, gx):
    # col (N, Ho, Wo, C, kh, kw) -> gx (N, C, H, W), summing every window that covers a pixel
    N, C, H, W = gx.shape
    Ho, Wo = col.shape[1], col.shape[2]
    for nc in prange(N * C):
        n = nc // C
        c = nc % C
        for h in range(H):
            for w in range(W):
                gx[n, c, h, w] = 0.0
        for oh in range(Ho):
            for i in range(kh):
                h = oh * sh - ph + i * dh
                if h < 0 or h >= H:
                    continue
                for ow in range(Wo):
                    for j in range(kw):
                        w = ow * sw - pw + j * dw
                        if 0 <= w < W:
                            gx[n, c, h, w] += col[n, oh, ow, c, i, j]


@njit(parallel=True, cache=True)
def maxpool2d_forward(x, kh, kw, sh, sw, ph, pw, dh, dw, out, arg):
    # x (N, C, H, W) -> out (N, C, Ho, Wo), arg (N, C, Ho, Wo) flat h*W+w of the max
    N, C, H, W = x.shape
    Ho, Wo = out.shape[2], out.shape[3]
    for nc in prange(N * C):
        n = nc // C
        c = nc % C
        for oh in range(Ho):
            for ow in range(Wo):
                best = -np.inf
                bi = -1
                for i in range(kh):
                    h = oh * sh - ph + i * dh
                    if h < 0 or h >= H:
                        continue
                    for j in range(kw):
                        w = ow * sw - pw + j * dw
                        if w < 0 or w >= W:
                            continue
                        v = x[n, c, h, w]
                        # NOTE: NaN wins, as in PyTorch, so a NaN is not silently dropped.
                        if bi < 0 or v > best or v != v:
                            best = v
                            bi = h * W + w
                            if v != v:
                                break
                out[n, c, oh, ow] = best
                arg[n, c, oh, ow] = bi


@njit(parallel=True, cache=True)
def maxpool2d_forward_valid(x, kh, kw, sh, sw, out, arg):
    # no padding, no dilation: every window lies inside x, so no bounds checks
    N, C, H, W = x.shape
    Ho, Wo = out.shape[2], out.shape[3]
    for nc in prange(N * C):
        n = nc // C
        c = nc - n * C
        xs = x[n, c]
        for oh in range(Ho):
            h0 = oh * sh
            for ow in range(Wo):
                w0 = ow * sw
                best = xs[h0, w0]
                bi = h0 * W + w0
                for i in range(kh):
                    for j in range(kw):
                        v = xs[h0 + i, w0 + j]
                        if (v > best or v != v) and best == best:
                            best = v
                            bi = (h0 + i) * W + w0 + j
                out[n, c, oh, ow] = best
                arg[n, c, oh, ow] = bi


@njit(parallel=True, cache=True)
def maxpool2d_backward(gy, arg, gx):
    # gy (N, C, Ho, Wo), arg (N, C, Ho, Wo) -> gx (N, C, H, W)
    N, C, H, W = gx.shape
    Ho, Wo = gy.shape[2], gy.shape[3]
    for nc in prange(N * C):
        n = nc // C
        c = nc % C
        for h in range(H):
            for w in range(W):
                gx[n, c, h, w] = 0.0
        for oh in range(Ho):
            for ow in range(Wo):
                k = arg[n, c, oh, ow]
                gx[n, c, k // W, k % W] += gy[n, c, oh, ow]


@njit(parallel=True, cache=True)
def avgpool2d_forward(x, kh, kw, sh, sw, ph, pw, include_pad, out):
    # x (N, C, H, W) -> out (N, C, Ho, Wo)
    N, C, H, W = x.shape
    Ho, Wo = out.shape[2], out.shape[3]
    for nc in prange(N * C):
        n = nc // C
        c = nc % C
        for oh in range(Ho):
            for ow in range(Wo):
                s = 0.0
                cnt = 0
                for i in range(kh):
                    h = oh * sh - ph + i
                    if h < 0 or h >= H:
                        continue
                    for j in range(kw):
                        w = ow * sw - pw + j
                        if 0 <= w < W:
                            s += x[n, c, h, w]
                            cnt += 1
                out[n, c, oh, ow] = s / (kh * kw if include_pad else max(cnt, 1))


@njit(parallel=True, cache=True)
def avgpool2d_backward(gy, kh, kw, sh, sw, ph, pw, include_pad, gx):
    # gy (N, C, Ho, Wo) -> gx (N, C, H, W)
    N, C, H, W = gx.shape
    Ho, Wo = gy.shape[2], gy.shape[3]
    for nc in prange(N * C):
        n = nc // C
        c = nc % C
        for h in range(H):
            for w in range(W):
                gx[n, c, h, w] = 0.0
        for oh in range(Ho):
            for ow in range(Wo):
                cnt = kh * kw
                if not include_pad:
                    cnt = 0
                    for i in range(kh):
                        h = oh * sh - ph + i
                        for j in range(kw):
                            w = ow * sw - pw + j
                            if 0 <= h < H and 0 <= w < W:
                                cnt += 1
                    cnt = max(cnt, 1)
                g = gy[n, c, oh, ow] / cnt
                for i in range(kh):
                    h = oh * sh - ph + i
                    if h < 0 or h >= H:
                        continue
                    for j in range(kw):
                        w = ow * sw - pw + j
                        if 0 <= w < W:
                            gx[n, c, h, w] += g


@njit(parallel=True, cache=True)
def _erf_flat(x, out):
    for i in prange(x.shape[0]):
        out[i] = math.erf(x[i])


def erf(x: np.ndarray) -> np.ndarray:
    xc = np.ascontiguousarray(x)
    out = np.empty_like(xc)
    _erf_flat(xc.reshape(-1), out.reshape(-1))
    return out
