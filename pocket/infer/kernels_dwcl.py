"""int8 depthwise convs on small maps with the channels innermost: 16 channels a vector, in LLVM
vectors every CPU compiles (NEON on ARM, SSE/AVX on x86), for the portable path and ARM.

kernels_dw's padded planes vectorize along a plane's flat outputs, which pays on big maps and
not on the small ones where MobileNet-class networks keep most of their channels: a 4 x 4
plane is 22 flat outputs rounded to 32 for 16 real ones, and each plane pays its padding, its
sum of weights, its epilogue loop and its copy-out. On the emulated Pi 5, MobileNetV2-0.5's
480 x 4 x 4 layers took 60 instructions an output there, its 192 x 8 x 8 ones 23.

Here a part (a thread's run of 16-channel blocks) copies its channels of an image into a
scratch laid (Hp, Wp, cb) (cb: its channels rounded up to 16), x_zp in the padding, then for
each block of 16 channels and each output pixel sums the kh*kw taps as 16-lane vectors:

    acc[c] = bias_adj[c] + sum over taps (i, j) of x_q[oh*s + i, ow*s + j, c] * w_q[i, j, c]

(bias_adj = b_q - x_zp * sum(w_q), the padding holding x_zp: exactly kernels_int8's sum). Two
taps' int8 x int8 products are summed in 16 bits before widening to int32: |x_q| <= 128 and
|w_q| <= 127 keep the pair within 32,512, which is why the route takes no weight of -128 (our
quantizer clips to +-127; an imported model may not). The epilogue is kernels_int8.
_code_clamped's in the same float32 operations, and the codes go out through the (Ho*Wo, cb)
scratch, which the part copies back into its planes. The block's weights, bias and multipliers
are loaded once for every pixel of the image. Both copies move 16 x 16 bytes at a time through
a register transpose (`_transpose`): one byte at a time they cost as much as the sums.

Emulated Pi 5, one thread, instructions: MobileNetV2-0.5's layers 0.19x (480 x 4 x 4) to 0.71x
(16 x 64 x 64) the padded planes', its depthwise convs 7.4M -> 3.3M of the int8 inference.
Where it runs instead of the planes: see `pays`.

dw_conv_cl_q gives int8 codes only (float32 outputs of an int8 conv keep kernels_dw);
dw_conv_cl is the float32 conv's twin (the bottom of this file).
"""

from __future__ import annotations

import platform

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from pocket.infer.jit import kernel
from pocket.infer.kernels_fp32 import act_inplace
from pocket.infer.kernels_int8 import _ROUND
from pocket.infer.kernels_vnni import _const, _loop, _ptr, _splat

VL = 16  # channels a vector
_ARM = platform.machine().lower() in ("aarch64", "arm64")

_I8, _I16, _I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
_F32 = ir.FloatType()
_VB, _VH, _VI, _VF = (ir.VectorType(t, VL) for t in (_I8, _I16, _I32, _F32))
_V4I, _V8I = ir.VectorType(_I32, 4), ir.VectorType(_I32, 8)


def _each_pixel(builder, xp, out, nvec, ho, wo, sh, pix, row, vbytes, setup, body):
    """The image kernels' loops: for each block v < nvec of vbytes bytes of a pixel's channels,
    state = setup(c) (c: the block's byte offset in a pixel), then for each output pixel
    body(state, xa, oa): xa the address of its first tap's block in the padded scratch (pix
    bytes a pixel, row bytes a row), oa its block's in the outputs (pix bytes a pixel)."""

    def block(v, _):
        c = builder.mul(v, _const(vbytes))
        state = setup(c)

        def out_row(oh, _):
            x_row = builder.add(builder.add(xp, c), builder.mul(builder.mul(oh, sh), row))
            o_row = builder.add(builder.add(out, c), builder.mul(builder.mul(oh, wo), pix))

            def pixel(ow, _):
                body(state, builder.add(x_row, builder.mul(builder.mul(ow, sh), pix)),
                     builder.add(o_row, builder.mul(ow, pix)))
                return []

            _loop(builder, wo, [], pixel)
            return []

        _loop(builder, ho, [], out_row)
        return []

    _loop(builder, nvec, [], block)


