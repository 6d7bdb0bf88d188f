"""float32 GEMMs on x86 CPUs with AVX-512: our own register-tiled kernel in place of BLAS
for the convolutions, so that a stride-1 conv reads its padded input directly (no im2col),
Winograd's 16 GEMMs run as one parallel kernel, and Numba's thread pool is the only one.

One tile keeps TILE_O output channels x TILE_P pixels (8 x 2 zmm = 16 accumulators) and,
per step along K, loads two vectors of inputs and broadcasts one weight per channel into 16
fused multiply-adds. Each step's input row starts at its own byte offset (`offs[k]`), which
is what lets one kernel serve three layouts:

- a stride-1 conv at a pixel pitch of Wp (see kernels_fp32.im2col_pitch): row k = (c, i, j)
  of image b's columns is the padded image itself, shifted by (c*Hp + i*dh)*Wp + j*dw; so
  offs[k] is that shift (`pitch_offsets`) and the GEMM reads the padded images in place;
- explicit columns (K, M) (im2col, Winograd's V[e], a linear's transposed rows):
  offs[k] = k * M * 4.

A linear with few rows (batch 1) takes `gemv` instead: dot products along K, 8 weight rows
at a time, with a masked load for the last partial chunk.

Winograd's transforms and its fused conv on AVX-512 are in kernels_fma_winograd, the linears
of 16 rows or more (x.T through these tiles) in kernels_fma_linear, im2col a vector at a time
in kernels_fma_im2col.

Exactness: like BLAS, the sums differ from formats/reference.py by float32 rounding only;
each GEMM output is one FMA chain along K in the weights' order (gemv: 16 chains, then summed).

The engine uses this module only when `AVAILABLE` (AVX-512 on the host and Numba compiling
for the host); ARM and older x86 keep NumPy's BLAS, and the LLVM here is never compiled.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from pocket.infer.jit import kernel
from pocket.infer.kernels_vnni import (
    _const,
    _lanes_below,
    _loop,
    _masked_io,
    _prefetch,
    _ptr,
    _row_at,
    _splat,
    host_has,
)

TILE_O, TILE_P = 8, 32  # a tile's channels and pixels; 16 accumulators leave room for loads
# Pairs of tiles run as one of WIDE_O channels x 64 pixels (24 accumulators): 10 loads per 24
# multiply-adds, not 10 per 16 (256 x 784 @ 784 x 64 on one thread: 158 -> 164-169 GFLOPS)
WIDE_O = 6
HALF_P = 16  # pixels of a half tile: a GEMM's last one, when its width is 16 past a multiple of 32
BLOCK_K, GROUP_P = 256, 16  # cache blocking (see gemm): 512 pixels x 256 rows = 512 KiB
# A GEMM whose weights pass this does not keep them in L2 from call to call (_block_k)
STREAM_W_BYTES = 1 << 20
# _sub_chunks: a part's channels in chunks of at most this many bytes of weights, each of at
# least SUB_MIN_O channels
SUB_W_BYTES, SUB_MIN_O = 1 << 20, 96
# gemm_pool2_pitch's images (one group each) up to this many pixels: 256 rows of them fill
# 1 MiB of L2 (cnn_mnist's first conv, 816 pixels at batch 1: gemm + pool 8.5 -> ~7 us)
POOL_GROUP_MAX = 2 * GROUP_P * TILE_P

AVAILABLE = host_has("POCKET_FP32_FMA", ("avx512f", "fma"))
# The tiles' mode argument carries a flag above its activation: prefetch the next channel
# tile's weights (_make_tile, _gemm_block)
PREFETCH_SHIFT = 8
AHEAD = 1 << PREFETCH_SHIFT

_I32, _I64, _F32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
_VF, _VI = ir.VectorType(_F32, 16), ir.VectorType(_I32, 16)


def _make_tile(nv: int, nr: int = TILE_O, masked: bool = False, partial: bool = False):
    """c[r, 0:16nv] (+)= sum over k < nk of w[r, k] * x[offs[k] : offs[k] + 16nv] for r < rows
    (1..nr).

    Addresses in bytes: w (rows of ldw, float32), x (the tile's first pixel), offs (int64 byte
    offsets from x, one per k), c (rows of ldc). With acc != 0 the sums start from c. With
    bias != 0 (the address of row 0's bias) c gets the sums + bias, then the activation `relu`
    (a mode of _by_mode: 0 none, 1 ReLU, ...); relu | AHEAD also prefetches the next nr rows of
    weights as it goes (the next channel tile's: see _gemm_block).
    masked (nv = 1): a 12th argument cnt (1..16) is the tile's pixels; the lanes past it are
    neither read (x, c) nor written (a GEMM's last pixels, when m is not a multiple of 16).
    partial (nv = 3 or 4): a 12th argument cnt (33..16nv) is the tile's pixels; the lanes of
    vectors 2 (and 3) past it are neither read nor written (a GEMM's last 33-63 pixels in one
    tile, where a tile, a half tile and a masked one each broadcast every weight again: a 7x7
    map's 1x1 convs, 192 x 1152 @ 1152 x 49, ran 0.70x of that on one thread).
    """

    def codegen(context, builder, signature, args):
        w, ldw, x, offs, nk, c, ldc, acc, rows, bias, relu = args[:11]
        ahead = builder.icmp_signed("!=", builder.ashr(relu, _const(PREFETCH_SHIFT)), _const(0))
        relu = builder.and_(relu, _const((1 << PREFETCH_SHIFT) - 1))
        if masked or partial:
            ld, st = _masked_io(builder, _VF, 4)
            first = 0 if masked else 2
            lanes = [_lanes_below(builder, builder.sub(args[11], _const(16 * v))) for v in range(nv)]

            def load(addr, v=0):
                if v < first:
                    return builder.load(_ptr(builder, addr, _VF), align=4)
                return ld(addr, lanes[v])

            def store(val, addr, v=0):
                if v < first:
                    builder.store(val, _ptr(builder, addr, _VF), align=4)
                else:
                    st(val, addr, lanes[v])
        else:
            def load(addr, v=0):
                return builder.load(_ptr(builder, addr, _VF), align=4)

            def store(val, addr, v=0):
                builder.store(val, _ptr(builder, addr, _VF), align=4)

        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VF, [_VF] * 3),
                                             "llvm.fma.v16f32")
        start = builder.icmp_signed("!=", acc, _const(0))
        c_at = [[builder.add(_row_at(builder, c, r, rows, ldc), _const(64 * v)) for v in range(nv)]
                for r in range(nr)]
        init = [builder.select(start, load(a, v), ir.Constant(_VF, None))
                for row in c_at for v, a in enumerate(row)]
        w_at = [_row_at(builder, w, r, rows, ldw) for r in range(nr)]

        def step(i, accs):
            off = builder.load(_ptr(builder, builder.add(offs, builder.mul(i, _const(8))), _I64),
                               align=8)
            xa = builder.add(x, off)
            xs = [load(builder.add(xa, _const(64 * v)), v) for v in range(nv)]
            k4 = builder.mul(i, _const(4))
            with builder.if_then(ahead):
                # the next channel tile's weights (nr rows on), swept in address order, nr
                # floats a step: its nr rows of nk where they are whole rows (nk * 4 == ldw),
                # else the run from its first row's k on. NOTE: in address order, not a row a
                # step: the hardware prefetchers then run on ahead of the sweep (ResNet-18 on one
                # thread: 19.5-19.6 ms against 20.8-21.2 a row a step, 21.3-22.2 without)
                sweep = builder.mul(i, _const(4 * nr))
                nxt = builder.add(w, builder.add(builder.mul(ldw, _const(nr)), sweep))
                _prefetch(builder, nxt)
            return _broadcast_fmas(builder, fma, [builder.add(a, k4) for a in w_at], xs, accs)

        final = _loop(builder, nk, init, step)

        def store_all(act):
            for r in range(nr):
                with builder.if_then(builder.icmp_signed("<", _const(r), rows)):
                    if act is not None:
                        bo = builder.load(_ptr(builder, builder.add(bias, _const(4 * r)), _F32), align=4)
                    for v in range(nv):
                        val = final[r * nv + v]
                        if act is not None:
                            val = act(builder, builder.fadd(val, _splat(builder, bo, _VF)))
                        store(val, c_at[r][v], v)

        _with_epilogue(builder, bias, relu, store_all)
        return context.get_dummy_value()

    if masked or partial:
        @intrinsic
        def tile_masked(typingctx, w, ldw, x, offs, nk, c, ldc, acc, rows, bias, relu, cnt):
            return types.void(*[types.intp] * 12), codegen

        return tile_masked

    @intrinsic
    def tile(typingctx, w, ldw, x, offs, nk, c, ldc, acc, rows, bias, relu):
        return types.void(*[types.intp] * 11), codegen

    return tile


_tile, _half = _make_tile(2), _make_tile(1)  # 32 pixels; 16 (a GEMM's last, half tile)
_tail = _make_tile(1, masked=True)  # 1..15: the last pixels of a GEMM whose m is not a multiple of 16
_wide = _make_tile(4, WIDE_O)  # 64 pixels (two tiles)
# A GEMM's last wide tile, when it has at most 4 or 2 channels: it would compute 6 either way
# (mlp's 256 channels are 42 tiles and 4; a 10-class linear 6 and 4)
_wide4, _wide2 = _make_tile(4, 4), _make_tile(4, 2)
_wide_part = _make_tile(4, WIDE_O, partial=True)  # a GEMM's last 49..63 pixels
# ... and its last 33..48 (a 13x13 map's 169 = 2 x 64 + 41). Where the channels take wide tiles,
# the narrow tiles have WIDE_O rows too: of 8, a tile of 6 channels computed 8 (SqueezeNet's
# 1000 x 512 @ 512 x 169, one thread: 32 + 9 pixels a 6 x 32 tile of 8 rows and a 9-pixel
# tail of 8, 12.5 cycles a step where one 6 x 48 tile takes 9)
_wide3_part = _make_tile(3, WIDE_O, partial=True)
_tile6, _half6, _tail6 = _make_tile(2, WIDE_O), _make_tile(1, WIDE_O), _make_tile(1, WIDE_O, masked=True)


def _broadcast_fmas(builder, fma, addrs, vecs, accs):
    """The tiles' step: for each float32 at addrs[i], broadcast, its multiply-adds with every
    vector of vecs into accs[i * len(vecs) + v] (the new accumulators, in that order)."""
    out = []
    for i, a in enumerate(addrs):
        b = _splat(builder, builder.load(_ptr(builder, a, _F32), align=4), _VF)
        out += [builder.call(fma, [b, v, accs[i * len(vecs) + j]]) for j, v in enumerate(vecs)]
    return out


def _with_epilogue(builder, bias, mode, store_all):
    """store_all(act) where bias != 0 (act: the activation `mode`, see _by_mode), else
    store_all(None): the plain sums."""
    with builder.if_else(builder.icmp_signed("!=", bias, _const(0))) as (then, otherwise):
        with then:
            _by_mode(builder, mode, store_all)
        with otherwise:
            store_all(None)


def _shuffle(builder, a, b, idx):
    return builder.shuffle_vector(a, b, ir.Constant(_VI, idx))


def _vmax(builder, a, b):
    """kernels_fp32.nanmax(a, b) lane by lane: a + b (NaN) where either is NaN, else
    Python's max(a, b) (b only where b > a)."""
    return builder.select(builder.fcmp_unordered("uno", a, b), builder.fadd(a, b),
                          builder.select(builder.fcmp_ordered(">", b, a), b, a))


def _relu(builder, v):
    """kernels_fp32.relu lane by lane (or on one float): 0 where v < 0, so NaN passes."""
    zero = ir.Constant(v.type, None)
    return builder.select(builder.fcmp_ordered("<", v, zero), zero, v)


def _bias_relu(builder, v, bo, relu):
    """v + bo, then a ReLU where relu (an i64) != 0: as the Numba epilogues do it."""
    v = builder.fadd(v, _splat(builder, bo, _VF))
    return builder.select(builder.icmp_signed("!=", relu, _const(0)), _relu(builder, v), v)


# The GEMM tiles' activations after the bias (`mode`, an i64: gemm's epi - 1): 0 none, 1 ReLU,
# then (routes.lowering_common.register_epi) SiLU, sigmoid, relu6, hardswish and hardsigmoid
# on the tile in registers: within a few ulp of the float64 formula, as act_run's loops
# (EfficientNet-B0's expand convs took a SiLU pass over every output, 2 ms of ~18; MobileNetV3's
# hardswish convs a pass each)
MODE_SILU, MODE_SIGMOID, MODE_RELU6, MODE_HSWISH, MODE_HSIGMOID = 2, 3, 4, 5, 6
# _exp_neg's table, 2**(j/16), and ln 2 / 16 in two parts: the high part has 9 significant
# bits, so its product with k (|k| < 2**12 after the clamp) is exact
_EXP_TABLE = [float(np.float32(2.0 ** (j / 16))) for j in range(16)]
_LN2_16_HI = 0.693359375 / 16
_LN2_16_LO = float(np.float32((0.6931471805599453 - 0.693359375) / 16))
_ROUND_MAGIC = 12582912.0  # 1.5 * 2**23: v + magic rounds v to an integer in its low bits
_EXP_CLAMP = 100.0


def _vconst(v: float):
    return ir.Constant(_VF, [float(np.float32(v))] * 16)


def _x86_fn(builder, name, n_vectors, extra=()):
    ty = ir.FunctionType(_VF, [_VF] * n_vectors + list(extra))
    return cgutils.get_or_insert_function(builder.module, ty, name)


def _exp_neg(builder, v):
    """exp(-v) on 16 lanes, to about 1.5 ulp: -v = (k/16) ln2 + r with k an integer, |r| <=
    ln2/32, so exp(-v) = 2**(k // 16) * 2**((k % 16)/16) * exp(r): the power of two by
    vscalefps (over- and underflow to inf and 0 as exp's), 2**(j/16) from a 16-entry table in
    one register (vpermps, indexed by the low bits of k's rounding sum), exp(r) to degree 3.
    v is clamped to [-100, 100] first (past it exp's float32 value is inf or 0 all the same)
    by vmaxps/vminps with v as the second operand, which they return when it is NaN: a NaN v
    gives NaN.

    NOTE: SiLU was ~24 vector operations (degree 7 on |r| <= ln2/2, compare-and-select clamps,
    vrcp14ps and a Newton step, a select for 1/inf): 0.34 ns an element on the Zen 4 AVX-512
    host, so EfficientNet-B0's SiLU convs spent 18% of the network in it, as long as
    onnxruntime's separate SiLU passes. This and a division: 0.21 ns (vdivps is 5-6 cycles
    a vector on that core, beside the FMAs)."""
    fma = _x86_fn(builder, "llvm.fma.v16f32", 3)
    vmax = _x86_fn(builder, "llvm.x86.avx512.max.ps.512", 2, [_I32])
    vmin = _x86_fn(builder, "llvm.x86.avx512.min.ps.512", 2, [_I32])
    perm = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VF, [_VF, _VI]),
                                          "llvm.x86.avx512.permvar.sf.512")
    scalef = _x86_fn(builder, "llvm.x86.avx512.mask.scalef.ps.512", 3, [ir.IntType(16), _I32])
    cur = ir.Constant(_I32, 4)  # (rounding: the current direction)
    v = builder.call(vmin, [_vconst(_EXP_CLAMP), builder.call(vmax, [_vconst(-_EXP_CLAMP), v, cur]), cur])
    s = builder.call(fma, [v, _vconst(-16 * 1.4426950408889634), _vconst(_ROUND_MAGIC)])
    k = builder.fsub(s, _vconst(_ROUND_MAGIC))  # round(-16 v / ln2); s's low 4 bits are k % 16
    rn = builder.call(fma, [k, _vconst(_LN2_16_HI), v])
    rn = builder.call(fma, [k, _vconst(_LN2_16_LO), rn])  # -r
    t = builder.call(perm, [ir.Constant(_VF, _EXP_TABLE), builder.bitcast(s, _VI)])
    q = builder.call(fma, [rn, _vconst(-1.0 / 6), _vconst(0.5)])
    q = builder.call(fma, [q, rn, _vconst(-1.0)])
    p = builder.call(fma, [builder.fmul(t, rn), q, t])  # t exp(r) = t (1 + r + r^2/2 + r^3/6)
    return builder.call(scalef, [p, builder.fmul(k, _vconst(1.0 / 16)), ir.Constant(_VF, None),
                                 ir.Constant(ir.IntType(16), -1), cur])


def _silu(builder, v):
    """v / (1 + exp(-v)): NaN stays NaN, -inf gives NaN (inf / inf) as the formula does."""
    return builder.fdiv(v, builder.fadd(_vconst(1.0), _exp_neg(builder, v)))


def _sigmoid(builder, v):
    return builder.fdiv(_vconst(1.0), builder.fadd(_vconst(1.0), _exp_neg(builder, v)))


def _relu6(builder, v):
    t = _relu(builder, v)
    return builder.select(builder.fcmp_ordered(">", t, _vconst(6.0)), _vconst(6.0), t)


def _div6(builder, p):
    """p / 6 correctly rounded from p (float32 lanes): q = p * (1/6), then one correction by the
    residual p - 6q (an FMA), kernels_fp32._div6's step in float32."""
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VF, [_VF] * 3), "llvm.fma.v16f32")
    q = builder.fmul(p, _vconst(1.0 / 6.0))
    r = builder.call(fma, [builder.fneg(q), _vconst(6.0), p])
    return builder.call(fma, [r, _vconst(1.0 / 6.0), q])


