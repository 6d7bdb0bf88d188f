"""Winograd on AVX-512 (kernels_fma_winograd): the vector transforms against kernels_winograd's
(bit for bit), and the fused conv against formats/reference.py in float64 and against the
same steps run one by one (bit for bit)."""

from __future__ import annotations

import numpy as np
import pytest

from pocket.formats import reference
from pocket.infer import kernels_fma as kfma
from pocket.infer import kernels_fma_winograd as kfw
from pocket.infer import kernels_winograd as kwg

needs_fma = pytest.mark.skipif(not kfma.AVAILABLE, reason="this CPU has no AVX-512")
RNG = np.random.default_rng(13)


@needs_fma
@pytest.mark.parametrize("n", [1, 16, 37, 300])
def test_filter_transform_equals_winograd_module(n):
    """The gathered 16-filter transform equals kernels_winograd.filter_transform bit for bit
    (same float32 operations) on partial last blocks, into rows with a skew, leaving the
    columns past n alone."""
    w9 = RNG.standard_normal((n, 9)).astype(np.float32)
    want = np.zeros((16, n), np.float32)
    kwg.filter_transform(want, w9)
    got = np.full((16, n + 16), 7.0, np.float32)
    kfw.filter_transform(got[:, :n], w9)
    assert np.array_equal(got[:, :n], want)
    assert np.all(got[:, n:] == 7.0)
    np.testing.assert_allclose(want, kwg.FILTER.astype(np.float64) @ w9.T, rtol=1e-6, atol=1e-6)


def _skewed(shape, fill=7.0):
    """A (16, a, b) float32 view whose 16 rows are a*b + 16 floats apart, filled with `fill`."""
    full = np.full((shape[0], shape[1] * shape[2] + 16), fill, np.float32)
    return full, full[:, :shape[1] * shape[2]].reshape(shape)


def _fenced(shape, rng=RNG):
    """Random float32 images in the middle of a NaN buffer: a read past their ends shows."""
    size = int(np.prod(shape))
    buf = np.full(size + 64, np.nan, np.float32)
    buf[32:32 + size] = rng.standard_normal(size)
    return buf[32:32 + size].reshape(shape)


def _padded(x, ph, pw, th, tw):
    """x padded with zeros as kernels_winograd wants it: (N, C, 2*th + 2, 2*tw + 2)."""
    n, c, h, w = x.shape
    xpad = np.zeros((n, c, 2 * th + 2, 2 * tw + 2), np.float32)
    xpad[:, :, ph:ph + h, pw:pw + w] = x
    return xpad


@needs_fma
@pytest.mark.parametrize("n,c,h,w,ph,pw", [(1, 3, 5, 7, 1, 1), (2, 4, 32, 32, 1, 1), (3, 2, 8, 8, 0, 0),
                                           (1, 2, 40, 33, 1, 1), (2, 3, 4, 4, 0, 1), (1, 1, 3, 36, 1, 0),
                                           (1, 2, 2, 2, 1, 1), (2, 1, 35, 70, 0, 1)])
