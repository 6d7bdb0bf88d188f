"""int8 GEMMs on x86 CPUs with AVX-512 VNNI; exact, so they must equal formats/reference.py
bit for bit like every int8 kernel (see kernels_int8 for the arithmetic).

One `vpdpbusd` multiplies 64 unsigned bytes by 64 signed bytes and adds each group of four
products into one of 16 int32 lanes: 64 multiply-adds per instruction, 4x a float32 FMA's 16.
Numba has no vector types, so the two inner loops are written as LLVM IR (`_tile`, `_dot`) and
called from ordinary Numba kernels that walk the tiles.

The unsigned operand is the activations shifted by +128 (x_u = x_q ^ 0x80, a bijection of the
bytes); the engine folds the shift into the bias like x_zp (bias_adj = b_q - (x_zp + 128) *
wsum). The weights are read in place, in their (O, C*kh*kw) layout, except by gemm_quad.

- conv2d (groups 1): `pad_shift` writes the padded, shifted images once, `pack_cols` the
  activations as (ceil(K/4), Mp) u32 (the four bytes of one pixel's columns k..k+3 in one
  word; Mp = pixels rounded up to 16; stride-1 convs at a pixel pitch of Wp, see pack_cols),
  then `gemm_cols` -> c (O, Mp) int32: each `_tile` keeps 4 channels x 64 pixels in 16 zmm
  accumulators and broadcasts 4 weight bytes per channel per step (the last 16-48 pixels:
  a narrow tile over more channels); `requant_cols(_pool)`
  writes the int8 (or float32) output, with a fused maxpool. K % 4 != 0 (a first layer)
  pads the weights to whole words in the node's scratch each call (`pad_weights`).
- conv2d (groups 1) at stride 1 with C % 4 == 0 whose columns would be at the pitch of Wp
  anyway: no packed copy. `pad_quad` writes each image as C/4 planes of words, four channels
  a word (+128 each), and `gemm_quad` reads its tiles' rows in place, row k4 = (c4, i, j) at
  its own offset in the planes; the weights, reordered to match (`pack_weights_quad`), are
  prepared once, at the first bind (routes/conv_vnni_quad.py). Each image's pixels end in a narrow
  tile of their own, so narrow maps (packed at a pitch of Wo) keep the packed route.
- linear with 16+ rows: `pack_rows_t` + `gemm_cols` the same way, `requant_cols_t`;
- linear with fewer rows: `pack_rows` -> (N, Kp) u8 (room for K rounded up to 64), then
  `gemm_rows` -> c (N, O) int32: each `_dot` runs along K for 4 weight rows and reduces the
  lanes at the end; the weight rows' last partial chunk is a masked load, never past the end.

Exactness: all sums are int32; |x_u * w| <= 255 * 128, so K <= MAX_K keeps every partial sum
in range and the int64 epilogue sees the true value. The engine uses these kernels only when
`AVAILABLE` (the host CPU has AVX-512 VNNI and Numba compiles for the host); elsewhere (ARM,
older x86) it keeps the portable kernels, and the LLVM here is never compiled.
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
from pocket.infer.kernels_int8 import _code_clamped, _epilogue, total32

MAX_K = (2**31 - 1) // (255 * 128)  # 65793: longer dot products could leave int32
TILE_O, TILE_P = 4, 64  # a _tile's channels and pixels (4 x 4 zmm accumulators)
COL_ALIGN = 16  # packed columns come in whole vectors (a narrow tile ends a GEMM)
BLOCK_K4 = 64  # K/4 steps per pass: 64 pixels x 256 bytes of activations stay in L1


def host_has(switch: str, features: tuple[str, ...]) -> bool:
    """x86 CPU `features` on the host and Numba compiling for the host; `switch`=0 opts out
    (the x86 kernel sets of this module and of kernels_fma)."""
    if os.environ.get(switch, "1") == "0":
        return False
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    import numba
    from llvmlite import binding

    # NOTE: a cache built for a named or generic CPU (NUMBA_CPU_NAME) must run on machines
    # without these instructions, and LLVM could not select them for it anyway; with the JIT
    # disabled the LLVM-level loops cannot run at all.
    if numba.config.CPU_NAME not in (None, "host") or numba.config.DISABLE_JIT:
        return False
    feats = binding.get_host_cpu_features()
    return all(feats.get(f, False) for f in features)


AVAILABLE = host_has("POCKET_INT8_VNNI", ("avx512f", "avx512bw", "avx512vnni"))

_I8, _I32, _I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
_V16 = ir.VectorType(_I32, 16)
_B64 = ir.VectorType(_I8, 64)


def _const(v: int) -> ir.Constant:
    return ir.Constant(_I64, v)


def _ptr(builder, addr, ty):
    return builder.inttoptr(addr, ty.as_pointer())


def _prefetch(builder, addr):
    """Prefetch the line at byte address addr for reading, into every cache level (the GEMM
    tiles' weights ahead of their pass: kernels_fma, kernels_tile)."""
    i8p = ir.IntType(8).as_pointer()
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p] + [_I32] * 3),
                                        "llvm.prefetch.p0i8")
    builder.call(fn, [builder.inttoptr(addr, i8p), ir.Constant(_I32, 0), ir.Constant(_I32, 3),
                      ir.Constant(_I32, 1)])


