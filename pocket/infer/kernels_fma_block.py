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
from pocket.infer.kernels_fma import (
    TILE_P,
    _channels,
    _gemm_block,
    _gemm_part,
    _group,
    _rows_aligned,
    _tile_rows,
)
from pocket.infer.kernels_fma_dw import _flat_part, _part
from pocket.infer.kernels_fma_dwcv import _cv_group
from pocket.infer.kernels_fp32 import mean_row


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


# --------------------------------------------------------------------------- squeeze-and-excitation
#
# MobileNetV3's and EfficientNet's blocks: expand -> depthwise -> [channel means -> FC -> FC ->
# gate] -> project (its weights times the gate, lowering_vision.gated_convs) (-> residual add).
# Run node by node on two threads, each parallel call split its work its own way: the project
# read half of its inputs from the other core's cache and lost to its serial twin
# (MobileNetV3-small's 40 x 240 @ 196: 36 us on two threads, 29 on one). Here a part (a run of
# 16-channel groups) makes its channels' expand rows, depthwise planes and means (se_parts);
# the gate's small FCs run as before; then the same part sums the project over its channels
# (se_project), and block_sum adds the parts, the bias and the residual.

DW_ROWS, DW_FLAT, DW_CV = 0, 1, 2  # se_parts' depthwise kernel: kernels_fma_dw's rows, flat; dwcv
_NO_BIAS = np.zeros(0, np.float32)


@njit(cache=True, inline="always")
def se_channels(part, c, parts):
    """[lo, hi): the channels of part `part` of `parts`, whole groups of 16."""
    g0, g1 = _group(part, (c + 15) // 16, parts)
    return g0 * 16, min(c, g1 * 16)


@kernel
def se_parts(means, e, d, x, w1, b1, epi1, offs1, kind, w2, b2, masks, scratch, sh, ph, pw, mode2, act2,
             alpha2, parts):
    """Batch 1, each of `parts` parts on its channels (se_channels): e (1, C1, H, W) = expand(x
    (K, H*W)) (W1 (C1, K), b1, kernels_fma.gemm's epi1), d (1, C1, Ho, Wo) = the depthwise conv
    of e and means (C1,) = d's channel means. kind: DW_ROWS (kernels_fma_dw's row kernels: w2
    (C1, 1, k, k), b2, a scratch row a part), DW_FLAT (its flat kernel: w2, b2, masks) or DW_CV
    (kernels_fma_dwcv: w2 = its pack(w), b2 = kernels_fma_cv.pad_bias(b), a scratch row a part).
    The activation as kernels_fma_dw's (mode2, act2, alpha2)."""
    c1, k = w1.shape
    m1 = e.shape[2] * e.shape[3]
    tr1 = _tiles(m1, c1, x, offs1)[1]
    flat_e, flat_d = e.reshape(c1, m1), d.reshape(c1, -1)
    for part in prange(parts):
        lo, hi = se_channels(part, c1, parts)
        if hi <= lo:
            continue
        # (kernels_fma.gemm's own loops and blocking, on the part's channels)
        _gemm_part(0, flat_e[lo:hi], w1[lo:hi], x, offs1, hi - lo, m1, 0, 0, k, 0, m1, b1[lo:hi], epi1, 1, 1,
                   tr1)
        if kind == DW_CV:
            for g in range(lo // 16, (hi + 15) // 16):
                _cv_group(d, e, w2, b2, scratch[part], g, sh, ph, pw, mode2, act2, alpha2)
        elif kind == DW_FLAT:
            _flat_part(d, e, w2, b2, masks, lo, hi, ph, pw, mode2, act2, alpha2)
        else:
            _part(d, e, w2, b2, scratch[part], lo, hi, sh, ph, pw, mode2, act2, alpha2)
        for ch in range(lo, hi):  # (global_avgpool's mean, so the same bits)
            means[ch] = mean_row(flat_d[ch])


@kernel
def se_project(psum, d, w3, gate, wg, offs3, rows):
    """psum[p] (C3, P) = W3 (C3, C1)[:, channels of part p] @ d[those channels] (C1, P) times
    the gate (C1,) (no bias), the parts (psum.shape[0]) on se_parts' channels; block_sum adds
    them. The gate multiplies the weights (float32 products into wg (C3, C1): lowering_vision's
    gated_convs) or, with `rows`, d's rows in place (kernels_vision.mul_rows' products)."""
    parts, c3, m2 = psum.shape
    c1 = w3.shape[1]
    tr3 = _tiles(m2, c3, d, offs3)[1]
    for part in prange(parts):
        lo, hi = se_channels(part, c1, parts)
        if hi <= lo:
            continue
        # (unsigned indices: no wraparound test, so LLVM vectorizes the loops)
        if rows:
            for j in range(lo, hi):
                row, g = d[j], gate[j]
                for i in range(m2):
                    row[np.uint64(i)] *= g
            w = w3
        else:
            for r in range(c3):
                src, dst = w3[r], wg[r]
                for j in range(lo, hi):
                    u = np.uint64(j)
                    dst[u] = src[u] * gate[u]
            w = wg
        _gemm_part(0, psum[part], w[:, lo:hi], d, offs3[lo:hi], c3, m2, 0, 0, c1, 0, m2, _NO_BIAS, 0, 1, 1,
                   tr3)
