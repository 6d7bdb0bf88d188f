"""The AVX-512 VNNI int8 kernels against naive NumPy twins in int64 (exact equality).

The end-to-end int8 cases in test_kernels.py also run through these kernels (the int8_route
fixture); here each kernel is checked alone, on the shapes where tiles and tails go wrong.
"""

from __future__ import annotations

import numpy as np
import pytest

from pocket.infer import kernels_pool as kp
from pocket.infer import kernels_vnni as kv

needs_vnni = pytest.mark.skipif(not kv.AVAILABLE, reason="this CPU has no AVX-512 VNNI")
RNG = np.random.default_rng(11)


def _codes(shape, lo=-128):
    return RNG.integers(lo, 128, shape).astype(np.int8)


def _cols(m: int) -> int:
    return -(-m // kv.COL_ALIGN) * kv.COL_ALIGN


@needs_vnni
@pytest.mark.parametrize("o,k,m", [(1, 4, 1), (3, 8, 65), (4, 12, 64), (7, 260, 130),
                                   (9, 1028, 3), (5, 4 * (kv.BLOCK_K4 * 2 + 3), 200),
                                   (17, 8, 16), (9, 20, 96), (11, 260, 48), (6, 12, 176),
                                   (40, 4 * (kv.BLOCK_K4 * 2 + 3), 24)])
def test_gemm_cols(o, k, m):
    """Channel tiles of 1-4 rows, narrow last tiles of 16, 32 and 48 pixels over 16, 8 and 5
    channels (and their channel tails), channel blocks, K across several BLOCK_K4 passes;
    extreme codes."""
    w, x = _codes((o, k), lo=-127), _codes((m, k))
    w[0], x[0] = -127, 127  # the largest products
    xp = np.full((k // 4, _cols(m)), 0xDEADBEEF, np.uint32)  # junk columns must stay harmless
    kv.pack_rows_t(xp, x.view(np.uint8).view(np.uint32))
    c = np.zeros((o, _cols(m)), np.int32)
    kv.gemm_cols(c, w, xp)
    want = w.astype(np.int64) @ (x.astype(np.int64) + 128).T
    assert np.array_equal(c[:, :m], want)


@needs_vnni
@pytest.mark.parametrize("o,k,n", [(1, 1, 1), (5, 63, 2), (4, 64, 3), (6, 65, 1), (13, 784, 5),
                                   (10, 3136, 15)])
def test_gemm_rows(o, k, n):
    """K tails of 0-63 bytes (masked weight loads), channel remainders, a single row."""
    w, x = _codes((o, k), lo=-127), _codes((n, k))
    xu = np.full((n, (k // 64 + 1) * 64), 0xAB, np.uint8)  # junk past K must not count
    kv.pack_rows(xu, x.view(np.uint8))
    assert np.array_equal(xu[:, :k], (x.astype(np.int64) + 128).astype(np.uint8))
    c = np.zeros((n, o), np.int32)
    kv.gemm_rows(c, xu, w)
    assert np.array_equal(c, (x.astype(np.int64) + 128) @ w.T.astype(np.int64))


def _naive_cols(x, kh, kw, sh, sw, ph, pw, dh, dw, pad):
    """x (N, C, H, W) i8 -> (N, Ho, Wo, C*kh*kw) int64 of x + 128, pad outside."""
    n, c, h, w = x.shape
    xp = np.full((n, c, h + 2 * ph, w + 2 * pw), pad, np.int64)
    xp[:, :, ph:ph + h, pw:pw + w] = x.astype(np.int64) + 128
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, ho, wo, c, kh, kw), np.int64)
    for i in range(kh):
        for j in range(kw):
            out[:, :, :, :, i, j] = xp[:, :, i * dh:i * dh + sh * ho:sh,
                                       j * dw:j * dw + sw * wo:sw].transpose(0, 2, 3, 1)
    return out.reshape(n, ho, wo, -1)


@needs_vnni
@pytest.mark.parametrize("geom", [(3, 3, 1, 1, 1, 1, 1, 1), (1, 1, 1, 1, 0, 0, 1, 1),
                                  (3, 2, 2, 1, 1, 0, 1, 1), (3, 3, 1, 1, 2, 1, 2, 2),
                                  (5, 5, 2, 2, 2, 2, 1, 1)])
@pytest.mark.parametrize("c", [1, 3, 4])
@pytest.mark.parametrize("by_table", [False, True])
@pytest.mark.parametrize("shared", [False, True])
def test_pad_pack_gemm_is_a_convolution(geom, c, by_table, shared):
    """pad_shift + pack_cols (+ pad_weights for K % 4 != 0) + gemm_cols + requant_cols: the
    sums equal the naive convolution at every real pixel, for both pixel pitches (a stride-1
    conv packed by pixel table too, as narrow maps are), with padded rows W + 2pw wide or, at
    stride 1, W + pw (a row's right padding read from the next row's left)."""
    kh, kw, sh, sw, ph, pw, dh, dw = geom
    n, h, w, o, zp = 2, 7, 9, 5, -3
    x, wt = _codes((n, c, h, w)), _codes((o, c * kh * kw), lo=-127)
    hp, wp = h + 2 * ph, w + (pw if shared and (sh, sw) == (1, 1) else 2 * pw)
    ho = (hp - dh * (kh - 1) - 1) // sh + 1
    wo = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    flat = (sh, sw) == (1, 1) and not by_table
    pitch = wp if flat else wo
    poffs = np.zeros(0, np.int64) if flat else kv.pixel_offsets(ho, wo, sh, sw, wp)
    k4 = -(-c * kh * kw // 4)
    xpad = np.zeros(n * c * hp * wp + (kw - 1) * dw + 1, np.uint8)
    kv.pad_shift(xpad, x.view(np.uint8), ph, pw, hp, wp, zp + 128)
    xp = np.zeros((k4, _cols(n * ho * pitch)), np.uint32)
    kv.pack_cols(xp, xpad, n, c, hp, wp, kh, kw, dh, dw, ho * pitch, poffs)
    w4 = np.full((o, 4 * k4), 99, np.int8)
    kv.pad_weights(w4, wt)
    assert np.array_equal(w4[:, :wt.shape[1]], wt) and not w4[:, wt.shape[1]:].any()
    c32 = np.zeros((o, xp.shape[1]), np.int32)
    kv.gemm_cols(c32, w4, xp)
    want = _naive_cols(x, kh, kw, sh, sw, ph, pw, dh, dw, zp + 128) @ wt.T.astype(np.int64)
    got = c32[:, :n * ho * pitch].reshape(o, n, ho, pitch)[..., :wo].transpose(1, 2, 3, 0)
    assert np.array_equal(got, want)
    # the epilogue reads the same pitch: with m = 1 and no rounding it returns the sums
    out = np.zeros((n, o, ho, wo), np.float32)
    kv.requant_cols(out, c32, c32.view(np.float32), pitch, ho * pitch, np.zeros(o, np.int64), np.ones(o),
                    False, 0.0, (-128.0, 127.0, np.inf), False)
    assert np.array_equal(out, want.transpose(0, 3, 1, 2).astype(np.float32))


@needs_vnni
@pytest.mark.parametrize("geom", [(3, 3, 1, 1), (1, 1, 0, 0), (3, 2, 1, 0), (3, 3, 2, 2), (5, 5, 2, 2),
                                  (2, 4, 0, 1)])
@pytest.mark.parametrize("c,o", [(4, 5), (12, 17), (4 * (kv.BLOCK_K4 // 4 + 3), 6)])
@pytest.mark.parametrize("n,h,w", [(1, 7, 9), (7, 4, 4), (2, 17, 18)])
def test_quad_route_is_a_convolution(geom, c, o, n, h, w):
    """pad_quad + pack_weights_quad + gemm_quad (stride 1, in place on four channels a word):
    the sums equal the naive convolution at every real pixel, with 1x1, non-square and
    dilated windows, K across BLOCK_K4 passes, an image's pixels in whole and partial tiles
    (16-48 past a multiple of 64) and batch 1 and 7."""
    kh, kw, ph, pw = geom
    dh = dw = 2 if geom == (3, 3, 2, 2) else 1
    zp = 9
    x, wt = _codes((n, c, h, w)), _codes((o, c, kh, kw), lo=-127)
    x[0, :, 0, 0], wt[0] = 127, -127  # the largest products
    hp, wp = h + 2 * ph, w + pw
    ho, wo = hp - dh * (kh - 1), w + 2 * pw - dw * (kw - 1)
    pix = ho * wp
    cpi = _cols(pix)
    img = c // 4 * hp * wp
    xq = np.full(n * img + cpi - pix + (kw - 1) * dw + 1, 0xDEADBEEF, np.uint32)
    kv.pad_quad(xq, x, ph, pw, hp, wp, zp + 128)
    # the planes: four channels a word, + 128 each, the padding's byte around them
    planes = xq[:n * img].view(np.uint8).reshape(n, c // 4, hp, wp, 4).transpose(0, 1, 4, 2, 3)
    want = np.full((n, c, hp, wp), zp + 128, np.int64)
    want[:, :, ph:ph + h, pw:] = x.astype(np.int64) + 128
    assert np.array_equal(planes.reshape(n, c, hp, wp), want)
    assert (xq[n * img:].view(np.uint8) == zp + 128).all()
    wq = np.zeros((o, c * kh * kw), np.int8)
    kv.pack_weights_quad(wq, wt)
    assert np.array_equal(wq.reshape(o, c // 4, kh, kw, 4),
                          wt.reshape(o, c // 4, 4, kh, kw).transpose(0, 1, 3, 4, 2))
    c32 = np.full((o, n * cpi), -1, np.int32)
    kv.gemm_quad(c32, wq, xq, kv.quad_offsets(c, hp, wp, kh, kw, dh, dw), n, cpi, img)
    cols = _naive_cols(x, kh, kw, 1, 1, ph, pw, dh, dw, zp + 128)
    want = cols @ wt.reshape(o, -1).T.astype(np.int64)
    got = c32.reshape(o, n, cpi)[..., :pix].reshape(o, n, ho, wp)[..., :wo].transpose(1, 2, 3, 0)
    assert np.array_equal(got, want)


@needs_vnni
@pytest.mark.parametrize("geom", [(3, 3, 1, 1, 1, 1, 1, 1), (1, 1, 2, 2, 0, 0, 1, 1),
                                  (3, 2, 2, 1, 1, 0, 1, 1), (3, 3, 1, 1, 2, 2, 2, 2),
                                  (5, 5, 2, 2, 2, 2, 1, 1)])
@pytest.mark.parametrize("n,c,o", [(1, 4, 5), (7, 12, 17)])
def test_quad_packed_route_is_a_convolution(geom, n, c, o):
    """pad_quad + pack_quad_cols (by pixel table: narrow maps, strides) + gemm_cols on
    pack_weights_quad's weights: the sums equal the naive convolution at every pixel."""
    kh, kw, sh, sw, ph, pw, dh, dw = geom
    h, w, zp = 7, 9, -3
    x, wt = _codes((n, c, h, w)), _codes((o, c, kh, kw), lo=-127)
    hp, wp = h + 2 * ph, w + (pw if (sh, sw) == (1, 1) else 2 * pw)
    ho = (hp - dh * (kh - 1) - 1) // sh + 1
    wo = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    img = c // 4 * hp * wp
    xq = np.full(n * img + (kw - 1) * dw + 1, 0xDEADBEEF, np.uint32)
    kv.pad_quad(xq, x, ph, pw, hp, wp, zp + 128)
    xp = np.full((c // 4 * kh * kw, _cols(n * ho * wo)), 0xDEADBEEF, np.uint32)
    koffs = kv.quad_offsets(c, hp, wp, kh, kw, dh, dw) // 4
    kv.pack_quad_cols(xp, xq, n, img, koffs, ho * wo, kv.pixel_offsets(ho, wo, sh, sw, wp))
    wq = np.zeros((o, c * kh * kw), np.int8)
    kv.pack_weights_quad(wq, wt)
    c32 = np.zeros((o, xp.shape[1]), np.int32)
    kv.gemm_cols(c32, wq, xp)
    want = _naive_cols(x, kh, kw, sh, sw, ph, pw, dh, dw, zp + 128) @ wt.reshape(o, -1).T.astype(np.int64)
    got = c32[:, :n * ho * wo].reshape(o, n, ho, wo).transpose(1, 2, 3, 0)
    assert np.array_equal(got, want)


@pytest.mark.parametrize("to_int8", [True, False])
@pytest.mark.parametrize("ho,wo,pitch", [(4, 4, 6), (3, 5, 5), (2, 20, 22), (2, 17, 17)])
@pytest.mark.parametrize("gap", [0, 7])
def test_requant_cols(to_int8, ho, wo, pitch, gap):
    """The epilogue over c's pixel-pitched columns equals NumPy's on the real pixels: narrow
    int8 rows (two passes) and wide or float32 ones (one pass); images `gap` columns apart
    past their pixels (gemm_quad's whole vectors per image)."""
    n, o, relu = 3, 5, True
    istride = ho * pitch + gap
    c = RNG.integers(-(2**20), 2**20, (o, _cols(n * istride))).astype(np.int32)
    bias, m = RNG.integers(-500, 500, o).astype(np.int64), RNG.random(o) * 1e-4
    acc = c[:, :n * istride].reshape(o, n, istride)[..., :ho * pitch].reshape(o, n, ho, pitch)
    acc = acc[..., :wo].transpose(1, 0, 2, 3).astype(np.int64)
    if to_int8:  # formats.quant: float32(acc) * float32(m) in float32
        v = (acc + bias[:, None, None]).astype(np.float32) * m.astype(np.float32)[:, None, None]
        want = np.clip(np.rint(v) - 7, -7, 127).astype(np.int8)
    else:
        v = (acc + bias[:, None, None]) * m[:, None, None]
        want = np.maximum(v.astype(np.float32), 0)
    out = np.zeros((n, o, ho, wo), want.dtype)
    kv.requant_cols(out, c, c.view(np.float32), pitch, istride, bias, m, to_int8, -7.0,
                    (-7.0, 127.0, np.inf), relu)
    assert np.array_equal(out, want)


@pytest.mark.parametrize("k,s", [((2, 2), (2, 2)), ((3, 3), (2, 2)), ((3, 2), (1, 2)), ((4, 3), (2, 1))])
@pytest.mark.parametrize("gap", [0, 13])
@pytest.mark.parametrize("wc,pitch", [(8, 11), (40, 43), (21, 21)])
def test_requant_cols_pool(k, s, gap, wc, pitch):
    """The pooled epilogue equals pool-after-epilogue on the sums (rows of `pitch` columns,
    images `gap` columns apart past their rows); kernels_pool's vector passes where the rows
    are 8+ sums wide (40 columns: 19-20 windows of stride 2 a row)."""
    n, o, hc = 3, 4, 9
    istride = hc * pitch + gap
    c = RNG.integers(-(2**20), 2**20, (o, _cols(n * istride))).astype(np.int32)
    bias, m = RNG.integers(-500, 500, o).astype(np.int64), RNG.random(o) * 1e-4
    ho, wo = (hc - k[0]) // s[0] + 1, (wc - k[1]) // s[1] + 1
    out = np.zeros((n, o, ho, wo), np.int8)
    sums = c.copy()  # a 2x2 pool works in place in c
    kp.requant_cols_pool(out, c, c.view(np.float32), hc, pitch, istride, *k, *s, bias, m, True, 5.0,
                         (-128.0, 127.0, np.inf), False)
    acc = sums[:, :n * istride].reshape(o, n, istride)[..., :hc * pitch].reshape(o, n, hc, pitch)
    acc = acc[..., :wc].transpose(1, 0, 2, 3)
    v = (acc + bias[:, None, None]).astype(np.float32) * m.astype(np.float32)[:, None, None]
    y = np.clip(np.rint(v) + 5, -128, 127)
    want = np.full((n, o, ho, wo), -128.0)
    for i in range(k[0]):
        for j in range(k[1]):
            want = np.maximum(want, y[:, :, i:i + s[0] * ho:s[0], j:j + s[1] * wo:s[1]])
    assert np.array_equal(out, want.astype(np.int8))


@pytest.mark.parametrize("relu", [True, False])
@pytest.mark.parametrize("n", [16, 17, 64])
def test_requant_cols_pack(relu, n):
    """A chained linear's int8 epilogue leaves the codes as pack_rows_t would pack them for the
    next linear (four channels a word, + 128 a byte), and columns past the rows untouched."""
    o, mp = 12, _cols(n)
    c = RNG.integers(-(2**20), 2**20, (o, mp + 16)).astype(np.int32)
    bias, m = RNG.integers(-500, 500, o).astype(np.int64), RNG.random(o) * 1e-4
    lo = 3.0 if relu else -128.0
    v = (c[:, :n] + bias[:, None]).astype(np.float32) * m.astype(np.float32)[:, None]
    codes = np.clip(np.rint(v) + 3, lo, 127).astype(np.int8)
    want = np.zeros((o // 4, mp), np.uint32)
    kv.pack_rows_t(want, np.ascontiguousarray(codes.T).view(np.uint32))
    got = np.full((o // 4, mp), 0xDEADBEEF, np.uint32)
    kv.requant_cols_pack(got, c, c.view(np.float32), n, bias, m, 3.0, (lo, 127.0, np.inf), relu)
    assert np.array_equal(got[:, :n], want[:, :n])
    assert (got[:, n:] == 0xDEADBEEF).all()
    words = ((codes.astype(np.int64).T + 128).reshape(n, o // 4, 4) << np.array([0, 8, 16, 24])).sum(-1)
    assert np.array_equal(got[:, :n], words.T.astype(np.uint32))
