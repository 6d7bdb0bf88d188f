"""fp32 3x3 stride-1 convolutions by Winograd's minimal filtering F(2x2, 3x3) (Lavin & Gray,
"Fast Algorithms for Convolutional Neural Networks", 2016).

Each 2x2 block of outputs comes from a 4x4 patch d of the padded input:
    Y = A^T [ sum over input channels of (G g G^T) * (B^T d B) ] A     (* elementwise)
so the convolution becomes 16 independent GEMMs, U[e] (O, C) @ V[e] (C, tiles): 16 products
per 4 outputs instead of 36, 2.25x fewer multiply-adds, and V holds 4x the input where im2col's
columns hold 9x. The transforms only add, subtract and halve, so the result differs from direct
summation by float32 rounding, within the engine's fp32 tolerance of formats/reference.py.

    B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]    G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1]
    A^T = [1 1 1 0; 0 1 -1 -1]

Tiles: image b's tile (th, tw) covers output rows 2th, 2th+1 and columns 2tw, 2tw+1; it is
column b*T + th*Tw + tw of V and M (T = Th*Tw tiles an image, Th = ceil(Ho/2)). Outputs past
Ho x Wo (odd sizes) come from zero padding and are dropped.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from pocket.infer.jit import kernel
from pocket.infer.kernels_fp32 import activate, nanmax, relu

# u[4i + k, o, c] = sum over (a, b) of G[i, a] G[k, b] w[o, c, a, b]: FILTER (16, 9) @
# w.reshape(O*C, 9).T -> u (16, O*C); `filter_transform` computes the same without BLAS
_G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])
FILTER = np.kron(_G, _G).astype(np.float32)


@kernel
def filter_transform(u, w9):
    """w9 (O*C, 9), each row a 3x3 filter g -> u (16, O*C) = G g G^T, row-major by element
    (= FILTER @ w9.T up to float32 rounding).

    NOTE: no BLAS call in a plan of Numba kernels: OpenBLAS's threads spin for a while after
    each call and took the second core from Numba's pool (cnn_cifar, 2 threads)."""
    n = w9.shape[0]
    h = np.float32(0.5)
    for r in prange(n):
        g0, g1, g2, g3, g4, g5, g6, g7, g8 = (w9[r, 0], w9[r, 1], w9[r, 2], w9[r, 3], w9[r, 4],
                                              w9[r, 5], w9[r, 6], w9[r, 7], w9[r, 8])
        # t = G g (4 x 3), by columns
        t10, t11, t12 = h * (g0 + g3 + g6), h * (g1 + g4 + g7), h * (g2 + g5 + g8)
        t20, t21, t22 = h * (g0 - g3 + g6), h * (g1 - g4 + g7), h * (g2 - g5 + g8)
        for i in range(4):
            if i == 0:
                a, b, c = g0, g1, g2
            elif i == 1:
                a, b, c = t10, t11, t12
            elif i == 2:
                a, b, c = t20, t21, t22
            else:
                a, b, c = g6, g7, g8
            u[4 * i, r] = a
            u[4 * i + 1, r] = h * (a + b + c)
            u[4 * i + 2, r] = h * (a - b + c)
            u[4 * i + 3, r] = c


