"""The flat loop of kernels_dw's padded-plane depthwise convs (float32 sums: fp32, and int8's
float32 route), as LLVM vectors of 8 floats that every CPU compiles.

    tmp[t] = bo + sum over taps (i, j) of w[i, j] * xp[t + offset(i, j)],   t < n_out

offset(i, j) = i * pitch + j at stride 1; at stride 2, the tap's phase plane (see kernels_dw's
layout) + (i // 2) * pitch + j // 2. A chunk of CHUNK outputs keeps CHUNK / 8 vectors of sums
in registers (8 chains of multiply-adds in flight: enough for two FMA units of 4-5 cycles'
latency) and, per tap, broadcasts the weight once and loads each vector of inputs at the
tap's offset; the last 16 outputs of a plane (n_out is a multiple of kernels_dw.VEC) take a
chunk of two vectors.

What it replaces: the same sums written as Numba loops over 64 outputs, which LLVM left half
scalar (48 scalar FMAs and 26 calls in the 5x5 loop's code): EfficientNet-B0's 240 x 28 x 28
5x5 plane sums took 0.25 ms where the FMA units need 0.1.

Exactness: each sum is bo, then one fused multiply-add per tap in (i, j) order: the same
float32 operations as the Numba loops (compiled with FMA contraction), the same bits.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from pocket.infer.kernels_vnni import _const, _loop, _ptr, _splat

VL = 8  # floats a vector
CHUNK = 64  # outputs a chunk (8 vectors)
TAIL = 16  # outputs of the last chunks (kernels_dw.VEC)

_F32 = ir.FloatType()
_VF = ir.VectorType(_F32, VL)


def _make_flat(kh: int, kw: int, stride: int, nv: int, clamp: bool = False):
    """The sums of `count` chunks of nv vectors from output t0 on, for fixed taps and stride;
    with clamp, each sum put in [lo, hi] as it is stored (NaN passes: kernels_fp32.relu's rule)."""

    def codegen(context, builder, signature, args):
        tmp, xp, w, bo, t0, count, pitch, plane = args[:8]
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VF, [_VF] * 3),
                                             f"llvm.fmuladd.v{VL}f32")
        vbo = _splat(builder, bo, _VF)

        def tap_base(i, j):
            """Byte offset of tap (i, j)'s first input from an output's, less its column."""
            if stride == 1:
                return builder.mul(builder.mul(_const(i), pitch), _const(4))
            phase = builder.mul(_const((i & 1) * 2 + (j & 1)), plane)
            return builder.mul(builder.add(phase, builder.mul(_const(i >> 1), pitch)), _const(4))

        # (row base, constant column bytes) of each tap: a few bases, reused across the row
        bases = {}
        taps = []
        for i in range(kh):
            for j in range(kw):
                key = (i, 0 if stride == 1 else j & 1)
                if key not in bases:
                    bases[key] = tap_base(i, j)
                col = j if stride == 1 else j >> 1
                taps.append((bases[key], 4 * col, 4 * (i * kw + j)))

        def chunk(c, carried):
            at = builder.mul(builder.add(t0, builder.mul(c, _const(nv * VL))), _const(4))
            x0 = builder.add(xp, at)
            accs = [vbo] * nv
            for base, col, wo in taps:
                wb = _splat(builder, builder.load(_ptr(builder, builder.add(w, _const(wo)), _F32),
                                                  align=4), _VF)
                xa = builder.add(builder.add(x0, base), _const(col))
                accs = [builder.call(fma, [wb, builder.load(
                    _ptr(builder, builder.add(xa, _const(4 * VL * v)), _VF), align=4), accs[v]])
                    for v in range(nv)]
            ta = builder.add(tmp, at)
            for v in range(nv):
                t = accs[v]
                if clamp:
                    t = builder.select(builder.fcmp_ordered("<", t, vlo), vlo, t)
                    t = builder.select(builder.fcmp_ordered(">", t, vhi), vhi, t)
                builder.store(t, _ptr(builder, builder.add(ta, _const(4 * VL * v)), _VF), align=4)
            return []

        if clamp:
            vlo, vhi = _splat(builder, args[8], _VF), _splat(builder, args[9], _VF)
        _loop(builder, count, [], chunk)
        return context.get_dummy_value()

    sig = (types.intp, types.intp, types.intp, types.float32, *[types.intp] * 4)

    if clamp:
        @intrinsic
        def flat_clamped(typingctx, tmp, xp, w, bo, t0, count, pitch, plane, lo, hi):
            return types.void(*sig, types.float32, types.float32), codegen

        return flat_clamped

    @intrinsic
    def flat(typingctx, tmp, xp, w, bo, t0, count, pitch, plane):
        return types.void(*sig), codegen

    return flat


_FLAT = {(kh, s, nv): _make_flat(kh, kh, s, nv)
         for kh in (3, 5) for s in (1, 2) for nv in (CHUNK // VL, TAIL // VL)}
_f3s1, _f3s1t = _FLAT[3, 1, 8], _FLAT[3, 1, 2]
_f3s2, _f3s2t = _FLAT[3, 2, 8], _FLAT[3, 2, 2]
_f5s1, _f5s1t = _FLAT[5, 1, 8], _FLAT[5, 1, 2]
_f5s2, _f5s2t = _FLAT[5, 2, 8], _FLAT[5, 2, 2]
# kernels_dw._direct_3x3's: the sums written to the output, ReLU or clip on the way
_f3s1c, _f3s1tc = _make_flat(3, 3, 1, CHUNK // VL, True), _make_flat(3, 3, 1, TAIL // VL, True)


@njit(cache=True, inline="always")
def flat_sums(tmp, xp, wf, wb, bo, n_out, pitch, plane, kh, s):
    """tmp[t] = bo + the sum of output t's taps for t < n_out (a multiple of TAIL), the
    weights wf[wb:wb + kh * kh]; kh 3 or 5, stride s 1 or 2 (kernels_dw.padded_fast)."""
    ta, xa = tmp.ctypes.data, xp.ctypes.data
    wa = wf.ctypes.data + wb * 4
    full = n_out // CHUNK
    t1 = full * CHUNK
    rest = (n_out - t1) // TAIL
    if kh == 3 and s == 1:
        _f3s1(ta, xa, wa, bo, 0, full, pitch, plane)
        _f3s1t(ta, xa, wa, bo, t1, rest, pitch, plane)
    elif kh == 3:
        _f3s2(ta, xa, wa, bo, 0, full, pitch, plane)
        _f3s2t(ta, xa, wa, bo, t1, rest, pitch, plane)
    elif s == 1:
        _f5s1(ta, xa, wa, bo, 0, full, pitch, plane)
        _f5s1t(ta, xa, wa, bo, t1, rest, pitch, plane)
    else:
        _f5s2(ta, xa, wa, bo, 0, full, pitch, plane)
        _f5s2t(ta, xa, wa, bo, t1, rest, pitch, plane)
