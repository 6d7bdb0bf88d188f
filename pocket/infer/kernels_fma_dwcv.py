"""float32 depthwise convs on small maps on x86 with AVX-512, vectorized along the channels
(routes.conv_fma_depthwise): 16 channels a vector, as onnxruntime's NCHWc layout has them.

On a 7x7 or 14x14 map a plane's rows fill vectors of 16 pixels badly (7 of 16 lanes; the flat
kernel's masked loads fill 49 of 64 and load a mask beside each tap), and a stride-2 conv
needs shuffles or phase planes. Here a part takes 16 planes at a time: their rows are
transposed into a zero-padded scratch of Hp x Wp pixels x 16 channels (16 x 16 transposes in
registers), each output is then k*k multiply-adds of whole vectors (one weight vector a tap,
the channels' taps packed once at load: `pack`), at any stride, 8 outputs of a row at a
time; the activation runs in registers and the outputs go back to the planes' rows by the
same transposes (kernels_fma_cv's way out).

The sums differ from the reference's float64 sum by float32 rounding only (bias first, the
taps in row order, one chain an output). ARM and older x86 keep kernels_dw.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from pocket.infer import kernels_fma as kfma
from pocket.infer import kernels_fma_cv as kcv
from pocket.infer.jit import kernel
from pocket.infer.kernels_fma_cv import _out16
from pocket.infer.kernels_fp32 import act_inplace
from pocket.infer.kernels_vnni import _const, _lanes_below, _masked_io, _ptr

_VF = ir.VectorType(ir.FloatType(), 16)
NO = 8  # outputs of a row computed together (8 chains in flight)
# maps this kernel takes: at most this many output pixels a plane (the route checks)
MAX_OUT = 196


def pack(w: np.ndarray) -> np.ndarray:
    """Depthwise weights (C, 1, k, k) as (groups, k*k, 16): group g's tap t holds channels
    16g..16g+15 (zeros past C); kernels_fma_cv.pack's layout of the (C, k*k) taps. The bias
    pads as gemm_cv's (kernels_fma_cv.pad_bias)."""
    return kcv.pack(w.reshape(w.shape[0], -1))


def scratch_floats(hp: int, wp: int, ho: int, wo: int) -> int:
    """A part's scratch: the padded pixels x 16 channels, then the outputs x 16, each with a
    guard of NO + 16 vectors (the last outputs of a row read and write past it)."""
    return (hp * wp + wp * 8 + NO * 4 + 16) * 16 + (ho * wo + NO + 16) * 16


def _make_tin():
    """dst[j] (64 bytes apart) = channel r's input at column j of a row, r < 16, for j < cols:
    src the address of channel 0's first input of the row (channels lds bytes apart, rows >=
    rows read as zeros), cols 1..16; 16 masked loads (nothing past the row is read), one
    16 x 16 transpose, `cols` stores."""

    @intrinsic
    def tin(typingctx, src, lds, rows, cols, dst):
        sig = types.void(*[types.intp] * 5)

        def codegen(context, builder, signature, args):
            src, lds, rows, cols, dst = args
            ld, _ = _masked_io(builder, _VF, 4)
            lanes = _lanes_below(builder, cols)
            none = _lanes_below(builder, _const(0))
            vecs = []
            for r in range(16):
                m = builder.select(builder.icmp_signed("<", _const(r), rows), lanes, none)
                vecs.append(ld(builder.add(src, builder.mul(lds, _const(r))), m))
            for j, v in enumerate(kfma._transposed(builder, vecs)):
                with builder.if_then(builder.icmp_signed("<", _const(j), cols)):
                    builder.store(v, _ptr(builder, builder.add(dst, _const(64 * j)), _VF), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return tin


_tin = _make_tin()


def _make_outs(k: int, no: int):
    """no outputs of one row (16 channels each): p (the scratch pixel of the first output's
    tap (0, 0)), ldp (bytes between the scratch's rows), step (bytes between the outputs'
    first taps: 64 x stride), w (the group's k*k weight vectors), bias (its 16 biases), mode
    (the tiles' activation, kernels_fma._by_mode), r (where the outputs go, 64 bytes apart)."""

    @intrinsic
    def outs(typingctx, p, ldp, step, w, bias, mode, r):
        sig = types.void(*[types.intp] * 7)

        def codegen(context, builder, signature, args):
            p, ldp, step, w, bias, mode, r = args
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VF, [_VF] * 3),
                                                 "llvm.fma.v16f32")
            bv = builder.load(_ptr(builder, bias, _VF), align=4)
            acc = [bv] * no
            at = [builder.add(p, builder.mul(step, _const(o))) for o in range(no)]
            for i in range(k):
                row = builder.mul(ldp, _const(i))
                for j in range(k):
                    wt = builder.load(_ptr(builder, builder.add(w, _const(64 * (i * k + j))), _VF), align=4)
                    for o in range(no):
                        a = builder.add(builder.add(at[o], row), _const(64 * j))
                        acc[o] = builder.call(fma, [wt, builder.load(_ptr(builder, a, _VF), align=4), acc[o]])

            def store(act):
                for o in range(no):
                    builder.store(act(builder, acc[o]), _ptr(builder, builder.add(r, _const(64 * o)), _VF),
                                  align=4)

            kfma._by_mode(builder, mode, store)
            return context.get_dummy_value()

        return sig, codegen

    return outs


