"""Numba kernels for the CPU hot loops: im2col/col2im, pooling, erf.

Each kernel writes into an output the caller allocated; shapes are in the comments. The naive
NumPy twins live in the tests.
"""

from __future__ import annotations

import math
import os

# NOTE: a training step alternates these kernels with OpenBLAS's GEMMs hundreds of times. After
# each GEMM OpenBLAS's worker threads spin for a while on their cores, so a parallel kernel's
# own worker threads wait for a core: on 2 busy cores the CIFAR step went from 0.6 s to 3-8 s,
# even with passive OpenMP waiting. Run serially, the kernels overlap the spinning BLAS workers
# instead of fighting them, and measured faster end to end; set POCKET_PARALLEL_KERNELS=1 to
# compile them with prange. Passive waiting still matters for that case (as in pocket.infer).
PARALLEL = os.environ.get("POCKET_PARALLEL_KERNELS", "0") == "1"
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
from numba import njit, prange  # noqa: E402


@njit(cache=True)
def _inside(k, d, p, s, size, n_out):
    # (lo, hi) per tap t < k: the outputs o whose input o*s + t*d - p lies in [0, size)
    lo = np.empty(k, np.int64)
    hi = np.empty(k, np.int64)
    for t in range(k):
        off = t * d - p
        lo[t] = min(max(0, (s - 1 - off) // s), n_out)
        hi[t] = min(max(lo[t], (size - off + s - 1) // s), n_out)
    return lo, hi


@njit(cache=True)
def _outside(kh, kw, hlo, hhi, wlo, whi, Ho, Wo):
    # per tap (i, j): the positions oh*Wo + ow of a (Ho, Wo) block whose window leaves x
    pos = np.empty((kh * kw, Ho * Wo), np.int64)
    cnt = np.zeros(kh * kw, np.int64)
    for i in range(kh):
        for j in range(kw):
            t = i * kw + j
            for oh in range(Ho):
                for ow in range(Wo):
                    if oh < hlo[i] or oh >= hhi[i] or ow < wlo[j] or ow >= whi[j]:
                        pos[t, cnt[t]] = oh * Wo + ow
                        cnt[t] += 1
    return pos, cnt


# NOTE on the kernels below: indices are cast to uint64 in the inner loops. Numba wraps a
# negative signed index around, and that per-element check keeps LLVM from vectorizing.
# With stride 1 and Wo == W (a "same" conv), the rows of one tap's block are one shifted run
# of x's plane, so one long copy replaces Ho short ones, and the few positions the shift
# wraps in from a neighbouring row are the padding positions (`_outside`), zeroed after.


@njit(parallel=PARALLEL, cache=True)
def im2col(x, kh, kw, sh, sw, ph, pw, dh, dw, col):
    # x (N, C, H, W) -> col (C, kh, kw, N, Ho, Wo), zeros where the window leaves x
    # NOTE: tap-major rows make the inner loops row copies of x, and the GEMM
    # W (O, C*kh*kw) @ col (C*kh*kw, N*Ho*Wo) then needs no transposed operand.
    N, C, H, W = x.shape
    Ho, Wo = col.shape[4], col.shape[5]
    P = Ho * Wo
    xf = x.reshape(-1)
    cf = col.reshape(-1)
    hlo, hhi = _inside(kh, dh, ph, sh, H, Ho)
    wlo, whi = _inside(kw, dw, pw, sw, W, Wo)
    pos, cnt = _outside(kh, kw, hlo, hhi, wlo, whi, Ho, Wo)
    run = sh == 1 and sw == 1 and Wo == W
    for ci in prange(C * kh):
        c = ci // kh
        i = ci - c * kh
        for j in range(kw):
            t = i * kw + j
            for n in range(N):
                base = ((ci * kw + j) * N + n) * P
                plane = (n * C + c) * H * W
                if run:
                    d = base + hlo[i] * Wo
                    src = plane + (hlo[i] + i * dh - ph) * W + j * dw - pw
                    k0 = max(0, plane - src)
                    k1 = min((hhi[i] - hlo[i]) * W, plane + H * W - src)
                    for k in range(k0, k1):
                        cf[np.uint64(d + k)] = xf[np.uint64(src + k)]
                else:
                    for oh in range(hlo[i], hhi[i]):
                        d = base + oh * Wo
                        src = plane + (oh * sh + i * dh - ph) * W + j * dw - pw
                        for ow in range(wlo[j], whi[j]):
                            cf[np.uint64(d + ow)] = xf[np.uint64(src + ow * sw)]
                for q in range(cnt[t]):
                    cf[np.uint64(base + pos[t, q])] = 0.0


@njit(parallel=PARALLEL, cache=True)
def col2im(col, kh, kw, sh, sw, ph, pw, dh, dw, gx):
    # col (C, kh, kw, N, Ho, Wo) -> gx (N, C, H, W), summing every window that covers a pixel.
    # col is scratch: its padding positions are zeroed on the way.
    N, C, H, W = gx.shape
    Ho, Wo = col.shape[4], col.shape[5]
    P = Ho * Wo
    cf = col.reshape(-1)
    gf = gx.reshape(-1)
    hlo, hhi = _inside(kh, dh, ph, sh, H, Ho)
    wlo, whi = _inside(kw, dw, pw, sw, W, Wo)
    pos, cnt = _outside(kh, kw, hlo, hhi, wlo, whi, Ho, Wo)
    run = sh == 1 and sw == 1 and Wo == W
    for nc in prange(N * C):
        n = nc // C
        c = nc - n * C
        plane = nc * H * W
        for k in range(plane, plane + H * W):
            gf[np.uint64(k)] = 0.0
        for i in range(kh):
            for j in range(kw):
                t = i * kw + j
                base = ((t + c * kh * kw) * N + n) * P
                if run:
                    for q in range(cnt[t]):
                        cf[np.uint64(base + pos[t, q])] = 0.0
                    s = base + hlo[i] * Wo
                    d = plane + (hlo[i] + i * dh - ph) * W + j * dw - pw
                    k0 = max(0, plane - d)
                    k1 = min((hhi[i] - hlo[i]) * W, plane + H * W - d)
                    for k in range(k0, k1):
                        gf[np.uint64(d + k)] += cf[np.uint64(s + k)]
                else:
                    for oh in range(hlo[i], hhi[i]):
                        s = base + oh * Wo
                        d = plane + (oh * sh + i * dh - ph) * W + j * dw - pw
                        for ow in range(wlo[j], whi[j]):
                            gf[np.uint64(d + ow * sw)] += cf[np.uint64(s + ow)]


@njit(parallel=PARALLEL, cache=True)
def rows_to_nchw(y, b, out):
    # y (O, N, P), b (O,) -> out (N, O, P) = y + b: the conv GEMM's rows back to NCHW
    O, N, P = y.shape
    yf = y.reshape(-1)
    of = out.reshape(-1)
    for no in prange(N * O):
        o = no % O
        s = (o * N + no // O) * P
        d = no * P
        bo = b[o]
        for k in range(P):
            of[d + k] = yf[s + k] + bo


@njit(parallel=PARALLEL, cache=True)
def nchw_to_rows(gy, out):
    # gy (N, O, P) -> out (O, N, P), the layout the conv backward GEMMs read
    N, O, P = gy.shape
    gf = gy.reshape(-1)
    of = out.reshape(-1)
    for on in prange(O * N):
        n = on % N
        s = (n * O + on // N) * P
        d = on * P
        for k in range(P):
            of[d + k] = gf[s + k]


@njit(parallel=PARALLEL, cache=True)
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


@njit(parallel=PARALLEL, cache=True)
def maxpool2d_forward_valid(x, kh, kw, sh, sw, out, arg):
    # no padding, no dilation: every window lies inside x, so no bounds checks
    N, C, H, W = x.shape
    Ho, Wo = out.shape[2], out.shape[3]
    xf = x.reshape(-1)
    of = out.reshape(-1)
    af = arg.reshape(-1)
    for nc in prange(N * C):
        xb = nc * H * W
        ob = nc * Ho * Wo
        for oh in range(Ho):
            for ow in range(Wo):
                q0 = oh * sh * W + ow * sw
                best = xf[np.uint64(xb + q0)]
                bi = q0
                for i in range(kh):
                    for j in range(kw):
                        q = q0 + i * W + j
                        v = xf[np.uint64(xb + q)]
                        if (v > best or v != v) and best == best:
                            best = v
                            bi = q
                of[np.uint64(ob + oh * Wo + ow)] = best
                af[np.uint64(ob + oh * Wo + ow)] = bi


@njit(parallel=PARALLEL, cache=True)
def maxpool2d_backward(gy, arg, gx):
    # gy (N, C, Ho, Wo), arg (N, C, Ho, Wo) -> gx (N, C, H, W)
    N, C, H, W = gx.shape
    P = gy.shape[2] * gy.shape[3]
    gyf = gy.reshape(-1)
    af = arg.reshape(-1)
    gf = gx.reshape(-1)
    for nc in prange(N * C):
        xb = nc * H * W
        for k in range(xb, xb + H * W):
            gf[np.uint64(k)] = 0.0
        for q in range(nc * P, nc * P + P):
            gf[np.uint64(xb + af[q])] += gyf[q]


@njit(parallel=PARALLEL, cache=True)
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


@njit(parallel=PARALLEL, cache=True)
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


@njit(parallel=PARALLEL, cache=True)
def _erf_flat(x, out):
    for i in prange(x.shape[0]):
        out[i] = math.erf(x[i])


def erf(x: np.ndarray) -> np.ndarray:
    xc = np.ascontiguousarray(x)
    out = np.empty_like(xc)
    _erf_flat(xc.reshape(-1), out.reshape(-1))
    return out


# NOTE: the batchnorm reductions accumulate in float64 and may be reassociated ("reassoc"), so
# LLVM can vectorize them; NaN and inf still propagate (no "nnan"/"ninf").
@njit(parallel=PARALLEL, cache=True, fastmath={"reassoc"})
def batchnorm_forward(x, gamma, beta, eps, xhat, y, mean, var):
    # x (N, C, P), gamma/beta (C,) -> xhat, y (N, C, P); mean, var (C,) float64 (biased var)
    N, C, P = x.shape
    m = N * P
    for c in prange(C):
        s = 0.0
        for n in range(N):
            for k in range(P):
                s += x[n, c, k]
        mu = s / m
        v = 0.0
        for n in range(N):
            for k in range(P):
                d = x[n, c, k] - mu
                v += d * d
        mean[c] = mu
        var[c] = v / m
        inv = 1.0 / math.sqrt(v / m + eps)
        g = gamma[c]
        b = beta[c]
        for n in range(N):
            for k in range(P):
                xh = (x[n, c, k] - mu) * inv
                xhat[n, c, k] = xh
                y[n, c, k] = xh * g + b


@njit(parallel=PARALLEL, cache=True, fastmath={"reassoc"})
def batchnorm_backward(gy, xhat, scale, gx, gbeta, ggamma):
    # gy, xhat (N, C, P), scale (C,) = gamma * invstd -> gx (N, C, P), gbeta, ggamma (C,)
    N, C, P = gy.shape
    m = N * P
    for c in prange(C):
        sg = 0.0
        sgx = 0.0
        for n in range(N):
            for k in range(P):
                g = gy[n, c, k]
                sg += g
                sgx += g * xhat[n, c, k]
        gbeta[c] = sg
        ggamma[c] = sgx
        sc = scale[c]
        mg = sg / m
        mgx = sgx / m
        for n in range(N):
            for k in range(P):
                gx[n, c, k] = sc * (gy[n, c, k] - mg - xhat[n, c, k] * mgx)


@njit(parallel=PARALLEL, cache=True)
def relu_backward(gy, out, gx):
    # gy, out (M,) -> gx (M,) = gy where out > 0, else 0
    for k in prange(gy.shape[0]):
        gx[k] = gy[k] if out[k] > 0 else 0.0