def _splat(builder, val, vty):
    """A vector of type vty (any number of lanes) with every lane val."""
    one = builder.insert_element(ir.Constant(vty, ir.Undefined), val, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, ir.Constant(vty, ir.Undefined),
                                  ir.Constant(ir.VectorType(_I32, vty.count), None))


def _lanes_below(builder, n):
    """<16 x i1>: lane l < n (an i64)."""
    limit = _splat(builder, builder.trunc(n, _I32), _V16)
    return builder.icmp_signed("<", ir.Constant(_V16, list(range(16))), limit)


def _lanes_within(builder, first, n):
    """<16 x i1>: lanes l with 0 <= first + l < n (i64s): a row's elements among the 16 from
    its element `first` on (a masked load then reads no padding and nothing past the row)."""
    at = builder.add(ir.Constant(_V16, list(range(16))), _splat(builder, builder.trunc(first, _I32), _V16))
    return builder.and_(builder.icmp_signed(">=", at, ir.Constant(_V16, None)),
                        builder.icmp_signed("<", at, _splat(builder, builder.trunc(n, _I32), _V16)))


def _masked_io(builder, vty, align: int):
    """ld(addr, mask[, passthru]), st(val, addr, mask): LLVM's masked load and store of vty at
    byte addresses; lanes off the mask are neither read nor written (a load gives zeros there,
    or passthru's lanes)."""
    mod = builder.module
    n, elt = vty.count, vty.element
    name = f"v{n}{'f32' if isinstance(elt, ir.FloatType) else f'i{elt.width}'}.p0"
    mask_t = ir.VectorType(ir.IntType(1), n)
    load = cgutils.get_or_insert_function(
        mod, ir.FunctionType(vty, [ir.PointerType(), _I32, mask_t, vty]), "llvm.masked.load." + name)
    store = cgutils.get_or_insert_function(
        mod, ir.FunctionType(ir.VoidType(), [vty, ir.PointerType(), _I32, mask_t]),
        "llvm.masked.store." + name)

    def ld(addr, mask, passthru=None):
        return builder.call(load, [builder.inttoptr(addr, ir.PointerType()), ir.Constant(_I32, align), mask,
                                   ir.Constant(vty, None) if passthru is None else passthru])

    def st(val, addr, mask):
        builder.call(store, [val, builder.inttoptr(addr, ir.PointerType()), ir.Constant(_I32, align), mask])

    return ld, st


def _vpdpbusd(builder):
    fnty = ir.FunctionType(_V16, [_V16, _V16, _V16])
    return cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.avx512.vpdpbusd.512")


def _loop(builder, count, carried, body):
    """for i in range(count): carried = body(i, carried); returns the final carried values
    (the initial ones when count <= 0). LLVM wants every phi at the top of its block."""
    pre = builder.block
    head = builder.append_basic_block("vnni.loop")
    done = builder.append_basic_block("vnni.done")
    builder.cbranch(builder.icmp_signed(">", count, _const(0)), head, done)
    builder.position_at_end(head)
    i = builder.phi(_I64)
    phis = [builder.phi(v.type) for v in carried]
    new = body(i, phis)
    nxt = builder.add(i, _const(1))
    end = builder.block
    i.add_incoming(_const(0), pre)
    i.add_incoming(nxt, end)
    for p, v0, v1 in zip(phis, carried, new):
        p.add_incoming(v0, pre)
        p.add_incoming(v1, end)
    builder.cbranch(builder.icmp_signed("<", nxt, count), head, done)
    builder.position_at_end(done)
    out = []
    for v0, v1 in zip(carried, new):
        p = builder.phi(v0.type)
        p.add_incoming(v0, pre)
        p.add_incoming(v1, end)
        out.append(p)
    return out


