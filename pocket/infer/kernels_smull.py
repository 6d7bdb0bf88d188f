"""int8 GEMMs on 64-bit ARM CPUs without the dot product extension (the Raspberry Pi 4's
Cortex-A72; A53, A57): kernels_sdot's GEMMs, with widening multiplies where sdot is missing.
Exact, so they must equal formats/reference.py bit for bit like every int8 kernel.

The operands are kernels_sdot's, packed by its pack_1x1 / pack_taps / weights_taps: xp (K4, Mp)
u32 words of four channels of one pixel, w (O, 4*K4) i8. A step takes two words of K (eight
channels) at once, for one output channel and 4 pixels:

    smull  t.8h, x_k.8b,  w_k.8b     two pixels' 4 products of word k, int16
    smlal  t.8h, x_k1.8b, w_k1.8b    + word k+1's: each int16 lane holds 2 products
    sadalp a.4s, t.8h                + the lanes' pairs into int32: 2 lanes a pixel

(smull2/smlal2 for the other two pixels of a 16-byte load), and `addp` folds each pixel's two
lanes at the end. 32 multiply-adds in 6 instructions: 5.3 a NEON instruction, where a float32
FMA over the codes (the portable path: BLAS on float32 copies) does 4, on a quarter of the bytes.

Exactness: an int16 lane holds x*w + x'*w' with |x| <= 128 and |w| <= 127 (formats/quant.py
clips weights to +-127): at most 32512 < 2**15. A model whose weights hold -128 (an imported
one) could reach 32768, so those GEMMs run one word a step (smull, sadalp: never two products in
an int16 lane): the routes pass pairs=0 for them. int32 sums as in kernels_sdot (MAX_K).

The tiles are 4 channels x 8 pixels (16 int32x4 accumulators: two a pixel group of 4 channels,
of NEON's 32 registers), the GEMM walk kernels_sdot's. Chosen where Numba compiles for 64-bit
ARM and kernels_sdot is not available (an A76 takes sdot: a quarter of these instructions);
POCKET_INT8_SMULL=0 opts out (the portable float32 kernels run instead). Every AArch64 CPU has
these NEON instructions, so a cache built here runs on any of them.
"""

from __future__ import annotations

import os
import platform

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from pocket.infer import kernels_sdot as ks
from pocket.infer.jit import kernel
from pocket.infer.kernels_sdot import BLOCK_K4, MAX_K, TILE_O, _split, requant_rows  # noqa: F401
from pocket.infer.kernels_vnni import _const, _loop, _ptr, _row_at
from pocket.infer.kernels_vnni import _splat as _vsplat

TILE_P = 8  # a tile's pixels: 2 groups of 4, two accumulators each, by TILE_O channels
NV = TILE_P // 4


def has_smull() -> bool:
    """64-bit ARM without kernels_sdot (which is faster where there is dotprod), Numba
    compiling; POCKET_INT8_SMULL=0 opts out."""
    if os.environ.get("POCKET_INT8_SMULL", "1") == "0" or ks.AVAILABLE:
        return False
    if platform.machine().lower() not in ("aarch64", "arm64"):
        return False
    import numba

    return not numba.config.DISABLE_JIT


AVAILABLE = has_smull()

_I8, _I16, _I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
_V4 = ir.VectorType(_I32, 4)
_B8, _B16, _H8 = ir.VectorType(_I8, 8), ir.VectorType(_I8, 16), ir.VectorType(_I16, 8)
_LO = ir.Constant(ir.VectorType(_I32, 8), list(range(8)))
_HI = ir.Constant(ir.VectorType(_I32, 8), list(range(8, 16)))


def _fns(builder):
    mod = builder.module
    smull = cgutils.get_or_insert_function(mod, ir.FunctionType(_H8, [_B8, _B8]),
                                           "llvm.aarch64.neon.smull.v8i16")
    saddlp = cgutils.get_or_insert_function(mod, ir.FunctionType(_V4, [_H8]),
                                            "llvm.aarch64.neon.saddlp.v4i32.v8i16")
    addp = cgutils.get_or_insert_function(mod, ir.FunctionType(_V4, [_V4, _V4]),
                                          "llvm.aarch64.neon.addp.v4i32")
    return smull, saddlp, addp


