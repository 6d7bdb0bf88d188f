"""int8 GEMMs on 64-bit ARM CPUs with the dot product extension (`dotprod`, ARMv8.2: `asimddp`
in /proc/cpuinfo; Cortex-A55/A75/A76 and later, the Raspberry Pi 5's A76, not the Pi 4's A72).
Exact, so they must equal formats/reference.py bit for bit like every int8 kernel (see
kernels_int8 for the arithmetic).

One `sdot v.4s, a.16b, b.16b` multiplies 16 signed bytes by 16 signed bytes and adds each group
of four products into one of 4 int32 lanes: 16 multiply-adds an instruction, 4x a float32 FMA's
4 lanes. Numba has no vector types, so the inner loop is LLVM IR (`_tile`, through
`llvm.aarch64.neon.sdot.v4i32.v16i8`, the technique of kernels_vnni) called from ordinary
Numba kernels that walk the tiles.

Both operands are signed, so the activations go in as their int8 codes and x_zp folds into the
bias as in kernels_int8 (bias_adj = b_q - x_zp * wsum): acc = bias_adj + sum(x_q * w_q).

- conv2d 1x1 (groups 1, no padding, any stride), what MobileNet-class networks spend their
  int8 GEMM time on: `pack_1x1` writes a chunk of images as (ceil(C/4), Mp) u32, the four
  bytes of one pixel's channels c..c+3 in one word (Mp = pixels rounded up to 16), then `gemm`
  -> c (O, Mp) int32: each `_tile` keeps 4 channels x 16 pixels in 16 accumulators (of NEON's
  32 registers) and broadcasts 4 weight bytes a channel a step; kernels_vnni.requant_cols then
  writes the int8 (or float32) output. Weights with C % 4 != 0 are padded to whole words once,
  at the first bind (routes/conv_sdot.py).
- any other conv2d of groups 1 (3x3 s1/s2, a 7x7 s2 stem, padded or dilated): `pack_taps` is
  the im2row written straight into the same operand, row tap*C4 + c4 (four channels of one
  input pixel a word, x_zp in the padding), and `weights_taps` orders the weights to match
  once (routes/conv_sdot_taps.py); `gemm` and requant_cols(_pool) as above.

Exactness: all sums are int32; |x_q * w| <= 128 * 128, so K <= MAX_K keeps every partial sum
in range and the int64 epilogue sees the true value.

The engine uses these kernels only when `AVAILABLE`: the machine is 64-bit ARM, its CPU reports
`dotprod`, and Numba compiles either for the host or for a named CPU (NUMBA_CPU_NAME) that has
the extension. A cache built for an A76 holds `sdot` and dies with SIGILL on an A72 (what
`PI=pi4 arm64-env` checks): that is why a named CPU must be one of _DOTPROD_CPUS as well. Elsewhere
(x86, the A72) the portable kernels run and the LLVM here is never compiled.
"""

from __future__ import annotations

import os
import platform

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from pocket.infer.jit import kernel
from pocket.infer.kernels_vnni import _const, _loop, _ptr, _row_at
from pocket.infer.kernels_vnni import _splat as _vsplat

MAX_K = (2**31 - 1) // (128 * 128)  # 131071: longer dot products could leave int32
TILE_O, TILE_P = 4, 16  # a _tile's channels and pixels (4 x 4 int32x4 accumulators)
BLOCK_K4 = 256  # K/4 steps per pass: 16 pixels x 1 KiB of activations stay in L1
# LLVM's names of the cores with the dot product extension (the first: the Pi 5's)
_DOTPROD_CPUS = ("cortex-a76", "cortex-a76ae", "cortex-a55", "cortex-a65", "cortex-a75",
                 "cortex-a77", "cortex-a78", "cortex-a78c", "cortex-a710", "cortex-a715",
                 "cortex-x1", "cortex-x2", "neoverse-n1", "neoverse-n2", "neoverse-v1",
                 "apple-m1", "apple-m2")


