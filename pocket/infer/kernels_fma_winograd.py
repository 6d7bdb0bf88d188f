"""Winograd F(2x2, 3x3) for fp32 convs on x86 CPUs with AVX-512 (see kernels_winograd for the
method and the portable version, kernels_fma for the GEMM).

The three transforms (`filter_transform`, `input_transform`, `output_transform`) are vector
twins of kernels_winograd's that equal them bit for bit (the same float32 operations in the
same order): 16 filters, or 16 tiles of a tile row, a step, with masked loads and stores at
the ends, where LLVM left the scalar loops of kernels_winograd mostly scalar.

The input transform reads the images unpadded, the padding masked off its loads: a padded
copy cost as much as a quarter of the transform (cnn_cifar fp32 at batch 1: ~30 µs of 1.2 ms).

`fused_conv` runs a whole batch in one kernel: each thread takes its share of the images in chunks
and runs the input transform, the 16 GEMMs and the output transform (with the bias, ReLU and
a fused 2x2 pool) on each chunk in its own part of the scratch, sized to stay in its core's
L2. As four parallel kernels a chunk, V and M (16 x C and 16 x O floats a tile) went out to
L3 between them, or, in chunks small enough for L2, the threads waited on each other four
times a chunk.

NaN propagates through the fused ReLU and the pool's max (kernels_fma._bias_relu and _vmax), as
in kernels_winograd and formats/reference.py.

Used only when kernels_fma.AVAILABLE.
"""

from __future__ import annotations

from functools import partial

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from pocket.infer.jit import kernel
from pocket.infer.kernels_fma import (
    _VF,
    HALF_P,
    TILE_O,
    _bias_relu,
    _half,
    _make_tile,
    _relu,
    _shuffle,
    _tile,
    _transposed,
    _vmax,
    tile_cols,
)
from pocket.infer.kernels_vnni import _const, _lanes_below, _masked_io, _splat

# The GEMMs' tile: 8 channels x 48 tiles (24 accumulators), the last 16 or 32 by kernels_fma's.
# With K = C as short as 32 a tile's setup and stores weigh more: on (64 x 32) @ (32 x 304),
# 79 GMAC/s against 67 with kernels_fma's 8 x 32.
_wide = _make_tile(3)

# V (16, C*cols) and M (16, O*cols) have rows this many floats longer: their transforms write
# (read) all 16 rows at once, and at C*cols a multiple of 1024 these fell in one L1 set (the
# input transform ran 1.4-4x slower)
VM_SKEW = 16


def _make_filter16():
    """u[e, l] = (G g_l G^T)[e] for the l < cnt (1..16) filters g_l = w[l, 0:9] (float32, 36
    bytes apart); u's rows ldu bytes apart. The same float32 operations, in the same order, as
    kernels_winograd.filter_transform, on 16 filters at once: 16 masked loads of a filter
    each, transposed in registers into the 9 vectors of element e of every filter, 16 vector
    stores.

    NOTE: the scalar transform stored 16 floats per filter one at a time, 16 rows apart, and
    was store-bound (~20 cycles a filter: 217 us of cnn_cifar fp32's 2.6 ms at batch 1); 9
    gathers in place of the loads and the transpose took ~9 cycles a filter."""

    @intrinsic
    def block(typingctx, w, u, ldu, cnt):
        sig = types.void(*[types.intp] * 4)

        def codegen(context, builder, signature, args):
            w, u, ldu, cnt = args
            ld, st = _masked_io(builder, _VF, 4)
            mask = _lanes_below(builder, cnt)
            nine = _lanes_below(builder, _const(9))
            none = ir.Constant(nine.type, None)
            filters = [ld(builder.add(w, _const(36 * lane)),
                          builder.select(builder.icmp_signed("<", _const(lane), cnt), nine, none))
                       for lane in range(16)]
            g = _transposed(builder, filters)[:9]  # g[e]: element e of the 16 filters
            h = ir.Constant(_VF, [0.5] * 16)
            add, sub = builder.fadd, builder.fsub
            t1 = [builder.fmul(h, add(add(g[j], g[3 + j]), g[6 + j])) for j in range(3)]
            t2 = [builder.fmul(h, add(sub(g[j], g[3 + j]), g[6 + j])) for j in range(3)]
            outs = []
            for a, b, c in (g[0:3], t1, t2, g[6:9]):
                outs += [a, builder.fmul(h, add(add(a, b), c)), builder.fmul(h, add(sub(a, b), c)), c]
            for e, val in enumerate(outs):
                st(val, builder.add(u, builder.mul(_const(e), ldu)), mask)
            return context.get_dummy_value()

        return sig, codegen

    return block