def _hardsigmoid(builder, v):
    """relu6(v + 3) / 6 in float32 (NaN kept): within an ulp of the float64 formula rounded once."""
    return _div6(builder, _relu6(builder, builder.fadd(v, _vconst(3.0))))


def _hardswish(builder, v):
    """v * relu6(v + 3) / 6 in float32: the product rounded, then divided exactly (2 ulp)."""
    return _div6(builder, builder.fmul(v, _relu6(builder, builder.fadd(v, _vconst(3.0)))))


def _by_mode(builder, mode, emit):
    """emit(act) under a branch on mode: act(builder, v) the activation of v = sums + bias."""
    with builder.if_else(builder.icmp_signed("<", mode, _const(MODE_SILU))) as (simple, other):
        with simple:
            emit(lambda b, v: b.select(b.icmp_signed("!=", mode, _const(0)), _relu(b, v), v))
        with other:
            _by_mode_from(builder, mode, emit, [(MODE_SILU, _silu), (MODE_SIGMOID, _sigmoid),
                                                (MODE_RELU6, _relu6), (MODE_HSWISH, _hardswish),
                                                (MODE_HSIGMOID, _hardsigmoid)])


def _by_mode_from(builder, mode, emit, cases):
    """The branches of _by_mode from its first (mode, act) case on: the last one is the else."""
    (code, act), rest = cases[0], cases[1:]
    if not rest:
        emit(act)
        return
    with builder.if_else(builder.icmp_signed("==", mode, _const(code))) as (this, others):
        with this:
            emit(act)
        with others:
            _by_mode_from(builder, mode, emit, rest)