def _hwcap_dotprod() -> bool:
    """The kernel's word for it: HWCAP_ASIMDDP in getauxval(AT_HWCAP) (also what qemu-user
    reports for the CPU it emulates), else `asimddp` in /proc/cpuinfo's features.

    NOTE: not LLVM's host features: its AArch64 Linux reader maps a few /proc/cpuinfo flags
    (neon, crc, aes, sha2, lse) and never reports dotprod, even on an A76."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        libc.getauxval.restype, libc.getauxval.argtypes = ctypes.c_ulong, [ctypes.c_ulong]
        return bool(libc.getauxval(16) & (1 << 20))  # AT_HWCAP, HWCAP_ASIMDDP
    except (OSError, AttributeError):
        try:
            text = open("/proc/cpuinfo").read()  # noqa: SIM115 - a one-shot read
        except OSError:
            return False
        return any(ln.split(":", 1)[-1].split().count("asimddp")
                   for ln in text.splitlines() if ln.lower().startswith("features"))


def has_dotprod() -> bool:
    """64-bit ARM with `dotprod`, Numba compiling for this host or a named dotprod CPU;
    POCKET_INT8_SDOT=0 opts out."""
    if os.environ.get("POCKET_INT8_SDOT", "1") == "0":
        return False
    if platform.machine().lower() not in ("aarch64", "arm64"):
        return False
    import numba

    if numba.config.DISABLE_JIT:
        return False
    if numba.config.CPU_NAME not in (None, "host") and numba.config.CPU_NAME not in _DOTPROD_CPUS:
        return False
    return _hwcap_dotprod()


AVAILABLE = has_dotprod()

_I8, _I32, _I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
_V4 = ir.VectorType(_I32, 4)
_B16 = ir.VectorType(_I8, 16)


def _sdot_step(builder, sdot, w_at, xp, ldx):
    """The tiles' step along K: step(i, accs) adds word i of each row's weights (w_at: the
    rows' byte addresses), broadcast, dotted with row i of xp (16 pixels x 4 bytes, ldx bytes
    apart) into the row's 4 accumulators (accs: 4 a row)."""
    undef = ir.Constant(_V4, ir.Undefined)
    splat = ir.Constant(ir.VectorType(_I32, 4), None)

    def step(i, accs):
        xrow = builder.add(xp, builder.mul(i, ldx))
        xs = [builder.load(_ptr(builder, builder.add(xrow, _const(16 * v)), _B16), align=4)
              for v in range(4)]
        k4 = builder.mul(i, _const(4))
        out = []
        for r in range(TILE_O):
            word = builder.load(_ptr(builder, builder.add(w_at[r], k4), _I32), align=1)
            one = builder.insert_element(undef, word, ir.Constant(_I32, 0))
            wb = builder.bitcast(builder.shuffle_vector(one, undef, splat), _B16)
            out += [builder.call(sdot, [accs[r * 4 + v], xs[v], wb]) for v in range(4)]
        return out

    return step


