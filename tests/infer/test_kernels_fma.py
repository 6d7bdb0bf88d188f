"""The AVX-512 float32 GEMM kernel against naive NumPy in float64.

The end-to-end fp32 conv cases in test_kernels.py also run through it (the fp32_route
fixture); here the kernel is checked alone, on the shapes where tiles and tails go wrong.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from models import naive_im2col

from pocket.infer import kernels_fma as kfma
from pocket.infer import kernels_fma_im2col as kfi
from pocket.infer import kernels_fma_linear as kfl
from pocket.infer import kernels_fp32 as kf

needs_fma = pytest.mark.skipif(not kfma.AVAILABLE, reason="this CPU has no AVX-512")
RNG = np.random.default_rng(12)
NO_BIAS = np.zeros(0, np.float32)


@pytest.mark.parametrize("module,switch", [("kernels_fma", "POCKET_FP32_FMA"),
                                           ("kernels_vnni", "POCKET_INT8_VNNI")])
@pytest.mark.parametrize("env", [{"SWITCH": "0"}, {"NUMBA_CPU_NAME": "generic"},
                                 {"NUMBA_DISABLE_JIT": "1"}])
def test_detection_opts_out(module, switch, env):
    """Either x86 kernel set (fp32 FMA, int8 VNNI): its switch, a portable Numba target and a
    disabled JIT all keep the portable routes (NumPy's BLAS, the portable int8 kernels)."""
    env = {switch if k == "SWITCH" else k: v for k, v in env.items()}
    code = f"from pocket.infer import {module} as k; assert not k.AVAILABLE"
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, **env})


def _at_line(shape, shift=0):
    """Standard normal float32 of this shape starting `shift` floats past a cache line (the
    GEMM's tile width depends on whether its rows of inputs start on one)."""
    n = int(np.prod(shape))
    buf = np.empty(n + 32, np.float32)
    start = (-buf.ctypes.data) % 64 // 4 + shift
    out = buf[start:start + n].reshape(shape)
    out[...] = RNG.standard_normal(shape)
    return out


def _naive(w, rows):
    """sum over k of w[:, k] * rows[k] in float64."""
    return np.einsum("ok,km->om", w.astype(np.float64), rows.astype(np.float64))


@needs_fma
@pytest.mark.parametrize("serial", [False, True])
@pytest.mark.parametrize("shift", [0, 1])
@pytest.mark.parametrize("nb,o,k,m", [(1, 1, 1, 32), (1, 7, 5, 64), (1, 8, 9, 16), (3, 9, 13, 96),
                                      (2, 17, 300, 48), (16, 24, 64, 160), (1, 64, 1, 32),
                                      (1, 5, 600, 80), (1, 33, 300, 96), (1, 9, 129, 560),
                                      (1, 12, 40, 96), (2, 18, 300, 160), (1, 130, 33, 112),
                                      (3, 64, 64, 256), (1, 122, 5, 64), (1, 31, 70, 64),
                                      (1, 41, 20, 128), (2, 260, 600, 48), (1, 400, 700, 96),
                                      (2, 130, 129, 200)])
def test_gemm_explicit_rows(nb, o, k, m, shift, serial):
    """nb GEMMs on explicit (K, M) columns, the weights nb blocks apart; every channel tail
    (o % 8), half tiles (m % 32 == 16) and K longer than a cache block; wide tiles (pairs of
    tiles, 6 channels: o = 12, 18, 130; with rows on cache lines (shift 0) also 33, 64, 122,
    31 and 41, whose last wide tile has 3, 4, 2, 1 and 5 channels) beside single and half
    ones; weights past STREAM_W_BYTES (2 x 260 x 600: all of K at once); many channels over
    more than 2 tiles in chunks, 2 tiles and half a block of K at a time (400 x 700: two
    chunks; 130 x 129); the parallel and serial twins alike."""
    assert 2 * 260 * 600 * 4 > kfma.STREAM_W_BYTES
    x = _at_line((nb, k, m), shift)
    w = RNG.standard_normal((nb, o, k)).astype(np.float32)
    c = np.full((nb, o, m), np.nan, np.float32)
    fn = kfma.gemm.serial if serial else kfma.gemm
    fn(c, w, x, kfma.row_offsets(k, m), nb, o, m, k * m, o * k, k, o * m, m, NO_BIAS, 0)
    for b in range(nb):
        want = _naive(w[b], x[b])
        np.testing.assert_allclose(c[b], want, rtol=1e-5, atol=1e-5 * np.sqrt(k))