@kernel
def input_transform(v, xpad, tmp, th_n, tw_n):
    """xpad (N, C, Hp, Wp): the zero-padded images (kernels_fp32.pad_images with Hp = 2*Th + 2,
    Wp = 2*Tw + 2, so every tile's patch is inside) -> v (16, C, >= N*T) = B^T d B of every tile's 4x4
    patch d = xpad[b, c, 2th:2th+4, 2tw:2tw+4]; tmp (N*C, 4, Wp) is scratch.

    NOTE: two passes per tile row, each a set of loops with one store stream: B^T d for the
    whole padded width (contiguous), then the 16 (B^T d) B elements across the row's tiles
    (stride-2 loads). One loop storing all 16 elements of a tile stayed scalar (LLVM does not
    vectorize that many streams) and ran 6x slower than im2col."""
    n, c, hp, wp = xpad.shape
    cols = v.shape[2]
    tiles = th_n * tw_n
    xf, vf, tf = xpad.reshape(-1), v.reshape(-1), tmp.reshape(-1)
    one, two, three = np.uint64(1), np.uint64(2), np.uint64(3)
    for r in prange(n * c):
        b, ch = r // c, r % c
        base = np.uint64(r * hp * wp)
        t0 = np.uint64(r * 4 * wp)  # tmp[r]: rows t0, t1, t2, t3 of B^T d
        t1, t2, t3 = t0 + np.uint64(wp), t0 + np.uint64(2 * wp), t0 + np.uint64(3 * wp)
        for th in range(th_n):
            q0 = base + np.uint64(2 * th * wp)
            q1, q2, q3 = q0 + np.uint64(wp), q0 + np.uint64(2 * wp), q0 + np.uint64(3 * wp)
            for j in range(wp):
                u = np.uint64(j)
                tf[t0 + u] = xf[q0 + u] - xf[q2 + u]
            for j in range(wp):
                u = np.uint64(j)
                tf[t1 + u] = xf[q1 + u] + xf[q2 + u]
            for j in range(wp):
                u = np.uint64(j)
                tf[t2 + u] = xf[q2 + u] - xf[q1 + u]
            for j in range(wp):
                u = np.uint64(j)
                tf[t3 + u] = xf[q1 + u] - xf[q3 + u]
            out = np.uint64(ch * cols + b * tiles + th * tw_n)
            for i in range(4):
                row = t0 + np.uint64(i * wp)
                o0 = out + np.uint64(4 * i * c * cols)
                o1, o2, o3 = (o0 + np.uint64(c * cols), o0 + np.uint64(2 * c * cols),
                              o0 + np.uint64(3 * c * cols))
                for tw in range(tw_n):
                    u, j = np.uint64(tw), row + np.uint64(2 * tw)
                    vf[o0 + u] = tf[j] - tf[j + two]
                for tw in range(tw_n):
                    u, j = np.uint64(tw), row + np.uint64(2 * tw)
                    vf[o1 + u] = tf[j + one] + tf[j + two]
                for tw in range(tw_n):
                    u, j = np.uint64(tw), row + np.uint64(2 * tw)
                    vf[o2 + u] = tf[j + two] - tf[j + one]
                for tw in range(tw_n):
                    u, j = np.uint64(tw), row + np.uint64(2 * tw)
                    vf[o3 + u] = tf[j + one] - tf[j + three]


@njit(cache=True)
def _activate(v, act, alpha):
    return np.float32(activate(np.float64(v), act, alpha))


@njit(cache=True, inline="always")
def _act(v, act, alpha):
    # NOTE: none and ReLU inline, any other activation a call: activate inlined at
    # output_transform's 11 sites took its parallel twin 38 s to compile (9 s serial), the
    # longest of any kernel (a first `pocket infer` on a Pi pays that too)
    if act == 0:
        return v
    return relu(v) if act == 1 else _activate(v, act, alpha)