@intrinsic
def _tile(typingctx, w, ldw, xp, ldx, c, ldc, n4, acc, rows):
    """c[r, 0:16] (+)= sum over k4 < n4 of w[r, 4k4:4k4+4] . xp[k4, 0:16, :] for r < rows
    (1..4): 16 int32x4 accumulators, one sdot each a step. Addresses in bytes: w (rows of ldw),
    xp (k4 rows of ldx), c (rows of ldc, int32). With acc != 0 the sums start from c (a later
    block of K), else from zero."""
    sig = types.void(*[types.intp] * 9)

    def codegen(context, builder, signature, args):
        w, ldw, xp, ldx, c, ldc, n4, acc, rows = args
        sdot = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V4, [_V4, _B16, _B16]),
                                              "llvm.aarch64.neon.sdot.v4i32.v16i8")
        start = builder.icmp_signed("!=", acc, _const(0))
        c_at = [[builder.add(_row_at(builder, c, r, rows, ldc), _const(16 * v)) for v in range(4)]
                for r in range(TILE_O)]
        init = [builder.select(start, builder.load(_ptr(builder, a, _V4), align=4),
                               ir.Constant(_V4, None)) for row in c_at for a in row]
        step = _sdot_step(builder, sdot, [_row_at(builder, w, r, rows, ldw) for r in range(TILE_O)],
                          xp, ldx)

        final = _loop(builder, n4, init, step)
        for r in range(TILE_O):
            with builder.if_then(builder.icmp_signed("<", _const(r), rows)):
                for v in range(4):
                    builder.store(final[r * 4 + v], _ptr(builder, c_at[r][v], _V4), align=4)
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True)
def _split(o, n_p):
    """(channel blocks, channels a block) beside n_p pixel tiles: at least 8 pieces of work
    where the channels allow."""
    tiles_o = (o + TILE_O - 1) // TILE_O
    n_b = max(1, min(tiles_o, (8 + n_p - 1) // n_p))
    per_b = (tiles_o + n_b - 1) // n_b * TILE_O
    return (o + per_b - 1) // per_b, per_b


@kernel
def gemm(c, w, xp):
    """w (O, 4*K4) i8, xp (K4, Mp) u32 (4 signed bytes each; Mp % 16 == 0) -> c (O, Mp) i32
    = w @ xp.

    NOTE: pixel tiles outermost, as kernels_vnni.gemm_cols: a tile's activations (16 pixels x
    BLOCK_K4 words) stay in L1 while every channel tile passes over them. Small maps have few
    pixel tiles, so the channels are split into blocks too (at least 8 pieces of work)."""
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
            for o0 in range(ob, o_end, TILE_O):
                _tile(wa + o0 * kb + kk * 4, kb, xa + (kk * mp + p0) * 4, mp * 4,
                      ca + (o0 * mp + p0) * 4, mp * 4, n4, kk, min(TILE_O, o_end - o0))


_F32, _F64 = ir.FloatType(), ir.DoubleType()
_VF4, _VD4 = ir.VectorType(_F32, 4), ir.VectorType(_F64, 4)


def _concat(builder, vs: list):
    """One vector of vs's lanes in order (len(vs) a power of two)."""
    while len(vs) > 1:
        n = 2 * vs[0].type.count
        vs = [builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, n), list(range(n))))
              for a, b in zip(vs[::2], vs[1::2])]
    return vs[0]


def requant_rows(builder, final, rows, dst, ldo, m, lo, hi, zp, codes: bool):
    """The fused tiles' epilogue (see _make_tile_q): final[r] holds row r's int32 sums as int32x4
    vectors of 4 pixels each (the same count a row), stored for r < rows at dst + r * ldo."""
    mod = builder.module
    f2 = ir.FunctionType(_VF4, [_VF4, _VF4])
    vmax = cgutils.get_or_insert_function(mod, f2, "llvm.maxnum.v4f32")
    vmin = cgutils.get_or_insert_function(mod, f2, "llvm.minnum.v4f32")
    cvtn = cgutils.get_or_insert_function(mod, ir.FunctionType(_V4, [_VF4]),
                                          "llvm.aarch64.neon.fcvtns.v4i32.v4f32")
    nv = len(final[0])
    vlo, vhi = (_vsplat(builder, v, _VF4) for v in (lo, hi))
    vb = ir.VectorType(_I8, 4 * nv)
    izp = _vsplat(builder, builder.fptosi(zp, _I8), vb)
    for r in range(len(final)):
        with builder.if_then(builder.icmp_signed("<", _const(r), rows)):
            at = builder.add(dst, builder.mul(_const(r), ldo))
            if not codes:
                md = _vsplat(builder, builder.load(_ptr(builder, builder.add(
                    m, _const(8 * r)), _F64), align=8), _VD4)
                for v in range(nv):
                    f = builder.fptrunc(builder.fmul(builder.sitofp(final[r][v], _VD4), md), _VF4)
                    f = builder.call(vmin, [builder.call(vmax, [f, vlo]), vhi])
                    builder.store(f, _ptr(builder, builder.add(at, _const(16 * v)), _VF4), align=4)
                continue
            mv = _vsplat(builder, builder.load(_ptr(builder, builder.add(
                m, _const(4 * r)), _F32), align=4), _VF4)
            q = []
            for v in range(nv):
                f = builder.fmul(builder.sitofp(final[r][v], _VF4), mv)
                # rint by fcvtns: |f| <= 255 after the clamp (kernels_dwcl's NOTE)
                q.append(builder.call(cvtn, [builder.call(vmin, [builder.call(
                    vmax, [f, vlo]), vhi])]))
            # + y_zp as int8: the code is in [-128, 127], so the wrap-around is exact
            codes_ = builder.add(builder.trunc(_concat(builder, q), vb), izp)
            builder.store(codes_, _ptr(builder, at, vb), align=1)