def _make_dot(ahead: int = 0):
    """c[r] = sum over j < k of x[j] * w[r, j] for r < rows (1..TILE_O; float32, 4 bytes apart);
    with bias != 0 (the address of row 0's bias) c[r] gets the sum + bias[r], then a ReLU if
    relu != 0 (as the Numba epilogues do it).

    x and the rows of w (ldw bytes apart) are read in chunks of 16 floats; the last partial
    chunk is a masked load and reads as zeros, never past the end. Each row's 16 lanes are
    summed at the end, so the order of the sum differs from a plain loop by rounding only.

    ahead: each step also prefetches every row `ahead` bytes on (0: not).
    NOTE: a batch-1 linear's weights come from L3 or memory, eight rows read side by side, and
    from memory the hardware prefetchers did not keep up: one thread, Zen 4, weights cycling
    through 30 MB, 1000 x 1024 147 -> 60 us, 1024 x 576 55 -> 35, 1000 x 1280 223 -> 68 (512
    bytes ahead; 256 to 2048 within a few us of it, except 1000 x 1280: 95 at 256, 88 at
    2048); from L3 (weights of one layer, 1-16 MB of other data between calls) within +-5%,
    but on weights that fit L2 the prefetches cost up to 6% (576 x 144: 4.6 -> 4.9 us), so
    gemv prefetches only weights of STREAM_W_BYTES or more.
    """

    @intrinsic
    def dot(typingctx, x, w, ldw, c, k, rows, bias, relu):
        sig = types.void(*[types.intp] * 8)

        def codegen(context, builder, signature, args):
            x, w, ldw, c, k, rows, bias, relu = args
            mod = builder.module
            fma = cgutils.get_or_insert_function(mod, ir.FunctionType(_VF, [_VF] * 3), "llvm.fma.v16f32")
            w_at = [_row_at(builder, w, r, rows, ldw) for r in range(TILE_O)]
            full = builder.sdiv(k, _const(16))

            def step(i, accs):
                off = builder.mul(i, _const(64))
                xv = builder.load(_ptr(builder, builder.add(x, off), _VF), align=4)
                if ahead:
                    for wr in w_at:
                        _prefetch(builder, builder.add(builder.add(wr, off), _const(ahead)))
                return [builder.call(fma, [xv, builder.load(_ptr(builder, builder.add(wr, off), _VF),
                                                           align=4), a]) for a, wr in zip(accs, w_at)]

            accs = _loop(builder, full, [ir.Constant(_VF, None)] * TILE_O, step)
            # the tail: rem (0..15) floats, the other lanes masked to zero
            mask = _lanes_below(builder, builder.srem(k, _const(16)))
            ld, _ = _masked_io(builder, _VF, 4)
            red = cgutils.get_or_insert_function(mod, ir.FunctionType(_F32, [_F32, _VF]),
                                                 "llvm.vector.reduce.fadd.v16f32")
            off = builder.mul(full, _const(64))

            def masked(addr):
                return ld(builder.add(addr, off), mask)

            xv = masked(x)
            for r, (a, wr) in enumerate(zip(accs, w_at)):
                with builder.if_then(builder.icmp_signed("<", _const(r), rows)):
                    a = builder.call(fma, [xv, masked(wr), a])
                    total = builder.call(red, [ir.Constant(_F32, 0.0), a], fastmath=("reassoc",))
                    has_bias = builder.icmp_signed("!=", bias, _const(0))
                    with builder.if_then(has_bias):  # (a block of its own: never a load at 0)
                        bo = builder.load(_ptr(builder, builder.add(bias, _const(4 * r)), _F32), align=4)
                        biased = builder.fadd(total, bo)
                        out = builder.select(builder.icmp_signed("!=", relu, _const(0)),
                                             _relu(builder, biased), biased)
                        builder.store(out, _ptr(builder, builder.add(c, _const(4 * r)), _F32), align=4)
                    with builder.if_then(builder.not_(has_bias)):
                        builder.store(total, _ptr(builder, builder.add(c, _const(4 * r)), _F32), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return dot


_dot, _dot_ahead = _make_dot(), _make_dot(ahead=512)


def _make_pool2():
    """One 2x2/2 max pool step on a pitch-laid GEMM result: the cnt (1..16) outputs at dst
    (4 bytes apart) from the two input rows at y and y + ldy (bytes; 2*cnt floats each, read
    masked), plus the bias bo and a ReLU (relu != 0). Vertical max of the rows, then of the
    even and odd columns (split by shuffles): the same values as bias_act_pool_pitch."""

    @intrinsic
    def pool(typingctx, y, ldy, dst, cnt, bo, relu):
        sig = types.void(*[types.intp] * 4, types.float32, types.intp)

        def codegen(context, builder, signature, args):
            y, ldy, dst, cnt, bo, relu = args
            ld, st = _masked_io(builder, _VF, 4)
            n2 = builder.mul(cnt, _const(2))
            masks = [_lanes_below(builder, builder.sub(n2, _const(16 * q))) for q in range(2)]

            top = [ld(builder.add(y, _const(64 * q)), masks[q]) for q in range(2)]
            bottom = [ld(builder.add(builder.add(y, ldy), _const(64 * q)), masks[q]) for q in range(2)]
            a, b = _vmax(builder, top[0], bottom[0]), _vmax(builder, top[1], bottom[1])
            evens, odds = (_shuffle(builder, a, b, list(range(q, 32, 2))) for q in (0, 1))
            st(_bias_relu(builder, _vmax(builder, evens, odds), bo, relu), dst, _lanes_below(builder, cnt))
            return context.get_dummy_value()

        return sig, codegen

    return pool


_pool2 = _make_pool2()


@kernel
def bias_act_pool2_pitch(out, y, pitch, istride, b, act):
    """kernels_fp32.bias_act_pool_pitch for a 2x2/2 pool and act 0 (none) or 1 (ReLU): one
    vector step per 16 outputs of a row.

    NOTE: the Numba loop ran ~1 ns an output (7-14 outputs a row, mostly its scalar tail):
    the pooled epilogues were 0.7 of cnn_mnist fp32's 4.8 ms at batch 64."""
    n, o, ho, wo = out.shape
    ya, oa = np.int64(y.ctypes.data), np.int64(out.ctypes.data)
    for r in prange(n * o):
        _pool2_plane(oa, ya, y.shape[1], r, o, ho, wo, pitch, istride, b, act, ho * wo, wo)


@njit(cache=True)
def _pool2_plane(oa, ya, mp, r, o, ho, wo, pitch, istride, b, act, ps, rs):
    """bias_act_pool2_pitch's plane r = (image bi, channel oc): its Ho x Wo outputs at
    oa + (r*ps + oh*rs) floats (ps, rs = Ho*Wo, Wo: out (N, O, Ho, Wo)), the GEMM result at ya
    (rows of mp floats)."""
    bi, oc = r // o, r % o
    bo = b[oc] if b.shape[0] > 0 else np.float32(0.0)
    for oh in range(ho):
        src = ya + (oc * mp + bi * istride + 2 * oh * pitch) * 4
        dst = oa + (r * ps + oh * rs) * 4
        for ow in range(0, wo, 16):
            _pool2(src + ow * 8, pitch * 4, dst + ow * 4, min(16, wo - ow), bo, act)


@kernel
def gemv(y, x, w, b, epi):
    """x (N, K), w (O, K) -> y (N, O) = x @ w.T, for few rows (a linear at batch 1): dot
    products along K, 8 weight rows at a time; parallel over (row, block of outputs). epi 1:
    + b (O,) too, epi 2: then a ReLU (applied to the sums in registers); 0: the plain sums."""
    n, k = x.shape
    o = w.shape[0]
    xa, wa, ya = np.int64(x.ctypes.data), np.int64(w.ctypes.data), np.int64(y.ctypes.data)
    ba, relu = np.int64(b.ctypes.data) if epi != 0 else np.int64(0), np.int64(epi == 2)
    n_o = (o + TILE_O - 1) // TILE_O
    stream = o * k * 4 >= STREAM_W_BYTES  # (see _make_dot's ahead)
    for t in prange(n * n_o):
        i, o0 = t // n_o, (t % n_o) * TILE_O
        xi, wi, yi, rows = xa + i * k * 4, wa + o0 * k * 4, ya + (i * o + o0) * 4, min(TILE_O, o - o0)
        bi = ba + o0 * 4 if epi != 0 else ba
        if stream:
            _dot_ahead(xi, wi, k * 4, yi, k, rows, bi, relu)
        else:
            _dot(xi, wi, k * 4, yi, k, rows, bi, relu)


def tile_cols(m: int) -> int:
    """Columns of a GEMM result for m pixels: whole tiles, the last one possibly a half tile."""
    return -(-m // HALF_P) * HALF_P


@kernel
def gemm(c, w, x, offs, nb, o, m, xs, ws, ldw, cs, ldc, b, epi):
    """nb independent GEMMs: for b < nb, C_b (o, m) = W_b (o, K) @ X_b, K = offs.shape[0],
    where W_b's rows start at w.flat[b*ws] (ldw apart), C_b's at c.flat[b*cs] (ldc apart),
    and X_b's row k at x.flat[b*xs] + offs[k] bytes (every row's tile_cols(m) floats must be
    readable where m % HALF_P == 0; else its last m % HALF_P pixels are read and written
    masked, and only m floats need be). Strides in elements. epi 1: C_b gets + b (O,) too, epi 2: then a ReLU
    (the epilogue of a linear, applied to the tile in registers), 3, 4, 5: SiLU, sigmoid, relu6
    instead (1 + the tiles' MODE_*); 0: the plain sums.

    NOTE: blocked for the caches like any GEMM: a group of GROUP_P pixel tiles x BLOCK_K rows
    of inputs stays in L2 while each channel tile's BLOCK_K weights (8 KiB, in L1) pass over
    all of its tiles; without it, a 256 x 2304 weight matrix (2.4 MB) streamed from L3 once
    per 32 pixels and the GEMM ran at a third of its speed. The parallel loop is over
    (item, pixel group) pairs, split along the channels too when there are fewer than 8; one
    item of a few tiles may split along its pixels instead (gemm_pixels).
    """
    tr = _tile_rows(m, GROUP_P, o, _rows_aligned(x, offs, xs, nb))
    n_g, n_o = _gemm_split(nb, o, m, tr)
    for t in prange(nb * n_g * n_o):
        _gemm_part(t, c, w, x, offs, o, m, xs, ws, ldw, cs, ldc, b, epi, n_g, n_o, tr)


@njit(cache=True)
def _gemm_split(nb, o, m, tr):
    """gemm's parallel parts: (pixel groups, channel splits), tiles of tr channels; the groups
    share the pixel tiles evenly (_group), at most GROUP_P each, the splits the channel tiles
    (_channels)."""
    n_p = (m + TILE_P - 1) // TILE_P  # the last one a half tile when m % TILE_P != 0
    n_g = (n_p + GROUP_P - 1) // GROUP_P
    return n_g, _channel_split(nb * n_g, o, tr)


@njit(cache=True)
def _tile_rows(m, gp, o, aligned):
    """The channels of a GEMM's tiles: WIDE_O where its pixel groups (gp tiles) pair tiles
    and tiles of WIDE_O waste at most 1/64 of the o channels; where every row of inputs
    starts on a cache line (`aligned`), where the last tile, of 6, 4 or 2 channels
    (_gemm_block), wastes at most 1/16 of them.

    NOTE: cnn_cifar's Winograd GEMMs (64 and 128 channels) ran 3% faster in wide tiles on two
    threads; cnn_mnist's second conv (64 channels, its rows at the unaligned shifts of a
    pitch) 51 -> 54 us, when its last tile computed 6 channels for 4."""
    waste = (-o) % WIDE_O
    if gp >= 2 and m > TILE_P + HALF_P and (waste * 64 <= o or (aligned and waste % 2 * 16 <= o)):
        return WIDE_O
    return TILE_O


@njit(cache=True)
def _rows_aligned(x, offs, xs, nb):
    """Whether each of nb items' rows of inputs (gemm's x, offs, xs) starts on a cache line
    (explicit columns; a pitch's rows are shifted by a pixel)."""
    k = offs.shape[0]
    first = (np.int64(x.ctypes.data) + offs[0]) % 64 == 0 if k > 0 else True
    return first and (k < 2 or offs[1] % 64 == 0) and (nb < 2 or xs * 4 % 64 == 0)


@njit(cache=True)
def _channel_split(parts, o, tr):
    """The channel splits for `parts` (item, pixel group) pairs and tiles of tr channels: at
    least 8 parts in all where the channel tiles allow."""
    tiles_o = (o + tr - 1) // tr
    return max(1, min(tiles_o, (8 + parts - 1) // parts))


@njit(cache=True, inline="always")
def _channels(oi, o, n_o, tr):
    """[o0, o1): the channels of split oi of n_o, which share o's tiles of tr channels evenly.

    NOTE: splits of ceil(tiles / n_o) tiles left the last one short: ResNet-18's 256-channel
    convs at 14x14 split 36 x 7 + 4 channels, one thread 144 and the other 112 (1.68x on two
    threads, not 2x)."""
    t0, t1 = _group(oi, (o + tr - 1) // tr, n_o)
    return t0 * tr, min(o, t1 * tr)


@kernel
def gemm_pixels(c, w, x, offs, o, m, ldw, ldc, b, epi, parts):
    """gemm of one item (the same arguments) split along its pixels into `parts` groups of
    whole tiles, all the channels in each; transpose_in(parts) splits its columns the same way.

    NOTE: for one item of a few tiles whose weights stay in each core's L2 (a linear at batch
    64): each core then reads only its own columns of X, which its core just wrote
    (transpose_in, or the GEMM before). Split along the channels, both cores read all of X,
    half of it from the other core's cache: mlp fp32 at batch 64 on 2 threads spent 99 us in
    a GEMM of 78 us of multiply-adds."""
    n_p = (m + TILE_P - 1) // TILE_P
    gp = (n_p + parts - 1) // parts
    n_g = (n_p + gp - 1) // gp
    tr = _tile_rows(m, gp, o, _rows_aligned(x, offs, 0, 1))
    for t in prange(n_g):
        _gemm_part(t, c, w, x, offs, o, m, 0, 0, ldw, 0, ldc, b, epi, n_g, 1, tr)


@njit(cache=True, inline="always")
def _gemm_part(t, c, w, x, offs, o, m, xs, ws, ldw, cs, ldc, b, epi, n_g, n_o, tr):
    """Part t of gemm (same arguments): item t // (n_g*n_o), its pixel group (of the n_g that
    share the item's tiles evenly) and channels (of the n_o splits of its tiles of tr).

    NOTE: the arrays' addresses into _gemm_part_at, compiled once: with the body here, each
    caller's array types (a layout, a read-only flag) compiled it again, ~3 s each and 48 of
    them in the test suite's cache; a new caller type now costs ~1.3 s."""
    i = np.int64  # (one signature whatever integer types the callers pass)
    _gemm_part_at(i(t), i(c.ctypes.data), i(w.ctypes.data), i(x.ctypes.data), i(offs.ctypes.data),
                  i(offs.shape[0]), i(w.size * 4), i(o), i(m), i(xs), i(ws), i(ldw), i(cs), i(ldc),
                  i(b.ctypes.data), i(epi), i(n_g), i(n_o), i(tr))


@njit(cache=True)
def _gemm_part_at(t, ca, wa, xa, oa, k, w_bytes, o, m, xs, ws, ldw, cs, ldc, ba, epi, n_g, n_o, tr):
    """_gemm_part on addresses (bytes): C, W, X, offs, the bias; k = offs' rows, w_bytes W's.

    NOTE: the threads take equal runs of the parts: groups of GROUP_P tiles and a remainder
    left one thread twice the other's pixels where 23 tiles (a 27 x 27 map) split 16 + 7
    (SqueezeNet's 27 x 27 convs ran 1.0-1.5x faster on two threads, not 2x)."""
    relu = np.int64(max(epi - 1, 0))  # the tiles' mode
    n_p = (m + TILE_P - 1) // TILE_P
    item, rest = t // (n_g * n_o), t % (n_g * n_o)
    g = rest // n_o
    ob, oe = _channels(rest % n_o, o, n_o, tr)
    xb, cb = xa + item * xs * 4, ca + (item * cs) * 4
    p0, p1 = _group(g, n_p, n_g)
    n_c = _sub_chunks(p1 - p0, oe - ob, k)
    if n_c > 0:
        tiles_o = (oe - ob + tr - 1) // tr
        for ci in range(n_c):
            t0, t1 = _group(ci, tiles_o, n_c)
            o0, o1 = ob + t0 * tr, min(oe, ob + t1 * tr)
            for q0 in range(p0, p1, 2):
                for k0 in range(0, k, BLOCK_K // 2):
                    nk = min(BLOCK_K // 2, k - k0)
                    _gemm_block(wa + (item * ws + k0) * 4, ldw, xb, oa + k0 * 8, nk, cb, ldc, k0,
                                k0 + nk == k, o0, o1, tr, q0, min(p1, q0 + 2), m, ba, epi, relu)
        return
    kb = _block_k(p1 - p0, m, k, w_bytes)
    for k0 in range(0, k, kb):
        nk = min(kb, k - k0)
        _gemm_block(wa + (item * ws + k0) * 4, ldw, xb, oa + k0 * 8, nk, cb, ldc, k0, k0 + nk == k,
                    ob, oe, tr, p0, p1, m, ba, epi, relu)


@njit(cache=True)
def _sub_chunks(tiles, channels, k):
    """The chunks of a part's channels that each run its pixel tiles two at a time, BLOCK_K // 2
    rows of inputs at a time (32 KiB: they stay in L1 while the chunk's channel tiles pass over
    them; the chunk's weights, at most SUB_W_BYTES, stay in L2); 0: the part runs as one group
    (see _block_k).

    NOTE: the group's inputs (BLOCK_K rows of up to 512 pixels) came from L2 for each channel
    tile, 4 vectors a step: where there are many channels and few pixels, that is what the
    tiles waited on (SqueezeNet's 1000 x 512 @ 512 x 169, one thread: 1.40 -> 1.30 ms; 128 x
    288 @ 288 x 729 455 -> 410 us, 512 x 512 @ 512 x 196 729 -> 685). Few channels (64: 11
    tiles) re-read each chunk's weights for too few tiles (64 x 144 @ 144 x 3025 2% slower, 64
    x 16 @ 16 x 3025 27%), and weights past L2 (256 x 2304) would come from L3 for each pair
    of pixel tiles (5% slower)."""
    if tiles <= 2 or k < 64:
        return 0
    n = -(-channels * k * 4 // SUB_W_BYTES)
    return n if channels // n >= SUB_MIN_O else 0


@njit(cache=True, inline="always")
def _group(g, n_p, n_g):
    """[p0, p1): the tiles of pixel group g of n_g that share n_p tiles evenly."""
    return g * n_p // n_g, (g + 1) * n_p // n_g


@njit(cache=True)
def _block_k(tiles, m, k, w_bytes):
    """The rows of inputs a GEMM takes at a time for a group of `tiles` pixel tiles, its
    weights w_bytes in all.

    NOTE: a group of at most 2 tiles (64 pixels) takes them by the half block: its
    BLOCK_K // 2 rows (32 KiB) then stay in L1 for all the channel tiles (mlp fp32 at batch
    64 on one thread: 199 -> 194 us), unless its weights pass STREAM_W_BYTES: they then come
    from L3 or memory on every call, and all of K at once makes each weight row one long
    stream, which the prefetchers follow (cnn_cifar fp32 at batch 1, its 8x8 convs on two
    threads: 126 -> 119 and 245 -> 227 us; with 1.2 and 2.4 MB of weights). One half tile
    (16 pixels) takes all of K at once too: its inputs stay in L2 anyway."""
    if m <= HALF_P or (tiles <= 2 and w_bytes > STREAM_W_BYTES):
        return max(k, 1)
    return BLOCK_K // 2 if tiles <= 2 else BLOCK_K


@njit(cache=True)
def _gemm_block(wk, ldw, xb, ok, nk, cb, ldc, k0, last, o_lo, o_hi, tr, p0, p1, m, ba, epi, relu):
    """One block of nk rows of K (from k0; `last`: the block that ends K) for channels
    o_lo..o_hi (tiles of tr) and pixel tiles p0..p1: wk is the address of W's row 0 at k0,
    ok that of offs[k0], xb and cb those of X's and C's pixel 0 (see gemm).

    NOTE: each channel tile's first pixel tile prefetches the next channel tile's weights
    (AHEAD): a network's weights come from L3 or memory on every call, in short rows that the
    hardware prefetchers did not run ahead of (ResNet-18's 14x14 Winograd GEMMs, 16 x 256 x 256
    @ 64: ~1.4 ms on one thread after the layers before them, 0.85 ms called twice running;
    the whole model 21.3-22.3 -> 19.5-20.3 ms on one thread, 12.2-12.8 -> 10.8-11.2 on two).
    One pixel tile a channel tile: a prefetch a step in every tile cost ShuffleNetV2 (weights
    that stay in L2) 2-4%."""
    for o0 in range(o_lo, o_hi, tr):
        wr, cr = wk + o0 * ldw * 4, cb + o0 * ldc * 4
        bias = ba + o0 * 4 if epi != 0 and last else np.int64(0)
        rows = min(tr, o_hi - o0)
        ahead = relu | AHEAD if o0 + tr < o_hi else relu
        pt = p0
        while pt < p1:
            args = (wr, ldw * 4, xb + pt * (TILE_P * 4), ok, nk, cr + pt * (TILE_P * 4), ldc * 4, k0,
                    rows, bias, ahead if pt == p0 else relu)
            if tr == WIDE_O and pt + 1 < p1 and (pt + 2) * TILE_P <= m:
                if rows <= 2:
                    _wide2(*args)
                elif rows <= 4:
                    _wide4(*args)
                else:
                    _wide(*args)
                pt += 2
                continue
            if tr == WIDE_O and pt + 1 < p1 and m - pt * TILE_P > TILE_P:  # the last 33..63
                if m - pt * TILE_P > TILE_P + HALF_P:
                    _wide_part(*args, m - pt * TILE_P)
                else:
                    _wide3_part(*args, m - pt * TILE_P)
                pt += 2
                continue
            if tr == WIDE_O:
                _narrow6(args, pt, m, wr, ldw, xb, ok, nk, cr, ldc, k0, rows, bias, relu)
            elif (pt + 1) * TILE_P <= m:
                _tile(*args)
            elif m - pt * TILE_P >= HALF_P:
                _half(*args)
                if m - pt * TILE_P > HALF_P:
                    _tail(wr, ldw * 4, xb + (pt * TILE_P + HALF_P) * 4, ok, nk,
                          cr + (pt * TILE_P + HALF_P) * 4, ldc * 4, k0, rows, bias, relu,
                          m - pt * TILE_P - HALF_P)
            else:
                _tail(*args, m - pt * TILE_P)
            pt += 1


@njit(cache=True)
def _narrow6(args, pt, m, wr, ldw, xb, ok, nk, cr, ldc, k0, rows, bias, relu):
    """_gemm_block's tile pt of at most 32 pixels where the channels take wide tiles: a tile, a
    half tile and a masked tail, of WIDE_O rows (see _tile6).

    NOTE: a function of its own, not inlined: inlined in _gemm_block, ResNet-18's Winograd
    GEMMs (16 x 256 x 256 @ 64, wide tiles only) ran 1.2-1.5x slower in the network."""
    if (pt + 1) * TILE_P <= m:
        _tile6(*args)
    elif m - pt * TILE_P >= HALF_P:
        _half6(*args)
        if m - pt * TILE_P > HALF_P:
            _tail6(wr, ldw * 4, xb + (pt * TILE_P + HALF_P) * 4, ok, nk,
                   cr + (pt * TILE_P + HALF_P) * 4, ldc * 4, k0, rows, bias, relu,
                   m - pt * TILE_P - HALF_P)
    else:
        _tail6(*args, m - pt * TILE_P)


@kernel
def gemm_pool2_pitch(out, c, w, x, offs, nb, o, m, xs, ldw, pitch, b, act):
    """gemm (nb images at a pitch: C_b at c[:, b*m:(b+1)*m], ldc = nb*m) followed, in each
    part, by bias_act_pool2_pitch of the planes it computed, into out (nb, O, Ho, Wo): the
    epilogue reads what its own core just wrote. Each part holds whole images: one pixel
    group of all of an image's tiles (POOL_GROUP_MAX pixels at most)."""
    ho, wo = out.shape[2], out.shape[3]
    n_o, gp, tr = _pool2_split(x, offs, nb, o, m, xs)
    for t in prange(nb * n_o):
        _gemm_part(t, c, w, x, offs, o, m, xs, 0, ldw, m, nb * m, b, 0, 1, n_o, tr)
        item = t // n_o
        ob, oe = _channels(t % n_o, o, n_o, tr)
        for oc in range(ob, oe):
            _pool2_plane(np.int64(out.ctypes.data), np.int64(c.ctypes.data), nb * m, item * o + oc, o, ho,
                         wo, pitch, m, b, act, ho * wo, wo)


@kernel
def gemm_pool2_padded(xpad, hp, wp, ph, pw, ho, wo, c, w, x, offs, nb, o, m, xs, ldw, pitch, b, act):
    """gemm_pool2_pitch whose pooled Ho x Wo planes land in the next conv's padded images:
    xpad in kernels_fp32.pad_images' layout (planes of hp x wp, each map at (ph, pw), zeros
    around it and past the last plane), so that conv needs no pad_images of its own.

    NOTE: cnn_mnist fp32 at batch 1 spent ~2.5 us of ~90 padding its 32 pooled maps."""
    n_o, gp, tr = _pool2_split(x, offs, nb, o, m, xs)
    pa, ca, plane = np.int64(xpad.ctypes.data), np.int64(c.ctypes.data), hp * wp
    for t in prange(nb * n_o):
        _gemm_part(t, c, w, x, offs, o, m, xs, 0, ldw, m, nb * m, b, 0, 1, n_o, tr)
        item = t // n_o
        ob, oe = _channels(t % n_o, o, n_o, tr)
        for oc in range(ob, oe):
            r = item * o + oc
            for j in range(0, plane, 16):  # the plane's zeros (the map overwrites its own)
                _row16(pa, pa + (r * plane + j) * 4, 0, min(16, plane - j), np.float32(0.0))
            _pool2_plane(pa + (ph * wp + pw) * 4, ca, nb * m, r, o, ho, wo, pitch, m, b, act, plane, wp)
    for j in range(nb * o * plane, xpad.shape[0]):
        xpad[j] = np.float32(0.0)


@njit(cache=True)
def _pool2_split(x, offs, nb, o, m, xs):
    """gemm_pool2_pitch's parts: (channel splits, tiles a group, tile rows)."""
    gp = max(GROUP_P, (m + TILE_P - 1) // TILE_P)
    tr = _tile_rows(m, gp, o, _rows_aligned(x, offs, xs, nb))
    return _channel_split(nb, o, tr), gp, tr


def pitch_offsets(c: int, hp: int, wp: int, kh: int, kw: int, dh: int, dw: int) -> np.ndarray:
    """Byte offsets of a stride-1 conv's row k = (c, i, j) in one padded image (see gemm)."""
    ch, i, j = np.meshgrid(np.arange(c), np.arange(kh), np.arange(kw), indexing="ij")
    return (((ch * hp + i * dh) * wp + j * dw) * 4).reshape(-1).astype(np.int64)


def row_offsets(k: int, m: int) -> np.ndarray:
    """Byte offsets of explicit columns (K, M) f32: row k at k * M floats."""
    return np.arange(k, dtype=np.int64) * (m * 4)


def _transposed(builder, rows: list) -> list:
    """The 16 x 16 transpose of 16 row vectors (float32), as 16 row vectors.

    Four butterfly stages (s = 8, 4, 2, 1): rows i and i + s swap the lanes l whose bit s
    differs from i's, which, over all four bits, is the transpose; 64 two-vector shuffles
    (fewer where only some of the rows are used: LLVM drops the rest)."""
    rows = list(rows)
    for s in (8, 4, 2, 1):
        lo = [lane if not lane & s else 16 + lane - s for lane in range(16)]
        hi = [lane + s if not lane & s else 16 + lane for lane in range(16)]
        for i in (i for i in range(16) if not i & s):
            rows[i], rows[i + s] = (_shuffle(builder, rows[i], rows[i + s], lo),
                                    _shuffle(builder, rows[i], rows[i + s], hi))
    return rows


def _make_row16():
    """dst[0:cnt] = src[l] where bit l of `bits` is set, else pad (cnt 1..16; addresses in
    bytes, float32): one masked load (off the mask nothing is read) and one masked store."""

    @intrinsic
    def row16(typingctx, src, dst, bits, cnt, pad):
        sig = types.void(*[types.intp] * 4, types.float32)

        def codegen(context, builder, signature, args):
            src, dst, bits, cnt, pad = args
            ld, st = _masked_io(builder, _VF, 4)
            inside = builder.bitcast(builder.trunc(bits, ir.IntType(16)), ir.VectorType(ir.IntType(1), 16))
            st(ld(src, inside, _splat(builder, pad, _VF)), dst, _lanes_below(builder, cnt))
            return context.get_dummy_value()

        return sig, codegen

    return row16


_row16 = _make_row16()