@kernel
def output_transform(out, m, tmp, th_n, tw_n, b, act, alpha, pool):
    """m (16, O, >= N*T) f32 -> out (N, O, Ho, Wo) = act(A^T m A + b) (b may be empty); with
    pool, out (N, O, Ho//2, Wo//2) = the max of each tile's 2x2 outputs, which is a 2x2/2
    maxpool of the convolution (taken before a non-decreasing activation, as in bias_act_pool).
    tmp (N*O, 8, T) is scratch.

    NOTE: two passes per plane, like input_transform: A^T m for all of the plane's T tiles
    (3 loads, 1 store a loop: 16 streams in one loop kept LLVM from vectorizing), then the
    2x2 outputs. The first pass runs over the whole plane, not a tile row: on 8x8 and 4x4
    maps a row is 4 or 2 tiles. Only a partial last tile row or column is checked."""
    n, o, ho, wo = out.shape
    cols = m.shape[2]
    tiles = th_n * tw_n
    has_bias = b.shape[0] > 0
    mf, of, tf = m.reshape(-1), out.reshape(-1), tmp.reshape(-1)
    e = np.uint64(o * cols)
    one = np.uint64(1)
    w_ = np.uint64(tiles)
    rows = min(th_n, ho) if pool else th_n
    full = min(tw_n, wo) if pool else wo // 2
    # pooled, every tile in the output: the pooled plane is the tiles in order
    flat_pool = pool and rows == th_n and full == tw_n
    for r in prange(n * o):
        bi, oc = r // o, r % o
        bo = b[oc] if has_bias else np.float32(0.0)
        plane = np.uint64(r * ho * wo)
        src = np.uint64(oc * cols + bi * tiles)
        s0 = np.uint64(r * 8 * tiles)  # tmp[r]: s0..s3 = rows 0+1+2, d0..d3 = rows 1-2-3
        s1, s2, s3 = s0 + w_, s0 + np.uint64(2) * w_, s0 + np.uint64(3) * w_
        d0, d1, d2, d3 = (s0 + np.uint64(4) * w_, s0 + np.uint64(5) * w_, s0 + np.uint64(6) * w_,
                          s0 + np.uint64(7) * w_)
        for k in range(4):  # column k of every tile
            a0 = src + np.uint64(k) * e
            a1, a2, a3 = a0 + np.uint64(4) * e, a0 + np.uint64(8) * e, a0 + np.uint64(12) * e
            sk, dk = s0 + np.uint64(k) * w_, d0 + np.uint64(k) * w_
            for t in range(tiles):
                u = np.uint64(t)
                tf[sk + u] = mf[a0 + u] + mf[a1 + u] + mf[a2 + u]
            for t in range(tiles):
                u = np.uint64(t)
                tf[dk + u] = mf[a1 + u] - mf[a2 + u] - mf[a3 + u]
        if flat_pool:
            for t in range(tiles):
                u = np.uint64(t)
                f = nanmax(nanmax(tf[s0 + u] + tf[s1 + u] + tf[s2 + u], tf[s1 + u] - tf[s2 + u] - tf[s3 + u]),
                        nanmax(tf[d0 + u] + tf[d1 + u] + tf[d2 + u], tf[d1 + u] - tf[d2 + u] - tf[d3 + u]))
                of[plane + u] = _act(f + bo, act, alpha)
            continue
        for th in range(rows):
            row = np.uint64(th * tw_n)
            if pool:
                dst = plane + np.uint64(th * wo)
                for tw in range(full):
                    u, q = np.uint64(tw), row + np.uint64(tw)
                    top = nanmax(tf[s0 + q] + tf[s1 + q] + tf[s2 + q], tf[s1 + q] - tf[s2 + q] - tf[s3 + q])
                    f = nanmax(top, nanmax(tf[d0 + q] + tf[d1 + q] + tf[d2 + q],
                                           tf[d1 + q] - tf[d2 + q] - tf[d3 + q]))
                    of[dst + u] = _act(f + bo, act, alpha)
                continue
            i = 2 * th
            if i + 1 < ho:
                top = plane + np.uint64(i * wo)
                bottom = top + np.uint64(wo)
                for tw in range(full):
                    q, j = row + np.uint64(tw), np.uint64(2 * tw)
                    y00 = tf[s0 + q] + tf[s1 + q] + tf[s2 + q] + bo
                    y01 = tf[s1 + q] - tf[s2 + q] - tf[s3 + q] + bo
                    y10 = tf[d0 + q] + tf[d1 + q] + tf[d2 + q] + bo
                    y11 = tf[d1 + q] - tf[d2 + q] - tf[d3 + q] + bo
                    if act == 1:
                        of[top + j] = relu(y00)
                        of[top + j + one] = relu(y01)
                        of[bottom + j] = relu(y10)
                        of[bottom + j + one] = relu(y11)
                    else:
                        of[top + j] = _act(y00, act, alpha)
                        of[top + j + one] = _act(y01, act, alpha)
                        of[bottom + j] = _act(y10, act, alpha)
                        of[bottom + j + one] = _act(y11, act, alpha)
            for tw in range(tw_n):  # what the loop above left: a last column, a last row
                if tw < full and i + 1 < ho:
                    continue
                j, q = 2 * tw, row + np.uint64(tw)
                y = (tf[s0 + q] + tf[s1 + q] + tf[s2 + q], tf[s1 + q] - tf[s2 + q] - tf[s3 + q],
                     tf[d0 + q] + tf[d1 + q] + tf[d2 + q], tf[d1 + q] - tf[d2 + q] - tf[d3 + q])
                if i < ho and j < wo:
                    of[plane + np.uint64(i * wo + j)] = _act(y[0] + bo, act, alpha)
                if i < ho and j + 1 < wo:
                    of[plane + np.uint64(i * wo + j + 1)] = _act(y[1] + bo, act, alpha)
                if i + 1 < ho and j < wo:
                    of[plane + np.uint64((i + 1) * wo + j)] = _act(y[2] + bo, act, alpha)
                if i + 1 < ho and j + 1 < wo:
                    of[plane + np.uint64((i + 1) * wo + j + 1)] = _act(y[3] + bo, act, alpha)