# gemm's epi codes past 2 (routes.conv_fma_1x1): the activation of sums + bias, in float64
TILE_ACTS = {0: lambda v: v, 2: lambda v: np.maximum(v, 0), 3: lambda v: v / (1 + np.exp(-v)),
             4: lambda v: 1 / (1 + np.exp(-v)), 5: lambda v: np.clip(v, 0, 6),
             6: lambda v: v * np.clip(v + 3, 0, 6) / 6, 7: lambda v: np.clip(v + 3, 0, 6) / 6}


@needs_fma
@pytest.mark.parametrize("serial", [False, True])
@pytest.mark.parametrize("epi", sorted(TILE_ACTS))
@pytest.mark.parametrize("nb,o,k,m", [(1, 8, 5, 1), (2, 13, 7, 9), (1, 6, 3, 17), (3, 64, 16, 49),
                                      (1, 24, 300, 31), (2, 100, 40, 169), (1, 16, 64, 3025),
                                      (1, 48, 20, 49), (2, 30, 33, 63), (1, 12, 300, 113),
                                      (1, 18, 70, 105), (2, 30, 20, 100), (1, 36, 20, 196),
                                      (1, 24, 30, 80), (1, 1000, 70, 169)])
def test_gemm_masked_tail(nb, o, k, m, epi, serial):
    """m not a multiple of 16 (a 1x1 conv's H*W, routes.conv_fma_1x1): the last m % 16 pixels
    run masked (the last 49-63 in one wide tile where the channels take wide tiles: 48, 30
    and 12 of them). X ends on a guard page (a read past it faults) and C is followed by NaN
    sentinels (a write past it shows); every output, the tail's too, is the GEMM's, through
    the tiles' activations (SiLU and sigmoid on the float32 exp polynomial); a NaN input
    pixel gives NaN outputs in its column whatever the activation. The last 33-48 pixels take
    one tile of 3 vectors, and the narrow tiles beside wide ones have 6 rows (105, 100 and 169
    pixels; 196 and 80: a 4-pixel tail and a half tile of 6 rows)."""
    from route_fuzz import guarded_copy

    x = 3 * RNG.standard_normal((nb, k, m)).astype(np.float32)
    x[0, 0, m - 1] = np.nan
    x = guarded_copy(x)
    w = RNG.standard_normal((o, k)).astype(np.float32)
    b = RNG.standard_normal(o).astype(np.float32)
    flat = np.full(nb * o * m + 64, np.nan, np.float32)
    c = flat[:nb * o * m].reshape(nb, o, m)
    fn = kfma.gemm.serial if serial else kfma.gemm
    fn(c, w, x, kfma.row_offsets(k, m), nb, o, m, k * m, 0, k, o * m, m, b if epi else NO_BIAS, epi)
    assert np.isnan(flat[nb * o * m:]).all()
    for i in range(nb):
        want = TILE_ACTS[epi](_naive(w, x[i]) + (b[:, None] if epi else 0))
        np.testing.assert_array_equal(np.isnan(c[i]), np.isnan(want))
        np.testing.assert_allclose(c[i], want, rtol=1e-5, atol=1e-5 * np.sqrt(k))


