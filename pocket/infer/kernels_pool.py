"""A separable max pool: the max over a kh x kw window is the max over kw columns of the max
over kh rows, so each output row takes one vector pass per window row over whole input rows
(contiguous, any stride), then one pass along the row buffer per window column.

kernels_fp32.maxpool2d takes the max over each window in turn (kh * kw scalar steps an output,
with the window clamped at the borders): ShuffleNetV2's 3x3/2 pool over 24 x 112 x 112 took
1.15 ms there. Here the padding columns hold the dtype's lowest value, written once a call, so no
step tests a bound; the padding rows are skipped (they never win: every window has a row inside).

NaN propagates as in kernels_fp32.nanmax (np.maximum's rule). int8 pools their codes, as the
reference does (quantization is monotone).

Both passes run on LLVM vectors of `lanes` elements that every CPU compiles (8 floats, 16
codes): a NaN-propagating max (_vmax: one fmax on NEON) or `llvm.smax`; a stride-2 window's
columns are the even and odd lanes of two loads (a 3-wide one: the evens of a third, two
columns on). A row's last vector ends at the row's end (overlapping the one before it: no scalar tail);
rows narrower than a vector take the scalar loops. SqueezeNet's three 3x3/2 pools (64 x 111,
128 x 55, 256 x 27 wide maps) on one x86 thread: 0.24 / 0.15 / 0.14 ms scalar (the rows of
13-55 outputs were mostly loop overhead), 0.17 / 0.11 / 0.08 ms in vectors; onnxruntime's
0.13 / 0.05 / 0.03.
"""

from __future__ import annotations

import platform

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from pocket.infer.jit import kernel
from pocket.infer.kernels_fp32 import nanmax
from pocket.infer.kernels_vnni import _const, _copy_channel, _epilogue_run, _loop, _ptr

# the vector passes; without Numba's JIT (they cannot run as Python) the scalar loops
VECTORS = not numba.config.DISABLE_JIT
X86 = platform.machine().lower() in ("x86_64", "amd64")  # (_vmax)
SLACK = 64  # elements past a row buffer's windows: the stride-2 loads' last (unused) lanes


def row_width(w: int, wo: int, kw: int, sw: int, pw: int) -> int:
    """Elements of the row buffer: the input row with pw lowest values on the left and enough
    on the right for the last window (ceil mode's may reach past the right padding), then
    SLACK more for the vector loads."""
    return max(pw + w + pw, (wo - 1) * sw + kw) + SLACK


def _lanes(dtype) -> tuple:
    """(LLVM element type, lanes a vector, bytes an element, the max intrinsic's name)."""
    if isinstance(dtype, types.Integer) and dtype.bitwidth == 32:  # int32 sums (requant_cols_pool)
        return ir.IntType(32), 8, 4, "llvm.smax.v8i32"
    if isinstance(dtype, types.Integer):
        return ir.IntType(8), 16, 1, "llvm.smax.v16i8"
    return ir.FloatType(), 8, 4, "llvm.maximum.v8f32"


def _vmax(builder, dtype):
    """(the vector type, the lanes' max): NaN propagating. ARM: llvm.maximum (NEON's fmax).
    x86: `b if b != b else (b if b > a else a)`, a maxps, a compare and a blend.

    NOTE: llvm.maximum also orders -0 below +0, which AVX2 pays for with more compares and
    blends: on a Zen 1 the 3x3/2 pools of SqueezeNet (64 x 111 x 111) and ResNet-18 (64 x 112 x
    112, padded) took 628 / 662 us, 414 / 405 this way (interleaved, outputs equal). A pool's
    zeros keep their value either way (-0 == +0); NaN still wins."""
    el, lanes, _, name = _lanes(dtype)
    vt = ir.VectorType(el, lanes)
    if isinstance(el, ir.FloatType) and X86:
        def nanmax(a, b):
            m = builder.select(builder.fcmp_ordered(">", b, a), b, a)
            return builder.select(builder.fcmp_unordered("uno", b, b), b, m)
        return vt, nanmax
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt, vt]), name)
    return vt, lambda a, b: builder.call(fn, [a, b])


def _vec_at(builder, i, n, lanes: int, esize: int):
    """Byte offset of vector i of a row of n >= lanes elements: the last vector ends at the
    row's end (it overlaps the one before: the elements both write get the same value)."""
    return builder.mul(builder.select(builder.icmp_signed("<", builder.mul(i, _const(lanes)),
                                                          builder.sub(n, _const(lanes))),
                                      builder.mul(i, _const(lanes)), builder.sub(n, _const(lanes))),
                       _const(esize))


def _nvec(builder, n, lanes: int):
    return builder.sdiv(builder.add(n, _const(lanes - 1)), _const(lanes))