def test_input_transform_equals_winograd_module(n, c, h, w, ph, pw):
    """kernels_fma_winograd.input_transform (16 tiles of a row a step, the padding masked off
    its loads) on the unpadded images equals kernels_winograd's on the padded ones bit for bit:
    odd sizes, each padding, rows of more than 16 tiles, into a V with skewed rows whose
    columns past the tiles (the GEMM's last tile) get zeros and whose skew is left alone. The
    images sit between NaNs: a read outside them would show."""
    th, tw = -(-(h + 2 * ph - 2) // 2), -(-(w + 2 * pw - 2) // 2)
    x = _fenced((n, c, h, w))
    cols = n * th * tw + 3
    want = np.zeros((16, c, cols), np.float32)
    tmp = np.zeros((n * c, 4, 2 * tw + 2), np.float32)
    kwg.input_transform(want, _padded(x, ph, pw, th, tw), tmp, th, tw)
    full, got = _skewed((16, c, cols))
    kfw.input_transform(got, x, tmp, th, tw, ph, pw)
    assert np.array_equal(got[:, :, :n * th * tw], want[:, :, :n * th * tw])
    assert np.all(got[:, :, n * th * tw:] == 0.0) and np.all(full[:, c * cols:] == 7.0)


@needs_fma
@pytest.mark.parametrize("pool", [False, True])
@pytest.mark.parametrize("act", [0, 1])
@pytest.mark.parametrize("n,o,h,w", [(1, 3, 5, 7), (2, 4, 32, 32), (3, 2, 8, 8), (1, 2, 40, 33),
                                     (2, 3, 3, 3), (1, 1, 6, 36)])
def test_output_transform_equals_winograd_module(n, o, h, w, act, pool):
    """kernels_fma_winograd.output_transform equals kernels_winograd's bit for bit: odd sizes (the
    last tile's row or column dropped), rows of more than 16 tiles, with and without the
    fused 2x2 pool, ReLU or none, from an M with skewed rows."""
    th, tw = -(-h // 2), -(-w // 2)
    cols = n * th * tw + 5
    _, m = _skewed((16, o, cols))
    m[...] = RNG.standard_normal(m.shape).astype(np.float32)
    b = RNG.standard_normal(o).astype(np.float32)
    shape = (n, o, h // 2, w // 2) if pool else (n, o, h, w)
    want, got = np.zeros(shape, np.float32), np.full(shape, 7.0, np.float32)
    tmp = np.zeros((n * o, 8, th * tw), np.float32)
    kwg.output_transform(want, np.ascontiguousarray(m), tmp, th, tw, b, act, 0.0, pool)
    kfw.output_transform(got, m, tmp, th, tw, b, act, 0.0, pool)
    assert np.array_equal(got, want)


def _fused(x, w, b, pad, act, pool, nt, chunk, serial=False):
    """kfw.fused_conv as the engine binds it: U, nt parts of scratch, the offsets of V's rows."""
    n, c, h, wd = x.shape
    o = w.shape[0]
    ph, pw = pad
    th, tw = -(-(h + 2 * ph - 2) // 2), -(-(wd + 2 * pw - 2) // 2)
    ho, wo = h + 2 * ph - 2, wd + 2 * pw - 2
    u = np.full((16, o * c + 16), np.nan, np.float32)
    kfw.filter_transform(u[:, :o * c], w.reshape(-1, 9))
    parts = kfw.slot_floats(c, o, chunk, th, tw)
    # NaN scratch: a read of anything the kernel did not write first shows in the output
    scratch = np.full(nt * sum(parts), np.nan, np.float32)
    offs = kfma.row_offsets(c, kfma.tile_cols(chunk * th * tw))
    out = np.full((n, o, ho // 2, wo // 2) if pool else (n, o, ho, wo), 7.0, np.float32)
    conv = kfw.fused_conv.serial if serial else kfw.fused_conv
    conv(out, x, u, scratch, offs, nt, chunk, th, tw, ph, pw, b, act, pool, parts)
    return out


@needs_fma
@pytest.mark.parametrize("pool", [False, True])
@pytest.mark.parametrize("n,c,o,h,w,pad,act,nt,chunk", [
    (7, 32, 64, 14, 14, (1, 1), 1, 2, 3),    # cnn_mnist's conv2, uneven chunks and threads
    (1, 3, 5, 5, 7, (1, 1), 0, 1, 1),        # odd maps: the last tile's row and column dropped
    (5, 16, 9, 9, 6, (0, 1), 1, 3, 2),       # O not a multiple of 8, a thread with one image
    (2, 8, 16, 40, 33, (1, 1), 1, 2, 1),     # rows of more than 16 tiles
    (9, 4, 8, 4, 4, (1, 1), 0, 2, 4),        # 48-wide GEMM tiles and a 32 or 16 tail
    (3, 1, 1, 6, 36, (0, 0), 1, 1, 3),
])
def test_fused_conv_is_a_convolution(n, c, o, h, w, pad, act, nt, chunk, pool):
    """kfw.fused_conv equals the float64 reference conv (+ bias, ReLU, 2x2 max pool) to float32
    rounding, and the steps run one by one (kfw's transforms, kfma.gemm) bit for bit."""
    x = _fenced((n, c, h, w))
    wt = RNG.standard_normal((o, c, 3, 3)).astype(np.float32)
    b = RNG.standard_normal(o).astype(np.float32)
    got = _fused(x, wt, b, pad, act, pool, nt, chunk)
    a = {"padding": list(pad), "activation": "relu" if act else "none"}
    want = reference.conv2d(a, x, wt, b)
    if pool:
        want = reference.maxpool2d({"kernel": [2, 2]}, want)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.sqrt(9 * c))
    assert np.array_equal(got, _fused(x, wt, b, pad, act, pool, nt, chunk, serial=True))
    # the same steps as separate kernels, over the whole batch
    th, tw = -(-(h + 2 * pad[0] - 2) // 2), -(-(w + 2 * pad[1] - 2) // 2)
    cols = kfma.tile_cols(n * th * tw)
    v = np.zeros((16, c, cols), np.float32)
    kfw.input_transform(v, x, None, th, tw, *pad)
    u = np.zeros((16, o * c), np.float32)
    kfw.filter_transform(u, wt.reshape(-1, 9))
    m = np.zeros((16, o, cols), np.float32)
    kfma.gemm(m, u, v, kfma.row_offsets(c, cols), 16, o, cols, c * cols, o * c, c, o * cols, cols,
              np.zeros(0, np.float32), 0)
    steps = np.zeros_like(got)
    kfw.output_transform(steps, m, None, th, tw, b, act, 0.0, pool)
    assert np.array_equal(got, steps)


@needs_fma
def test_fused_conv_without_bias():
    x = RNG.standard_normal((4, 8, 8, 8)).astype(np.float32)
    wt = RNG.standard_normal((8, 8, 3, 3)).astype(np.float32)
    got = _fused(x, wt, np.zeros(0, np.float32), (1, 1), 0, False, 2, 1)
    want = reference.conv2d({"padding": [1, 1]}, x, wt)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