def _make_image(kh: int, kw: int):
    """One image of a part: every block of VL channels over every output pixel, for fixed
    taps. Addresses in bytes; cbp (the scratch's channel pitch), wp (its row length in
    pixels), ldw (the weights' tap pitch) in elements."""

    def codegen(context, builder, signature, args):
        xp, w, ldw, badj, m, out, nvec, ho, wo, sh, cbp, wp, lo, hi, zp = args
        vlo, vhi = _splat(builder, lo, _VF), _splat(builder, hi, _VF)
        vround = _splat(builder, ir.Constant(_F32, float(_ROUND)), _VF)
        izp = _splat(builder, builder.fptosi(zp, _I8), _VB)
        fty = ir.FunctionType(_VF, [_VF, _VF])
        vmax, vmin = (cgutils.get_or_insert_function(builder.module, fty, f"llvm.{op}.v16f32")
                      for op in ("maxnum", "minnum"))
        if _ARM:
            cvtn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VectorType(_I32, 4), [ir.VectorType(_F32, 4)]),
                "llvm.aarch64.neon.fcvtns.v4i32.v4f32")
        row = builder.mul(wp, cbp)
        taps = [builder.add(builder.mul(_const(i), row), builder.mul(_const(j), cbp))
                for i in range(kh) for j in range(kw)]

        def setup(c0):
            ws = [builder.sext(builder.load(_ptr(builder, builder.add(
                w, builder.add(builder.mul(_const(t), ldw), c0)), _VB), align=1), _VH)
                for t in range(kh * kw)]
            b0 = builder.load(_ptr(builder, builder.add(badj, builder.mul(c0, _const(4))), _VI),
                              align=4)
            mv = builder.load(_ptr(builder, builder.add(m, builder.mul(c0, _const(4))), _VF),
                              align=4)
            return ws, b0, mv

        def pixel(state, xa, oa):
            ws, acc, mv = state
            # NOTE: two taps' products summed in 16 bits before widening (|x_q| <= 128,
            # |w_q| <= 127: |p + p'| <= 32512), a multiply-accumulate of bytes into halfwords
            # (smlal) where one tap took two widening adds
            for t0 in range(0, len(taps), 2):
                pair = None
                for t in range(t0, min(t0 + 2, len(taps))):
                    xv = builder.load(_ptr(builder, builder.add(xa, taps[t]), _VB), align=1)
                    prod = builder.mul(builder.sext(xv, _VH), ws[t])
                    pair = prod if pair is None else builder.add(pair, prod)
                acc = builder.add(acc, builder.sext(pair, _VI))
            # kernels_int8._code_clamped, lane by lane: the same float32 operations (maxnum /
            # minnum are its max / min: no NaN reaches them)
            f = builder.fmul(builder.sitofp(acc, _VF), mv)
            f = builder.call(vmin, [builder.call(vmax, [f, vlo]), vhi])
            if _ARM:
                # rint by the conversion's round-to-nearest-even (fcvtns): |f| <= 255, so it
                # equals (f + _ROUND) - _ROUND
                qs = [builder.call(cvtn, [builder.shuffle_vector(
                    f, f, ir.Constant(_V4I, list(range(4 * k, 4 * k + 4))))]) for k in range(4)]
                i32 = builder.shuffle_vector(
                    builder.shuffle_vector(qs[0], qs[1], ir.Constant(_V8I, list(range(8)))),
                    builder.shuffle_vector(qs[2], qs[3], ir.Constant(_V8I, list(range(8)))),
                    ir.Constant(_VI, list(range(VL))))
            else:
                i32 = builder.fptosi(builder.fsub(builder.fadd(f, vround), vround), _VI)
            # + y_zp as int8: the code is in [-128, 127], so the wrap-around is exact
            q = builder.add(builder.trunc(i32, _VB), izp)
            builder.store(q, _ptr(builder, oa, _VB), align=1)

        _each_pixel(builder, xp, out, nvec, ho, wo, sh, cbp, row, VL, setup, pixel)
        return context.get_dummy_value()

    @intrinsic
    def image(typingctx, xp, w, ldw, badj, m, out, nvec, ho, wo, sh, cbp, wp, lo, hi, zp):
        return types.void(*[types.intp] * 12, types.float32, types.float32, types.float32), codegen

    return image


_image3, _image5 = _make_image(3, 3), _make_image(5, 5)