def _make_tile_q(codes: bool):
    """_tile's sums over all of K (n4 words) from badj, then an epilogue in registers, for
    r < rows, row r at dst + r * ldo (bytes). badj (int32) and m are the addresses of the
    tile's first channel's.

    codes: kernels_int8._code_clamped's, clamp(rint(float32(sum) * m[r]), lo, hi) + zp (m
    float32; lo, hi: the codes' bounds less zp), 16 bytes a row. Else kernels_int8._epilogue's
    float32 values, float32(float64(sum) * m[r]) (m float64) clamped to [lo, hi] (lo 0 for a
    ReLU, else -inf; hi the float ceiling), 64 bytes a row."""
    sig = types.void(*[types.intp] * 10, types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        w, ldw, xp, ldx, dst, ldo, n4, rows, badj, m, lo, hi, zp = args
        sdot = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V4, [_V4, _B16, _B16]),
                                              "llvm.aarch64.neon.sdot.v4i32.v16i8")
        step = _sdot_step(builder, sdot, [_row_at(builder, w, r, rows, ldw) for r in range(TILE_O)],
                          xp, ldx)

        # the sums start from badj (int32 wrap-around: kernels_int8.total32's total)
        starts = [_vsplat(builder, builder.load(_ptr(builder, _row_at(builder, badj, r, rows, _const(4)),
                                                     _I32), align=4), _V4) for r in range(TILE_O)]
        final = _loop(builder, n4, [starts[r] for r in range(TILE_O) for _ in range(4)], step)
        requant_rows(builder, [final[r * 4:r * 4 + 4] for r in range(TILE_O)], rows, dst, ldo, m,
                     lo, hi, zp, codes)
        return context.get_dummy_value()

    @intrinsic
    def tile(typingctx, w, ldw, xp, ldx, dst, ldo, n4, rows, badj, m, lo, hi, zp):
        return sig, codegen

    return tile


_tile_q, _tile_f = _make_tile_q(True), _make_tile_q(False)


def fused(k4: int, p: int) -> bool:
    """Whether gemm_q takes a conv: K in one block (any map: tiles across an image's end are
    stored through a small buffer, _edge_tiles)."""
    return k4 <= BLOCK_K4


@njit(cache=True, inline="always")
def _q_call(item, w, ldw, xp, ldx, dst, ldo, n4, rows, badj, m, lo, hi, zp):
    if item == 1:
        _tile_q(w, ldw, xp, ldx, dst, ldo, n4, rows, badj, m, lo, hi, zp)
    else:
        _tile_f(w, ldw, xp, ldx, dst, ldo, n4, rows, badj, m, lo, hi, zp)


# NOTE: not inlined into gemm_q (as kernels_smull's: a second inlined copy of the tiles there
# changed the whole tiles' code)
@njit(cache=True)
def _edge_tiles(out, w, xp, badj, m, p, lo, hi, zp):
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
            continue  # no tile across this end, or one done already (maps under 16 pixels)
        last = pt
        p0 = pt * TILE_P
        for ob in range(0, o, per_b):
            o_end = min(o, ob + per_b)
            for o0 in range(ob, o_end, TILE_O):
                rows = min(TILE_O, o_end - o0)
                _q_call(item, wa + o0 * kb, kb, xa + p0 * 4, mp * 4, ta, TILE_P * item, k4, rows,
                        ba + 4 * o0, ma + mi * o0, lo, hi, zp)
                for j in range(min(TILE_P, cols - p0)):
                    bb = (p0 + j) // p
                    base = (bb * o + o0) * p + p0 + j - bb * p
                    for r in range(rows):
                        of[base + r * p] = tmp[r, j]


