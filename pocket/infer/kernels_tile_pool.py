"""A stride-2 stem conv over its input's phases (kernels_tile.gemm_phase) with the max pool
after it fused: each part computes the conv rows its pooled rows need into a ring of kh rows
(every output channel's, in L1/L2) and pools them from there, so the conv's whole output is
never written to memory and read back by the pool.

NOTE: in a model's sequence the stems' outputs (SqueezeNet's 64 x 111 x 111, ResNet-18's 64 x
112 x 112: 3.2 MB) left the caches before the pool read them: on a 2-core Zen 1 the pools took
0.48-0.54 / 0.98 ms there against 0.17 / 0.41 ms alone (kernels_pool.maxpool_sep, the pass
this replaces, whose vector row and column maxes are used here as they are).

Exactness: each conv output is gemm_phase's (the same tile, the same chain along K), and the
pool is maxpool_sep's vector passes over the same values: the same bytes as the two calls.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from pocket.infer.jit import kernel
from pocket.infer.kernels_pool import _cols2, _cols3, _rows2, _rows3, _rows_any, row_width
from pocket.infer.kernels_tile import AHEAD, PIX, ROWS, VL, _tile_ix, clamp_of


@njit(cache=True)
def pitch_of(wo: int) -> int:
    """A ring row's floats: the conv row in whole tiles (the last tile's junk lanes land in
    its padding)."""
    return -(-wo // PIX) * PIX


def ring_floats(o: int, wo: int, wp: int, kh: int, kw: int, pw: int) -> int:
    """A part's scratch (floats): kh conv rows of O channels, then the pool's row buffer."""
    return o * kh * pitch_of(wo) + row_width(wo, wp, kw, 2, pw)


def fusable(kh: int, kw: int, sh: int, sw: int, ph: int, pw: int, wo: int, act_rest: bool) -> bool:
    """Whether gemm_phase_pool takes this pool after a conv of Wo columns: 2x2 or 3x3 windows
    at stride 2, padding below the window, rows of a vector or more, and an activation the
    tiles apply (act_rest: one applied after them, kernels_tile.clamp_of)."""
    wp = (wo + 2 * pw - kw) // 2 + 1
    return (kh == kw and kh in (2, 3) and sh == sw == 2 and 0 <= ph == pw < kh
            and wo >= VL and wp >= VL and not act_rest)


@kernel
def gemm_phase_pool(yp, w, xq, wq, offs, b, ring, ho, wo, kh, ph, act, alpha):
    """yp (O, Hp, Wp) = maxpool(kh x kh, stride 2, padding ph) of gemm_phase's conv of one
    image (Ho x Wo, not stored): xq, wq, offs, w and b as gemm_phase takes them; ring (parts,
    ring_floats(O, Wo, Wp, kh, kh, ph)) float32, one row a part; act one the tiles apply
    (none, ReLU, clip: non-decreasing, so pooling commutes with it; fusable). Parallel over
    the pooled rows in `parts` runs (a run's first window computes its conv rows again)."""
    parts = ring.shape[0]
    hp = yp.shape[1]
    lo, hi, _, _ = clamp_of(act, alpha)
    flo, fhi = np.float32(lo), np.float32(hi)
    for part in prange(parts):
        _part(yp, w, xq, wq, offs, b, ring[part], ho, wo, kh, ph, flo, fhi,
              part * hp // parts, (part + 1) * hp // parts)


# a solo call runs these as one part (bound.solo): parts only split the pooled rows, each
# computed the same way in any part
gemm_phase_pool.one_part = (6,)


# NOTE: not inlined, so the prange twin compiles a call (as kernels_dw's parts)
@njit(cache=True)
def _part(yp, w, xq, wq, offs, b, ring, ho, wo, kh, ph, flo, fhi, r0, r1):
    """Pooled rows [r0, r1): each window's conv rows not in the ring yet, then the pool."""
    o, _, wp = yp.shape
    k = offs.shape[0]
    ng = (o + ROWS - 1) // ROWS
    pitch = pitch_of(wo)
    chan = kh * pitch  # a channel's ring rows; conv row oh sits in row oh % kh
    buf = ring[o * chan:]
    buf[:ph] = -np.inf  # the pool's padding columns (its padding rows never win: skipped)
    buf[ph + wo:] = -np.inf
    wa, xa, ba = np.int64(w.ctypes.data), np.int64(xq.ctypes.data), np.int64(b.ctypes.data)
    oa, ra, ya = np.int64(offs.ctypes.data), np.int64(ring.ctypes.data), np.int64(yp.ctypes.data)
    bufa = ra + o * chan * 4
    fin = np.int64(1)
    done = -1  # the last conv row computed
    for pr in range(r0, r1):
        top = 2 * pr - ph
        first, end = max(top, 0), min(top + kh, ho)
        for oh in range(max(first, done + 1), end):
            xr = xa + oh * wq * 4
            at = ra + (oh % kh) * pitch * 4
            for g in range(ng):
                o0 = g * ROWS
                wk, bb, cr = wa + g * k * ROWS * 4, ba + o0 * 4, at + o0 * chan * 4
                # NOTE: whole tiles to the pitch: the last one reads at most 15 floats past
                # the row, as gemm_phase's spilling rows do (kernels_tile.phase_slack)
                for q in range(0, pitch, PIX):
                    _tile_ix(wk, xr + q * 4, oa, k, cr + q * 4, chan * 4, 0, min(ROWS, o - o0),
                             bb, fin | AHEAD if q == 0 else fin, flo, fhi)
            done = oh
        rows = end - first
        # the window's ring rows: all kh of them, or rows from slot s0 one slot step apart
        s0 = first % kh
        step = ((s0 + 1) % kh - s0) * pitch * 4
        for c in range(o):
            src = ra + c * chan * 4
            if rows == kh:
                if kh == 3:
                    _rows3(bufa + ph * 4, src, pitch * 4, 3, wo, ring)
                else:
                    _rows2(bufa + ph * 4, src, pitch * 4, 2, wo, ring)
            elif rows == 2:
                _rows2(bufa + ph * 4, src + s0 * pitch * 4, step, 2, wo, ring)
            else:
                _rows_any(bufa + ph * 4, src + s0 * pitch * 4, step, rows, wo, ring)
            dst = ya + (c * yp.shape[1] + pr) * wp * 4
            if kh == 3:
                _cols3(dst, bufa, wp, ring)
            else:
                _cols2(dst, bufa, wp, ring)
