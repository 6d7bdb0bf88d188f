"""kernels_fp32.im2col_same on x86 with AVX-512, a vector at a time (lowering_common's im2col
for the AVX-512 routes' columns): on small maps its rows are a few vectors long, and the scalar
loop, with a mask test per element, ran ~1 ns an element.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from pocket.infer.jit import kernel
from pocket.infer.kernels_fma import _row16


def same_masks(valid: np.ndarray) -> np.ndarray:
    """kernels_fp32.same_valid's (kh*kw, H*W) mask as (kh*kw, ceil(H*W / 16)) int64 bit masks,
    bit l of [t, v] for pixel 16v + l: im2col_same's argument."""
    taps, hw = valid.shape
    bits = np.zeros((taps, -(-hw // 16) * 16), np.int64)
    bits[:, :hw] = valid != 0
    return (bits.reshape(taps, -1, 16) << np.arange(16, dtype=np.int64)).sum(axis=2)


@kernel
def im2col_same(col, x, masks, kh, kw, ph, pw, dh, dw, pad, rb, cb):
    """kernels_fp32.im2col_same (same layout and arguments) with masks = same_masks(valid): each
    row a masked load and store per 16 pixels."""
    n, c, h, w = x.shape
    hw = h * w
    ld, nv = col.shape[1], masks.shape[1]
    xa, ca = np.int64(x.ctypes.data), np.int64(col.ctypes.data)
    for nc in prange(n * c):
        b, ch = nc // c, nc % c
        for i in range(kh):
            for j in range(kw):
                s = (i * dh - ph) * w + (j * dw - pw)
                src = xa + (nc * hw + s) * 4
                dst = ca + ((b * rb + (ch * kh + i) * kw + j) * ld + b * cb) * 4
                for v in range(nv):
                    _row16(src + v * 64, dst + v * 64, masks[i * kw + j, v], min(16, hw - 16 * v), pad)
