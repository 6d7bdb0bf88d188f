"""A stride-2 conv's input split into its four phases, so that the conv reads it as a stride-1
one: padded pixel (r, s) of a plane goes to phase (r % 2, s % 2) at (r // 2, s // 2), and tap
(i, j) of output (oh, ow) reads phase (i % 2, j % 2) at (oh + i // 2, ow + j // 2). Each tap is
then one constant shift of a flat phase plane (`phase_offsets`), which kernels_fma.gemm reads
in place as its rows of K (routes.conv_fma_phase), the outputs at the phases' pitch Wq; on
the portable path split_phases makes the same planes and kernels_tile.gemm_phase's indexed
tiles read them (routes.conv_tile_phase).

NOTE: against im2col, the columns of ResNet-18's 7x7/2 stem (147 x 12544 floats, 7.4 MB) were
written and then read from L3; the phases are 12 planes of 115 x 115 (635 KB), in L2, and
consecutive rows of K read the same cache lines shifted by a float.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from pocket.infer.jit import kernel
from pocket.infer.kernels_fma_dw import _VF, EVEN, ODD
from pocket.infer.kernels_vnni import _const, _lanes_below, _loop, _masked_io


@intrinsic
def _split_row(typingctx, de, do, src, cnt):
    """de[0:ceil(cnt/2)] = src[0::2] and do[0:cnt//2] = src[1::2] (byte addresses, float32):
    32 inputs a step, two masked loads, their even and odd lanes shuffled out, two masked
    stores (nothing past cnt is read or written).

    NOTE: pad_phases' element loop (a phase and a position computed per element) took 84 us of
    MobileNetV3-Small's 1.7 ms for its 3 x 224 x 224 input on one thread."""

    def codegen(context, builder, signature, args):
        de, do, src, cnt = args
        ld, st = _masked_io(builder, _VF, 4)

        def step(i, carried):
            rest = builder.sub(cnt, builder.mul(i, _const(32)))
            at = builder.add(src, builder.mul(i, _const(128)))
            a = ld(at, _lanes_below(builder, rest))
            b = ld(builder.add(at, _const(64)), _lanes_below(builder, builder.sub(rest, _const(16))))
            out = builder.mul(i, _const(64))
            st(builder.shuffle_vector(a, b, EVEN), builder.add(de, out),
               _lanes_below(builder, builder.ashr(builder.add(rest, _const(1)), _const(1))))
            st(builder.shuffle_vector(a, b, ODD), builder.add(do, out),
               _lanes_below(builder, builder.ashr(rest, _const(1))))
            return []

        _loop(builder, builder.sdiv(builder.add(cnt, _const(31)), _const(32)), [], step)
        return context.get_dummy_value()

    return types.void(*[types.intp] * 4), codegen


def phase_shape(h: int, w: int, ph: int, pw: int) -> tuple[int, int]:
    """(Hq, Wq): a phase plane's rows and columns for an H x W input padded by (ph, pw)."""
    return -(-(h + 2 * ph) // 2), -(-(w + 2 * pw) // 2)


def phase_offsets(c: int, kh: int, kw: int, hq: int, wq: int) -> np.ndarray:
    """Byte offsets of the GEMM's rows k = (c, i, j) (the weights' order) from an output's flat
    index at pitch Wq: phase plane (c, i % 2, j % 2), shifted (i // 2, j // 2)."""
    ci, i, j = np.meshgrid(np.arange(c), np.arange(kh), np.arange(kw), indexing="ij")
    planes = ci * 4 + (i % 2) * 2 + j % 2
    return ((planes * (hq * wq) + (i // 2) * wq + j // 2) * 4).reshape(-1).astype(np.int64)


# A plane's four phases of at most this many floats are zeroed whole before its rows are split
# into them (a few vector stores), larger ones only outside the rows (see _zero_border): one
# thread, ResNet-18's 128 x 28 x 28 and 256 x 14 x 14 padded by 1 (4 x 15 x 15 and 4 x 8 x 8 a
# plane) 28 -> 16 and 26.5 -> 13 us
SMALL_PHASES = 1024


@kernel
def pad_phases(xq, x, ph, pw, hq, wq):
    """x (N, C, H, W) f32 -> xq (>= N*C*4*Hq*Wq,): each plane zero-padded by (ph, pw) and split
    into its four phases, planes of Hq x Wq in the order (n, c, row phase, column phase); xq's
    elements past the last plane are zeros (the last tiles' junk columns read them)."""
    n, c, h, w = x.shape
    plane = hq * wq
    qa, xa = np.int64(xq.ctypes.data), np.int64(x.ctypes.data)
    # a row's even inputs go to column phase pw % 2 from column pw // 2 on, its odd ones to
    # the other phase from (pw + 1) // 2 on
    even, odd = (pw & 1) * plane + (pw >> 1), ((pw + 1) & 1) * plane + ((pw + 1) >> 1)
    for t in prange(n * c):
        if 4 * plane <= SMALL_PHASES:
            xq[t * 4 * plane:(t + 1) * 4 * plane] = np.float32(0.0)
        else:
            _zero_borders(xq, t, h, w, ph, pw, hq, wq)
        for ih in range(h):
            r = ih + ph
            row = t * 4 * plane + (r & 1) * 2 * plane + (r >> 1) * wq
            _split_row(qa + (row + even) * 4, qa + (row + odd) * 4, xa + (t * h + ih) * w * 4, w)
    for e in range(n * c * 4 * plane, xq.shape[0]):
        xq[e] = np.float32(0.0)


_V8 = ir.VectorType(ir.FloatType(), 8)


@intrinsic
def _deinterleave16(typingctx, de, do, src):
    """de[0:8] = src[0:16:2], do[0:8] = src[1:16:2] (byte addresses, float32): two vector
    loads, two shuffles, two stores (LLVM's shuffles on AVX2, uzp1/uzp2 on NEON), where the
    element loop ran scalar (0.4 ns an element: 62 us for a 3 x 224 x 224 image, 128 in the
    network, where the input comes from memory)."""

    def codegen(context, builder, signature, args):
        d_e, d_o, s = args
        lo = builder.load(builder.inttoptr(s, _V8.as_pointer()), align=4)
        hi = builder.load(builder.inttoptr(builder.add(s, _const(32)), _V8.as_pointer()), align=4)
        for dst, first in ((d_e, 0), (d_o, 1)):
            lanes = ir.Constant(ir.VectorType(ir.IntType(32), 8), list(range(first, 16, 2)))
            builder.store(builder.shuffle_vector(lo, hi, lanes), builder.inttoptr(dst, _V8.as_pointer()),
                          align=4)
        return context.get_dummy_value()

    return types.void(*[types.intp] * 3), codegen


@kernel
def split_phases(xq, x, ph, pw, hq, wq):
    """pad_phases' result on any CPU (plain Numba, no AVX-512 masked loads): x (N, C, H, W)
    contiguous -> xq, the planes' four phases (n, c, row phase, column phase) of Hq x Wq, zeros
    where the padding falls and past the last plane (kernels_tile.gemm_phase's tiles read
    there)."""
    n, c, h, w = x.shape
    plane = hq * wq
    xf = x.reshape(-1)
    # input column 2j goes to column phase pw % 2 at pw // 2 + j, column 2j + 1 to the other
    # phase at (pw + 1) // 2 + j
    even, odd = (pw & 1) * plane + (pw >> 1), ((pw + 1) & 1) * plane + ((pw + 1) >> 1)
    ne, no = (w + 1) // 2, w // 2
    qa, xa = np.int64(xq.ctypes.data), np.int64(x.ctypes.data)
    for t in prange(n * c):
        _zero_borders(xq, t, h, w, ph, pw, hq, wq)
        for ih in range(h):
            r = ih + ph
            row = np.uint64(t * 4 * plane + (r & 1) * 2 * plane + (r >> 1) * wq)
            src = np.uint64((t * h + ih) * w)
            de, do = row + np.uint64(even), row + np.uint64(odd)
            vec = w // 16 * 8  # outputs of each phase through _deinterleave16
            for j in range(0, vec, 8):
                _deinterleave16(qa + np.int64(de + np.uint64(j)) * 4, qa + np.int64(do + np.uint64(j)) * 4,
                                xa + np.int64(src + np.uint64(2 * j)) * 4)
            for j in range(vec, ne):
                xq[de + np.uint64(j)] = xf[src + np.uint64(2 * j)]
            for j in range(vec, no):
                xq[do + np.uint64(j)] = xf[src + np.uint64(2 * j + 1)]
    for e in range(n * c * 4 * plane, xq.shape[0]):
        xq[e] = np.float32(0.0)


@njit(cache=True, inline="always")
def _zero_borders(xq, t, h, w, ph, pw, hq, wq):
    """_zero_border on each of plane t's four phases (an H x W plane padded by (ph, pw))."""
    plane = hq * wq
    for a in range(2):
        for b in range(2):
            _zero_border(xq, (t * 4 + a * 2 + b) * plane, hq, wq, (ph - a + 1) // 2,
                         (ph + h - 1 - a) // 2, (pw - b + 1) // 2, (pw + w - 1 - b) // 2)


@njit(cache=True, inline="always")
def _zero_border(xq, at, hq, wq, i0, i1, j0, j1):
    """Zeros in the phase plane at element `at` of xq (Hq x Wq) outside rows i0..i1 and columns
    j0..j1 (inclusive: the positions the input's pixels fill; the padding and the plane's
    round-up row or column are the rest). NOTE: zeroing whole planes first wrote every element
    twice (MobileNetV3-Small's 3 x 224 x 224 input, a memory-bound pass, in the network)."""
    for i in range(hq):
        row = at + i * wq
        if i < i0 or i > i1:
            for j in range(wq):
                xq[row + j] = np.float32(0.0)
            continue
        for j in range(min(j0, wq)):
            xq[row + j] = np.float32(0.0)
        for j in range(max(j1 + 1, 0), wq):
            xq[row + j] = np.float32(0.0)