def _sums(builder, w, ldw, xp, ldx, npair, nsingle, rows):
    """The tile's int32 sums: [r][v] an int32x4 of pixels 4v..4v+3 of channel row r, over
    npair steps of two words, then nsingle of one (see the module's doc)."""
    smull, saddlp, _ = _fns(builder)
    w_at = [_row_at(builder, w, r, rows, ldw) for r in range(TILE_O)]
    undef = ir.Constant(_B16, ir.Undefined)

    ld2r = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.LiteralStructType([_V4, _V4]), [_I32.as_pointer()]),
        "llvm.aarch64.neon.ld2r.v4i32.p0i32")

    def wsplats(k, pair: bool):
        """Row r's word k (and k+1 for a pair) in all 4 lanes, as 16 bytes.

        NOTE: a pair's by one ld2r (both words, each splat). smull2 wants the high halves of
        two registers; LLVM narrows a splat it can see (ld1r) to its low half and shifts x's
        high half down with an `ext` a pixel pair instead. ld2r's lanes it cannot see."""
        out = []
        for r in range(TILE_O):
            at = builder.add(w_at[r], builder.mul(k, _const(4)))
            if pair:
                both = builder.call(ld2r, [_ptr(builder, at, _I32)])
                out.append([builder.bitcast(builder.extract_value(both, i), _B16) for i in (0, 1)])
            else:
                one = _vsplat(builder, builder.load(_ptr(builder, at, _I32), align=1), _V4)
                out.append([builder.bitcast(one, _B16)])
        return out

    def xrow(k):
        """Row k of xp's 8 pixels: NV loads of 16 bytes (4 pixels each)."""
        row = builder.add(xp, builder.mul(k, ldx))
        return [builder.load(_ptr(builder, builder.add(row, _const(16 * v)), _B16), align=4)
                for v in range(NV)]

    def half(v, h):
        return builder.shuffle_vector(v, undef, (_LO, _HI)[h])

    def step(k, accs, pair: bool):
        xs, ws = [xrow(k)], wsplats(k, pair)
        if pair:
            xs.append(xrow(builder.add(k, _const(1))))
        out = []
        for r in range(TILE_O):
            for v in range(NV):
                for h in range(2):  # pixels 4v, 4v+1 (low 8 bytes), then 4v+2, 4v+3
                    t = builder.call(smull, [half(xs[0][v], h), half(ws[r][0], h)])
                    if pair:
                        t = builder.add(t, builder.call(smull, [half(xs[1][v], h), half(ws[r][1], h)]))
                    out.append(builder.add(accs[(r * NV + v) * 2 + h], builder.call(saddlp, [t])))
        return out

    zero = [ir.Constant(_V4, None)] * (TILE_O * 2 * NV)
    accs = _loop(builder, npair, zero, lambda i, a: step(builder.mul(i, _const(2)), a, True))
    base = builder.mul(npair, _const(2))
    accs = _loop(builder, nsingle, accs, lambda i, a: step(builder.add(base, i), a, False))
    _, _, addp = _fns(builder)
    # each pixel's two lanes (its channels' even and odd pairs) added: 4 pixels a vector
    return [[builder.call(addp, [accs[(r * NV + v) * 2], accs[(r * NV + v) * 2 + 1]])
             for v in range(NV)] for r in range(TILE_O)]


