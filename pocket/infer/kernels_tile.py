"""float32 GEMM for the portable path (ARM NEON, x86 without AVX-512): a register-tiled kernel
in LLVM vectors of VL floats that every CPU compiles, the bias and activation fused.

    c[o, p] = act(b[o] + sum over k of w[o, k] * x[k, p])      per image, x (K, P), c (O, P)

What it replaces there: kernels_pw.pw_conv (plain Numba, its 8 partial-sum rows going through
memory each 4 steps along K) and BLAS + kernels_fp32.bias_act (a second pass over the output).

One tile keeps ROWS output channels x VECS vectors of pixels in registers (6 x 16 = 12 vectors
of 8: AVX2's 16 ymm registers hold them, the two input vectors and a broadcast weight; NEON's
32 q registers hold them as 24) and, per step along K, loads the inputs' vectors once and
broadcasts each channel's weight into them: 12 multiply-adds per 2 vector loads and 6 scalar
ones, where pw_conv's inner pass did 32 per 12 vector loads and 8 stores. The rest is LLVM's:
`llvm.fmuladd` is one FMA where the CPU has one (a multiply and an add where not), and a
vector of 8 floats is one ymm on AVX2 and two q registers on NEON.

The driver walks blocks of PB pixels (the block's inputs, K x PB floats, stay in L1/L2 while
every channel tile passes over them); a GEMM's last pixels (P % 16) take a narrow tile of 8
and, for the last 1-7, a copy through a zero-padded scratch (no masked loads: NEON has none).

Exactness: each output is one float32 multiply-add chain along K in the weights' order, the
bias added after; it differs from formats/reference.py by float32 rounding, like BLAS.
"""

from __future__ import annotations

import os
import platform

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from pocket.infer.jit import kernel
from pocket.infer.kernels_fp32 import act_inplace
from pocket.infer.kernels_pw import _requant_row
from pocket.infer.kernels_vnni import _const, _loop, _prefetch, _ptr
from pocket.infer.kernels_vnni import _splat as _vsplat

VL = 8  # floats a vector
# NOTE: on ARM the weights load 4 steps at a time as a vector (fmla by element); on x86 one at a
# time as a broadcast load (vbroadcastss from memory is a load; from a register, a shuffle
# whose port the 6 broadcasts a step would saturate). POCKET_TILE_WVECTORS=1 takes the ARM form
# anywhere (its test on x86; a Numba cache of its own, as the kernels differ)
W_VECTORS = (os.environ.get("POCKET_TILE_WVECTORS") == "1"
             or platform.machine().lower() in ("aarch64", "arm64"))
# a tile: output channels x vectors of pixels. ARM's 5 rows: 20 accumulators, the 5 rows'
# weight vectors and 4 of inputs fill 29 of its 32 registers (6 rows spilled)
ROWS, VECS = (5 if W_VECTORS else 6), 2
PIX = VL * VECS  # pixels a tile
PB = 128  # pixels a block (see the module docstring)
AHEAD = 2  # the tiles' fin flag: prefetch the next weights (_make_tile, _block)


def _available() -> bool:
    """The tiles are LLVM IR: they need Numba's JIT; POCKET_FP32_TILE=0 opts out."""
    import numba

    return os.environ.get("POCKET_FP32_TILE", "1") != "0" and not numba.config.DISABLE_JIT


AVAILABLE = _available()

_I32, _F32 = ir.IntType(32), ir.FloatType()
_VF, _V4 = ir.VectorType(_F32, VL), ir.VectorType(_F32, 4)


def _splat(builder, val):
    return _vsplat(builder, val, _VF)


def _row(builder, base, r: int, rows, stride):
    """base + min(r, rows - 1) * stride: a row past the valid ones repeats the last one (it is
    computed and never stored, so a channel tail needs no tile of its own)."""
    rr = builder.select(builder.icmp_signed("<", _const(r), rows), _const(r),
                        builder.sub(rows, _const(1)))
    return builder.add(base, builder.mul(rr, stride))


# fin's bits 2 and 3: hardswish / hardsigmoid applied in the epilogue (set with bit 0 only)
HARD, HARD_SIGMOID = 4, 8


def _hard(builder, t, sig, ty, fma):
    """hardswish(t), or hardsigmoid(t) where sig, for t of type ty (a vector or a float): the
    steps of kernels_actvec (kernels_math._relu6_32 and _div6_32), so the same bits as the
    pass after the tiles that it replaces.

    NOTE: that pass re-read and re-wrote every output at 0.5-0.65 ns an element (16 x 27 @
    12544, MobileNetV3-small's stem: 113 us of 574), where these dozen operations a vector run
    beside the tile's multiply-adds."""
    def k(v):
        return ir.Constant(ty, [v] * ty.count) if isinstance(ty, ir.VectorType) else ir.Constant(ty, v)

    def pick(cmp, a, c, yes, no):
        return builder.select(builder.fcmp_ordered(cmp, a, c), yes, no)

    u = builder.fadd(t, k(3.0))
    u = pick("<", u, k(0.0), k(0.0), u)
    u = pick(">", u, k(6.0), k(6.0), u)
    p = builder.select(sig, u, builder.fmul(t, u))
    q = builder.fmul(p, k(1.0 / 6.0))
    h = builder.call(fma, [builder.call(fma, [builder.fneg(q), k(6.0), p]), k(1.0 / 6.0), q])
    # from 3 on hardswish is t itself (exact; inf stays inf)
    return builder.select(sig, h, pick(">=", t, k(3.0), t, h))