@needs_fma
@pytest.mark.parametrize("epi", [1, 2])
@pytest.mark.parametrize("o,k,m", [(7, 5, 48), (17, 600, 64), (8, 256, 16), (12, 200, 96)])
def test_gemm_fused_epilogue(epi, o, k, m):
    """epi 1 adds the bias to the sums, epi 2 then takes a ReLU, on the tiles in registers:
    once, after the last block of K, whatever the channel tail and tile width."""
    x = RNG.standard_normal((k, m)).astype(np.float32)
    w = RNG.standard_normal((o, k)).astype(np.float32)
    b = RNG.standard_normal(o).astype(np.float32)
    c = np.full((o, m), np.nan, np.float32)
    kfma.gemm(c, w, x, kfma.row_offsets(k, m), 1, o, m, 0, 0, k, 0, m, b, epi)
    want = _naive(w, x) + b[:, None]
    if epi == 2:
        want = np.maximum(want, 0)
    np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-5 * np.sqrt(k))


@needs_fma
@pytest.mark.parametrize("serial", [False, True])
@pytest.mark.parametrize("parts", [1, 2, 3, 5])
@pytest.mark.parametrize("epi", [0, 2])
@pytest.mark.parametrize("o,k,m", [(7, 5, 64), (33, 300, 96), (9, 129, 80), (8, 1, 16), (1, 260, 160),
                                   (12, 50, 160)])
def test_gemm_pixels(o, k, m, epi, parts, serial):
    """One GEMM split along its pixels into groups of whole tiles (more parts than tiles
    too), every group all the channels; with the epilogue, once after the last block of K
    (a group of 1-2 tiles takes K by half blocks), and C's rows wider than m left alone."""
    x = RNG.standard_normal((k, m)).astype(np.float32)
    w = RNG.standard_normal((o, k)).astype(np.float32)
    b = RNG.standard_normal(o).astype(np.float32) if epi else NO_BIAS
    ldc = m + 8
    c = np.full((o, ldc), 7.0, np.float32)
    fn = kfma.gemm_pixels.serial if serial else kfma.gemm_pixels
    fn(c, w, x, kfma.row_offsets(k, m), o, m, k, ldc, b, epi, parts)
    want = _naive(w, x) + (b[:, None] if epi else 0)
    np.testing.assert_allclose(c[:, :m], np.maximum(want, 0) if epi else want, rtol=1e-5,
                               atol=1e-5 * np.sqrt(k))
    assert np.all(c[:, m:] == 7.0)