_O3, _O5 = _make_outs(3, NO), _make_outs(5, NO)


@kernel
def dw_conv_fma_cv(out, x, wpk, bp, scratch, sh, ph, pw, mode, act, alpha):
    """out (N, C, Ho, Wo) = act(depthwise k x k conv (stride sh both ways, padding ph, pw) of x
    + bias), k = 3 or 5, wpk = pack(w), bp = pad_bias(b, C). mode >= 0: the activation in
    registers (kernels_fma's tile modes), else act (alpha) in one pass over each plane.
    scratch (parts, scratch_floats(...)) f32, any contents: each part takes an even run of
    the (image, 16-channel group) tasks."""
    parts = scratch.shape[0]
    tasks = x.shape[0] * wpk.shape[0]
    for part in prange(parts):
        for t in range(part * tasks // parts, (part + 1) * tasks // parts):
            _cv_group(out, x, wpk, bp, scratch[part], t, sh, ph, pw, mode, act, alpha)


@njit(cache=True)
def _cv_group(out, x, wpk, bp, scratch, t, sh, ph, pw, mode, act, alpha):
    n, c, h, wd = x.shape
    ho, wo = out.shape[2], out.shape[3]
    g_n, kk = wpk.shape[0], wpk.shape[1]
    k = 3 if kk == 9 else 5
    hp, wp = (ho - 1) * sh + k, (wo - 1) * sh + k
    img, g = t // g_n, t % g_n
    c0 = g * 16
    rows = min(16, c - c0)
    pad = scratch[:hp * wp * 16]
    pad[:] = np.float32(0.0)
    pa = np.int64(scratch.ctypes.data)
    ra = pa + (hp * wp + wp * 8 + NO * 4 + 16) * 64
    xa = np.int64(x.ctypes.data) + ((img * c + c0) * h * wd) * 4
    for y in range(h):
        if y + ph >= hp:
            break
        for x0 in range(0, wd, 16):
            cols = min(16, wd - x0, wp - pw - x0)
            if cols > 0:
                _tin(xa + (y * wd + x0) * 4, np.int64(h * wd * 4), np.int64(rows), np.int64(cols),
                     pa + ((y + ph) * wp + pw + x0) * 64)
    wa = np.int64(wpk.ctypes.data) + g * kk * 64
    ba = np.int64(bp.ctypes.data) + c0 * 4
    reg = np.int64(max(mode, 0))
    step, ldp = np.int64(sh * 64), np.int64(wp * 64)
    for oy in range(ho):
        prow = pa + oy * sh * wp * 64
        rrow = ra + oy * wo * 64
        # NOTE: always NO outputs at a time, the last ones of a row past its end (they land
        # on the next row's, computed after, or on the guard): one at a time, a row of 7
        # waited on its single chain of k*k multiply-adds (1152 x 7 x 7 5x5: 117 us)
        for ox in range(0, wo, NO):
            if k == 3:
                _O3(prow + ox * sh * 64, ldp, step, wa, ba, reg, rrow + ox * 64)
            else:
                _O5(prow + ox * sh * 64, ldp, step, wa, ba, reg, rrow + ox * 64)
    oa = np.int64(out.ctypes.data) + ((img * c + c0) * ho * wo) * 4
    for oy in range(ho):
        for x0 in range(0, wo, 16):
            _out16(ra + (oy * wo + x0) * 64, np.int64(64), oa + (oy * wo + x0) * 4, np.int64(ho * wo * 4),
                   np.int64(rows), np.int64(min(16, wo - x0)))
    if mode < 0 and act != 0:
        flat = out.reshape(-1)
        for r in range(rows):
            act_inplace(flat, (img * c + c0 + r) * ho * wo, ho * wo, np.float32(0.0), act, alpha)