@intrinsic
def _tile(typingctx, w, ldw, xp, ldx, c, ldc, npair, nsingle, acc, rows):
    """c[r, 0:8] (+)= sum over the tile's 2*npair + nsingle words k of w[r, 4k:4k+4] . xp[k,
    0:8, :] for r < rows (1..4). Addresses in bytes: w (rows of ldw), xp (rows of ldx), c (rows
    of ldc, int32). With acc != 0 the sums are added to c (a later block of K)."""
    sig = types.void(*[types.intp] * 10)

    def codegen(context, builder, signature, args):
        w, ldw, xp, ldx, c, ldc, npair, nsingle, acc, rows = args
        sums = _sums(builder, w, ldw, xp, ldx, npair, nsingle, rows)
        more = builder.icmp_signed("!=", acc, _const(0))
        for r in range(TILE_O):
            with builder.if_then(builder.icmp_signed("<", _const(r), rows)):
                for v in range(NV):
                    at = _ptr(builder, builder.add(builder.add(c, builder.mul(_const(r), ldc)),
                                                   _const(16 * v)), _V4)
                    old = builder.select(more, builder.load(at, align=4), ir.Constant(_V4, None))
                    builder.store(builder.add(sums[r][v], old), at, align=4)
        return context.get_dummy_value()

    return sig, codegen