def _transpose(builder, rows, n=VL):
    """The n x n elements in rows (n vectors of n) transposed: at each level d (n/2, ..., 2, 1)
    rows i and i + d (i & d == 0) swap their off-diagonal d x d blocks, element (r, c) going to
    (r ^ d, c ^ d) where bit d of r and c differ; over the levels (r, c) -> (c, r). Each level
    is a TRN/ZIP of one element width on NEON, an unpack on x86."""
    rows = list(rows)
    d = n // 2
    while d:
        lo = [c if not c & d else n + c - d for c in range(n)]
        hi = [c + d if not c & d else n + c for c in range(n)]
        for i in range(n):
            if i & d:
                continue
            a, b = rows[i], rows[i + d]
            rows[i] = builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, n), lo))
            rows[i + d] = builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, n), hi))
        d //= 2
    return rows


def _make_blocks(vty, n: int, size: int):
    """The copies through the transpose for vectors of n elements of `size` bytes (vty):

    in_blocks(src, plane, dst, cbp, wd, wp, ph, pw, nblk): pixels [nq, nq + n) of n channel
    planes (src, plane bytes apart) for q < nblk into the padded channel-last scratch: pixel
    p's n elements at dst + ((p // wd + ph) * wp + p % wd + pw) * cbp * size;
    out_blocks(src, cbp, dst, plane, nblk): the channel-last outputs of pixels [nq, nq + n)
    (pixel p's n channels at src + p * cbp * size) into n channel planes (dst, plane bytes
    apart)."""

    def in_codegen(context, builder, signature, args):
        src, plane, dst, cbp, wd, wp, ph, pw, nblk = args

        def blk(q, _):
            p0 = builder.mul(q, _const(n))
            first = builder.add(src, builder.mul(p0, _const(size)))
            rows = [builder.load(_ptr(builder, builder.add(first, builder.mul(_const(k), plane)), vty),
                                 align=size) for k in range(n)]
            for j, vec in enumerate(_transpose(builder, rows, n)):
                p = builder.add(p0, _const(j))
                ih, iw = builder.sdiv(p, wd), builder.srem(p, wd)
                at = builder.add(builder.mul(builder.add(ih, ph), wp), builder.add(iw, pw))
                at = builder.add(dst, builder.mul(builder.mul(at, cbp), _const(size)))
                builder.store(vec, _ptr(builder, at, vty), align=size)
            return []

        _loop(builder, nblk, [], blk)
        return context.get_dummy_value()

    def out_codegen(context, builder, signature, args):
        src, cbp, dst, plane, nblk = args

        def blk(q, _):
            p0 = builder.mul(q, _const(n))
            rows = [builder.load(_ptr(builder, builder.add(src, builder.mul(builder.mul(
                builder.add(p0, _const(j)), cbp), _const(size))), vty), align=size) for j in range(n)]
            first = builder.add(dst, builder.mul(p0, _const(size)))
            for k, vec in enumerate(_transpose(builder, rows, n)):
                at = builder.add(first, builder.mul(_const(k), plane))
                builder.store(vec, _ptr(builder, at, vty), align=size)
            return []

        _loop(builder, nblk, [], blk)
        return context.get_dummy_value()

    @intrinsic
    def in_blocks(typingctx, src, plane, dst, cbp, wd, wp, ph, pw, nblk):
        return types.void(*[types.intp] * 9), in_codegen

    @intrinsic
    def out_blocks(typingctx, src, cbp, dst, plane, nblk):
        return types.void(*[types.intp] * 5), out_codegen

    return in_blocks, out_blocks


_in_blocks, _out_blocks = _make_blocks(_VB, VL, 1)


def fast(kh: int, kw: int, sh: int, sw: int, dh: int, dw: int) -> bool:
    """The geometries compiled here: 3x3 and 5x5, stride 1 or 2 (the same both ways), no
    dilation."""
    return kh == kw and kh in (3, 5) and sh == sw and sh in (1, 2) and dh == dw == 1


def pays(kh: int, ho: int, wo: int, fma: bool) -> bool:
    """Whether channels innermost beat the planes (one thread, bit-identical codes).

    NOTE: measured per layer. Emulated Pi 5 (instructions): 0.19-0.71x kernels_dw's padded
    planes on every MobileNetV2-0.5 layer, 480 x 4 x 4 to 16 x 64 x 64. x86 without AVX-512
    (the padded planes with float32 sums): 0.2-0.75x up to 16 x 16 outputs and on 5x5 at
    28 x 28 (0.92), 1.1-1.2x on 3x3 at 32 x 32 and up. AVX-512 against kernels_fma_dw's
    dw_conv_fma_q: 0.43-0.85x up to 8 x 8 outputs (480 x 4 x 4: 14.4 -> 6.8 us), 1.25-2.2x
    from 14 x 14 up."""
    if _ARM:
        return True
    if fma:
        return ho * wo <= 64
    return ho * wo <= (784 if kh == 5 else 256)