def _make_rows(fixed: int):
    """The vertical pass over `fixed` rows (unrolled: a loop of 2-3 steps inside each vector's
    cost more than the maxes), or any number (fixed 0)."""

    @intrinsic
    def rows_max(typingctx, dst, src, ld, rows, n, like):
        """dst[0:n] = the max over r < rows of src[r ld:r ld + n], n >= lanes elements of like's
        dtype (addresses and ld in bytes)."""
        def codegen(context, builder, signature, args):
            d, s, step, nr, n, _ = args
            vt, vmax = _vmax(builder, like.dtype)
            _, lanes, esize, _ = _lanes(like.dtype)

            def vec(i, carried):
                off = _vec_at(builder, i, n, lanes, esize)
                at = builder.add(s, off)

                def row(r, acc):  # acc = max(acc, row r + 1's vector)
                    ra = builder.add(at, builder.mul(builder.add(r, _const(1)), step))
                    return [vmax(acc[0], builder.load(_ptr(builder, ra, vt), align=1))]

                acc = [builder.load(_ptr(builder, at, vt), align=1)]
                if fixed:
                    for r in range(fixed - 1):
                        acc = row(_const(r), acc)
                else:
                    acc = _loop(builder, builder.sub(nr, _const(1)), acc, row)
                builder.store(acc[0], _ptr(builder, builder.add(d, off), vt), align=1)
                return []

            _loop(builder, _nvec(builder, n, lanes), [], vec)
            return context.get_dummy_value()

        return types.void(*[types.intp] * 5, like), codegen

    return rows_max


_rows2, _rows3, _rows_any = _make_rows(2), _make_rows(3), _make_rows(0)


def _make_stride2(kw: int):
    @intrinsic
    def cols_max(typingctx, dst, src, n, like):
        """dst[i] = max(src[2i], src[2i + 1][, src[2i + 2]]) (kw 2 or 3) for i < n (n >= lanes);
        src is read to 2 n + 1 (addresses in bytes)."""
        def codegen(context, builder, signature, args):
            d, s, n, _ = args
            el, lanes, esize, _ = _lanes(like.dtype)
            vt, vmax = _vmax(builder, like.dtype)
            wide = ir.VectorType(el, 2 * lanes)
            even = ir.Constant(ir.VectorType(ir.IntType(32), lanes), [2 * j for j in range(lanes)])
            odd = ir.Constant(ir.VectorType(ir.IntType(32), lanes), [2 * j + 1 for j in range(lanes)])

            def vec(i, carried):
                off = _vec_at(builder, i, n, lanes, esize)
                at = builder.add(s, builder.add(off, off))
                a = builder.load(_ptr(builder, at, wide), align=1)
                m = vmax(builder.shuffle_vector(a, a, even), builder.shuffle_vector(a, a, odd))
                if kw == 3:
                    c = builder.load(_ptr(builder, builder.add(at, _const(2 * esize)), wide), align=1)
                    m = vmax(m, builder.shuffle_vector(c, c, even))
                builder.store(m, _ptr(builder, builder.add(d, off), vt), align=1)
                return []

            _loop(builder, _nvec(builder, n, lanes), [], vec)
            return context.get_dummy_value()

        return types.void(types.intp, types.intp, types.intp, like), codegen

    return cols_max


_cols2, _cols3 = _make_stride2(2), _make_stride2(3)


@njit(cache=True, inline="always")
def lanes_of(x):
    """Elements a vector of the pool's dtype (8 for float32 and int32)."""
    return 16 if x.itemsize == 1 else 8


@kernel
def maxpool_sep(out, x, rows, kh, kw, sh, sw, ph, pw, lowest):
    """x (N, C, H, W) f32 or i8 -> out (N, C, Ho, Wo), as kernels_fp32.maxpool2d; rows (parts,
    row_width(...)) of x's dtype, one a part (a thread's share of the planes), any contents;
    lowest: the dtype's lowest value (-inf, -128), the padding."""
    parts = rows.shape[0]
    planes = x.shape[0] * x.shape[1]
    for part in prange(parts):
        _pool_part(out, x, rows[part], part * planes // parts, (part + 1) * planes // parts,
                   kh, kw, sh, sw, ph, pw, lowest)