def _make_tile(nv: int, nr: int = ROWS, indexed: bool = False):
    """c[r, 0:VL nv] = lo <= (b[r] + sum over k < nk of w[r, k] * x[k, 0:VL nv]) <= hi for
    r < rows (1..nr); addresses in bytes: w (a K block of a channel group's pack_weights
    panel), x (rows ldx apart), c (rows ldc apart), b. With acc != 0 the sums start from c (a
    later block of K) and, with fin's bit 0 clear, the bias and clamp wait for the last
    block. lo/hi: -inf/inf (none), 0/inf (ReLU), 0/max (clip): NaN passes, as
    kernels_fp32.relu. fin's bit 1 (AHEAD): each step also prefetches the weights that follow
    this block's (the next group's in pack_weights' blocked layout), in address order. Bits
    HARD / HARD_SIGMOID (with bit 0): hardswish / hardsigmoid after the bias (_hard).
    indexed: step k's inputs at x + offs[k], ldx the address of offs (int64 byte offsets:
    a stride-2 conv's taps over its input's phases, gemm_phase)."""

    def codegen(context, builder, signature, args):
        w, x, ldx, nk, c, ldc, acc, rows, b, fin, lo, hi = args
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VF, [_VF] * 3),
                                             f"llvm.fmuladd.v{VL}f32")
        ahead = builder.icmp_signed("!=", builder.and_(fin, _const(AHEAD)), _const(0))
        nxt = builder.add(w, builder.mul(nk, _const(4 * ROWS)))  # the weights after this block's

        def fetch(i, size):
            """prefetch the next weights' i-th run of `size` bytes (a step's, a quad's)"""
            with builder.if_then(ahead):
                _prefetch(builder, builder.add(nxt, builder.mul(i, _const(size))))

        def load(addr):
            return builder.load(_ptr(builder, addr, _VF), align=4)

        c_at = [[builder.add(_row(builder, c, r, rows, ldc), _const(4 * VL * v)) for v in range(nv)]
                for r in range(nr)]
        start = builder.icmp_signed("!=", acc, _const(0))
        init = [builder.select(start, load(a), ir.Constant(_VF, None)) for row in c_at for a in row]

        def madds(k, accs, weight):
            """accs + weight(r) * x's row k for each row r (weight: its vector splat)."""
            if indexed:
                at = builder.add(ldx, builder.mul(k, _const(8)))
                xa = builder.add(x, builder.load(_ptr(builder, at, ir.IntType(64)), align=8))
            else:
                xa = builder.add(x, builder.mul(k, ldx))
            xs = [load(builder.add(xa, _const(4 * VL * v))) for v in range(nv)]
            out = []
            for r in range(nr):
                wb = weight(r)
                out += [builder.call(fma, [wb, xs[v], accs[r * nv + v]]) for v in range(nv)]
            return out

        def step(k0, wa, i, accs):
            """step k0 + i, its weights the i-th ROWS floats from address wa on"""
            wi = builder.add(wa, builder.mul(i, _const(4 * ROWS)))
            return madds(builder.add(k0, i), accs, lambda r: _splat(builder, builder.load(
                _ptr(builder, builder.add(wi, _const(4 * r)), _F32), align=4)))

        if not W_VECTORS:
            def step1(i, accs):
                fetch(i, 4 * ROWS)
                return step(_const(0), w, i, accs)

            final = _loop(builder, nk, init, step1)
        else:
            def step4(i, accs):
                # each row's 4 weights as one vector; each step a lane of it (NEON's fmla by
                # element takes the lane itself: 6 loads per 4 steps, not 24)
                wi = builder.add(w, builder.mul(i, _const(16 * ROWS)))
                fetch(i, 16 * ROWS)
                wv = [builder.load(_ptr(builder, builder.add(wi, _const(16 * r)), _V4), align=4)
                      for r in range(nr)]
                for kk in range(4):
                    lane = ir.Constant(ir.VectorType(_I32, VL), [kk] * VL)
                    accs = madds(builder.add(builder.mul(i, _const(4)), _const(kk)), accs,
                                 lambda r, kk=kk, lane=lane: builder.shuffle_vector(
                                     wv[r], ir.Constant(_V4, ir.Undefined), lane))
                return accs

            quads = builder.ashr(nk, _const(2))
            final = _loop(builder, quads, init, step4)
            tail = builder.shl(quads, _const(2))
            rest = builder.sub(nk, tail)
            wt = builder.add(w, builder.mul(tail, _const(4 * ROWS)))
            final = _loop(builder, rest, final, lambda i, accs: step(tail, wt, i, accs))
        last = builder.icmp_signed("!=", builder.and_(fin, _const(1)), _const(0))
        hard = builder.icmp_signed("!=", builder.and_(fin, _const(HARD)), _const(0))
        sig = builder.icmp_signed("!=", builder.and_(fin, _const(HARD_SIGMOID)), _const(0))
        vlo, vhi = _splat(builder, lo), _splat(builder, hi)
        for r in range(nr):
            with builder.if_then(builder.icmp_signed("<", _const(r), rows)):
                bo = builder.load(_ptr(builder, builder.add(b, _const(4 * r)), _F32), align=4)
                ts = []
                for v in range(nv):
                    t = builder.fadd(final[r * nv + v], _splat(builder, bo))
                    t = builder.select(builder.fcmp_ordered("<", t, vlo), vlo, t)
                    ts.append(builder.select(builder.fcmp_ordered(">", t, vhi), vhi, t))
                with builder.if_else(hard) as (then, other):
                    with then:
                        for v in range(nv):
                            builder.store(_hard(builder, ts[v], sig, _VF, fma),
                                          _ptr(builder, c_at[r][v], _VF), align=4)
                    with other:
                        for v in range(nv):
                            builder.store(builder.select(last, ts[v], final[r * nv + v]),
                                          _ptr(builder, c_at[r][v], _VF), align=4)
        return context.get_dummy_value()

    @intrinsic
    def tile(typingctx, w, x, ldx, nk, c, ldc, acc, rows, b, fin, lo, hi):
        return types.void(*[types.intp] * 10, types.float32, types.float32), codegen

    return tile


