"""float32 1x1 convolutions on small maps on x86 with AVX-512, vectorized along the output
channels: C (o, m) = W (o, k) @ X (k, m) where m, a map's pixels, fills pixel vectors badly.

kernels_fma.gemm broadcasts weights against vectors of 16 pixels: a 7x7 map's 49 pixels fill
49 of its 64 lanes, and its weights, read a row per channel, come from L3 in as many streams
as the tile has channels. Here a tile keeps up to CV_V vectors of 16 output channels x CV_P
pixels (24 accumulators) and, per step along K, loads its vectors of weights and broadcasts
one input per pixel. The weights are packed once, at load (`pack`), a vector of 16 channels
at a time, each vector's K rows contiguous (one stream each, which the prefetchers follow);
every lane is a channel, so only a conv's last vector, where o is not a multiple of 16,
idles lanes. A part's channels run in blocks of at most CV_V vectors, as even as they go.

Per block the tiles write their sums a pixel at a time into a scratch of the part's pixels x
CV_O channels (K is taken in chunks of CV_K rows, so that the chunk's weights stay in L1
while its pixels pass over them; each chunk after the first starts from the scratch), then
16 x 16 transposes (kernels_fma._transposed) store them as the rows of C.

Exactness: each output is one FMA chain along K in the weights' order, the bias added and
the activation applied to the float32 sum, as kernels_fma.gemm does it: the two give the
same bits.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from pocket.infer.jit import kernel
from pocket.infer.kernels_fma import _VF, _broadcast_fmas, _transposed, _with_epilogue
from pocket.infer.kernels_vnni import _const, _lanes_below, _loop, _masked_io, _ptr

CV_V = 4  # vectors of output channels a tile at most (a block's)
CV_O = 16 * CV_V  # a block's channels at most: a pixel's row of the scratch (256 bytes)
CV_P = 6  # pixels a tile of 3 or 4 vectors (24 accumulators); 12 for 1 or 2 vectors
CV_K = 128  # rows of K a chunk: its weights, 32 KiB, stay in L1 (see gemm_cv)
# A part's scratch in rows of this many pixels: a multiple of 16 (the transposes read whole
# 16-pixel blocks) and of both tiles' pixels
_SCRATCH_ROWS = 48


def _make_cv_tile(nv: int, npx: int, full: bool = False):
    """t[j, 16v:16v+16] (+)= sum over k < nk of x[k*ldx + j] * (vector v of wp's row k) for
    j < npx, v < nv.

    Addresses in bytes: wp (vector v of row k at wp + v*ldv + k*ldw), x (the tile's first
    pixel; rows ldx apart), t (pixel j's row at t + 256j). With acc != 0 the sums start from
    t. cnt (1..npx) is the tile's pixels: the pixels past it read the last one's inputs
    (nothing past a row is read) and land in the scratch's spare rows. With bias != 0 (the
    address of the block's first bias) t gets the sums + bias, through the tiles' activation
    `mode` (kernels_fma._by_mode).
    """

    @intrinsic
    def tile(typingctx, wp, ldv, ldw, x, ldx, nk, t, acc, cnt, bias, mode):
        sig = types.void(*[types.intp] * 11)

        def codegen(context, builder, signature, args):
            wp, ldv, ldw, x, ldx, nk, t, acc, cnt, bias, mode = args
            w_at = [builder.add(wp, builder.mul(ldv, _const(v))) for v in range(nv)]
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VF, [_VF] * 3),
                                                 "llvm.fma.v16f32")
            if full:  # one pointer, the pixels at fixed offsets (folded into the broadcasts)
                x_at = [builder.add(x, _const(4 * j)) for j in range(npx)]
            else:
                last = builder.sub(cnt, _const(1))
                x_at = [builder.add(x, builder.mul(builder.select(
                    builder.icmp_signed("<", _const(j), cnt), _const(j), last), _const(4)))
                    for j in range(npx)]
            t_at = [[builder.add(t, _const(256 * j + 64 * v)) for v in range(nv)] for j in range(npx)]
            start = builder.icmp_signed("!=", acc, _const(0))
            init = [builder.select(start, builder.load(_ptr(builder, a, _VF), align=4),
                                   ir.Constant(_VF, None)) for row in t_at for a in row]

            def step(i, accs):
                wk = builder.mul(i, ldw)
                ws = [builder.load(_ptr(builder, builder.add(w_at[v], wk), _VF), align=4) for v in range(nv)]
                row = builder.mul(i, ldx)
                return _broadcast_fmas(builder, fma, [builder.add(a, row) for a in x_at], ws, accs)

            final = _loop(builder, nk, init, step)

            def store_all(act):
                bo = [builder.load(_ptr(builder, builder.add(bias, _const(64 * v)), _VF), align=4)
                      for v in range(nv)] if act is not None else None
                for j in range(npx):
                    for v in range(nv):
                        val = final[j * nv + v]
                        if act is not None:
                            val = act(builder, builder.fadd(val, bo[v]))
                        builder.store(val, _ptr(builder, t_at[j][v], _VF), align=4)

            _with_epilogue(builder, bias, mode, store_all)
            return context.get_dummy_value()

        return sig, codegen

    return tile


_cv4, _cv3 = _make_cv_tile(4, CV_P), _make_cv_tile(3, CV_P)
_cv2, _cv1 = _make_cv_tile(2, 2 * CV_P), _make_cv_tile(1, 2 * CV_P)
# the same for a whole tile (cnt = npx): the clamped pixels cost a pointer each per step (12
# increments beside 12 multiply-adds in _cv1)
_cv4f, _cv3f = _make_cv_tile(4, CV_P, True), _make_cv_tile(3, CV_P, True)
_cv2f, _cv1f = _make_cv_tile(2, 2 * CV_P, True), _make_cv_tile(1, 2 * CV_P, True)
# whole tiles of CV_P - 1 pixels: with tiles of CV_P they cover a part's pixels exactly (see
# _five_tiles)
_cv4f5, _cv3f5 = _make_cv_tile(4, CV_P - 1, True), _make_cv_tile(3, CV_P - 1, True)


@njit(cache=True, inline="always")
def _cv_tile(nv, full, args):
    if full:
        if nv == 4:
            _cv4f(*args)
        elif nv == 3:
            _cv3f(*args)
        elif nv == 2:
            _cv2f(*args)
        else:
            _cv1f(*args)
    elif nv == 4:
        _cv4(*args)
    elif nv == 3:
        _cv3(*args)
    elif nv == 2:
        _cv2(*args)
    else:
        _cv1(*args)


@njit(cache=True)
def _five_tiles(mp):
    """How many tiles of CV_P - 1 pixels, after tiles of CV_P, cover mp pixels exactly (blocks
    of 3 or 4 vectors); 0 where none do (fewer than 20 pixels: the last tile of CV_P then
    computes pixels past mp).

    NOTE: a 7x7 map's 49 pixels in tiles of 6 computed 54 (the last tile 1 pixel of 6); in
    4 x 6 + 5 x 5 they compute 49."""
    b = (CV_P - mp % CV_P) % CV_P
    return b if mp >= b * (CV_P - 1) else 0


@njit(cache=True, inline="always")
def _cv_tile5(nv, args):
    if nv == 4:
        _cv4f5(*args)
    else:
        _cv3f5(*args)


def _make_out16():
    """dst[r*ldd : r*ldd + cnt] = t[0:cnt, r] for r < rows: 16 pixels' vectors of 16 channels
    (lds bytes apart; all 16 are read) transposed in registers, each channel's pixels one
    masked store (rows 1..16, cnt 1..16; addresses in bytes). kernels_fma_dwcv's way out too."""

    @intrinsic
    def out16(typingctx, t, lds, dst, ldd, rows, cnt):
        sig = types.void(*[types.intp] * 6)

        def codegen(context, builder, signature, args):
            t, lds, dst, ldd, rows, cnt = args
            _, st = _masked_io(builder, _VF, 4)
            lanes = _lanes_below(builder, cnt)
            vecs = [builder.load(_ptr(builder, builder.add(t, builder.mul(lds, _const(j))), _VF), align=4)
                    for j in range(16)]
            for r, v in enumerate(_transposed(builder, vecs)):
                with builder.if_then(builder.icmp_signed("<", _const(r), rows)):
                    st(v, builder.add(dst, builder.mul(ldd, _const(r))), lanes)
            return context.get_dummy_value()

        return sig, codegen

    return out16


_out16 = _make_out16()


def pays(o: int, k: int, m: int, threads: int) -> bool:
    """Whether a 1x1 conv of o channels over m pixels and k inputs takes gemm_cv on `threads`
    threads: m fills at most 85% of the vectors of 16 pixels that kernels_fma.gemm's tiles
    compute (97% where k >= 256) and o fills the channel vectors at least as well; on more
    threads, each thread also gets 4 channel vectors or 64 pixels of at least 4 vectors
    (cv_split).

    NOTE: interleaved in the networks, AVX-512, one thread: EfficientNet-B0's 1152 x 192 @ 192
    x 49 224 -> 203 us, 1280 x 320 @ 320 x 49 420 -> 361, 112 x 672 @ 672 x 196 183 -> 147,
    SqueezeNet's 1000 x 512 @ 512 x 169 ~1.1 -> 0.92-0.98 ms; MobileNetV3's 576 x 96 @ 96 x 49
    (k = 96) 40 -> 42, SqueezeNet's 192 x 48 @ 48 x 169 20 -> 27 (the transposes out of the
    scratch cost more than the few multiply-adds an output gain); on two threads 96 x 288 @
    288 x 49 split 3 + 3 vectors or 25 + 24 pixels 16 -> 19 us."""
    fill_m = m / (-(-m // 16) * 16)
    fill_o = o / (-(-o // 16) * 16)
    if fill_o < fill_m or not ((fill_m <= 0.85 and k >= 128) or (fill_m <= 0.97 and k >= 256)):
        return False
    vecs = -(-o // 16)
    return threads <= 1 or vecs >= 4 * threads or (m >= 64 * threads and vecs >= 4)


def pack(w2: np.ndarray) -> np.ndarray:
    """W (o, k) as gemm_cv reads it: (vectors, k, 16), vector v's row k channels 16v..16v+15
    at input k (zeros past o), each vector's rows one stream; on a cache line."""
    o, k = w2.shape
    n = -(-o // 16)
    wp = np.zeros((n * 16, k), np.float32)
    wp[:o] = w2
    out = _on_lines((n, k, 16))
    out[...] = wp.reshape(n, 16, k).transpose(0, 2, 1)
    return out


def _on_lines(shape) -> np.ndarray:
    """float32 zeros of this shape starting on a cache line: the tiles' vectors of weights
    each one line, never two."""
    size = int(np.prod(shape))
    buf = np.zeros(size + 16, np.float32)
    start = (-buf.ctypes.data) % 64 // 4
    return buf[start:start + size].reshape(shape)


def pad_bias(b: np.ndarray, o: int) -> np.ndarray:
    """The bias of o channels (or none: zeros) padded to whole vectors."""
    out = np.zeros(-(-o // 16) * 16, np.float32)
    out[:b.shape[0]] = b
    return out


@kernel
def gemm_cv(c, wp, x, nb, o, m, bp, epi, groups, splits, scratch):
    """nb independent 1x1 convs: C_i (o, m) = W (o, k) @ X_i (k, m), c (nb, o, m) and x (nb,
    k, m) contiguous, wp = pack(W), bp = pad_bias(b, o). epi as kernels_fma.gemm's: 0 the
    plain sums, 1 + bias, 2.. then the tiles' activation (1 + kernels_fma's MODE_*).

    The tasks are (item, pixel group, channel split): `groups` pixel groups share each item's
    tiles evenly, `splits` channel splits its vectors (see cv_split); scratch (parts,
    scratch_floats(m, groups)) f32, any contents, on a cache line: each part takes an even
    run of the tasks."""
    parts = scratch.shape[0]
    tasks = nb * groups * splits
    for part in prange(parts):
        ta = np.int64(scratch[part].ctypes.data)
        for t in range(part * tasks // parts, (part + 1) * tasks // parts):
            _cv_task(t, c, wp, x, o, m, bp, epi, groups, splits, ta)


def cv_split(o: int, m: int, threads: int) -> tuple[int, int]:
    """(pixel groups, channel splits) of gemm_cv for `threads` threads: the channels split
    where each thread gets 4 vectors or more (it then reads only its part of the weights,
    which on small maps come from L3 each call; split by pixels, ShuffleNetV2's 232 x 232 @
    232 x 49 ran 26 -> 33 us on two threads), else the pixels (64 channels would split into
    tiles of 2 vectors, which broadcast twice the inputs for their multiply-adds)."""
    vecs = -(-o // 16)
    if threads <= 1:
        return 1, 1
    if vecs >= 4 * threads:
        return 1, threads
    return min(threads, -(-m // CV_P)), 1


def scratch_floats(m: int, groups: int) -> int:
    """A part's scratch (gemm_cv): the largest group's pixels, rounded up to _SCRATCH_ROWS,
    x CV_O channels."""
    tiles = -(-m // CV_P)
    most = min(m, -(-tiles // groups) * CV_P)
    return -(-most // _SCRATCH_ROWS) * _SCRATCH_ROWS * CV_O


@njit(cache=True)
def _cv_task(t, c, wp, x, o, m, bp, epi, groups, splits, ta):
    """Task t of gemm_cv (same arguments; ta: the address of its part's scratch): its split's
    vectors in blocks of at most CV_V, as even as they go (6: 3 + 3), each block over the
    group's pixels, then out of the scratch into C."""
    n_v, k = wp.shape[0], wp.shape[1]
    item, rest = t // (groups * splits), t % (groups * splits)
    g, sp = rest // splits, rest % splits
    n_t = (m + CV_P - 1) // CV_P
    p0 = g * n_t // groups * CV_P
    p1 = min(m, (g + 1) * n_t // groups * CV_P)
    v0, v1 = sp * n_v // splits, (sp + 1) * n_v // splits
    if p1 <= p0 or v1 <= v0:
        return
    mp = p1 - p0
    n_blk = (v1 - v0 + CV_V - 1) // CV_V
    xa = np.int64(x.ctypes.data) + (item * k * m + p0) * 4
    mode = np.int64(max(epi - 1, 0))
    ldv = np.int64(k * 64)
    for bi in range(n_blk):
        b0 = v0 + bi * (v1 - v0) // n_blk
        nv = v0 + (bi + 1) * (v1 - v0) // n_blk - b0
        npx = CV_P if nv >= 3 else 2 * CV_P
        wa = np.int64(wp.ctypes.data) + b0 * ldv
        ba = np.int64(bp.ctypes.data) + b0 * 64 if epi != 0 else np.int64(0)
        for k0 in range(0, k, CV_K):
            nk = min(CV_K, k - k0)
            bias = ba if k0 + nk == k else np.int64(0)
            acc = np.int64(k0 > 0)
            wk, xk = wa + k0 * 64, xa + k0 * m * 4
            five = _five_tiles(mp) if nv >= 3 else 0
            for q in range(0, mp - five * (CV_P - 1), npx):
                args = (wk, ldv, np.int64(64), xk + q * 4, np.int64(m * 4), np.int64(nk),
                        ta + q * (CV_O * 4), acc, np.int64(min(npx, mp - q)), bias, mode)
                _cv_tile(nv, mp - q >= npx, args)
            for q in range(mp - five * (CV_P - 1), mp, CV_P - 1):
                _cv_tile5(nv, (wk, ldv, np.int64(64), xk + q * 4, np.int64(m * 4), np.int64(nk),
                               ta + q * (CV_O * 4), acc, np.int64(CV_P - 1), bias, mode))
        ca = np.int64(c.ctypes.data) + (item * o * m + b0 * 16 * m + p0) * 4
        for q in range(0, mp, 16):
            for v in range(nv):
                _out16(ta + q * (CV_O * 4) + v * 64, np.int64(CV_O * 4), ca + (v * 16 * m + q) * 4,
                       np.int64(m * 4), np.int64(min(16, o - 16 * (b0 + v))), np.int64(min(16, mp - q)))
