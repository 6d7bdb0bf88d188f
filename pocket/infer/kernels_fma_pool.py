"""float32 max pooling on x86 with AVX-512: kernels_pool.maxpool_sep's separable pool with both
passes as 16-lane IR.

kernels_pool's passes are plain Numba over each input row: on the short rows of the pools
between convs (SqueezeNet's 3x3/2 over 128 x 55 x 55 and 256 x 27 x 27) they ran
mostly in scalar remainders, 0.2 ms each where onnxruntime took 0.09 and 0.03. Here each
output row takes, per chunk of 16 input columns, one masked load of each window row and their
max, kept in registers, then, per chunk of 16 outputs, the window's columns from those: at
stride 2 the even and odd lanes of two of them (kernels_fma_dw's stride-2 loads), at stride 1
lanes shifted across two.

The windows, the padding and NaN are maxpool_sep's: the padding columns read as -inf (masked
loads), padding rows are skipped (every window has a row inside), and the max is
kernels_fma._vmax (np.maximum's rule: NaN propagates). Only (kw, sw) in FAST come here; one
pool over 256 x 27 x 27 (3x3/2) took 0.054 ms where maxpool_sep took 0.152.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic

from pocket.infer import kernels_fma as kfma
from pocket.infer.jit import kernel
from pocket.infer.kernels_fma_dw import EVEN, ODD
from pocket.infer.kernels_vnni import _const, _lanes_below, _lanes_within, _loop, _masked_io

FAST = ((2, 2), (3, 2), (3, 1))  # (kw, sw) with a compiled column pass; any kh, sh, padding

_F32, _I32, _I64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
_VF, _VI = ir.VectorType(_F32, 16), ir.VectorType(_I32, 16)
_LOW = ir.Constant(_VF, [float("-inf")] * 16)


def fast(kw: int, sw: int) -> bool:
    return (kw, sw) in FAST


def _make_planes(kw: int, sw: int, kh_fixed: int = 0):
    """Planes [first, last) of x (planes h x w at byte address x) pooled into out (ho x wo
    planes), addresses in bytes. Each output row keeps its window's row maxima in registers:
    R(k), lanes l, is the max over the window's rows (those inside the plane) of input column
    16k + l - pw, -inf outside [0, w); a chunk of 16 outputs takes R(2c), R(2c + 1) and lane 0
    of R(2c + 2) at stride 2 (their even, odd and shifted-even lanes), R(c) and R(c + 1) at
    stride 1, the last one carried into the next chunk.

    NOTE: not through a row buffer in memory: the column pass's loads straddled the row pass's
    masked stores, which cannot forward, and stalled on them (SqueezeNet's 3x3/2 pools ran at
    half their speed)."""
    even2 = ir.Constant(_VI, list(range(2, 32, 2)) + [0])
    last_from_c = ir.Constant(_VI, list(range(15)) + [16])
    shift1 = ir.Constant(_VI, list(range(1, 17)))
    shift2 = ir.Constant(_VI, list(range(2, 18)))

    def codegen(context, builder, signature, args):
        out, x, first, last, h, w, ho, wo, kh, sh, ph, pw = args
        ld, st = _masked_io(builder, _VF, 4)
        out_chunks = builder.sdiv(builder.add(wo, _const(15)), _const(16))

        def smax(a, b):
            return builder.select(builder.icmp_signed(">", a, b), a, b)

        def smin(a, b):
            return builder.select(builder.icmp_signed("<", a, b), a, b)

        def plane(i, carried):
            nc = builder.add(first, i)
            xp = builder.add(x, builder.mul(nc, builder.mul(builder.mul(h, w), _const(4))))
            op = builder.add(out, builder.mul(nc, builder.mul(builder.mul(ho, wo), _const(4))))

            def out_row(oh, carried):
                top = builder.sub(builder.mul(oh, sh), ph)
                r0, r1 = smax(top, _const(0)), smin(builder.add(top, kh), h)
                row0 = builder.add(xp, builder.mul(builder.mul(r0, w), _const(4)))
                pitch = builder.mul(w, _const(4))

                def rmax(k):  # R(k)
                    col = builder.sub(builder.mul(k, _const(16)), pw)
                    inside = _lanes_within(builder, col, w)
                    a0 = builder.add(row0, builder.mul(col, _const(4)))
                    acc = ld(a0, inside, _LOW)
                    if kh_fixed:  # the window's rows unrolled, clamped inside (a repeat changes no max)
                        last = builder.sub(builder.sub(r1, r0), _const(1))
                        for j in range(1, kh_fixed):
                            a = builder.add(a0, builder.mul(smin(_const(j), last), pitch))
                            acc = kfma._vmax(builder, acc, ld(a, inside, _LOW))
                        return acc

                    def more(j, carried):
                        a = builder.add(a0, builder.mul(builder.add(j, _const(1)), pitch))
                        return [kfma._vmax(builder, carried[0], ld(a, inside, _LOW))]

                    return _loop(builder, builder.sub(builder.sub(r1, r0), _const(1)), [acc], more)[0]

                dst = builder.add(op, builder.mul(builder.mul(oh, wo), _const(4)))

                def chunk(c, carried):
                    ra = carried[0]
                    if sw == 1:
                        rb = rmax(builder.add(c, _const(1)))
                        acc = kfma._vmax(builder, ra, builder.shuffle_vector(ra, rb, shift1))
                        if kw == 3:
                            acc = kfma._vmax(builder, acc, builder.shuffle_vector(ra, rb, shift2))
                        nxt = rb
                    else:
                        rb = rmax(builder.add(builder.mul(c, _const(2)), _const(1)))
                        rc = rmax(builder.add(builder.mul(c, _const(2)), _const(2)))
                        acc = kfma._vmax(builder, builder.shuffle_vector(ra, rb, EVEN),
                                         builder.shuffle_vector(ra, rb, ODD))
                        if kw == 3:
                            e2 = builder.shuffle_vector(ra, rb, even2)
                            e2 = builder.shuffle_vector(e2, rc, last_from_c)
                            acc = kfma._vmax(builder, acc, e2)
                        nxt = rc
                    lanes = _lanes_below(builder, builder.sub(wo, builder.mul(c, _const(16))))
                    st(acc, builder.add(dst, builder.mul(c, _const(64))), lanes)
                    return [nxt]

                _loop(builder, out_chunks, [rmax(_const(0))], chunk)
                return []

            _loop(builder, ho, [], out_row)
            return []

        _loop(builder, builder.sub(last, first), [], plane)
        return context.get_dummy_value()

    @intrinsic
    def planes(typingctx, out, x, first, last, h, w, ho, wo, kh, sh, ph, pw):
        return types.void(*[types.intp] * 12), codegen

    return planes


_P22, _P32, _P31 = _make_planes(2, 2), _make_planes(3, 2), _make_planes(3, 1)
# the square windows, their rows unrolled
_Q22, _Q32, _Q31 = _make_planes(2, 2, 2), _make_planes(3, 2, 3), _make_planes(3, 1, 3)


@kernel
def maxpool_fma(out, x, parts, kh, kw, sh, sw, ph, pw):
    """x (N, C, H, W) f32 -> out (N, C, Ho, Wo), as kernels_pool.maxpool_sep (kw, sw in FAST),
    the N*C planes in `parts` shares (one a thread)."""
    planes = x.shape[0] * x.shape[1]
    h, w = x.shape[2], x.shape[3]
    ho, wo = out.shape[2], out.shape[3]
    xa, oa = np.int64(x.ctypes.data), np.int64(out.ctypes.data)
    for part in prange(parts):
        first, last = part * planes // parts, (part + 1) * planes // parts
        if kw == 2:
            if kh == 2:
                _Q22(oa, xa, first, last, h, w, ho, wo, kh, sh, ph, pw)
            else:
                _P22(oa, xa, first, last, h, w, ho, wo, kh, sh, ph, pw)
        elif sw == 2:
            if kh == 3:
                _Q32(oa, xa, first, last, h, w, ho, wo, kh, sh, ph, pw)
            else:
                _P32(oa, xa, first, last, h, w, ho, wo, kh, sh, ph, pw)
        elif kh == 3:
            _Q31(oa, xa, first, last, h, w, ho, wo, kh, sh, ph, pw)
        else:
            _P31(oa, xa, first, last, h, w, ho, wo, kh, sh, ph, pw)