@kernel
def gemm_q(out, w, xp, badj, m, p, lo, hi, zp):
    """gemm with kernels_int8's epilogue in the tiles: out (M, O, P) of w (O, 4*K4) @ xp (K4,
    Mp) (`fused`: K4 <= BLOCK_K4; tiles whose 16 pixels are not all in one image, or run past
    the last, go through _edge_tiles); badj (O,) int32 = b_q - x_zp * wsum. int8 out: int8
    codes, m (O,) float32 and lo / hi the codes' bounds less zp, as kernels_int8._code_clamped;
    float32 out: m (O,) float64 the real scales and [lo, hi] the values' clamp. Replaces gemm +
    kernels_vnni.requant_cols: the int32 sums never leave the registers."""
    o, kb = w.shape
    k4, mp = xp.shape
    wa, xa, oa = np.int64(w.ctypes.data), np.int64(xp.ctypes.data), np.int64(out.ctypes.data)
    ba, ma = np.int64(badj.ctypes.data), np.int64(m.ctypes.data)
    item, mi = out.itemsize, m.itemsize
    cols = out.shape[0] * p  # the real pixels; mp rounds them up to whole tiles
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
                _tile_q(wa + o0 * kb, kb, xa + p0 * 4, mp * 4, at, p, k4, rows, ba + 4 * o0,
                        ma + mi * o0, lo, hi, zp)
            else:
                _tile_f(wa + o0 * kb, kb, xa + p0 * 4, mp * 4, at, p * 4, k4, rows, ba + 4 * o0,
                        ma + mi * o0, lo, hi, zp)
    _edge_tiles(out, w, xp, badj, m, p, lo, hi, zp)


@njit(cache=True, inline="always")
def _put4(dst, v, xf, o0, hw, nch, i):
    """Byte i of the nch (1..4, a compile-time constant) planes at xf[o0:], hw apart, into
    dst[v:v + 4], zeros past nch.

    NOTE: flat arrays and uint64 indices. A view a plane cost ~1000 instructions a row of
    words on the Pi 5 (a 4x4 map has 16 pixels a row), and a signed index carries a
    negative-index wraparound that kept the loops scalar (3.5 instructions a byte); unsigned,
    LLVM stores four planes' bytes as one interleaved group (st4 on NEON: 32 bytes in 7
    instructions)."""
    dst[v] = xf[o0 + i]
    dst[v + np.uint64(1)] = xf[o0 + hw + i] if nch > 1 else 0
    dst[v + np.uint64(2)] = xf[o0 + np.uint64(2) * hw + i] if nch > 2 else 0
    dst[v + np.uint64(3)] = xf[o0 + np.uint64(3) * hw + i] if nch > 3 else 0


@njit(cache=True, inline="always")
def _run(dst, w0, xf, o0, hw, nch, lo, hi, sw, off):
    """_put4 for output columns lo..hi-1 of a row (input column ow * sw + off), nch a
    constant: the callers branch on it, so each loop is compiled with its own."""
    for ow in range(lo, hi):
        _put4(dst, w0 + np.uint64(4 * ow), xf, o0, hw, nch, np.uint64(ow * sw + off))


@njit(cache=True, inline="always")
def _run_nch(dst, w0, xf, o0, hw, nch, lo, hi, sw, off):
    if nch == 4:
        _run(dst, w0, xf, o0, hw, 4, lo, hi, sw, off)
    elif nch == 3:
        _run(dst, w0, xf, o0, hw, 3, lo, hi, sw, off)
    elif nch == 2:
        _run(dst, w0, xf, o0, hw, 2, lo, hi, sw, off)
    else:
        _run(dst, w0, xf, o0, hw, 1, lo, hi, sw, off)


@kernel
def pack_1x1(xb, x, sh, sw):
    """x (M, C, H, W) i8 -> xb (K4, 4*Mp) i8, the bytes of xp (K4, Mp) u32: word [c4, b*P + q]
    holds x[b, 4*c4 + t, i*sh, j*sw] in byte t (q = i*Wo + j, P = Ho*Wo), zero past C and past
    the M*P real columns."""
    m, ch, h, wd = x.shape
    k4, nb = xb.shape
    ho, wo = (h - 1) // sh + 1, (wd - 1) // sw + 1
    p = ho * wo
    xf, bf = x.view(np.uint8).reshape(-1), xb.view(np.uint8).reshape(-1)
    hw = np.uint64(h * wd)
    for r in prange(k4 * m):
        c4, b = r // m, r % m
        nch = min(4, ch - 4 * c4)
        o0 = np.uint64((b * ch + 4 * c4) * h * wd)
        d0 = np.uint64(c4 * nb + 4 * b * p)
        if sh == 1 and sw == 1:
            _run_nch(bf, d0, xf, o0, hw, nch, 0, p, 1, 0)
        else:
            for i in range(ho):
                _run_nch(bf, d0 + np.uint64(4 * i * wo), xf, o0, hw, nch, 0, wo, sw, i * sh * wd)
        if b == m - 1:
            for u in range(4 * m * p, nb):
                bf[np.uint64(c4 * nb + u)] = 0