_tile, _tile8 = _make_tile(VECS), _make_tile(1)  # 16 pixels; 8 (a GEMM's last ones)
_tile_ix, _tile8_ix = _make_tile(VECS, indexed=True), _make_tile(1, indexed=True)


GROUPS_COLS = 8  # channel groups a call of _cols (8 accumulators; AVX2 has 16 registers)
# the last 1-7 pixels of a block through _cols (x86's weight layout; ARM's quads keep tile8)
COLS_TAIL = not W_VECTORS


def _make_cols():
    """c[g, r, j] = lo <= (b[g, r] + sum over k < nk of w[g, k, r] * x[k, j]) <= hi for the
    last 1-7 pixels j < left of a block (the panel's VL-wide rows at x) and channel groups
    g < ng (<= GROUPS_COLS) of ROWS rows each, the last group's `rows` valid: each group's ROWS
    weights of a step as one vector, the pixel's input broadcast into it. Addresses in
    bytes: group g's weights at w + g * gstride (x86's pack_weights layout: a step's ROWS
    weights together), its row r of outputs at c + (g * ROWS + r) * ldc, its bias at
    b + g * ROWS * 4. acc and fin as _make_tile's (its bits 0, HARD and HARD_SIGMOID).

    Why: tile8 for the last pixels of a block spends a whole vector of 8 pixels' multiply-adds
    per row and step on 1-7 of them, and waits on their chains: on 7 x 7 maps (49 pixels: 3
    tiles and one pixel) that one pixel cost a quarter of the GEMM (192 x 1152 @ 48: 598 us, @ 49:
    753). Here a step is one multiply-add per group for GROUPS_COLS groups.

    Exactness: each output is the same chain as a tile's (its start, then one multiply-add per
    step in K's order, then the bias and the clamp), so the same bits."""
    vr = ir.VectorType(_F32, ROWS)

    def codegen(context, builder, signature, args):
        w, gstride, ng, x, nk, left, c, ldc, acc, rows, b, fin, lo, hi = args
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vr, [vr] * 3),
                                             f"llvm.fmuladd.v{ROWS}f32")
        last_g = builder.sub(ng, _const(1))
        gs = [builder.select(builder.icmp_signed("<", _const(g), ng), _const(g), last_g)
              for g in range(GROUPS_COLS)]
        start = builder.icmp_signed("!=", acc, _const(0))
        done = builder.icmp_signed("!=", builder.and_(fin, _const(1)), _const(0))
        hard = builder.icmp_signed("!=", builder.and_(fin, _const(HARD)), _const(0))
        sig = builder.icmp_signed("!=", builder.and_(fin, _const(HARD_SIGMOID)), _const(0))
        fma1 = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_F32, [_F32] * 3),
                                              "llvm.fmuladd.f32")
        rows_g = [builder.select(builder.icmp_signed("<", _const(g), last_g), _const(ROWS), rows)
                  for g in range(GROUPS_COLS)]

        def out_at(g, r, j):
            # (rows past the valid ones repeat the last valid one, as _row: read, never stored)
            rr = builder.select(builder.icmp_signed("<", _const(r), rows_g[g]), _const(r),
                                builder.sub(rows_g[g], _const(1)))
            row = builder.add(builder.mul(gs[g], _const(ROWS)), rr)
            return builder.add(builder.add(c, builder.mul(row, ldc)), builder.mul(j, _const(4)))

        def pixel(j, carried):
            init = []
            for g in range(GROUPS_COLS):
                v = ir.Constant(vr, None)
                for r in range(ROWS):
                    old = builder.load(_ptr(builder, out_at(g, r, j), _F32), align=4)
                    v = builder.insert_element(v, builder.select(start, old, ir.Constant(_F32, 0.0)),
                                               ir.Constant(_I32, r))
                init.append(v)

            def step(k, accs):
                xv = builder.load(_ptr(builder, builder.add(x, builder.mul(
                    builder.add(builder.mul(k, _const(VL)), j), _const(4))), _F32), align=4)
                xb = _vsplat(builder, xv, vr)
                out = []
                for g in range(GROUPS_COLS):
                    wa = builder.add(builder.add(w, builder.mul(gs[g], gstride)),
                                     builder.mul(k, _const(4 * ROWS)))
                    wv = builder.load(_ptr(builder, wa, vr), align=4)
                    out.append(builder.call(fma, [wv, xb, accs[g]]))
                return out

            final = _loop(builder, nk, init, step)
            for g in range(GROUPS_COLS):
                for r in range(ROWS):
                    keep = builder.and_(builder.icmp_signed("<", _const(g), ng),
                                        builder.icmp_signed("<", _const(r), rows_g[g]))
                    with builder.if_then(keep):
                        val = builder.extract_element(final[g], ir.Constant(_I32, r))
                        ba = builder.add(b, builder.mul(builder.add(
                            builder.mul(gs[g], _const(ROWS)), _const(r)), _const(4)))
                        t = builder.fadd(val, builder.load(_ptr(builder, ba, _F32), align=4))
                        t = builder.select(builder.fcmp_ordered("<", t, lo), lo, t)
                        t = builder.select(builder.fcmp_ordered(">", t, hi), hi, t)
                        t = builder.select(hard, _hard(builder, t, sig, _F32, fma1), t)
                        builder.store(builder.select(done, t, val),
                                      _ptr(builder, out_at(g, r, j), _F32), align=4)
            return []

        _loop(builder, left, [], pixel)
        return context.get_dummy_value()

    @intrinsic
    def cols(typingctx, w, gstride, ng, x, nk, left, c, ldc, acc, rows, b, fin, lo, hi):
        return types.void(*[types.intp] * 12, types.float32, types.float32), codegen

    return cols


