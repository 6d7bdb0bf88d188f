"""im2col for stride-2 convs (the 224x224 stems of MobileNetV3, EfficientNet, ...) from each
input row split once into its even and odd columns: a tap's columns at stride 2 are then a
contiguous run of one half, and the copies vectorize as plain copies.

kernels_fp32.im2col's own stride-2 copy (a stride-2 load LLVM vectorizes with shuffles, each
tap again) ran MobileNetV3-Small's 3 x 224 x 224 stem columns at ~0.5 ns an element; the split
(kernels_dw._split_pairs: one load and two shuffles a step) is paid once a row and tap row.
Same layout and arguments as kernels_fp32.im2col; the values are copies (int8 codes converted
to float32, as the int8 routes' columns are): bit for bit its.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from pocket.infer.jit import kernel
from pocket.infer.kernels_dw import SPLIT_LANES, _split_pairs

U = np.uint64


def eligible(x_dtype, w: int, sh: int, sw: int, dw: int) -> bool:
    """Whether im2col_s2 takes this conv: float32 images or int8 codes (float32 columns either
    way), stride 2 along W (any along H), no dilation along W, rows of at least 2 SPLIT_LANES
    columns."""
    return x_dtype in (np.float32, np.int8) and sw == 2 and dw == 1 and w >= 2 * SPLIT_LANES


@kernel
def im2col_s2(col, x, kh, kw, sh, ph, pw, dh, pad, rb, cb):
    """kernels_fp32.im2col for sw = 2, dw = 1 (see eligible): image b's row (c, i, j) of Ho*Wo
    pixels at col[b*rb + (c*kh + i)*kw + j, b*cb:b*cb + Ho*Wo]; outside the image = pad."""
    n, c, h, w = x.shape
    wo = (w + 2 * pw - kw) // 2 + 1
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    pairs = w // 2
    half = pairs + 1  # the odd columns start here in the split buffer (the evens take w - pairs)
    for nc in prange(n * c):
        b, ch = nc // c, nc % c
        xs = x[b, ch].ravel()
        split = np.empty(2 * half, np.float32)
        sa = split.ctypes.data
        for i in range(kh):
            for oh in range(ho):
                ih = oh * sh - ph + i * dh
                base = b * cb + oh * wo
                r0 = b * rb + (ch * kh + i) * kw
                if not 0 <= ih < h:
                    for j in range(kw):
                        row = col[r0 + j]
                        for ow in range(wo):
                            row[base + ow] = pad
                    continue
                _split_pairs(sa, sa + half * 4, xs.ctypes.data + ih * w * xs.itemsize, pairs, split, xs)
                if w % 2:
                    split[pairs] = xs[ih * w + w - 1]
                for j in range(kw):
                    row = col[r0 + j]
                    q = j - pw  # the input column of output column ow is 2 ow + q
                    lo = min(wo, max(0, -(q // 2)))
                    hi = max(lo, min(wo, -(-(w - q) // 2)))
                    for ow in range(lo):
                        row[base + ow] = pad
                    # 2 ow + q = 2 (ow + q // 2) + q % 2: the evens' or the odds' column ow + q // 2
                    src = U((q % 2) * half + lo + q // 2)
                    dst = U(base + lo)
                    for t in range(hi - lo):
                        row[dst + U(t)] = split[src + U(t)]
                    for ow in range(hi, wo):
                        row[base + ow] = pad