def blocks(c: int) -> int:
    return -(-c // VL)


def scratch_sizes(c: int, h: int, wd: int, ho: int, wo: int, ph: int, pw: int,
                  parts: int) -> tuple[int, int]:
    """(bytes of a part's channel-last padded image, of its channel-last codes): room for the
    most blocks a part gets."""
    cb = -(-blocks(c) // parts) * VL
    return (h + 2 * ph) * (wd + 2 * pw) * cb, ho * wo * cb


def prepare_weights(w: np.ndarray) -> np.ndarray:
    """(kh*kw, Cp) int8, taps-major: Cp the channels rounded up to VL, zeros past C (lanes
    computed and never stored)."""
    c = w.shape[0]
    wt = np.zeros((w.shape[2] * w.shape[3], blocks(c) * VL), np.int8)
    wt[:, :c] = w.reshape(c, -1).T
    return wt


def lanes(v: np.ndarray, dtype) -> np.ndarray:
    """A per-channel constant (bias_adj: int32, wrapping as kernels_int8.total32 does; the
    multipliers: float32) padded with zeros to whole vectors."""
    out = np.zeros(blocks(v.shape[0]) * VL, dtype)
    out[:v.shape[0]] = v.astype(dtype)
    return out


@kernel
def dw_conv_cl_q(out, x, wt, badj, m, xp_all, tmp_all, x_zp, lo, hi, zp, sh, ph, pw):
    """out (N, C, Ho, Wo) int8 codes of the depthwise conv of x (N, C, H, W) int8; wt, badj, m
    from prepare_weights (m, the multipliers, and lo / hi, the codes' clamp less zp = y_zp, in
    float32 as kernels_int8._code_clamped has them); xp_all / tmp_all (parts, scratch_sizes)
    int8 scratch, a row a part."""
    parts = xp_all.shape[0]
    nb = (x.shape[1] + VL - 1) // VL
    for part in prange(parts):
        b0, b1 = part * nb // parts, (part + 1) * nb // parts
        if b1 > b0:
            _part(out, x, wt, badj, m, xp_all[part], tmp_all[part], b0, b1, x_zp, lo, hi, zp,
                  sh, ph, pw)


@njit(cache=True, inline="always")
def _tails_in(xp, xf, first, nk, full, n_vec, hw, wd, wp, ph, pw, cbp):
    """The elements the transposes leave into the channel-last scratch: the last hw % n_vec
    pixels of the full blocks' channels, every pixel of the partial block's (channel k of the
    part's at xf[first + k * hw:])."""
    for k in range(nk):
        p0 = hw - hw % n_vec if k < full * n_vec else 0
        for p in range(p0, hw):
            ih, iw = p // wd, p % wd
            xp[np.uint64(((ih + ph) * wp + iw + pw) * cbp + k)] = xf[np.uint64(first + k * hw + p)]


@njit(cache=True, inline="always")
def _tails_out(of, tmp, first, nk, full, n_vec, howo, cbp):
    """_tails_in's elements of the outputs, from the channel-last outputs into the planes."""
    for k in range(nk):
        p0 = howo - howo % n_vec if k < full * n_vec else 0
        for p in range(p0, howo):
            of[np.uint64(first + k * howo + p)] = tmp[np.uint64(p * cbp + k)]


@njit(cache=True)
def _part(out, x, wt, badj, m, xp, tmp, b0, b1, x_zp, lo, hi, zp, sh, ph, pw):
    n, c, h, wd = x.shape
    ho, wo = out.shape[2], out.shape[3]
    c0, c1 = b0 * VL, min(c, b1 * VL)
    cbp = (b1 - b0) * VL
    wp = wd + 2 * pw
    kt = wt.shape[0]
    xf, of = x.reshape(-1), out.reshape(-1)
    xp[:(h + 2 * ph) * wp * cbp] = np.int8(x_zp)
    xa, ta = np.int64(xp.ctypes.data), np.int64(tmp.ctypes.data)
    wa = np.int64(wt.ctypes.data) + c0
    ba, ma = np.int64(badj.ctypes.data) + 4 * c0, np.int64(m.ctypes.data) + 4 * c0
    hw, howo = h * wd, ho * wo
    full = (c1 - c0) // VL  # blocks of VL channels that are all there (the last may not be)
    for b in range(n):
        for v in range(full):
            _in_blocks(np.int64(x.ctypes.data) + (b * c + c0 + v * VL) * hw, hw,
                       xa + v * VL, cbp, wd, wp, ph, pw, hw // VL)
        _tails_in(xp, xf, (b * c + c0) * hw, c1 - c0, full, VL, hw, wd, wp, ph, pw, cbp)
        if kt == 9:
            _image3(xa, wa, wt.shape[1], ba, ma, ta, b1 - b0, ho, wo, sh, cbp, wp, lo, hi, zp)
        else:
            _image5(xa, wa, wt.shape[1], ba, ma, ta, b1 - b0, ho, wo, sh, cbp, wp, lo, hi, zp)
        for v in range(full):
            _out_blocks(ta + v * VL, cbp, np.int64(out.ctypes.data) + (b * c + c0 + v * VL) * howo,
                        howo, howo // VL)
        _tails_out(of, tmp, (b * c + c0) * howo, c1 - c0, full, VL, howo, cbp)


# --------------------------------------------------------------------------- float32

VF = 8  # float32 channels a vector (one ymm; two NEON q registers)
_VF8 = ir.VectorType(_F32, VF)


def _make_image_f32(kh: int, kw: int):
    """The float32 twin of _make_image: out[pixel, c] = b[c], then one multiply-add a tap in
    (i, j) order (llvm.fmuladd: kernels_dwflat's sums, the same bits), then ReLU (act 1) or a
    clip to [0, alpha] (act 9) in registers; other activations are the caller's. Addresses in
    bytes; cbp, wp, ldw in elements."""

    def codegen(context, builder, signature, args):
        xp, w, ldw, b, out, nvec, ho, wo, sh, cbp, wp, act, alpha = args
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VF8, [_VF8] * 3),
                                             f"llvm.fmuladd.v{VF}f32")
        zero = ir.Constant(_VF8, None)
        top = _splat(builder, alpha, _VF8)
        cb4 = builder.mul(cbp, _const(4))
        row = builder.mul(wp, cb4)
        taps = [builder.add(builder.mul(_const(i), row), builder.mul(_const(j), cb4))
                for i in range(kh) for j in range(kw)]
        is_relu = builder.icmp_signed("==", act, _const(1))
        is_clip = builder.icmp_signed("==", act, _const(9))

        def setup(c4):
            ws = [builder.load(_ptr(builder, builder.add(w, builder.add(builder.mul(
                _const(4 * t), ldw), c4)), _VF8), align=4) for t in range(kh * kw)]
            return ws, builder.load(_ptr(builder, builder.add(b, c4), _VF8), align=4)

        def pixel(state, xa, oa):
            ws, acc = state
            for t, off in enumerate(taps):
                xv = builder.load(_ptr(builder, builder.add(xa, off), _VF8), align=4)
                acc = builder.call(fma, [ws[t], xv, acc])
            # kernels_fp32.relu (NaN passes) and the clip of kernels_dw._copy_out
            r = builder.select(builder.fcmp_ordered("<", acc, zero), zero, acc)
            c = builder.select(builder.fcmp_ordered(">", r, top), top, r)
            acc = builder.select(is_relu, r, builder.select(is_clip, c, acc))
            builder.store(acc, _ptr(builder, oa, _VF8), align=4)

        _each_pixel(builder, xp, out, nvec, ho, wo, sh, cb4, row, 4 * VF, setup, pixel)
        return context.get_dummy_value()

    @intrinsic
    def image(typingctx, xp, w, ldw, b, out, nvec, ho, wo, sh, cbp, wp, act, alpha):
        return types.void(*[types.intp] * 12, types.float32), codegen

    return image


_image3f, _image5f = _make_image_f32(3, 3), _make_image_f32(5, 5)


_in_blocks_f32, _out_blocks_f32 = _make_blocks(_VF8, VF, 4)


def pays_f32(h: int, wd: int, ho: int, wo: int, sh: int) -> bool:
    """Whether float32 channels innermost beat kernels_dw's padded planes (the portable path
    and ARM; AVX-512 has kernels_fma_dw).

    NOTE: measured per layer, one thread. Emulated Pi 5 (instructions): 0.34x (480 x 4 x 4),
    0.68-0.74x on 8 x 8 and 7 x 7, 0.84-0.97x on 16 x 16, 14 x 14 and 28 x 28 at stride 1;
    1.06x on a 28 x 28 input at stride 2, 1.16-1.27x from 32 x 32 up. x86 (the portable path on
    the AVX-512 host): 0.49x on 4 x 4, 1.0-2.2x on everything larger (kernels_dwflat's 8-float
    flat sums are as fast per tap there, and the transposes cost)."""
    if _ARM:
        return h * wd <= (784 if sh == 1 else 256)
    return ho * wo <= 16


def blocks_f32(c: int) -> int:
    return -(-c // VF)


def scratch_sizes_f32(c, h, wd, ho, wo, ph, pw, parts) -> tuple[int, int]:
    """(floats of a part's channel-last padded image, of its channel-last outputs)."""
    cb = -(-blocks_f32(c) // parts) * VF
    return (h + 2 * ph) * (wd + 2 * pw) * cb, ho * wo * cb


def prepare_f32(w: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(wt (kh*kw, Cp) float32 taps-major, b (Cp,)): Cp the channels rounded up to VF, zeros
    past C (and a zero bias where the conv has none)."""
    c = w.shape[0]
    cp = blocks_f32(c) * VF
    wt = np.zeros((w.shape[2] * w.shape[3], cp), np.float32)
    wt[:, :c] = w.reshape(c, -1).T
    bp = np.zeros(cp, np.float32)
    if b.shape[0]:
        bp[:c] = b
    return wt, bp


@kernel(contract=True)
def dw_conv_cl(out, x, wt, b, xp_all, tmp_all, sh, ph, pw, act, alpha):
    """out (N, C, Ho, Wo) float32: kernels_dw.dw_conv_padded's conv (bias, then the taps in
    (i, j) order, then the activation `act`) with the channels innermost; wt, b from
    prepare_f32; xp_all / tmp_all (parts, scratch_sizes_f32) float32 scratch, a row a part."""
    parts = xp_all.shape[0]
    nb = (x.shape[1] + VF - 1) // VF
    for part in prange(parts):
        b0, b1 = part * nb // parts, (part + 1) * nb // parts
        if b1 > b0:
            _part_f32(out, x, wt, b, xp_all[part], tmp_all[part], b0, b1, sh, ph, pw, act, alpha)


@njit(cache=True, fastmath={"contract"})
def _part_f32(out, x, wt, b, xp, tmp, b0, b1, sh, ph, pw, act, alpha):
    n, c, h, wd = x.shape
    ho, wo = out.shape[2], out.shape[3]
    c0, c1 = b0 * VF, min(c, b1 * VF)
    cbp = (b1 - b0) * VF
    wp = wd + 2 * pw
    kt = wt.shape[0]
    xf, of = x.reshape(-1), out.reshape(-1)
    xp[:(h + 2 * ph) * wp * cbp] = 0.0
    xa, ta = np.int64(xp.ctypes.data), np.int64(tmp.ctypes.data)
    wa, ba = np.int64(wt.ctypes.data) + 4 * c0, np.int64(b.ctypes.data) + 4 * c0
    hw, howo = h * wd, ho * wo
    full = (c1 - c0) // VF
    # ReLU and clip in the registers; any other activation over the outputs after
    inner = act if act == 1 or act == 9 else 0
    for im in range(n):
        for v in range(full):
            _in_blocks_f32(np.int64(x.ctypes.data) + 4 * (im * c + c0 + v * VF) * hw, 4 * hw,
                           xa + 4 * v * VF, cbp, wd, wp, ph, pw, hw // VF)
        _tails_in(xp, xf, (im * c + c0) * hw, c1 - c0, full, VF, hw, wd, wp, ph, pw, cbp)
        if kt == 9:
            _image3f(xa, wa, wt.shape[1], ba, ta, b1 - b0, ho, wo, sh, cbp, wp, inner, alpha)
        else:
            _image5f(xa, wa, wt.shape[1], ba, ta, b1 - b0, ho, wo, sh, cbp, wp, inner, alpha)
        if inner != act:
            act_inplace(tmp, 0, howo * cbp, np.float32(0.0), act, alpha)
        for v in range(full):
            dst = np.int64(out.ctypes.data) + 4 * (im * c + c0 + v * VF) * howo
            _out_blocks_f32(ta + 4 * v * VF, cbp, dst, 4 * howo, howo // VF)
        _tails_out(of, tmp, (im * c + c0) * howo, c1 - c0, full, VF, howo, cbp)