# NOTE: not inlined, so the prange twin compiles a call (as kernels_dw's parts)
@njit(cache=True)
def _pool_part(out, x, buf, first, last, kh, kw, sh, sw, ph, pw, lowest):
    h, w = x.shape[2], x.shape[3]
    ho, wo = out.shape[2], out.shape[3]
    xf, of = x.reshape(-1), out.reshape(-1)
    buf[:pw] = lowest
    buf[pw + w:] = lowest
    mid = buf[pw:pw + w]
    size, lanes = x.itemsize, lanes_of(x)
    xa, ba, oa = np.int64(x.ctypes.data), np.int64(buf.ctypes.data), np.int64(out.ctypes.data)
    vw = VECTORS and w >= lanes  # the rows in vectors (the last one overlapping), else scalar
    vo = VECTORS and sw == 2 and (kw == 2 or kw == 3) and wo >= lanes
    for nc in range(first, last):
        xb, ob = nc * h * w, nc * ho * wo
        for oh in range(ho):
            r0, r1 = max(oh * sh - ph, 0), min(oh * sh - ph + kh, h)
            if vw:
                at = xa + (xb + r0 * w) * size
                if r1 - r0 == 3:
                    _rows3(ba + pw * size, at, w * size, 3, w, x)
                elif r1 - r0 == 2:
                    _rows2(ba + pw * size, at, w * size, 2, w, x)
                else:
                    _rows_any(ba + pw * size, at, w * size, r1 - r0, w, x)
            else:
                src = xf[xb + r0 * w:xb + r0 * w + w]
                for j in range(w):
                    mid[j] = src[j]
                for r in range(r0 + 1, r1):
                    src = xf[xb + r * w:xb + r * w + w]
                    for j in range(w):
                        mid[j] = nanmax(mid[j], src[j])
            if vo:
                if kw == 3:
                    _cols3(oa + (ob + oh * wo) * size, ba, wo, x)
                else:
                    _cols2(oa + (ob + oh * wo) * size, ba, wo, x)
                continue
            dst = of[ob + oh * wo:ob + oh * wo + wo]
            if kw == 3 and sw == 2:
                for ow in range(wo):
                    a = np.uint64(2 * ow)
                    dst[ow] = nanmax(nanmax(buf[a], buf[a + np.uint64(1)]), buf[a + np.uint64(2)])
            elif kw == 2 and sw == 2:
                for ow in range(wo):
                    a = np.uint64(2 * ow)
                    dst[ow] = nanmax(buf[a], buf[a + np.uint64(1)])
            else:
                # NOTE: unsigned indices let LLVM vectorize the strided loads (see im2col)
                for ow in range(wo):
                    dst[ow] = buf[np.uint64(ow * sw)]
                for j in range(1, kw):
                    for ow in range(wo):
                        dst[ow] = nanmax(dst[ow], buf[np.uint64(ow * sw + j)])


@kernel
def requant_cols_pool(out, c, cf, hc, pitch, istride, kh, kw, sh, sw, bias, m, to_int8, y_zp, lo, relu):
    """kernels_vnni.requant_cols with a fused unpadded maxpool: image b's hc conv rows of
    `pitch` columns from column b*istride of c (O, Mp) i32 (cf: the same memory as float32) ->
    out (N, O, Ho, Wo), the epilogue of the max over each kh x kw window (exact: the epilogue is
    non-decreasing in the sum, see kernels_int8.requant_sum_pool). Overwrites c.

    NOTE: per channel, each output row's window maxima by this module's two passes over the
    int32 sums (kh rows into a row buffer, then its columns), written in place, compacted to the
    row's start (output (b, t) at column b*Ho*Wo + t: a row's windows are in the buffer before
    its outputs are stored, and every later window lies past them); then one long epilogue
    loop over them and a copy of whole planes. SqueezeNet's 64 x 111 x 111 stem pool took 19.4M
    instructions on the emulated Pi 4 with a scalar loop over each window."""
    n, o, ho, wo = out.shape
    ldc = c.shape[1]
    of, cflat, fflat = out.reshape(-1), c.reshape(-1), cf.reshape(-1)
    ca = np.int64(c.ctypes.data)
    span = (wo - 1) * sw + kw  # the conv columns the windows of a row cover
    vw = VECTORS and span >= 8
    vo = VECTORS and sw == 2 and (kw == 2 or kw == 3) and wo >= 8
    for oc in prange(o):
        buf = np.empty(span + SLACK, np.int32)
        ba = np.int64(buf.ctypes.data)
        for b in range(n):
            for oh in range(ho):
                src = oc * ldc + b * istride + oh * sh * pitch
                dst = oc * ldc + (b * ho + oh) * wo
                if vw:
                    at = ca + src * 4
                    if kh == 3:
                        _rows3(ba, at, pitch * 4, 3, span, cflat)
                    elif kh == 2:
                        _rows2(ba, at, pitch * 4, 2, span, cflat)
                    else:
                        _rows_any(ba, at, pitch * 4, kh, span, cflat)
                else:
                    for j in range(span):
                        buf[j] = cflat[src + j]
                    for r in range(1, kh):
                        for j in range(span):
                            buf[j] = max(buf[j], cflat[src + r * pitch + j])
                if vo:
                    if kw == 3:
                        _cols3(ca + dst * 4, ba, wo, cflat)
                    else:
                        _cols2(ca + dst * 4, ba, wo, cflat)
                    continue
                for ow in range(wo):
                    best = buf[np.uint64(ow * sw)]
                    for j in range(1, kw):
                        best = max(best, buf[np.uint64(ow * sw + j)])
                    cflat[dst + ow] = best
    for oc in prange(o):
        _epilogue_run(c, cf, oc, n * ho * wo, bias[oc], m[oc], y_zp, lo, to_int8, relu)
    for oc in prange(o):
        _copy_channel(of, cflat, fflat, oc, n, o, ho * wo, ldc, 1, 0, ho * wo, to_int8)
