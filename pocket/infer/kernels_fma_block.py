"""An inverted residual block on a small map as one parallel call on x86 with AVX-512
(lowering_block): 1x1 expand -> 3x3 depthwise (stride 1, "same") -> 1x1 project, then one small
call for the sum, the project's bias and the residual.

Each thread takes a run of the expanded channels: their expand rows (kernels_fma's tiles), the
depthwise planes of those channels (kernels_fma_dw's flat kernel) and the project's partial
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
from pocket.infer.kernels_fma_dw import _flat_part


@njit(cache=True)
def _tiles(m, o, x, offs):
    """kernels_fma.gemm's tile rows for one item of m pixels and o channels."""
    n_p = (m + TILE_P - 1) // TILE_P
    return n_p, _tile_rows(m, n_p, o, _rows_aligned(x, offs, 0, 1))


@kernel
def block_parts(psum, e, d, x, w1, b1, epi1, offs1, w2, b2, masks, ph, pw, mode2, act2, alpha2, w3, offs3):
    """Batch 1: e (C1, P) = expand(x (K, P)) (W1 (C1, K), bias b1, kernels_fma.gemm's epi1),
    d (1, C1, H, W) = the depthwise conv of e (W2 (C1, 1, 3, 3), b2, masks and the activation
    as kernels_fma_dw.dw_conv_fma_flat's), psum[p] (C3, P) = W3[:, channels of part p] @ d[those
    channels] (no bias). offs1, offs3: kernels_fma.row_offsets(K, P), (C1, P). The parts
    (psum.shape[0]) share the expanded channels in whole tiles of the expand's rows."""
    parts = psum.shape[0]
    c1, k = w1.shape
    c3, m = psum.shape[1], psum.shape[2]
    e4 = e.reshape(1, c1, d.shape[2], d.shape[3])
    n_p, tr1 = _tiles(m, c1, x, offs1)
    _, tr3 = _tiles(m, c3, d, offs3)
    xa, ea, da = np.int64(x.ctypes.data), np.int64(e.ctypes.data), np.int64(d.ctypes.data)
    w1a, w3a = np.int64(w1.ctypes.data), np.int64(w3.ctypes.data)
    o1a, o3a, b1a = np.int64(offs1.ctypes.data), np.int64(offs3.ctypes.data), np.int64(b1.ctypes.data)
    for part in prange(parts):
        lo, hi = _channels(part, c1, parts, tr1)
        if hi <= lo:
            continue
        _gemm_block(w1a, k, xa, o1a, k, ea, m, 0, True, lo, hi, tr1, 0, n_p, m,
                    b1a if epi1 != 0 else np.int64(0), epi1, np.int64(max(epi1 - 1, 0)))
        _flat_part(d, e4, w2, b2, masks, lo, hi, ph, pw, mode2, act2, alpha2)
        pa = np.int64(psum[part].ctypes.data)
        _gemm_block(w3a + lo * 4, c1, da, o3a + lo * 8, hi - lo, pa, m, 0, True, 0, c3, tr3, 0, n_p, m,
                    np.int64(0), 0, np.int64(0))


@kernel
def block_sum(out, psum, b3, res):
    """out (C3, P) = the parts of psum (parts, C3, P) summed in order, + b3 (C3,), + res (C3,
    P) where res is not empty: block_parts' project, its bias and the residual add."""
    parts, c3, m = psum.shape
    has_res = res.shape[0] > 0
    for r in prange(c3):
        bo = b3[r]
        for j in range(m):
            v = psum[0, r, j]
            for p in range(1, parts):
                v += psum[p, r, j]
            v = v + bo
            if has_res:
                v = v + res[r, j]
            out[r, j] = v