@njit(cache=True)
def pad_weights(out, w):
    """w (O, K) i8 -> out (O, 4*K4) i8: each row zero-padded to whole 4-byte words."""
    o, k = w.shape
    for r in range(o):
        for j in range(out.shape[1]):
            out[r, j] = w[r, j] if j < k else 0


@kernel
def pack_taps(xb, x, kh, kw, sh, sw, ph, pw, dh, dw, zp):
    """x (M, C, H, W) i8 -> xb (K4, 4*Mp) i8, the bytes of xp (K4, Mp) u32 for a kh x kw conv:
    row r = tap*C4 + c4 (tap = i*kw + j, C4 = ceil(C/4)), word [r, b*P + q] holds channels
    4*c4..4*c4+3 of the input under tap (i, j) of output pixel q = oh*Wo + ow of image b, zp
    (x_zp: the code of 0.0) where the tap falls in the padding, 0 past C (zero weights there,
    see weights_taps), zero past the M*P real columns.

    NOTE: taps outermost and four channels a word, not OIHW's (c, i, j) order: each word is
    four planes' bytes at one input pixel (the interleave pack_1x1 stores a group at a time)
    and each row's valid columns are one run per output row, found once, not tested per
    byte."""
    m, ch, h, wd = x.shape
    k4, nb = xb.shape
    c4n = (ch + 3) // 4
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    p = ho * wo
    z = np.uint8(np.int64(zp) & 0xFF)
    xf = x.view(np.uint8).reshape(-1)
    hw = np.uint64(h * wd)
    for r in prange(k4 * m):
        row, b = r // m, r % m
        tap, c4 = row // c4n, row % c4n
        i, j = tap // kw, tap % kw
        nch = min(4, ch - 4 * c4)
        off = j * dw - pw  # input column of output column 0
        # output columns whose input column lies in [0, W): [lo, hi)
        lo = min(wo, max(0, (-off + sw - 1) // sw))
        hi = max(lo, min(wo, (wd - 1 - off) // sw + 1)) if wd - 1 - off >= 0 else lo
        dst = xb[row].view(np.uint8)
        for oh in range(ho):
            ih = oh * sh + i * dh - ph
            u = 4 * (b * p + oh * wo)
            if ih < 0 or ih >= h:
                for t in range(4 * wo):
                    dst[u + t] = z if t % 4 < nch else 0
                continue
            for t in range(4 * lo):
                dst[u + t] = z if t % 4 < nch else 0
            for t in range(4 * hi, 4 * wo):
                dst[u + t] = z if t % 4 < nch else 0
            o0 = np.uint64(((b * ch + 4 * c4) * h + ih) * wd)
            w0 = np.uint64(u)
            _run_nch(dst, w0, xf, o0, hw, nch, lo, hi, sw, off)
        if b == m - 1:
            for u in range(4 * m * p, nb):
                dst[u] = 0


@njit(cache=True)
def weights_taps(out, w):
    """w (O, C, kh, kw) i8 -> out (O, 4*kh*kw*C4) i8 in pack_taps' row order: byte
    4*(tap*C4 + c4) + t of row o is w[o, 4*c4 + t, i, j] (tap = i*kw + j), zero past C."""
    o, ch, kh, kw = w.shape
    c4n = (ch + 3) // 4
    for r in range(o):
        for tap in range(kh * kw):
            i, j = tap // kw, tap % kw
            for c in range(4 * c4n):
                out[r, 4 * tap * c4n + c] = w[r, c, i, j] if c < ch else 0