def _make_dot(rows: int, ahead: int = 0):
    """c[r] = sum over j < k of xu[j] * w[r, j] for r < rows (int32, 4 bytes apart).

    xu has room for a whole last chunk of 64 bytes (its bytes past k may be anything); w's rows
    (ldw bytes apart) do not, so their last partial chunk is a masked load and reads as zeros.
    ahead: each step also prefetches every row `ahead` bytes on (0: not; see kernels_fma's
    _make_dot).
    """

    @intrinsic
    def dot(typingctx, xu, w, ldw, c, k):
        sig = types.void(*[types.intp] * 5)

        def codegen(context, builder, signature, args):
            xu, w, ldw, c, k = args
            dp = _vpdpbusd(builder)
            w_at = [builder.add(w, builder.mul(_const(r), ldw)) for r in range(rows)]
            zero = ir.Constant(_V16, None)
            accs = [zero] * rows
            full = builder.sdiv(k, _const(64))
            rem = builder.trunc(builder.srem(k, _const(64)), _I8)

            def step(i, accs):
                off = builder.mul(i, _const(64))
                xv = builder.load(_ptr(builder, builder.add(xu, off), _V16), align=1)
                if ahead:
                    for wr in w_at:
                        _prefetch(builder, builder.add(builder.add(wr, off), _const(ahead)))
                return [builder.call(dp, [a, xv, builder.load(
                    _ptr(builder, builder.add(wr, off), _V16), align=1)]) for a, wr in zip(accs, w_at)]

            accs = _loop(builder, full, accs, step)
            # the tail: rem (0..63) bytes of each weight row, the rest masked to zero
            one = builder.insert_element(ir.Constant(_B64, ir.Undefined), rem, ir.Constant(_I32, 0))
            splat = builder.shuffle_vector(one, ir.Constant(_B64, ir.Undefined),
                                           ir.Constant(ir.VectorType(_I32, 64), None))
            mask = builder.icmp_unsigned("<", ir.Constant(_B64, list(range(64))), splat)
            off = builder.mul(full, _const(64))
            xv = builder.load(_ptr(builder, builder.add(xu, off), _V16), align=1)
            mload, _ = _masked_io(builder, _B64, 1)
            red = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I32, [_V16]),
                                                 "llvm.vector.reduce.add.v16i32")
            for r, (a, wr) in enumerate(zip(accs, w_at)):
                wt = mload(builder.add(wr, off), mask)
                a = builder.call(dp, [a, xv, builder.bitcast(wt, _V16)])
                builder.store(builder.call(red, [a]), _ptr(builder, builder.add(c, _const(4 * r)), _I32),
                              align=4)
            return context.get_dummy_value()

        return sig, codegen

    return dot


def _row_at(builder, base, r: int, rows, stride):
    """base + min(r, rows - 1) * stride: a row past the valid ones repeats the last valid one
    (it is computed and never stored, so a channel tail needs no kernel of its own)."""
    rr = builder.select(builder.icmp_signed("<", _const(r), rows), _const(r),
                        builder.sub(rows, _const(1)))
    return builder.add(base, builder.mul(rr, stride))