_filter16 = _make_filter16()


@kernel
def filter_transform(u, w9):
    """kernels_winograd.filter_transform (same arguments, same results bit for bit), 16
    filters a step."""
    n = w9.shape[0]
    wa, ua, ldu = np.int64(w9.ctypes.data), np.int64(u.ctypes.data), np.int64(u.strides[0])
    for blk in prange((n + 15) // 16):
        r0 = blk * 16
        _filter16(wa + r0 * 36, ua + r0 * 4, ldu, min(16, n - r0))


def _make_input16():
    """The input transform of cnt (1..16) consecutive tiles of one tile row, read from an
    unpadded image: x (bytes) is where the row's first input row at the first tile's column
    would be, ldx bytes between input rows; of the 48 columns from x, lanes lo..hi-1 lie in
    the image, and input row r (0..3) does where bit r of `rows` is set; the rest read as
    zeros (the padding) and are never touched. Writes (B^T d B)[e] of tile l to dst + e*lde
    + 4l. The same float32 operations, in the same order, as kernels_winograd.input_transform
    on the padded image: B^T d along the rows first (on 48 loaded columns), then along the
    columns, the even and odd columns split by shuffles."""

    @intrinsic
    def tiles(typingctx, x, ldx, dst, lde, cnt, lo, hi, rows_in):
        sig = types.void(*[types.intp] * 8)

        def codegen(context, builder, signature, args):
            x, ldx, dst, lde, cnt, lo, hi, rows_in = args
            ld, st = _masked_io(builder, _VF, 4)
            need = builder.add(builder.mul(cnt, _const(2)), _const(2))  # columns read
            end = builder.select(builder.icmp_signed("<", hi, need), hi, need)
            masks = [builder.and_(_lanes_below(builder, builder.sub(end, _const(16 * q))),
                                  builder.not_(_lanes_below(builder, builder.sub(lo, _const(16 * q)))))
                     for q in range(3)]
            none = ir.Constant(masks[0].type, None)
            rows = []
            for r in range(4):
                at = builder.add(x, builder.mul(ldx, _const(r)))
                inside = builder.icmp_signed("!=", builder.and_(rows_in, _const(1 << r)), _const(0))
                rows.append([ld(builder.add(at, _const(64 * q)), builder.select(inside, masks[q], none))
                             for q in range(3)])
            sub, add = builder.fsub, builder.fadd
            t = [[op(rows[a][q], rows[b][q]) for q in range(3)]  # B^T d, row by row
                 for op, a, b in ((sub, 0, 2), (add, 1, 2), (sub, 2, 1), (sub, 1, 3))]
            evens, odds, shift = list(range(0, 32, 2)), list(range(1, 32, 2)), list(range(2, 18))
            store_mask = _lanes_below(builder, cnt)
            for i, (a, b, c) in enumerate(t):
                a2, b2 = _shuffle(builder, a, b, shift), _shuffle(builder, b, c, shift)
                e0, o0 = _shuffle(builder, a, b, evens), _shuffle(builder, a, b, odds)
                e1, o1 = _shuffle(builder, a2, b2, evens), _shuffle(builder, a2, b2, odds)
                for k, val in enumerate((sub(e0, e1), add(o0, e1), sub(e1, o0), sub(o0, o1))):
                    st(val, builder.add(dst, builder.mul(lde, _const(4 * i + k))), store_mask)
            return context.get_dummy_value()

        return sig, codegen

    return tiles


_input16 = _make_input16()


@kernel
def input_transform(v, x, tmp, th_n, tw_n, ph, pw):
    """kernels_winograd.input_transform (same results bit for bit; tmp unused) read from the
    unpadded images x (N, C, H, W), padded by (ph, pw) with zeros, 16 tiles of a tile row a
    step. V's columns past the N images' tiles (the GEMM's last tile) get zeros.

    NOTE: the zeros with each channel's last plane, in the cache of the core that wrote its
    row: a numpy fill of those columns after the call cost 15-20 us a conv on one thread and
    35 on two (ResNet-18's 14x14 convs: 16 x 256 rows of 15 floats)."""
    n, c, h, w = x.shape
    xa, va = np.int64(x.ctypes.data), np.int64(v.ctypes.data)
    used = n * th_n * tw_n
    for r in prange(n * c):
        _input_plane(va, np.int64(v.strides[0]), v.shape[2], xa, r, c, h, w, ph, pw, th_n, tw_n)
        if r >= (n - 1) * c:
            ch = r - (n - 1) * c
            for e in range(16):
                for j in range(used, v.shape[2]):
                    v[e, ch, j] = np.float32(0.0)


@njit(cache=True)
def _input_plane(va, lde, cols, xa, r, c, h, w, ph, pw, th_n, tw_n):
    """The input transform of plane r = (image b, channel ch) at xa (planes of H x W float32,
    padded by (ph, pw) as it reads): its tiles to V[:, ch, b*T:(b+1)*T], V at va with rows of
    `cols` floats and its 16 elements lde bytes apart."""
    b, ch = r // c, r % c
    plane = xa + r * h * w * 4
    for th in range(th_n):
        top = 2 * th - ph
        rows = 0
        for i in range(4):
            if 0 <= top + i < h:
                rows |= 1 << i
        dst = va + (ch * cols + (b * th_n + th) * tw_n) * 4
        for tw in range(0, tw_n, 16):
            left = 2 * tw - pw
            _input16(plane + (top * w + left) * 4, w * 4, dst + tw * 4, lde, min(16, tw_n - tw),
                     max(0, -left), w - left, rows)


def _make_output16(pool: bool, residual: bool = False):
    """The output transform of cnt (1..16) consecutive tiles of one tile row: m (bytes) is
    element 0 of the first tile, lde bytes between elements; plus the bias bo and a ReLU
    (relu != 0). Without pool, writes the tiles' top output row (`valid` floats, 2 per tile)
    at dst and, when `second`, the bottom one ldo bytes on; with pool, the max of each tile's
    four outputs (`valid` floats) at dst. The same float32 operations, in the same order, as
    kernels_winograd.output_transform.

    residual (no pool): a 10th argument rd; each output gets + bo, then + the float at its own
    address + rd bytes (a residual add's other input, laid out as the output), then the ReLU:
    the bits of the conv's output (no activation) and kernels_fp32.add_relu / add after it."""

    sig = types.void(*[types.intp] * 7, types.float32, *[types.intp] * (2 if residual else 1))

    def codegen(context, builder, signature, args):
        m, lde, dst, ldo, cnt, valid, second, bo, relu = args[:9]
        ld, st = _masked_io(builder, _VF, 4)
        load_mask = _lanes_below(builder, cnt)
        e = [ld(builder.add(m, builder.mul(lde, _const(i))), load_mask) for i in range(16)]
        add, sub = builder.fadd, builder.fsub
        s_ = [add(add(e[k], e[4 + k]), e[8 + k]) for k in range(4)]
        d_ = [sub(sub(e[4 + k], e[8 + k]), e[12 + k]) for k in range(4)]
        y = [add(add(v[0], v[1]), v[2]) for v in (s_, d_)], [sub(sub(v[1], v[2]), v[3]) for v in (s_, d_)]
        (y00, y10), (y01, y11) = y

        def act(v):
            return _bias_relu(builder, v, bo, relu)

        if residual:
            def store(vals, at, mask):
                v = builder.fadd(vals, _splat(builder, bo, _VF))
                v = builder.fadd(v, ld(builder.add(at, args[9]), mask))
                st(builder.select(builder.icmp_signed("!=", relu, _const(0)), _relu(builder, v), v), at, mask)
        else:
            def store(vals, at, mask):
                st(act(vals), at, mask)

        if pool:
            vmax = partial(_vmax, builder)
            st(act(vmax(vmax(y00, y01), vmax(y10, y11))), dst, _lanes_below(builder, valid))
            return context.get_dummy_value()
        lo_mask = _lanes_below(builder, valid)
        hi_mask = _lanes_below(builder, builder.sub(valid, _const(16)))
        lo_idx = [i // 2 + 16 * (i % 2) for i in range(16)]
        hi_idx = [8 + i // 2 + 16 * (i % 2) for i in range(16)]
        # (the bias and ReLU per lane commute with the shuffles: applied after them here,
        # the same operations on the same values)
        store(_shuffle(builder, y00, y01, lo_idx), dst, lo_mask)
        store(_shuffle(builder, y00, y01, hi_idx), builder.add(dst, _const(64)), hi_mask)
        with builder.if_then(builder.icmp_signed("!=", second, _const(0))):
            at = builder.add(dst, ldo)
            store(_shuffle(builder, y10, y11, lo_idx), at, lo_mask)
            store(_shuffle(builder, y10, y11, hi_idx), builder.add(at, _const(64)), hi_mask)
        return context.get_dummy_value()

    if residual:
        @intrinsic
        def tiles_res(typingctx, m, lde, dst, ldo, cnt, valid, second, bo, relu, rd):
            return sig, codegen

        return tiles_res

    @intrinsic
    def tiles(typingctx, m, lde, dst, ldo, cnt, valid, second, bo, relu):
        return sig, codegen

    return tiles


_output16, _pool16 = _make_output16(False), _make_output16(True)
_output16_res = _make_output16(False, residual=True)


@kernel
def output_transform(out, m, tmp, th_n, tw_n, b, act, alpha, pool):
    """kernels_winograd.output_transform (same arguments, same results bit for bit; tmp and
    alpha unused) for act 0 (none) and 1 (ReLU) only, 16 tiles of a tile row a step."""
    n, o, ho, wo = out.shape
    ma, oa = np.int64(m.ctypes.data), np.int64(out.ctypes.data)
    for r in prange(n * o):
        _output_plane(oa, ma, np.int64(m.strides[0]), m.shape[2], r, o, ho, wo, th_n, tw_n, b, act, pool,
                      False, 0)


@kernel
def output_transform_res(out, m, th_n, tw_n, b, res, relu):
    """out (N, O, Ho, Wo) = the output transform of m (as output_transform's) + b, + res (same
    shape as out: a residual add's other input), then a ReLU if relu: a conv with no
    activation and the add (kernels_fp32.add, or add_relu) after it, bit for bit, in one pass
    (lowering.residual_convs)."""
    n, o, ho, wo = out.shape
    ma, oa = np.int64(m.ctypes.data), np.int64(out.ctypes.data)
    rd = np.int64(res.ctypes.data) - oa
    for r in prange(n * o):
        _output_plane(oa, ma, np.int64(m.strides[0]), m.shape[2], r, o, ho, wo, th_n, tw_n, b, relu, False,
                      True, rd)


@njit(cache=True)
def _output_plane(oa, ma, lde, cols, r, o, ho, wo, th_n, tw_n, b, act, pool, has_res, rd):
    """The output transform of plane r = (image bi, channel oc) of out (N, O, Ho, Wo) at oa:
    from M[:, oc, bi*T:(bi+1)*T], M at ma with rows of `cols` floats and its 16 elements lde
    bytes apart; + b[oc] (b may be empty), (+ the residual rd bytes past each output where
    has_res), a ReLU if act == 1, the 2x2 max if pool (not with has_res)."""
    bi, oc = r // o, r % o
    bo = b[oc] if b.shape[0] > 0 else np.float32(0.0)
    src = ma + (oc * cols + bi * th_n * tw_n) * 4
    plane = oa + r * ho * wo * 4
    for th in range(min(th_n, ho) if pool else th_n):
        for tw in range(0, tw_n, 16):
            at, cnt = src + (th * tw_n + tw) * 4, min(16, tw_n - tw)
            if pool:
                _pool16(at, lde, plane + (th * wo + tw) * 4, 0, cnt, min(cnt, wo - tw), 0, bo, act)
            elif has_res:
                _output16_res(at, lde, plane + (2 * th * wo + 2 * tw) * 4, wo * 4, cnt,
                              min(2 * cnt, wo - 2 * tw), 2 * th + 1 < ho, bo, act, rd)
            else:
                _output16(at, lde, plane + (2 * th * wo + 2 * tw) * 4, wo * 4, cnt,
                          min(2 * cnt, wo - 2 * tw), 2 * th + 1 < ho, bo, act)


def slot_floats(c: int, o: int, chunk: int, th_n: int, tw_n: int) -> tuple[int, int]:
    """A thread's part of `fused_conv`'s scratch, in float32 elements (each part a multiple of 16):
    V (16 rows of C*cols + VM_SKEW), M (16 rows of O*cols + VM_SKEW), cols = tile_cols(chunk *
    tiles)."""
    cols = tile_cols(chunk * th_n * tw_n)
    return 16 * (c * cols + VM_SKEW), 16 * (o * cols + VM_SKEW)


@njit(cache=True)
def _gemm(wa, c, xa, oa, ca, ld, o, cols):
    """C (O, cols) = W (O, C) @ X (C, cols): W's rows c floats apart, X's row k at xa + oa[k]
    bytes, C's rows ld floats apart; cols % 16 == 0."""
    for o0 in range(0, o, TILE_O):
        w, rows, cr = wa + o0 * c * 4, min(TILE_O, o - o0), ca + o0 * ld * 4
        for p0 in range(0, cols, 48):
            args = (w, c * 4, xa + p0 * 4, oa, c, cr + p0 * 4, ld * 4, 0, rows, 0, 0)
            if cols - p0 >= 48:
                _wide(*args)
            elif cols - p0 == 32:
                _tile(*args)
            else:
                _half(*args)


@kernel
def fused_conv(out, x, u, scratch, offs, nt, chunk, th_n, tw_n, ph, pw, b, act, pool, parts):
    """out = the 3x3 stride-1 conv of x (N, C, H, W) padded by (ph, pw), + b (O,) (may be
    empty), a ReLU if act == 1, then the 2x2/2 max pool if pool: out (N, O, Ho, Wo), pooled
    or not; th_n x tw_n tiles of 2x2 outputs an image. u (16, >= O*C): the filters as
    filter_transform writes them. scratch: nt parts of `parts` = slot_floats(C, O, chunk, th_n,
    tw_n) floats; offs: kernels_fma.row_offsets(C, tile_cols(chunk * th_n * tw_n)).

    Part t < nt takes images [t*N/nt, (t+1)*N/nt) in chunks of up to `chunk` (see the module
    docstring). The same float32 operations as output_transform(gemm(u, input_transform(...))),
    so the same results bit for bit."""
    n, c, h, w = x.shape
    o, ho, wo = out.shape[1], out.shape[2], out.shape[3]
    tiles = th_n * tw_n
    vlen, mlen = parts
    lv, lm = vlen // 16, mlen // 16
    ldv = (lv - VM_SKEW) // c  # tile_cols(chunk * tiles)
    sa, ua, oa = np.int64(scratch.ctypes.data), np.int64(u.ctypes.data), np.int64(out.ctypes.data)
    xa = np.int64(x.ctypes.data)
    offs_at = np.int64(offs.ctypes.data)
    for t in prange(nt):
        base = t * (vlen + mlen)
        va = sa + base * 4
        ma = va + vlen * 4
        for s in range(t * n // nt, (t + 1) * n // nt, chunk):
            m = min(chunk, (t + 1) * n // nt - s)
            for r in range(m * c):
                _input_plane(va, lv * 4, ldv, xa + s * c * h * w * 4, r, c, h, w, ph, pw, th_n, tw_n)
            cols = -(-m * tiles // HALF_P) * HALF_P  # tile_cols
            for e in range(16 * c):  # the GEMM's last tile: zeros, never denormals
                at = base + (e // c) * lv + (e % c) * ldv
                scratch[at + m * tiles:at + cols] = np.float32(0.0)
            for e in range(16):
                _gemm(ua + e * u.strides[0], c, va + e * lv * 4, offs_at, ma + e * lm * 4, ldv, o, cols)
            for r in range(m * o):
                _output_plane(oa + s * o * ho * wo * 4, ma, lm * 4, ldv, r, o, ho, wo, th_n, tw_n, b, act,
                              pool, False, 0)
