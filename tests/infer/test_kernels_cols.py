"""kernels_cols.im2col_s2 (stride 2 along W from even/odd split rows) against an im2col written
here in NumPy (padding, then strided slices), float32 images and int8 codes: odd and even
widths, padding wider than the kernel's reach, strides 1-3 along H with dilation, both column
layouts, the parallel kernel."""

from __future__ import annotations

import numpy as np
import pytest

from pocket.infer import kernels_cols as kc

RNG = np.random.default_rng(5)
PAD = np.float32(-7.0)


def _naive(x, kh, kw, sh, ph, pw, dh):
    """(N, C*kh*kw, Ho*Wo) columns of a stride (sh, 2) conv, dilation (dh, 1), padded with PAD."""
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=PAD)
    ho, wo = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - kw) // 2 + 1
    rows = [xp[:, ch, i * dh:i * dh + sh * (ho - 1) + 1:sh, j:j + 2 * (wo - 1) + 1:2].reshape(n, -1)
            for ch in range(c) for i in range(kh) for j in range(kw)]
    return np.stack(rows, axis=1), ho, wo


# (N, C, H, W, kh, kw, sh, ph, pw, dh)
CASES = [(1, 3, 40, 48, 3, 3, 2, 1, 1, 1),  # a stem
         (2, 2, 17, 33, 3, 5, 2, 2, 2, 1),  # odd width, two images
         (1, 1, 16, 16, 1, 1, 2, 0, 0, 1),  # 1x1 stride 2
         (1, 2, 20, 31, 5, 4, 1, 3, 0, 2),  # stride 1 along H, dilated
         (1, 1, 9, 40, 2, 7, 3, 0, 3, 1),  # padding 3 with a 7-wide kernel
         (1, 2, 12, 19, 3, 2, 2, 4, 5, 1)]  # padding past the kernel's reach


@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("layout", ["wide", "stacked"])
@pytest.mark.parametrize("dtype", [np.float32, np.int8])
def test_im2col_s2_matches_numpy(case, layout, dtype):
    n, c, h, w, kh, kw, sh, ph, pw, dh = case
    assert kc.eligible(np.dtype(dtype), w, sh, 2, 1)
    if dtype == np.int8:  # the int8 routes' codes, float32 columns
        x = RNG.integers(-128, 128, (n, c, h, w)).astype(np.int8)
    else:
        x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    want, ho, wo = _naive(x.astype(np.float32), kh, kw, sh, ph, pw, dh)
    k, p = c * kh * kw, ho * wo
    if layout == "wide":  # (K, N*P): rb 0, cb P
        got = np.full((k, n * p), np.nan, np.float32)
        kc.im2col_s2.serial(got, x, kh, kw, sh, ph, pw, dh, PAD, 0, p)
        got = got.reshape(k, n, p).transpose(1, 0, 2)
    else:  # (N*K, P): rb K, cb 0
        got = np.full((n * k, p), np.nan, np.float32)
        kc.im2col_s2(got, x, kh, kw, sh, ph, pw, dh, PAD, k, 0)
        got = got.reshape(n, k, p)
    assert np.array_equal(got, want)


def test_eligible():
    assert not kc.eligible(np.dtype(np.float32), 15, 2, 2, 1)  # rows too short to split
    assert not kc.eligible(np.dtype(np.uint8), 64, 2, 2, 1)
    assert not kc.eligible(np.dtype(np.float32), 64, 2, 1, 1)
    assert not kc.eligible(np.dtype(np.float32), 64, 2, 2, 2)
