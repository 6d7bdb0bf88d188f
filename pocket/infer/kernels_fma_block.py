"""An inverted residual block as one parallel call on x86 with AVX-512 (lowering_block): 1x1
expand -> depthwise (3x3 or 5x5, stride 1 or 2) -> 1x1 project, then one small call for the
sum, the project's bias and the residual.

Each thread takes a run of the expanded channels: their expand rows (kernels_fma's tiles), the
depthwise planes of those channels (kernels_fma_dw's flat or row kernels) and the project's partial
sums over them (its K restricted to those channels) into a part of its own; `block_sum` then
adds the parts, the bias and the residual. So the expanded and depthwise maps never leave the
core that made them, and the block costs two calls, not three or four.

NOTE: MobileNetV2's 8x8 and 4x4 blocks (64 and 16 pixels) took 5-6 us a call and stayed on one
thread under the engine's work threshold (a split by output channels read the other core's
half of each input, and a fork and join cost ~1.4 us a call).

Exactness: on one part each output is kernels_fma.gemm's FMA chain along K, then + bias, then
+ residual: the same bits as the three calls. On two parts the project's sum is two chains
added (float32 rounding only).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from pocket.infer.jit import kernel
from pocket.infer.kernels_fma import TILE_P, _channels, _gemm_block, _rows_aligned, _tile_rows
from pocket.infer.kernels_fma_dw import _flat_part, _part


@njit(cache=True)
def _tiles(m, o, x, offs):
    """kernels_fma.gemm's tile rows for one item of m pixels and o channels."""
    n_p = (m + TILE_P - 1) // TILE_P
    return n_p, _tile_rows(m, n_p, o, _rows_aligned(x, offs, 0, 1))


@kernel
def block_parts(psum, e, d, x, w1, b1, epi1, offs1, w2, b2, masks, rows, sh, ph, pw, mode2, act2, alpha2,
                w3, offs3):
    """Batch 1: e (1, C1, H, W) = expand(x (K, H*W)) (W1 (C1, K), bias b1, kernels_fma.gemm's
    epi1), d (1, C1, Ho, Wo) = the depthwise conv of e (W2 (C1, 1, k, k), b2, stride sh,
    padding (ph, pw), the activation as kernels_fma_dw's), psum[p] (C3, Ho*Wo) = W3[:, channels
    of part p] @ d[those channels] (no bias). The depthwise conv runs kernels_fma_dw's flat
    kernel where masks has rows (its masks), else its row kernels (rows: a scratch row a
    part). offs1, offs3: kernels_fma.row_offsets(K, H*W), (C1, Ho*Wo). The parts
    (psum.shape[0]) share the expanded channels in whole tiles of the expand's rows."""
    parts = psum.shape[0]
    c1, k = w1.shape
    c3, m2 = psum.shape[1], psum.shape[2]
    m1 = e.shape[2] * e.shape[3]
    n_p1, tr1 = _tiles(m1, c1, x, offs1)
    n_p3, tr3 = _tiles(m2, c3, d, offs3)
    flat = masks.shape[0] > 0
    xa, ea, da = np.int64(x.ctypes.data), np.int64(e.ctypes.data), np.int64(d.ctypes.data)
    w1a, w3a = np.int64(w1.ctypes.data), np.int64(w3.ctypes.data)
    o1a, o3a, b1a = np.int64(offs1.ctypes.data), np.int64(offs3.ctypes.data), np.int64(b1.ctypes.data)
    for part in prange(parts):
        lo, hi = _channels(part, c1, parts, tr1)
        if hi <= lo:
            continue
        _gemm_block(w1a, k, xa, o1a, k, ea, m1, 0, True, lo, hi, tr1, 0, n_p1, m1,
                    b1a if epi1 != 0 else np.int64(0), epi1, np.int64(max(epi1 - 1, 0)))
        if flat:
            _flat_part(d, e, w2, b2, masks, lo, hi, ph, pw, mode2, act2, alpha2)
        else:
            _part(d, e, w2, b2, rows[part], lo, hi, sh, ph, pw, mode2, act2, alpha2)
        pa = np.int64(psum[part].ctypes.data)
        _gemm_block(w3a + lo * 4, c1, da, o3a + lo * 8, hi - lo, pa, m2, 0, True, 0, c3, tr3, 0, n_p3, m2,
                    np.int64(0), 0, np.int64(0))


@kernel
def block_sum(out, psum, b3, res):
    """out (C3, P) = the parts of psum (parts, C3, P) summed in order, + b3 (C3,), + res (C3,
    P) where res is not empty: block_parts' project, its bias and the residual add. psum's
    part 0 keeps the running sum (psum is the block's scratch).

    NOTE: one pass a part, each a loop LLVM vectorizes: a loop over the parts inside the loop
    over the pixels stayed scalar, and MobileNetV2's 32x32 blocks' sums of two parts took
    20-25 us on one thread (all of what a 2-part block cost over a 1-part one, the plan a
    2-thread engine runs solo under load)."""
    parts, c3, m = psum.shape
    has_res = res.shape[0] > 0
    for r in prange(c3):
        bo = b3[r]
        acc = psum[0, r]
        for p in range(1, parts):
            src = psum[p, r]
            for j in range(m):
                acc[j] += src[j]
        if has_res:
            for j in range(m):
                out[r, j] = acc[j] + bo + res[r, j]
        else:
            for j in range(m):
                out[r, j] = acc[j] + bo
