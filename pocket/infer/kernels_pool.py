"""A separable max pool: the max over a kh x kw window is the max over kw columns of the max
over kh rows, so each output row takes one vector pass per window row over whole input rows
(contiguous, any stride), then one pass along the row buffer per window column.

kernels_fp32.maxpool2d takes the max over each window in turn (kh * kw scalar steps an output,
with the window clamped at the borders): ShuffleNetV2's 3x3/2 pool over 24 x 112 x 112 took
1.15 ms there. Here the padding columns hold the dtype's lowest value, written once a call, so no
step tests a bound; the padding rows are skipped (they never win: every window has a row inside).

NaN propagates as in kernels_fp32.nanmax (np.maximum's rule). int8 pools their codes, as the
reference does (quantization is monotone).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from pocket.infer.jit import kernel
from pocket.infer.kernels_fp32 import nanmax


def row_width(w: int, wo: int, kw: int, sw: int, pw: int) -> int:
    """Elements of the row buffer: the input row with pw lowest values on the left and enough
    on the right for the last window (ceil mode's may reach past the right padding)."""
    return max(pw + w + pw, (wo - 1) * sw + kw)


@kernel
def maxpool_sep(out, x, rows, kh, kw, sh, sw, ph, pw, lowest):
    """x (N, C, H, W) f32 or i8 -> out (N, C, Ho, Wo), as kernels_fp32.maxpool2d; rows (parts,
    row_width(...)) of x's dtype, one a part (a thread's share of the planes), any contents;
    lowest: the dtype's lowest value (-inf, -128), the padding."""
    parts = rows.shape[0]
    planes = x.shape[0] * x.shape[1]
    for part in prange(parts):
        _pool_part(out, x, rows[part], part * planes // parts, (part + 1) * planes // parts,
                   kh, kw, sh, sw, ph, pw, lowest)


# NOTE: not inlined, so the prange twin compiles a call (as kernels_dw's parts)
@njit(cache=True)
def _pool_part(out, x, buf, first, last, kh, kw, sh, sw, ph, pw, lowest):
    h, w = x.shape[2], x.shape[3]
    ho, wo = out.shape[2], out.shape[3]
    xf, of = x.reshape(-1), out.reshape(-1)
    buf[:pw] = lowest
    buf[pw + w:] = lowest
    mid = buf[pw:pw + w]
    for nc in range(first, last):
        xb, ob = nc * h * w, nc * ho * wo
        for oh in range(ho):
            r0, r1 = max(oh * sh - ph, 0), min(oh * sh - ph + kh, h)
            src = xf[xb + r0 * w:xb + r0 * w + w]
            for j in range(w):
                mid[j] = src[j]
            for r in range(r0 + 1, r1):
                src = xf[xb + r * w:xb + r * w + w]
                for j in range(w):
                    mid[j] = nanmax(mid[j], src[j])
            dst = of[ob + oh * wo:ob + oh * wo + wo]
            if kw == 3 and sw == 2:
                for ow in range(wo):
                    a = np.uint64(2 * ow)
                    dst[ow] = nanmax(nanmax(buf[a], buf[a + np.uint64(1)]), buf[a + np.uint64(2)])
            elif kw == 2 and sw == 2:
                for ow in range(wo):
                    a = np.uint64(2 * ow)
                    dst[ow] = nanmax(buf[a], buf[a + np.uint64(1)])
            else:
                # NOTE: unsigned indices let LLVM vectorize the strided loads (see im2col)
                for ow in range(wo):
                    dst[ow] = buf[np.uint64(ow * sw)]
                for j in range(1, kw):
                    for ow in range(wo):
                        dst[ow] = nanmax(dst[ow], buf[np.uint64(ow * sw + j)])