def _make_tile(nv: int, indexed: bool = False):
    """c[r, 0:16nv] (+)= sum over k4 < n4 of w[r, 4k4:4k4+4] . xp[k4, 0:16nv, :] for r < rows
    (1..16 // nv): 16 accumulators (12 for nv = 3), one vpdpbusd each per step.

    Addresses in bytes: w (rows of ldw), xp (k4 rows of ldx), c (rows of ldc, int32). With
    acc != 0 the sums start from c (a later block of K), else from zero. nv = 4 is the GEMM's
    tile of 64 pixels over 4 channels; 1-3 are its last, narrow one over 16, 8 or 5 channels
    (small maps end in it: a 4x4 map's 24 pixel-pitched columns at batch 1 filled 24 of a
    64-pixel tile's). `indexed`: row k4 is at xp + offs[k4] instead, ldx being the address of
    offs (int64 byte offsets; see gemm_quad).
    """
    tile_o = 16 // nv

    @intrinsic
    def tile(typingctx, w, ldw, xp, ldx, c, ldc, n4, acc, rows):
        sig = types.void(*[types.intp] * 9)

        def codegen(context, builder, signature, args):
            w, ldw, xp, ldx, c, ldc, n4, acc, rows = args
            dp = _vpdpbusd(builder)
            start = builder.icmp_signed("!=", acc, _const(0))
            c_at = [[builder.add(_row_at(builder, c, r, rows, ldc), _const(64 * v)) for v in range(nv)]
                    for r in range(tile_o)]
            init = [builder.select(start, builder.load(_ptr(builder, a, _V16), align=4),
                                   ir.Constant(_V16, None)) for row in c_at for a in row]
            w_at = [_row_at(builder, w, r, rows, ldw) for r in range(tile_o)]

            def step(i, accs):
                if indexed:
                    at = builder.add(ldx, builder.mul(i, _const(8)))
                    xrow = builder.add(xp, builder.load(_ptr(builder, at, _I64), align=8))
                else:
                    xrow = builder.add(xp, builder.mul(i, ldx))
                xs = [builder.load(_ptr(builder, builder.add(xrow, _const(64 * v)), _V16), align=4)
                      for v in range(nv)]
                k4 = builder.mul(i, _const(4))
                out = []
                for r in range(tile_o):
                    word = builder.load(_ptr(builder, builder.add(w_at[r], k4), _I32), align=1)
                    wb = _splat(builder, word, _V16)
                    out += [builder.call(dp, [accs[r * nv + v], xs[v], wb]) for v in range(nv)]
                return out

            final = _loop(builder, n4, init, step)
            for r in range(tile_o):
                with builder.if_then(builder.icmp_signed("<", _const(r), rows)):
                    for v in range(nv):
                        builder.store(final[r * nv + v], _ptr(builder, c_at[r][v], _V16), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return tile


_tile16, _tile32, _tile48, _tile64 = (_make_tile(nv) for nv in (1, 2, 3, 4))
_itile16, _itile32, _itile48, _itile64 = (_make_tile(nv, True) for nv in (1, 2, 3, 4))
# NOTE: a batch-1 int8 linear's weights come from L3 or memory, and from memory the hardware
# prefetchers did not keep up with four rows side by side: one thread, Zen 4, weights cycling
# through 12-24 MB, 1000 x 1024 46 -> 15 us, 1024 x 576 17.5 -> 8.7, 1000 x 2048 162 -> 32
# (1024 bytes ahead; 512 within 10% of it, 256 up to 25% slower); weights in L3 or L2: +-5%
_dot1, _dot2, _dot3, _dot4 = (_make_dot(r, ahead=1024) for r in (1, 2, 3, 4))


@njit(cache=True, inline="always")
def _tile_nv(nv, indexed, rows, w, ldw, xp, ldx, c, ldc, n4, acc):
    """The tile of nv vectors, its rows at ldx apart or (indexed) at the offsets at ldx."""
    if indexed:
        if nv == 4:
            _itile64(w, ldw, xp, ldx, c, ldc, n4, acc, rows)
        elif nv == 1:
            _itile16(w, ldw, xp, ldx, c, ldc, n4, acc, rows)
        elif nv == 2:
            _itile32(w, ldw, xp, ldx, c, ldc, n4, acc, rows)
        else:
            _itile48(w, ldw, xp, ldx, c, ldc, n4, acc, rows)
    elif nv == 4:
        _tile64(w, ldw, xp, ldx, c, ldc, n4, acc, rows)
    elif nv == 1:
        _tile16(w, ldw, xp, ldx, c, ldc, n4, acc, rows)
    elif nv == 2:
        _tile32(w, ldw, xp, ldx, c, ldc, n4, acc, rows)
    else:
        _tile48(w, ldw, xp, ldx, c, ldc, n4, acc, rows)


@njit(cache=True, inline="always")
def _dot_rows(rows, xu, w, ldw, c, k):
    if rows == 4:
        _dot4(xu, w, ldw, c, k)
    elif rows == 3:
        _dot3(xu, w, ldw, c, k)
    elif rows == 2:
        _dot2(xu, w, ldw, c, k)
    else:
        _dot1(xu, w, ldw, c, k)


@kernel
def gemm_cols(c, w, xp):
    """w (O, K) i8, xp (K/4, Mp) u32 (4 unsigned bytes each; Mp % 16 == 0) -> c (O, Mp) i32
    = w @ xp.

    NOTE: pixel tiles outermost: a tile's activations (64 pixels x BLOCK_K4 words) stay in L1
    while every channel tile passes over them; the weights stream from L2. The last 16, 32 or
    48 pixels take a narrow tile over more channels. Small maps have few pixel tiles (a 4x4
    map at batch 1: one), so the channels are split into blocks too, giving the threads at
    least 8 pieces of work.
    """
    o, k = w.shape
    k4, mp = xp.shape
    ldc = c.shape[1]  # >= mp: a linear's result rows are skewed (see requant_cols_t)
    wa, xa, ca = np.int64(w.ctypes.data), np.int64(xp.ctypes.data), np.int64(c.ctypes.data)
    n_full, nv = mp // TILE_P, (mp % TILE_P) // 16
    n_p = n_full + (1 if nv else 0)
    tiles_o = (o + TILE_O - 1) // TILE_O
    n_b = max(1, min(tiles_o, (8 + n_p - 1) // n_p))
    per_b = (tiles_o + n_b - 1) // n_b * TILE_O
    n_b = (o + per_b - 1) // per_b
    narrow_o = 16 // max(nv, 1)
    for t in prange(n_p * n_b):
        pt, ob = t // n_b, (t % n_b) * per_b
        p0, o_end = pt * TILE_P, min(o, ob + per_b)
        for kk in range(0, k4, BLOCK_K4):
            n4 = min(BLOCK_K4, k4 - kk)
            tnv, to = (TILE_P // 16, TILE_O) if pt < n_full else (nv, narrow_o)
            for o0 in range(ob, o_end, to):
                _tile_nv(tnv, False, min(to, o_end - o0), wa + o0 * k + kk * 4, k, xa + (kk * mp + p0) * 4,
                         mp * 4, ca + (o0 * ldc + p0) * 4, ldc * 4, n4, kk)


@kernel
def gemm_quad(c, w, xq, offs, m, cpi, img):
    """m images' stride-1 conv GEMMs on their channel-quad planes (see pad_quad), read in
    place: for b < m, c[:, b*cpi : (b+1)*cpi] (O, cpi) i32 = w (O, 4*K4) i8 (in the order of
    `pack_weights_quad`) @ X_b, where X_b's row k4 is the cpi words at xq.flat[b*img] +
    offs[k4] bytes (`quad_offsets`; cpi % 16 == 0, every word readable).

    NOTE: the same tiles and blocking as gemm_cols, one image's pixels at a time (an image's
    last 16-48 pixels take the narrow tile): no packed copy of the columns is written; the
    windows of neighbouring k4 rows overlap, so a tile's activations are fewer distinct
    words than gemm_cols' 64 x BLOCK_K4."""
    o, k = w.shape
    k4 = offs.shape[0]
    ldc = c.shape[1]
    wa, xa, ca, oa = (np.int64(w.ctypes.data), np.int64(xq.ctypes.data), np.int64(c.ctypes.data),
                      np.int64(offs.ctypes.data))
    n_full, nv = cpi // TILE_P, (cpi % TILE_P) // 16
    n_p = n_full + (1 if nv else 0)
    tiles_o = (o + TILE_O - 1) // TILE_O
    n_b = max(1, min(tiles_o, (8 + m * n_p - 1) // (m * n_p)))
    per_b = (tiles_o + n_b - 1) // n_b * TILE_O
    n_b = (o + per_b - 1) // per_b
    narrow_o = 16 // max(nv, 1)
    for t in prange(m * n_p * n_b):
        b, rest = t // (n_p * n_b), t % (n_p * n_b)
        pt, ob = rest // n_b, (rest % n_b) * per_b
        p0, o_end = pt * TILE_P, min(o, ob + per_b)
        xb, cb = xa + b * img * 4 + p0 * 4, ca + (b * cpi + p0) * 4
        for kk in range(0, k4, BLOCK_K4):
            n4 = min(BLOCK_K4, k4 - kk)
            tnv, to = (TILE_P // 16, TILE_O) if pt < n_full else (nv, narrow_o)
            for o0 in range(ob, o_end, to):
                _tile_nv(tnv, True, min(to, o_end - o0), wa + o0 * k + kk * 4, k, xb, oa + kk * 8,
                          cb + o0 * ldc * 4, ldc * 4, n4, kk)


@kernel
def pack_quad_cols(xp, xq, n, img, koffs, pix, poffs):
    """xq from pad_quad (n images of img words) -> xp (K4, Mp) u32, gemm_cols' operand in
    gemm_quad's order of K: word (k4, b*pix + t) = xq[b*img + koffs[k4] + poffs[t]] (koffs:
    quad_offsets in words; poffs: `pixel_offsets`). Columns from n*pix on are left as they are.

    NOTE: narrow maps and strided convs, whose pixels are no one run at a pitch: one word a
    column and row (pack_cols gathers and interleaves four bytes)."""
    k4n = koffs.shape[0]
    for k4 in prange(k4n):
        dst = xp[k4]
        ko = np.uint64(koffs[k4])
        for b in range(n):
            src, at = np.uint64(b * img) + ko, np.uint64(b * pix)
            for t in range(pix):
                dst[at + np.uint64(t)] = xq[src + np.uint64(poffs[t])]


def quad_offsets(c: int, hp: int, wp: int, kh: int, kw: int, dh: int, dw: int) -> np.ndarray:
    """Byte offsets of gemm_quad's row k4 = (c4, i, j) in one image's channel-quad planes."""
    c4, i, j = np.meshgrid(np.arange(c // 4), np.arange(kh), np.arange(kw), indexing="ij")
    return (((c4 * hp + i * dh) * wp + j * dw) * 4).reshape(-1).astype(np.int64)


def _make_interleave4():
    """dst[l] = word (src[l], src[l + ld], src[l + 2ld], src[l + 3ld]) ^ flip for l < cnt
    (1..16): the bytes of four rows at src (ld bytes apart) interleaved, low byte first;
    masked loads and stores, never past cnt."""

    @intrinsic
    def interleave4(typingctx, src, ld, dst, cnt, flip):
        sig = types.void(*[types.intp] * 5)

        def codegen(context, builder, signature, args):
            src, ld, dst, cnt, flip = args
            v8 = ir.VectorType(_I8, 16)
            ld8, _ = _masked_io(builder, v8, 1)
            _, st32 = _masked_io(builder, _V16, 4)
            mask = _lanes_below(builder, cnt)
            rows = [ld8(builder.add(src, builder.mul(ld, _const(q))), mask) for q in range(4)]
            idx32 = ir.VectorType(_I32, 32)
            ab = builder.shuffle_vector(rows[0], rows[1], ir.Constant(idx32, list(range(32))))
            cd = builder.shuffle_vector(rows[2], rows[3], ir.Constant(idx32, list(range(32))))
            # byte 4l + q of the result is row q's byte l
            order = [l + 16 * q for l in range(16) for q in range(4)]
            both = builder.shuffle_vector(ab, cd, ir.Constant(ir.VectorType(_I32, 64), order))
            words = builder.xor(builder.bitcast(both, _V16), _splat(builder, builder.trunc(flip, _I32), _V16))
            st32(words, dst, mask)
            return context.get_dummy_value()

        return sig, codegen

    return interleave4


_interleave4 = _make_interleave4()


@kernel
def pack_weights_quad(wq, w):
    """w (O, C, kh, kw) i8 -> wq (O, C*kh*kw) i8 in gemm_quad's order: byte q of word
    (c4, i, j) is w[:, 4*c4 + q, i, j]."""
    o, c, kh, kw = w.shape
    khw, c4n = kh * kw, c // 4
    wa, qa = np.int64(w.ctypes.data), np.int64(wq.ctypes.data)
    for t in prange(o * c4n):
        for j in range(0, khw, 16):
            _interleave4(wa + t * 4 * khw + j, khw, qa + t * 4 * khw + j * 4, min(16, khw - j), 0)


@kernel
def pad_quad(xq, x, ph, pw, hp, wp, pad):
    """x (N, C, H, W) i8 (C % 4 == 0) -> xq (>= N*C/4*Hp*Wp,) u32: each image as C/4 planes
    of Hp x Wp words, word (c4, y, x) holding channels 4*c4..4*c4+3 (low byte first) + 128
    each, the image at (ph, pw) and the byte `pad` (x_zp + 128) around it and past the last
    plane. The layout gemm_quad reads in place (pad_shift's, four channels a word)."""
    n, c, h, w = x.shape
    c4n = c // 4
    plane = hp * wp
    fill = np.uint32(pad) * np.uint32(0x01010101)
    flip = np.int64(0x80808080)
    xa, qa = np.int64(x.ctypes.data), np.int64(xq.ctypes.data)
    for t in prange(n * c4n):
        d = np.uint64(t * plane)
        # the padding only, then the rows (flat unsigned indices, as in pad_shift)
        for j in range(ph * wp + pw):
            xq[d + np.uint64(j)] = fill
        src = xa + t * 4 * h * w
        for i in range(h):
            r = d + np.uint64((ph + i) * wp + pw)
            for j in range(0, w, 16):
                _interleave4(src + i * w + j, h * w, qa + np.int64(r) * 4 + j * 4, min(16, w - j), flip)
            for j in range(w, wp):
                xq[r + np.uint64(j)] = fill
        for j in range((ph + h) * wp + pw, plane):
            xq[d + np.uint64(j)] = fill
    for j in range(n * c4n * plane, xq.shape[0]):
        xq[j] = fill


@kernel
def gemm_rows(c, xu, w):
    """xu (N, Kp) u8 (Kp > K, any bytes from K on), w (O, K) i8 -> c (N, O) i32 = xu[:, :K] @ w.T."""
    n, kp = xu.shape
    o, k = w.shape
    n_o = (o + TILE_O - 1) // TILE_O
    xa, wa, ca = np.int64(xu.ctypes.data), np.int64(w.ctypes.data), np.int64(c.ctypes.data)
    # NOTE: parallel over (row, channel tile): at batch 1 a linear has one row but many outputs
    for t in prange(n * n_o):
        i, o0 = t // n_o, (t % n_o) * TILE_O
        _dot_rows(min(TILE_O, o - o0), xa + i * kp, wa + o0 * k, k, ca + (i * o + o0) * 4, k)


@kernel
def pack_rows(xu, x):
    """x (N, K) u8 (the int8 codes' bytes) -> xu (N, Kp) u8 = x_q + 128; the bytes from K on
    are left as they are: `_dot` multiplies them by masked-off (zero) weights."""
    n, k = x.shape
    for i in prange(n):
        for j in range(k):
            xu[i, j] = x[i, j] ^ np.uint8(0x80)


@kernel
def pack_rows_t(xp, x):
    """x (N, K/4) u32 (four int8 codes each) -> xp (K/4, Mp) u32 = x.T + 128 per byte."""
    n, k4 = x.shape
    for j in prange(k4):
        dst = xp[j]
        for i in range(n):
            dst[i] = x[i, j] ^ np.uint32(0x80808080)


@kernel
def pad_shift(xpad, x, ph, pw, hp, wp, pad):
    """x (N, C, H, W) u8 (int8 codes' bytes) -> xpad (>= N*C*Hp*Wp,) u8: the images in planes
    of Hp x Wp (at least H + ph and W + pw, as kernels_fp32.pad_images), x_q + 128 at (ph, pw)
    and pad (x_zp + 128) around it and past the last plane.

    NOTE: flat unsigned indices throughout: slicing a row per loop costs a reference count
    each, which dominated on small maps."""
    n, c, h, w = x.shape
    xf = x.reshape(-1)
    plane = np.uint64(hp * wp)
    for t in prange(n * c):
        d, s = np.uint64(t) * plane, np.uint64(t * h * w)
        # the whole plane first (one long loop), then the image rows over it
        for j in range(plane):
            xpad[d + np.uint64(j)] = pad
        for i in range(h):
            r, q = d + np.uint64((ph + i) * wp + pw), s + np.uint64(i * w)
            for j in range(w):
                xpad[r + np.uint64(j)] = xf[q + np.uint64(j)] ^ np.uint8(0x80)
    for j in range(n * c * hp * wp, xpad.shape[0]):
        xpad[j] = pad


@njit(cache=True, inline="always")
def _col_offset(kq, khw, kw, hp, wp, dh, dw):
    """Offset in one padded image of column kq's input for output pixel (0, 0)."""
    ch, i, j = kq // khw, (kq % khw) // kw, kq % kw
    return np.uint64((ch * hp + i * dh) * wp + j * dw)


@njit(cache=True, inline="always")
def _word(xf, a0, a1, a2, a3, u):
    return (np.uint32(xf[a0 + u]) | (np.uint32(xf[a1 + u]) << 8) | (np.uint32(xf[a2 + u]) << 16)
            | (np.uint32(xf[a3 + u]) << 24))


def pixel_offsets(ho: int, wo: int, sh: int, sw: int, wp: int) -> np.ndarray:
    """Offsets in a padded image (width wp) of each output pixel's window, row-major: the
    table `pack_cols` reads pixels by when they are not one contiguous run."""
    oh, ow = np.meshgrid(np.arange(ho), np.arange(wo), indexing="ij")
    return (oh * sh * wp + ow * sw).reshape(-1).astype(np.int64)


@kernel
def pack_cols(xp, xpad, n, c, hp, wp, kh, kw, dh, dw, pix, poffs):
    """xpad from `pad_shift` (N images (C, Hp, Wp)) -> xp (ceil(K/4), Mp) u32: byte q of
    xp[k4, b*pix + t] is the input under column k = 4*k4 + q (OIHW order) of output pixel t's
    receptive field. Columns from N*pix on are left as they are (their sums go unread).

    Pixels: with poffs empty (stride 1 at a pitch of Wp), pix = Ho*Wp and output (oh, ow) is
    pixel oh*Wp + ow: columns ow >= Wo are junk the epilogue skips, and in exchange a
    column's inputs for a whole image are one contiguous run of the padded image, so the loop
    is long and vectorizes (the four-byte interleave). xpad needs (kw-1)*dw bytes of slack
    after the last image for the junk. Otherwise pix = Ho*Wo, pixel t's window at poffs[t]
    (`pixel_offsets`): one loop over an image's pixels, where a loop per output row of 4 or 8
    cost more than the words it wrote.
    """
    k4n, mp = xp.shape
    khw = kh * kw
    k = c * khw
    img = np.uint64(c * hp * wp)
    of = xp.reshape(-1)
    flat = poffs.shape[0] == 0
    for k4 in prange(k4n):
        # NOTE: columns past K (K % 4 != 0) meet zero weights (`pad_weights`): any byte will
        # do, so they repeat the last column rather than read outside the images
        a0 = _col_offset(min(4 * k4, k - 1), khw, kw, hp, wp, dh, dw)
        a1 = _col_offset(min(4 * k4 + 1, k - 1), khw, kw, hp, wp, dh, dw)
        a2 = _col_offset(min(4 * k4 + 2, k - 1), khw, kw, hp, wp, dh, dw)
        a3 = _col_offset(min(4 * k4 + 3, k - 1), khw, kw, hp, wp, dh, dw)
        for b in range(n):
            base = np.uint64(b) * img
            dst = np.uint64(k4 * mp + b * pix)
            b0, b1, b2, b3 = base + a0, base + a1, base + a2, base + a3
            if flat:
                for t in range(pix):
                    u = np.uint64(t)
                    of[dst + u] = _word(xpad, b0, b1, b2, b3, u)
            else:
                for t in range(pix):
                    of[dst + np.uint64(t)] = _word(xpad, b0, b1, b2, b3, np.uint64(poffs[t]))


@njit(cache=True)
def pad_weights(wp, w):
    """w (O, K) i8 -> wp (O, 4*ceil(K/4)) i8, zeros past K: whole 4-byte groups for `_tile`."""
    o, k = w.shape
    for i in range(o):
        for j in range(k):
            wp[i, j] = w[i, j]
        for j in range(k, wp.shape[1]):
            wp[i, j] = 0


@njit(cache=True, inline="always")
def _epilogue_run(c, cf, oc, count, badj, mo, y_zp, lo, to_int8, relu):
    """c[oc, :count] = the epilogue of c + badj, in place: int8 codes as int32 (to_int8) or
    float32 into cf (c's memory). One long contiguous loop: it vectorizes."""
    if to_int8:
        for j in range(count):
            c[oc, j] = np.int32(_code_clamped(total32(c[oc, j], badj), mo, y_zp, lo))
    else:
        for j in range(count):
            cf[oc, j] = np.float32(_epilogue(np.int64(c[oc, j]) + badj, mo, y_zp, lo, to_int8, relu))


@njit(cache=True, inline="always")
def _copy_channel(of, cflat, fflat, oc, n, o, hw, ldc, rows, pitch, per_image, to_int8):
    """Channel oc of out (N, O, Ho, Wo) flat (of) <- the epilogue's results in c (O, ldc)
    flat (cflat; fflat when float32): image b's row i at column b*per_image + i*pitch of c's
    row oc, rows of hw/rows. Flat arrays and no divisions: on a 4x4 map a reshape or an
    integer division per plane cost more than the plane's copy."""
    width = hw // rows
    for b in range(n):
        dst0 = np.uint64((b * o + oc) * hw)
        for i in range(rows):
            src = np.uint64(oc * ldc + b * per_image + i * pitch)
            dst = dst0 + np.uint64(i * width)
            if to_int8:
                for j in range(width):
                    of[dst + np.uint64(j)] = cflat[src + np.uint64(j)]
            else:
                for j in range(width):
                    of[dst + np.uint64(j)] = fflat[src + np.uint64(j)]


@kernel
def requant_cols(out, c, cf, pitch, istride, bias, m, to_int8, y_zp, lo, relu):
    """c (O, Mp) i32 (cf: the same memory as float32), image b's output row oh at column
    b*istride + oh*pitch (see pack_cols; istride >= Ho*pitch) -> out (N, O, Ho, Wo) i8 or f32
    = epilogue(c + bias[o]) as in kernels_int8 (bias: b_q - (x_zp + 128) * wsum). May overwrite c.

    NOTE: int8 rows narrower than 16 take two passes: the epilogue in place along c's rows
    (junk columns included), then a copy of the real pixels. In one pass, 4x4 maps cost 3.1
    ns an output (scalar loop tails, a float-to-byte conversion each); two passes 1.4. Wider
    rows and float32 outputs vectorize in one pass, and a second pass over c costs more.
    """
    n, o, ho, wo = out.shape
    mp = c.shape[1]
    rows, width = (1, ho * wo) if pitch == wo else (ho, wo)
    of, cflat, fflat = out.reshape(-1), c.reshape(-1), cf.reshape(-1)
    if to_int8 and width < 16:
        # NOTE: two loops over the channels, not one: the copy's loads right after the
        # epilogue's wider stores missed store forwarding (3x slower at batch 1)
        for oc in prange(o):
            _epilogue_run(c, cf, oc, n * istride, bias[oc], m[oc], y_zp, lo, to_int8, relu)
        for oc in prange(o):
            _copy_channel(of, cflat, fflat, oc, n, o, ho * wo, mp, rows, pitch, istride, to_int8)
        return
    for r in prange(n * o):
        b, oc = r // o, r % o
        badj, mo = bias[oc], m[oc]
        for i in range(rows):
            src = np.uint64(oc * mp + b * istride + i * pitch)
            dst = np.uint64((r * ho + i) * wo)
            if to_int8:
                for j in range(width):
                    u = np.uint64(j)
                    of[dst + u] = _code_clamped(total32(cflat[src + u], badj), mo, y_zp, lo)
            else:
                for j in range(width):
                    u = np.uint64(j)
                    of[dst + u] = _epilogue(np.int64(cflat[src + u]) + badj, mo, y_zp, lo,
                                            to_int8, relu)


@kernel
def requant_cols_t(out, c, cf, bias, m, to_int8, y_zp, lo, relu):
    """c (O, >= N) i32 (cf: the same memory as float32), row i's sums in column i -> out (N, O)
    i8 or f32 = epilogue(c.T + bias): a linear's epilogue after `gemm_cols`. Overwrites c.

    NOTE: the epilogue along c's rows in place (contiguous, vectorized), then a transposing copy
    written in runs; scattered writes of each output cost 2x, and reading down c's columns
    left the epilogue scalar, 1.5 ns an output. c's rows are skewed past 64 words by the
    engine, else 256 rows 256 bytes apart share a few L1 sets."""
    n, o = out.shape
    for oc in prange(o):
        _epilogue_run(c, cf, oc, n, bias[oc], m[oc], y_zp, lo, to_int8, relu)
    for i in prange(n):
        if to_int8:
            for oc in range(o):
                out[i, oc] = c[oc, i]
        else:
            for oc in range(o):
                out[i, oc] = cf[oc, i]


@kernel
def requant_cols_pack(xq, c, cf, n, bias, m, y_zp, lo, relu):
    """c (O, >= n) i32 (cf: the same memory as float32), row i's sums in column i -> xq
    (O/4, >= n) u32: the int8 codes of epilogue(c + bias) in the next VNNI linear's packed
    layout, as pack_rows_t writes it (channels 4q..4q+3 of row i in word (q, i), low byte
    first, + 128 each). Columns n.. of xq are left as they are (the next GEMM's results there
    are never read). Overwrites c.

    NOTE: a linear's int8 result that only the next linear reads (see
    lowering.chained_linears): no transposing copy here and no pack_rows_t there."""
    for q in prange(c.shape[0] // 4):
        for r in range(4):
            oc = 4 * q + r
            _epilogue_run(c, cf, oc, n, bias[oc], m[oc], y_zp, lo, True, relu)
        c0, c1, c2, c3, dst = c[4 * q], c[4 * q + 1], c[4 * q + 2], c[4 * q + 3], xq[q]
        for i in range(n):
            word = ((c0[i] & 0xFF) | ((c1[i] & 0xFF) << 8) | ((c2[i] & 0xFF) << 16)
                    | ((c3[i] & 0xFF) << 24))
            dst[i] = np.uint32(word) ^ np.uint32(0x80808080)