@needs_fma
@pytest.mark.parametrize("serial", [False, True])
@pytest.mark.parametrize("act", ["none", "relu", "leaky_relu", "sigmoid"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("n,o,k", [(64, 10, 128), (16, 7, 300), (50, 33, 40), (100, 1, 9), (64, 130, 256)])
def test_gemm_t(n, o, k, bias, act, serial):
    """A linear's last GEMM on x.T's columns and its transposing epilogue in one call:
    out (n, o) = act(x @ w.T + b), from c's columns past n (zeros here, as transpose_in
    leaves them) nothing."""
    m = kfma.tile_cols(n)
    xt = np.zeros((k, m), np.float32)
    xt[:, :n] = RNG.standard_normal((k, n))
    w = RNG.standard_normal((o, k)).astype(np.float32)
    b = RNG.standard_normal(o).astype(np.float32) if bias else NO_BIAS
    c = np.full((o, m + 8), np.nan, np.float32)
    out = np.full((n, o), np.nan, np.float32)
    fn = kfl.gemm_t.serial if serial else kfl.gemm_t
    fn(out, c, w, xt, kfma.row_offsets(k, m), o, m, k, m + 8, b, kf.ACT[act], np.float32(0.2))
    z = _naive(w, xt[:, :n]).T + (b if bias else 0)
    want = {"none": z, "relu": np.maximum(z, 0), "leaky_relu": np.where(z > 0, z, 0.2 * z),
            "sigmoid": 1 / (1 + np.exp(-z))}[act]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.sqrt(k))


@needs_fma
@pytest.mark.parametrize("serial", [False, True])
@pytest.mark.parametrize("parts", [1, 2, 3])
@pytest.mark.parametrize("epi", [0, 1])
@pytest.mark.parametrize("n,o,k", [(64, 256, 300), (17, 9, 33), (50, 17, 16), (40, 3, 129),
                                   (100, 13, 600), (200, 20, 70), (16, 9, 300)])
def test_gemm_rows(n, o, k, epi, parts, serial):
    """A linear's GEMM from its rows: each of `parts` channel splits transposes x a block of
    K at a time into its own buffer (NaN-filled here: every column the GEMM reads must be
    written), then computes its channels over it; C = W @ x.T, with the epilogue once K
    ends, C's rows wider than m untouched."""
    x = RNG.standard_normal((n, k)).astype(np.float32)
    w = RNG.standard_normal((o, k)).astype(np.float32)
    b = RNG.standard_normal(o).astype(np.float32) if epi else NO_BIAS
    m = kfma.tile_cols(n)
    xts = np.full((parts, kfl.rows_block(m, k), m), np.nan, np.float32)
    c = np.full((o, m + 8), 7.0, np.float32)
    fn = kfl.gemm_rows.serial if serial else kfl.gemm_rows
    fn(c, w, x, xts, kfma.row_offsets(k, m), o, m, m + 8, b, epi)
    want = _naive(w, x.T) + (b[:, None] if epi else 0)
    np.testing.assert_allclose(c[:, :n], want, rtol=1e-5, atol=1e-5 * np.sqrt(k))
    assert not np.isnan(c[:, :m]).any() and np.all(c[:, m:] == 7.0)


@needs_fma
def test_gemm_shared_weights_and_wide_rows():
    """ws = 0 (one weight matrix for every item) and C's rows wider than m (ldc): the columns
    past each item's m are left alone."""
    nb, o, k, m, ldc = 3, 5, 11, 32, 100
    x = RNG.standard_normal((nb, k, m)).astype(np.float32)
    w = RNG.standard_normal((o, k)).astype(np.float32)
    c = np.full((o, ldc), 7.0, np.float32)
    kfma.gemm(c, w, x, kfma.row_offsets(k, m), nb, o, m, k * m, 0, k, m, ldc, NO_BIAS, 0)
    for b in range(nb):
        np.testing.assert_allclose(c[:, b * m:(b + 1) * m], _naive(w, x[b]), rtol=1e-5, atol=1e-5)
    assert np.all(c[:, nb * m:] == 7.0)


@needs_fma
@pytest.mark.parametrize("c_in,h,w,kh,kw,dh,dw", [(3, 5, 7, 3, 3, 1, 1), (2, 9, 4, 2, 3, 2, 1),
                                                 (5, 6, 6, 1, 1, 1, 1)])
def test_gemm_pitch_offsets_are_a_convolution(c_in, h, w, kh, kw, dh, dw):
    """With pitch_offsets the GEMM reads the padded images in place: output (oh, ow) at column
    oh*Wp + ow is the stride-1 convolution, checked against a naive loop in float64."""
    n, o, ph, pw = 2, 9, 1, 2
    hp, wp = h + 2 * ph, w + 2 * pw
    ho, wo = hp - dh * (kh - 1), wp - dw * (kw - 1)
    x = RNG.standard_normal((n, c_in, h, w)).astype(np.float32)
    wt = RNG.standard_normal((o, c_in, kh, kw)).astype(np.float32)
    mpi = kfma.tile_cols(ho * wp)
    img = c_in * hp * wp
    xpad = np.zeros(n * img + mpi + (kw - 1) * dw + 16, np.float32)
    xpad[:n * img].reshape(n, c_in, hp, wp)[:, :, ph:ph + h, pw:pw + w] = x
    c = np.zeros((o, n * mpi), np.float32)
    offs = kfma.pitch_offsets(c_in, hp, wp, kh, kw, dh, dw)
    kfma.gemm(c, wt.reshape(o, -1), xpad, offs, n, o, mpi, img, 0, offs.shape[0], mpi, n * mpi, NO_BIAS, 0)
    xp = xpad[:n * img].reshape(n, c_in, hp, wp).astype(np.float64)
    for b in range(n):
        want = np.zeros((o, ho, wo))
        for i in range(kh):
            for j in range(kw):
                patch = xp[b, :, i * dh:i * dh + ho, j * dw:j * dw + wo]
                want += np.einsum("oc,chw->ohw", wt[:, :, i, j].astype(np.float64), patch)
        got = c[:, b * mpi:b * mpi + ho * wp].reshape(o, ho, wp)[:, :, :wo]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.sqrt(c_in * kh * kw))


