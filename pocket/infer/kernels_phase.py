"""A stride-2 conv's input split into its four phases, so that the conv reads it as a stride-1
one: padded pixel (r, s) of a plane goes to phase (r % 2, s % 2) at (r // 2, s // 2), and tap
(i, j) of output (oh, ow) reads phase (i % 2, j % 2) at (oh + i // 2, ow + j // 2). Each tap is
then one constant shift of a flat phase plane (`phase_offsets`), which kernels_fma.gemm reads
in place as its rows of K (routes.conv_fma_phase), the outputs at the phases' pitch Wq.

NOTE: against im2col, the columns of ResNet-18's 7x7/2 stem (147 x 12544 floats, 7.4 MB) were
written and then read from L3; the phases are 12 planes of 115 x 115 (635 KB), in L2, and
consecutive rows of K read the same cache lines shifted by a float.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from pocket.infer.jit import kernel


def phase_shape(h: int, w: int, ph: int, pw: int) -> tuple[int, int]:
    """(Hq, Wq): a phase plane's rows and columns for an H x W input padded by (ph, pw)."""
    return -(-(h + 2 * ph) // 2), -(-(w + 2 * pw) // 2)


def phase_offsets(c: int, kh: int, kw: int, hq: int, wq: int) -> np.ndarray:
    """Byte offsets of the GEMM's rows k = (c, i, j) (the weights' order) from an output's flat
    index at pitch Wq: phase plane (c, i % 2, j % 2), shifted (i // 2, j // 2)."""
    ci, i, j = np.meshgrid(np.arange(c), np.arange(kh), np.arange(kw), indexing="ij")
    planes = ci * 4 + (i % 2) * 2 + j % 2
    return ((planes * (hq * wq) + (i // 2) * wq + j // 2) * 4).reshape(-1).astype(np.int64)


@kernel
def pad_phases(xq, x, ph, pw, hq, wq):
    """x (N, C, H, W) f32 -> xq (>= N*C*4*Hq*Wq,): each plane zero-padded by (ph, pw) and split
    into its four phases, planes of Hq x Wq in the order (n, c, row phase, column phase); xq's
    elements past the last plane are zeros (the last tiles' junk columns read them)."""
    n, c, h, w = x.shape
    plane = hq * wq
    xf = x.reshape(-1)
    for t in prange(n * c):
        base = np.uint64(t * 4 * plane)
        for e in range(4 * plane):
            xq[base + np.uint64(e)] = np.float32(0.0)
        for ih in range(h):
            r = ih + ph
            row = base + np.uint64((r & 1) * 2 * plane + (r >> 1) * wq)
            src = np.uint64((t * h + ih) * w)
            for iw in range(w):
                s = iw + pw
                xq[row + np.uint64((s & 1) * plane + (s >> 1))] = xf[src + np.uint64(iw)]
    for e in range(n * c * 4 * plane, xq.shape[0]):
        xq[e] = np.float32(0.0)