_cols = _make_cols()


@intrinsic
def _copy_pix(typingctx, dst, src, like):
    """float32 dst[0:PIX] = src[0:PIX] (addresses; src of like's dtype: float32, or int8 codes
    converted): one vector load and store, where LLVM left the packing loop scalar (it cannot
    tell that the panel and x do not overlap) at 1.2 cycles an element."""
    is_int = isinstance(like.dtype, types.Integer)

    def codegen(context, builder, signature, args):
        d, s, _ = args
        vt = ir.VectorType(ir.IntType(8) if is_int else _F32, PIX)
        v = builder.load(_ptr(builder, s, vt), align=1 if is_int else 4)
        if is_int:
            v = builder.sitofp(v, ir.VectorType(_F32, PIX))
        builder.store(v, _ptr(builder, d, ir.VectorType(_F32, PIX)), align=4)
        return context.get_dummy_value()

    return types.void(types.intp, types.intp, like), codegen


BLOCK_K = 128  # rows of inputs a pass: a block's panel (BLOCK_K x PB floats) stays in L2


@njit(cache=True, inline="always")
def k_block(k):
    """The rows along K a pass: K in even blocks of at most BLOCK_K (147: 76 + 71, not 128 +
    19), each a multiple of 4 but the last (ARM's weight quads never straddle two blocks)."""
    return (-(-k // -(-k // BLOCK_K)) + 3) // 4 * 4


def pack_weights(w: np.ndarray, blocked: bool = True) -> np.ndarray:
    """w (O, K) float32 -> the tiles' weights (groups of ROWS channels, K * ROWS floats each),
    made once at load: a group's weights in the order its tiles read them, one sequential
    stream (read in place, the ROWS rows of a 1000 x 512 layer's weights were K floats apart
    and came from L3 at each pass: 8% of its time). x86: step k's ROWS weights together; ARM
    (W_VECTORS): steps 4q..4q+3 of each row together, then K % 4 single steps. Rows past O
    are zeros (their outputs are computed, never stored).

    blocked (gemm_act's layout): the groups' chunks of each block of K (k_block) together,
    block after block, so that a pass over the groups reads one stream; gemm_q, which takes
    the whole of K a pass, reads them unblocked (group after group)."""
    o, k = w.shape
    g = -(-o // ROWS)
    t = np.zeros((g * ROWS, k), np.float32)
    t[:o] = w
    t = t.reshape(g, ROWS, k)
    if not W_VECTORS:
        t = np.ascontiguousarray(t.transpose(0, 2, 1)).reshape(g, k * ROWS)
    else:
        k4 = k - k % 4
        quads = t[:, :, :k4].reshape(g, ROWS, k4 // 4, 4).transpose(0, 2, 1, 3).reshape(g, k4 * ROWS)
        rest = t[:, :, k4:].transpose(0, 2, 1).reshape(g, (k - k4) * ROWS)
        t = np.concatenate([quads, rest], axis=1)
    if not blocked:
        return np.ascontiguousarray(t)
    # NOTE: a block's chunk of a group is the same floats either way (k_block's blocks are
    # multiples of 4 but the last, so ARM's quads never straddle two); only their order moves.
    # Group after group, a pass over the groups read nk * ROWS floats and skipped the rest of
    # each group: the prefetchers lost the stream at every skip, and in a model's sequence
    # (weights from L3) EfficientNet-B0's 1152 x 192 @ 49 ran in 445 us, 269 when repeated
    kb = k_block(k)
    chunks = [t[:, k0 * ROWS:min(k, k0 + kb) * ROWS].reshape(-1) for k0 in range(0, k, kb)]
    return np.concatenate(chunks).reshape(g, k * ROWS)


@njit(cache=True)
def clamp_of(act, alpha):
    """(lo, hi, rest, bits): the tile's clamp for activation code `act` (kernels_fp32.ACT),
    whether the driver applies the activation after the tiles (act_inplace) instead, and the
    bits of the tiles' last step (fin) that apply it in their epilogue (hardswish,
    hardsigmoid)."""
    if act == 0:
        return -np.inf, np.inf, False, 0
    if act == 1:
        return 0.0, np.inf, False, 0
    if act == 9:
        return 0.0, float(np.float32(alpha)), False, 0
    if act == 7:
        return -np.inf, np.inf, False, HARD
    if act == 8:
        return -np.inf, np.inf, False, HARD | HARD_SIGMOID
    return -np.inf, np.inf, True, 0


def scratch_floats(k: int) -> int:
    """A part's scratch (floats): a panel of min(K, BLOCK_K) x (PB + VL) inputs and a tail
    tile's ROWS x VL outputs."""
    return min(k, BLOCK_K) * (PB + VL) + ROWS * VL


def _weights(w, img):
    """Image img's weights: w itself (2-D, every image's), or w[img] (3-D: one each)."""


@overload(_weights, inline="always")
def _weights_impl(w, img):
    if w.ndim == 3:
        return lambda w, img: w[img]
    return lambda w, img: w


@kernel
def gemm_act(c, w, x, b, scratch, act, alpha):
    """c (N, O, P) = act(w @ x[i] (K, P) + b (O,)) for each image i, w the (O, K) weights as
    pack_weights lays them, or (N, groups, K * ROWS) such layouts stacked, image i's own
    weights (Winograd's 16 GEMMs in one call: its tasks spread over the threads, where 16
    calls would wait for them 16 times); b holds O floats (zeros without a bias); scratch
    (parts, scratch_floats(K)) float32, one row a part. Parallel over (image, pixel block,
    channel group) tasks in `parts` contiguous runs."""
    parts = scratch.shape[0]
    nb, ng, _ = _tasks(x, c.shape[1])
    for part in prange(parts):
        t0, t1 = _span(part, parts, x, nb, ng), _span(part + 1, parts, x, nb, ng)
        while t0 < t1:  # one (image, block) and its channel groups in this part at a time
            img, p0, g0, g1 = _run(t0, t1, nb, ng)
            _block(c, _weights(w, img), x, b, scratch[part], act, alpha, img, p0, g0, g1)
            t0 += g1 - g0
    if clamp_of(act, alpha)[2]:
        # NOTE: SiLU, hardswish, ...: one pass over the whole output after the tiles, not one a
        # block row of at most PB pixels: over 128 outputs SiLU's vector loop ran latency-bound
        # (1.5 ns an output against 0.8-0.9 over long runs; MobileNetV3-Small fp32 0.90x,
        # EfficientNet-B0 0.98x); the output is re-read from L2/L3, which the activation's
        # arithmetic hides
        cf, size = c.reshape(-1), c.size
        for part in prange(parts):
            lo, hi = part * size // parts, (part + 1) * size // parts
            act_inplace(cf, lo, hi - lo, np.float32(0.0), act, alpha)


# a solo call runs these as one part (bound.solo): parts only split the (image, pixel block,
# channel group) tasks, each computed the same way in any part, and the activation pass by
# element
gemm_act.one_part = (4,)


@njit(cache=True, inline="always")
def _tasks(x, o):
    """(pixel blocks an image, channel groups, tasks) of a GEMM of O channels over x (N, K, P)."""
    nb, ng = (x.shape[2] + PB - 1) // PB, (o + ROWS - 1) // ROWS
    return nb, ng, x.shape[0] * nb * ng


@njit(cache=True, inline="always")
def _cost(t, p, nb, ng):
    """The pixels (whole vectors) of the tasks before task t, tasks in (image, pixel block,
    channel group) order: every block PB pixels but each image's last."""
    last = (p - (nb - 1) * PB + VL - 1) // VL * VL
    per_img = ng * ((nb - 1) * PB + last)
    img, r = t // (nb * ng), t % (nb * ng)
    ib, g = r // ng, r % ng
    return img * per_img + ib * ng * PB + g * (PB if ib < nb - 1 else last)


@njit(cache=True)
def _span(part, parts, x, nb, ng):
    """The first task of `part`: where the tasks' pixels pass part / parts of the whole."""
    # NOTE: split by pixels, not by task count: a 13 x 13 map is a block of 128 pixels and one
    # of 41, and two parts of equal task counts got one each (SqueezeNet's 1000 x 512 conv at
    # 2 threads: 1.5x the even split's time); so did 3.5 blocks of 128 and 2.5 + 16 pixels
    # of a 28 x 28 map. A part may now start inside a block's channel groups
    tasks = x.shape[0] * nb * ng
    if part >= parts:
        return tasks
    target = _cost(tasks, x.shape[2], nb, ng) * part // parts
    lo, hi = 0, tasks
    while lo < hi:  # the first task whose pixels before it reach target
        mid = (lo + hi) // 2
        if _cost(mid, x.shape[2], nb, ng) < target:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True, inline="always")
def _run(t0, t1, nb, ng):
    """The tasks from t0 on (before t1) that share t0's (image, pixel block): (image, its
    block's first pixel, first channel group, end group)."""
    ib, g0 = t0 // ng, t0 % ng
    return ib // nb, (ib % nb) * PB, g0, min(ng, g0 + t1 - t0)


# NOTE: the panel pays from about 8 channel groups on: with fewer, copying the inputs cost more
# than it saved (16 x 27 @ 27 x 12544: 300 -> 446 us) and the tiles read x in place
PACK_GROUPS = 8


@njit(cache=True)
def _block(c, w, x, b, scratch, act, alpha, img, p0, g0, g1):
    """Channel groups [g0, g1) (of ROWS) of image img's pixels [p0, p0 + PB). With PACK_GROUPS
    groups or more, each block of K is packed into a panel first (tile by tile, then VL-wide
    rows, zeros past p) and every group's tiles read it; with fewer, the tiles read x in place
    and only the last 1-7 pixels go through the panel."""
    n, k, p = x.shape
    o = c.shape[1]
    p1 = min(p, p0 + PB)
    m = p1 - p0
    full = m // PIX * PIX  # pixels in whole tiles
    packed = g1 - g0 >= PACK_GROUPS
    lo, hi, _, hard = clamp_of(act, alpha)  # (any other activation: gemm_act's pass after)
    flo, fhi = np.float32(lo), np.float32(hi)
    wa, xa, ca, ba = (np.int64(w.ctypes.data), np.int64(x.ctypes.data), np.int64(c.ctypes.data),
                      np.int64(b.ctypes.data))
    sa = np.int64(scratch.ctypes.data)
    nkb = min(k, BLOCK_K)
    ca_tail = sa + nkb * (PB + VL) * 4  # the tail tile's outputs (ROWS x VL)
    cs = scratch[nkb * (PB + VL):nkb * (PB + VL) + ROWS * VL]
    ld = p * 4
    kb = k_block(k)
    for k0 in range(0, k, kb):
        nk = min(kb, k - k0)
        if packed:
            _pack(scratch, x, img, k0, nk, p0, m, full, 0)
        elif m % VL:
            _pack(scratch, x, img, k0, nk, p0, m, full, m - m % VL)
        xk = xa + ((img * k + k0) * p + p0) * 4
        fin, first = np.int64(k0 + nk == k), np.int64(k0 > 0)
        if fin:
            fin |= hard
        for g in range(g0, g1):
            o0 = g * ROWS
            rows = min(ROWS, o - o0)
            # (pack_weights' blocked layout: block k0's chunks after those of the blocks
            # before it, G groups of k0 rows each, nk * ROWS floats a group)
            wk = wa + (k0 * w.shape[0] + g * nk) * ROWS * 4
            ci, bb = ca + ((img * o + o0) * p + p0) * 4, ba + o0 * 4
            for q in range(0, full, PIX):
                fq = fin | AHEAD if q == 0 else fin
                if packed:
                    _tile(wk, sa + q * nk * 4, PIX * 4, nk, ci + q * 4, ld, first, rows, bb,
                          fq, flo, fhi)
                else:
                    _tile(wk, xk + q * 4, ld, nk, ci + q * 4, ld, first, rows, bb, fq, flo,
                          fhi)
            for q in range(full, m, VL):  # the panel's VL-wide rows
                xq = sa + q * nk * 4
                if q + VL <= m:
                    if packed:
                        _tile8(wk, xq, VL * 4, nk, ci + q * 4, ld, first, rows, bb, fin, flo,
                               fhi)
                    else:
                        _tile8(wk, xk + q * 4, ld, nk, ci + q * 4, ld, first, rows, bb, fin,
                               flo, fhi)
                    continue
                if COLS_TAIL:
                    break  # (the last 1-7 pixels of every group: _cols, after the groups)
                # NOTE: the last 1-7 pixels: the panel is zero past them, the outputs go
                # through cs (the sums so far in, the results out)
                left = m - q
                if k0 > 0:
                    for r in range(rows):
                        for j in range(left):
                            cs[r * VL + j] = c[img, o0 + r, p0 + q + j]
                _tile8(wk, xq, VL * 4, nk, ca_tail, VL * 4, first, rows, bb, fin, flo, fhi)
                for r in range(rows):
                    for j in range(left):
                        c[img, o0 + r, p0 + q + j] = cs[r * VL + j]
        tq = m - m % VL
        if COLS_TAIL and tq < m:
            for gc in range(g0, g1, GROUPS_COLS):
                ngc = min(GROUPS_COLS, g1 - gc)
                o0 = gc * ROWS
                _cols(wa + (k0 * w.shape[0] + gc * nk) * ROWS * 4, nk * ROWS * 4, ngc,
                      sa + tq * nk * 4, nk, m - tq, ca + ((img * o + o0) * p + p0 + tq) * 4, ld,
                      first, min(ROWS, o - (gc + ngc - 1) * ROWS), ba + o0 * 4, fin, flo, fhi)


@njit(cache=True, inline="always")
def _pack(panel, x, img, k0, nk, p0, m, full, start):
    """panel = x[img, k0:k0 + nk, p0:p0 + m] from pixel `start` on, tile by tile: nk PIX-wide
    rows for each whole tile (the panel's first full * nk floats), then nk VL-wide rows for
    each VL pixels after, zeros past m. Pixel q's rows start at panel[q * nk]."""
    # NOTE: row by row (each row's pixels a contiguous run): tile by tile, a 12544-pixel
    # map's rows (50 KB apart, so all in 4 of L1's sets) were read a line each, and the 7x7
    # stem of ResNet-18 ran at 0.75x of BLAS
    tail = max(start, full)
    pa, xa, size = np.int64(panel.ctypes.data), np.int64(x.ctypes.data), x.itemsize
    for kk in range(nk):
        row = xa + ((img * x.shape[1] + k0 + kk) * x.shape[2] + p0) * size
        for q in range(start, full, PIX):
            _copy_pix(pa + (q * nk + kk * PIX) * 4, row + q * size, x)
        for q in range(tail, m, VL):
            d = np.uint64(q * nk + kk * VL)
            for j in range(VL):
                panel[d + np.uint64(j)] = (x[img, k0 + kk, p0 + q + j] if q + j < m
                                           else np.float32(0.0))


# --------------------------------------------------------------------------- phases
#
# A stride-2 conv read over its input's four phases (kernels_phase.split_phases): tap k of
# output (oh, ow) is the phase plane's float at oh * Wq + ow + offs[k] / 4, so each output
# row is a GEMM whose rows of K are constant shifts of one flat array (the indexed tiles),
# with no im2col columns written and read again.


def phase_slack(wq: int) -> int:
    """Floats past the last phase plane that a row's last tile may read (its junk pixels)."""
    return wq + PIX


@kernel
def gemm_phase(y, w, xq, wq, offs, b, cs, act, alpha):
    """y (O, Ho, Wo) = act(conv of one image) with xq its phases (kernels_phase.split_phases:
    planes of Hq x Wq, then phase_slack(Wq) zeros), offs the K
    taps' byte offsets (kernels_phase.phase_offsets), w the (O, K) weights as pack_weights
    lays them unblocked, b O floats; cs (parts, ROWS * VL) float32 (a row's last 1-7 pixels).
    Parallel over output rows in `parts` runs. One chain along K per output, as gemm_act's."""
    o, ho, wo = y.shape
    k = offs.shape[0]
    parts = cs.shape[0]
    lo, hi, rest, hard = clamp_of(act, alpha)
    flo, fhi = np.float32(lo), np.float32(hi)
    fin = np.int64(1) | hard
    ng = (o + ROWS - 1) // ROWS
    full = wo // PIX * PIX
    plane = ho * wo
    wa, xa, ya, ba = (np.int64(w.ctypes.data), np.int64(xq.ctypes.data), np.int64(y.ctypes.data),
                      np.int64(b.ctypes.data))
    oa = np.int64(offs.ctypes.data)
    for part in prange(parts):
        ct = cs[part]
        cta = np.int64(ct.ctypes.data)
        end = (part + 1) * ho // parts
        for oh in range(part * ho // parts, end):
            xr = xa + oh * wq * 4
            # NOTE: a row's last pixels as one more whole tile where its lanes past the row
            # land in the part's next rows (written after: rows in order; never past the part)
            # and read junk columns of the phases, at most 15 past the row, where the image's
            # last row already reads 7 past itself a row further on (phase_slack).
            # SqueezeNet's 111-wide rows took a tile of 8 and 7 pixels through ct a group:
            # its stem 0.84-0.86x (interleaved, same bytes)
            top = -(-wo // PIX) * PIX
            spill = oh * wo + top <= end * wo  # (a narrow row's tile spans rows after it)
            if not spill:
                top = full
            for g in range(ng):
                o0 = g * ROWS
                rows = min(ROWS, o - o0)
                wk, bb = wa + g * k * ROWS * 4, ba + o0 * 4
                yr = ya + (o0 * plane + oh * wo) * 4
                for q in range(0, top, PIX):
                    _tile_ix(wk, xr + q * 4, oa, k, yr + q * 4, plane * 4, 0, rows, bb,
                             fin | AHEAD if q == 0 else fin, flo, fhi)
                if spill:
                    continue
                q = full
                if q + VL <= wo:
                    _tile8_ix(wk, xr + q * 4, oa, k, yr + q * 4, plane * 4, 0, rows, bb, fin,
                              flo, fhi)
                    q += VL
                if q < wo:  # the last 1-7 pixels through ct (the tile reads junk past them)
                    _tile8_ix(wk, xr + q * 4, oa, k, cta, VL * 4, 0, rows, bb, fin, flo, fhi)
                    for r in range(rows):
                        for j in range(wo - q):
                            y[o0 + r, oh, q + j] = ct[r * VL + j]
    if rest:
        yf, size = y.reshape(-1), y.size
        for part in prange(parts):
            a0, a1 = part * size // parts, (part + 1) * size // parts
            act_inplace(yf, a0, a1 - a0, np.float32(0.0), act, alpha)


# --------------------------------------------------------------------------- int8
#
# The codes multiplied as float32 (kernels_pw's argument): every product and partial sum is an
# integer below K * 128 * 127 < 2**24 for K <= kernels_int8.EXACT_K, so the tiles' sums are
# exact in any order, and kernels_pw's requantizing rows make the output bit for bit the
# reference's. The panel holds the block's whole K (the packing converts the codes), the sums
# of one channel group go to a scratch of ROWS rows, and the group's rows are requantized from
# there while they are in L1.


def scratch_floats_q(k: int) -> int:
    """gemm_q's scratch a part (floats): the panel (K x (PB + VL)), the sums (ROWS x (PB + VL))
    and ROWS zeros (the tiles' bias)."""
    return k * (PB + VL) + ROWS * (PB + VL) + ROWS


@kernel
def gemm_q(out, w, x, bias_adj, m, to_int8, y_zp, lo, relu, scratch):
    """out (N, O, P) int8 or float32 = kernels_pw.pw_conv_q's epilogue of the exact sums of
    w @ x[i] (K, P) int8 codes (or their float32 values: im2col columns), w the (O, K) codes as
    float32 laid by pack_weights, K <= kernels_int8.EXACT_K or weights whose 128 x sum |w_q| per
    channel stays within 2**24 (routes.base.ConvGeometry.w_l1); scratch (parts,
    scratch_floats_q(K)) float32."""
    parts = scratch.shape[0]
    nb, ng, _ = _tasks(x, out.shape[1])
    for part in prange(parts):
        t0, t1 = _span(part, parts, x, nb, ng), _span(part + 1, parts, x, nb, ng)
        while t0 < t1:
            img, p0, g0, g1 = _run(t0, t1, nb, ng)
            _block_q(out, w, x, bias_adj, m, to_int8, y_zp, lo, relu, scratch[part], img, p0,
                     g0, g1)
            t0 += g1 - g0


gemm_q.one_part = (9,)  # (as gemm_act's)


@njit(cache=True)
def _block_q(out, w, x, bias_adj, m, to_int8, y_zp, lo, relu, scratch, img, p0, g0, g1):
    n, k, p = x.shape
    o = out.shape[1]
    m_ = min(p, p0 + PB) - p0
    full = m_ // PIX * PIX
    lda = PB + VL
    _pack(scratch, x, img, 0, k, p0, m_, full, 0)
    at = k * lda  # the sums' rows, then the zeros
    zb = scratch[at + ROWS * lda:at + ROWS * lda + ROWS]
    zb[:] = 0.0
    wa, sa = np.int64(w.ctypes.data), np.int64(scratch.ctypes.data)
    aa, ba = sa + at * 4, sa + (at + ROWS * lda) * 4
    inf = np.float32(np.inf)
    of = out.reshape(-1)
    for g in range(g0, g1):
        o0 = g * ROWS
        rows = min(ROWS, o - o0)
        wk = wa + g * k * ROWS * 4
        for q in range(0, full, PIX):  # (the first prefetches the next group's weights)
            _tile(wk, sa + q * k * 4, PIX * 4, k, aa + q * 4, lda * 4, 0, rows, ba,
                  1 | AHEAD if q == 0 else 1, -inf, inf)
        for q in range(full, m_, VL):  # the panel's VL-wide rows (their last may run past m_)
            _tile8(wk, sa + q * k * 4, VL * 4, k, aa + q * 4, lda * 4, 0, rows, ba, 1, -inf,
                   inf)
        for r in range(rows):
            _requant_row(of, (img * o + o0 + r) * p + p0, scratch, at + r * lda, m_,
                         bias_adj[o0 + r], m[o0 + r], y_zp, lo, to_int8, relu)