@needs_fma
@pytest.mark.parametrize("serial", [False, True])
@pytest.mark.parametrize("n,k,o", [(1, 1, 1), (1, 16, 8), (2, 17, 9), (3, 15, 7), (1, 3136, 128),
                                   (5, 300, 37), (2, 1041, 259)])
def test_gemv_tails(n, k, o, serial):
    """The dot-product kernel: every output tail (o % 8) and K tail (k % 16, a masked load that
    must read as zeros: the arrays sit inside NaN-filled buffers); weights of STREAM_W_BYTES or
    more take the prefetching twin (3136 x 128, 1041 x 259 with both tails)."""
    xb = np.full(n * k + 64, np.nan, np.float32)
    wb = np.full(o * k + 64, np.nan, np.float32)
    x, w = xb[:n * k].reshape(n, k), wb[:o * k].reshape(o, k)
    x[:] = RNG.standard_normal((n, k))
    w[:] = RNG.standard_normal((o, k))
    y = np.full((n, o), np.nan, np.float32)
    gemv = kfma.gemv.serial if serial else kfma.gemv
    gemv(y, x, w, NO_BIAS, 0)
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * np.sqrt(k))
    # the epilogue in registers: + b, then a ReLU; the same float32 ops as the sums, then
    # kernels_fp32.bias_act_rows
    b = RNG.standard_normal(o).astype(np.float32)
    for epi in (1, 2):
        got = np.full((n, o), np.nan, np.float32)
        gemv(got, x, w, b, epi)
        steps = np.empty_like(y)
        kf.bias_act_rows(steps, y, b, epi - 1, 0.0)
        assert np.array_equal(got, steps)
        ref = want + b
        np.testing.assert_allclose(got, np.maximum(ref, 0) if epi == 2 else ref, rtol=1e-5,
                                   atol=1e-5 * np.sqrt(k))


@needs_fma
@pytest.mark.parametrize("act", [0, 1])
@pytest.mark.parametrize("ho,wo,pitch", [(14, 14, 15), (7, 7, 8), (3, 17, 18), (5, 40, 41),
                                         (4, 32, 32)])