def _make_tile_q(codes: bool):
    """_tile's sums over all of K from badj, then kernels_sdot.requant_rows' epilogue (8 pixels
    a row: 8 bytes of codes or 32 of float32)."""
    sig = types.void(*[types.intp] * 11, types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        w, ldw, xp, ldx, dst, ldo, npair, nsingle, rows, badj, m, lo, hi, zp = args
        sums = _sums(builder, w, ldw, xp, ldx, npair, nsingle, rows)
        # + badj in int32 (wrap-around: kernels_int8.total32's total, in any order)
        final = []
        for r in range(TILE_O):
            b = _vsplat(builder, builder.load(_ptr(builder, _row_at(builder, badj, r, rows, _const(4)),
                                                   _I32), align=4), _V4)
            final.append([builder.add(s, b) for s in sums[r]])
        requant_rows(builder, final, rows, dst, ldo, m, lo, hi, zp, codes)
        return context.get_dummy_value()

    @intrinsic
    def tile(typingctx, w, ldw, xp, ldx, dst, ldo, npair, nsingle, rows, badj, m, lo, hi, zp):
        return sig, codegen

    return tile


_tile_q, _tile_f = _make_tile_q(True), _make_tile_q(False)


def fused(k4: int, p: int) -> bool:
    """Whether gemm_q takes a conv: K in one block (any map: tiles across an image's end are
    stored through a small buffer)."""
    return k4 <= BLOCK_K4


def pairs_ok(w: np.ndarray) -> int:
    """1 where two products may share an int16 lane: no weight is -128 (see the module's doc)."""
    return int(w.size == 0 or int(w.min()) > -128)


@kernel
def gemm(c, w, xp, pairs):
    """w (O, 4*K4) i8, xp (K4, Mp) u32 (4 signed bytes each; Mp % 8 == 0) -> c (O, Mp) i32
    = w @ xp, kernels_sdot.gemm's walk (pairs: pairs_ok(w))."""
    o, kb = w.shape
    k4, mp = xp.shape
    wa, xa, ca = np.int64(w.ctypes.data), np.int64(xp.ctypes.data), np.int64(c.ctypes.data)
    n_p = mp // TILE_P
    n_b, per_b = _split(o, n_p)
    for t in prange(n_p * n_b):
        pt, ob = t // n_b, (t % n_b) * per_b
        p0, o_end = pt * TILE_P, min(o, ob + per_b)
        for kk in range(0, k4, BLOCK_K4):
            n4 = min(BLOCK_K4, k4 - kk)
            npair = n4 // 2 if pairs else 0
            for o0 in range(ob, o_end, TILE_O):
                _tile(wa + o0 * kb + kk * 4, kb, xa + (kk * mp + p0) * 4, mp * 4,
                      ca + (o0 * mp + p0) * 4, mp * 4, npair, n4 - 2 * npair, kk,
                      min(TILE_O, o_end - o0))


@njit(cache=True, inline="always")
def _q_call(item, w, ldw, xp, ldx, dst, ldo, npair, nsingle, rows, badj, m, lo, hi, zp):
    if item == 1:
        _tile_q(w, ldw, xp, ldx, dst, ldo, npair, nsingle, rows, badj, m, lo, hi, zp)
    else:
        _tile_f(w, ldw, xp, ldx, dst, ldo, npair, nsingle, rows, badj, m, lo, hi, zp)


# NOTE: not inlined into gemm_q: a second inlined copy of the tiles there cost its whole tiles
# ~6% more instructions (MobileNetV2's 48 x 8 x 4096 1x1 on the emulated Pi 4)
@njit(cache=True)
def _edge_tiles(out, w, xp, badj, m, p, lo, hi, zp, npair):
    """gemm_q's tiles across an image's end (or the last image's), serially (a few a channel
    block), through one buffer, then copied pixel by pixel."""
    o, kb = w.shape
    k4, mp = xp.shape
    cols = out.shape[0] * p
    wa, xa = np.int64(w.ctypes.data), np.int64(xp.ctypes.data)
    ba, ma = np.int64(badj.ctypes.data), np.int64(m.ctypes.data)
    item, mi = out.itemsize, m.itemsize
    of = out.reshape(-1)
    n_b, per_b = _split(o, mp // TILE_P)
    tmp = np.empty((TILE_O, TILE_P), out.dtype)
    ta = np.int64(tmp.ctypes.data)
    last = -1
    for b in range(1, out.shape[0] + 1):
        pt = b * p // TILE_P  # the tile holding image b's first pixel (or the end)
        if b * p % TILE_P == 0 or pt == last:
            continue  # no tile across this end, or one done already (maps under 8 pixels)
        last = pt
        p0 = pt * TILE_P
        for ob in range(0, o, per_b):
            o_end = min(o, ob + per_b)
            for o0 in range(ob, o_end, TILE_O):
                rows = min(TILE_O, o_end - o0)
                _q_call(item, wa + o0 * kb, kb, xa + p0 * 4, mp * 4, ta, TILE_P * item, npair,
                        k4 - 2 * npair, rows, ba + 4 * o0, ma + mi * o0, lo, hi, zp)
                for j in range(min(TILE_P, cols - p0)):
                    bb = (p0 + j) // p
                    base = (bb * o + o0) * p + p0 + j - bb * p
                    for r in range(rows):
                        of[base + r * p] = tmp[r, j]


@kernel
def gemm_q(out, w, xp, badj, m, p, lo, hi, zp, pairs):
    """kernels_sdot.gemm_q on these tiles (`fused`: K4 <= BLOCK_K4), out (M, O, P) for any P:
    a tile whose 8 pixels are not all in one image (or run past the last) is stored to a
    buffer and copied pixel by pixel; pairs: pairs_ok(w)."""
    o, kb = w.shape
    k4, mp = xp.shape
    cols = out.shape[0] * p  # the real pixels; mp rounds them up to whole 16-pixel tiles
    wa, xa, oa = np.int64(w.ctypes.data), np.int64(xp.ctypes.data), np.int64(out.ctypes.data)
    ba, ma = np.int64(badj.ctypes.data), np.int64(m.ctypes.data)
    item, mi = out.itemsize, m.itemsize
    npair = k4 // 2 if pairs else 0
    n_p = mp // TILE_P
    n_b, per_b = _split(o, n_p)
    for t in prange(n_p * n_b):
        pt, ob = t // n_b, (t % n_b) * per_b
        p0, o_end = pt * TILE_P, min(o, ob + per_b)
        b = p0 // p
        if p0 + TILE_P > min(cols, (b + 1) * p):  # past the last image, or across an image's end
            continue
        for o0 in range(ob, o_end, TILE_O):
            at = oa + ((b * o + o0) * p + p0 - b * p) * item
            rows = min(TILE_O, o_end - o0)
            if item == 1:
                _tile_q(wa + o0 * kb, kb, xa + p0 * 4, mp * 4, at, p, npair, k4 - 2 * npair, rows,
                        ba + 4 * o0, ma + mi * o0, lo, hi, zp)
            else:
                _tile_f(wa + o0 * kb, kb, xa + p0 * 4, mp * 4, at, p * 4, npair, k4 - 2 * npair,
                        rows, ba + 4 * o0, ma + mi * o0, lo, hi, zp)
    _edge_tiles(out, w, xp, badj, m, p, lo, hi, zp, npair)


# --------------------------------------------------------------------------- linear (GEMV)

GEMV_O = 4  # outputs a pass: 4 accumulators, one 16-byte load of x shared by their rows


@intrinsic
def _dot4(typingctx, w, ldw, x, c, n16, rows, pairs):
    """c[r] = w[r, :16 n16] . x[:16 n16] (int32) for r < rows (1..4): w's rows ldw bytes apart.
    Both operands run along K, so a 16-byte load of each is 16 products, no packing: smull on
    the low halves, smlal2 adds the high halves' (pairs: no weight is -128), sadalp."""
    sig = types.void(*[types.intp] * 7)

    def codegen(context, builder, signature, args):
        w, ldw, x, c, n16, rows, pairs = args
        smull, saddlp, _ = _fns(builder)
        undef = ir.Constant(_B16, ir.Undefined)
        w_at = [_row_at(builder, w, r, rows, ldw) for r in range(GEMV_O)]

        def halves(v):
            return [builder.shuffle_vector(v, undef, sel) for sel in (_LO, _HI)]

        def step(pair: bool):
            def body(i, accs):
                off = builder.mul(i, _const(16))
                xs = halves(builder.load(_ptr(builder, builder.add(x, off), _B16), align=1))
                out = []
                for r in range(GEMV_O):
                    ws = halves(builder.load(_ptr(builder, builder.add(w_at[r], off), _B16), align=1))
                    lo, hi = (builder.call(smull, [xs[h], ws[h]]) for h in (0, 1))
                    if pair:
                        out.append(builder.add(accs[r], builder.call(saddlp, [builder.add(lo, hi)])))
                    else:
                        acc = builder.add(accs[r], builder.call(saddlp, [lo]))
                        out.append(builder.add(acc, builder.call(saddlp, [hi])))
                return out
            return body

        on = builder.icmp_signed("!=", pairs, _const(0))
        zero = [ir.Constant(_V4, None)] * GEMV_O
        accs = _loop(builder, builder.select(on, n16, _const(0)), zero, step(True))
        accs = _loop(builder, builder.select(on, _const(0), n16), accs, step(False))
        vsum = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I32, [_V4]),
                                              "llvm.vector.reduce.add.v4i32")
        for r in range(GEMV_O):
            with builder.if_then(builder.icmp_signed("<", _const(r), rows)):
                at = builder.add(c, _const(4 * r))
                builder.store(builder.call(vsum, [accs[r]]), _ptr(builder, at, _I32), align=4)
        return context.get_dummy_value()

    return sig, codegen


@kernel
def gemv(c, x, w, pairs):
    """x (N, K16) i8, w (O, K16) i8 (K16 % 16 == 0; zero weights past K) -> c (N, O) i32 =
    x @ w.T (pairs: pairs_ok(w)).

    NOTE: blocks of 4 outputs outermost, the rows inside: a block's weights (4 x K16 bytes)
    stay in L1 while every row passes over them."""
    n, kk = x.shape
    o = w.shape[0]
    wa, xa, ca = np.int64(w.ctypes.data), np.int64(x.ctypes.data), np.int64(c.ctypes.data)
    for ob in prange((o + GEMV_O - 1) // GEMV_O):
        o0 = ob * GEMV_O
        for i in range(n):
            _dot4(wa + o0 * kk, kk, xa + i * kk, ca + (i * o + o0) * 4, kk // 16,
                  min(GEMV_O, o - o0), pairs)