def test_bias_act_pool2_pitch_equals_numba_loop(ho, wo, pitch, act):
    """The vector 2x2/2 pooled epilogue equals kernels_fp32.bias_act_pool_pitch bit for bit:
    odd widths and heights (the last row and column dropped), rows of more than 16 outputs,
    images side by side at istride, no ReLU and ReLU."""
    from pocket.infer import kernels_fp32 as kf

    n, o = 3, 5
    istride = kfma.tile_cols(ho * pitch)
    y = RNG.standard_normal((o, n * istride)).astype(np.float32)
    b = RNG.standard_normal(o).astype(np.float32)
    want = np.zeros((n, o, ho // 2, wo // 2), np.float32)
    kf.bias_act_pool_pitch(want, y, pitch, istride, 2, 2, 2, 2, b, act, 0.0)
    got = np.full(want.shape, np.nan, np.float32)
    kfma.bias_act_pool2_pitch(got, y, pitch, istride, b, act)
    assert np.array_equal(got, want)
    z = y.reshape(o, n, istride)[:, :, :ho * pitch].reshape(o, n, ho, pitch)[..., :wo]
    z = z + b[:, None, None, None]
    z = np.maximum(z, 0) if act else z
    pooled = z[:, :, :ho // 2 * 2, :wo // 2 * 2].reshape(o, n, ho // 2, 2, wo // 2, 2).max(axis=(3, 5))
    np.testing.assert_allclose(got, pooled.transpose(1, 0, 2, 3), rtol=1e-6, atol=1e-6)


@needs_fma
@pytest.mark.parametrize("serial", [False, True])
@pytest.mark.parametrize("n,c,o,h,w,act", [(1, 32, 64, 14, 14, 1), (3, 4, 13, 7, 9, 0), (2, 3, 21, 5, 5, 1),
                                           (1, 8, 5, 12, 31, 1), (1, 1, 32, 28, 28, 1),
                                           (2, 2, 12, 30, 31, 0)])
def test_gemm_pool2_pitch_equals_steps(n, c, o, h, w, act, serial):
    """The pitch GEMM with each part's pooled epilogue equals gemm then bias_act_pool2_pitch
    bit for bit: several images, channels past a multiple of 8 (and splits of them), odd
    maps, images of more than one GEMM pixel group (28x28: 812 pixels, 30x31: wide tiles);
    every pooled output written; and written into padded images (gemm_pool2_padded) as
    kernels_fp32.pad_images would pad them."""
    assert h * (w + 1) <= kfma.POOL_GROUP_MAX
    from pocket.infer import kernels_fp32 as kf

    hp, wp = h + 2, w + 1  # a 3x3 'same' conv at the pitch of Wp (see _pitch_geometry)
    mpi = kfma.tile_cols(h * wp)
    padded = c * hp * wp
    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    xpad = np.zeros(n * padded + 2 + mpi - h * wp + 16, np.float32)
    kf.pad_images(xpad, x, 1, 1, hp, wp, np.float32(0))
    wt = RNG.standard_normal((o, c * 9)).astype(np.float32)
    b = RNG.standard_normal(o).astype(np.float32)
    offs = kfma.pitch_offsets(c, hp, wp, 3, 3, 1, 1)
    yw = np.zeros((o, n * mpi), np.float32)
    kfma.gemm(yw, wt, xpad, offs, n, o, mpi, padded, 0, c * 9, mpi, n * mpi, NO_BIAS, 0)
    want = np.zeros((n, o, h // 2, w // 2), np.float32)
    kfma.bias_act_pool2_pitch(want, yw, wp, mpi, b, act)
    got = np.full(want.shape, np.nan, np.float32)
    scratch = np.zeros_like(yw)
    (kfma.gemm_pool2_pitch.serial if serial else kfma.gemm_pool2_pitch)(
        got, scratch, wt, xpad, offs, n, o, mpi, padded, c * 9, wp, b, act)
    assert np.array_equal(got, want)
    # ... and into the next conv's padded images: pad_images' layout, its zeros and slack
    # rewritten over NaN, for two paddings of the next conv
    for (nph, npw, nhp, nwp) in ((1, 1, h // 2 + 2, w // 2 + 1), (2, 0, h // 2 + 4, w // 2 + 3)):
        pad_want = np.full(n * o * nhp * nwp + 20, np.nan, np.float32)
        kf.pad_images(pad_want, want, nph, npw, nhp, nwp, np.float32(0))
        pad_got = np.full(pad_want.shape, np.nan, np.float32)
        (kfma.gemm_pool2_padded.serial if serial else kfma.gemm_pool2_padded)(
            pad_got, nhp, nwp, nph, npw, h // 2, w // 2, scratch, wt, xpad, offs, n, o, mpi, padded, c * 9,
            wp, b, act)
        assert np.array_equal(pad_got, pad_want)


@needs_fma
@pytest.mark.parametrize("serial", [False, True])
@pytest.mark.parametrize("parts", [1, 2, 3])
@pytest.mark.parametrize("n,k", [(64, 784), (17, 33), (16, 16), (5, 40), (31, 17), (50, 20),
                                 (96, 48), (70, 31)])
def test_transpose_in(n, k, parts, serial):
    """A linear's rows become GEMM columns: xt = x.T, zeros past the rows: whole 16 x 16
    register blocks, then the ragged rows and columns, in one or more groups of columns."""
    x = RNG.standard_normal((n, k)).astype(np.float32)
    xt = np.full((k, kfma.tile_cols(n)), np.nan, np.float32)
    (kfl.transpose_in.serial if serial else kfl.transpose_in)(xt, x, parts)
    assert np.array_equal(xt[:, :n], x.T) and not xt[:, n:].any()


@needs_fma
@pytest.mark.parametrize("geom", [(3, 3, 1, 1, 1, 1), (1, 1, 0, 0, 1, 1), (5, 3, 2, 1, 1, 1),
                                  (3, 3, 2, 2, 2, 2), (3, 5, 1, 4, 1, 2)])
@pytest.mark.parametrize("hw", [(4, 4), (8, 8), (3, 7), (1, 5), (9, 13), (32, 32)])
@pytest.mark.parametrize("n", [1, 3])
def test_im2col_same_vector(geom, hw, n):
    """kfi.im2col_same (a masked load and store per 16 pixels) equals a naive im2col from a
    padded copy in both layouts (rows K with the images side by side; rows b*K + k), with a
    pad of 0 and of -7, never writing past a row's pixels nor reading outside the images
    (which sit between NaNs)."""
    kh, kw, ph, pw, dh, dw = geom
    c, (h, w) = 2, hw
    buf = np.full(n * c * h * w + 64, np.nan, np.float32)
    x = buf[32:32 + n * c * h * w].reshape(n, c, h, w)
    x[:] = RNG.standard_normal(x.shape)
    masks = kfi.same_masks(kf.same_valid(h, w, kh, kw, ph, pw, dh, dw))
    k, p = c * kh * kw, h * w
    for pad in (0.0, -7.0):
        want = naive_im2col(x, kh, kw, ph, pw, dh, dw, pad)
        wide = np.full((k, n * p + 5), 9.0, np.float32)
        kfi.im2col_same(wide, x, masks, kh, kw, ph, pw, dh, dw, np.float32(pad), 0, p)
        assert np.array_equal(wide[:, :n * p], want.transpose(1, 0, 2).reshape(k, n * p))
        assert np.all(wide[:, n * p:] == 9.0)
        per = np.full((n * k, p), np.nan, np.float32)
        kfi.im2col_same.serial(per, x, masks, kh, kw, ph, pw, dh, dw, np.float32(pad), k, 0)
        assert np.array_equal(per, want.reshape(n * k, p))


@needs_fma
@pytest.mark.parametrize("m", [16, 512, 529, 560, 729, 784, 3025, 12544])
def test_gemm_groups_share_the_tiles_evenly(m):
    """gemm's pixel groups (the parts the threads take runs of) hold all of m's tiles, at most
    GROUP_P each and within one tile of each other: 23 tiles (a 27x27 map) once split 16 + 7."""
    n_p = -(-m // kfma.TILE_P)
    n_g, n_o = kfma._gemm_split(1, 64, m, kfma.TILE_O)
    bounds = [kfma._group.py_func(g, n_p, n_g) for g in range(n_g)]  # _gemm_part's groups
    assert bounds[0][0] == 0 and all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    sizes = [p1 - p0 for p0, p1 in bounds]
    assert sum(sizes) == n_p and max(sizes) <= kfma.GROUP_P
    assert max(sizes) - min(sizes) <= 1, sizes


@needs_fma
@pytest.mark.parametrize("o,tr", [(256, kfma.WIDE_O), (64, kfma.TILE_O), (1000, kfma.WIDE_O),
                                  (13, kfma.TILE_O), (3, kfma.WIDE_O)])
def test_gemm_channel_splits_share_the_tiles_evenly(o, tr):
    """A GEMM of one pixel group splits its channels into parts within one tile of each other
    that cover all of them: 256 channels in tiles of 6 once split 36 x 7 + 4."""
    n_o = kfma._channel_split(1, o, tr)
    bounds = [kfma._channels.py_func(i, o, n_o, tr) for i in range(n_o)]
    assert bounds[0][0] == 0 and bounds[-1][1] == o
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    tiles = [-(-(b - a) // tr) for a, b in bounds]
    assert min(tiles) >= 1 and max(tiles) - min(tiles) <= 1, bounds


@needs_fma
@pytest.mark.parametrize("epi,name", [(3, "silu"), (4, "sigmoid")])
def test_tile_exp_activations_within_4_ulp(epi, name):
    """The tiles' SiLU and sigmoid (exp by a 16-entry table, degree 3 and vscalefps; a
    division) on sums that are the inputs themselves (one weight, 1.0): within 4 ulp of the
    float64 formula (1e-36 absolute where float32 over- and underflow meet), NaN and
    infinities as the formula gives them (SiLU(-inf) NaN). The values about -16.7 are where
    1 + exp(-v) rounds last before it is exp(-v) alone (the largest error seen: 3.1 ulp)."""
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 3.0, -3.0, 86.8, -86.8, 88.7, -88.7,
                        89.5, -89.5, -103.9, 800.0, -800.0, 1e-30, -1e-30, 99.9, -99.9, 100.0,
                        -100.0, 100.5, -100.5, 3e38, -3e38], np.float32)
    special = np.concatenate([special, np.linspace(-16.8, -16.6, 2001, dtype=np.float32)])
    v = np.concatenate([RNG.standard_normal(3000).astype(np.float32) * s for s in (0.5, 4, 40)]
                       + [special])
    m = v.size
    c = np.full((1, m), 7.0, np.float32)
    kfma.gemm(c, np.ones((1, 1), np.float32), v.reshape(1, m).copy(), kfma.row_offsets(1, m), 1, 1,
              m, 0, 0, 1, 0, m, np.zeros(1, np.float32), epi)
    with np.errstate(over="ignore", invalid="ignore"):
        exact = TILE_ACTS[epi](v.astype(np.float64))
    want = exact.astype(np.float32)
    out = c[0]
    assert np.array_equal(np.isnan(out), np.isnan(want)), name
    assert np.array_equal(np.isinf(out), np.isinf(want)), name
    ok = np.isfinite(want)
    ulp = np.spacing(np.abs(want[ok])).astype(np.float64)
    assert np.all(np.abs(out[ok] - exact[ok]) <= 4 * ulp + 1e-36), name


@pytest.mark.parametrize("n,c,h,w,ph,pw", [(1, 3, 224, 224, 1, 1), (2, 2, 9, 7, 1, 1), (1, 3, 12, 33, 3, 3),
                                           (1, 2, 5, 64, 0, 0), (1, 1, 6, 65, 2, 1), (2, 1, 3, 1, 1, 2),
                                           (1, 2, 8, 31, 0, 3)])
def test_pad_phases_equals_numpy(n, c, h, w, ph, pw):
    """kernels_phase.pad_phases (rows split into even and odd columns by vector shuffles)
    against NumPy: each plane zero-padded and cut into its four phases, (row phase, column
    phase) planes of Hq x Wq in order, zeros after the last plane; a NaN-filled buffer shows an
    element not written, odd and even widths and paddings the row tails."""
    from pocket.infer import kernels_phase as kq

    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    hq, wq = kq.phase_shape(h, w, ph, pw)
    xp = np.zeros((n, c, 2 * hq, 2 * wq), np.float32)
    xp[:, :, ph:ph + h, pw:pw + w] = x
    want = np.stack([xp[:, :, a::2, b::2] for a in (0, 1) for b in (0, 1)], axis=2).reshape(-1)
    xq = np.full(want.size + 37, np.nan, np.float32)
    for fn in (kq.pad_phases, kq.pad_phases.serial):
        xq[:] = np.nan
        fn(xq, x, ph, pw, hq, wq)
        np.testing.assert_array_equal(xq[:want.size], want)
        assert not xq[want.size:].any()
