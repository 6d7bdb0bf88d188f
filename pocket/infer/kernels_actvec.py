"""The costly float32 activations (sigmoid, SiLU, hardswish, hardsigmoid) over a run of
elements as LLVM vectors, CHAINS independent vectors of VL floats a step, interleaved:

    dst[i] = activation(src[i] + bo)      for i < n   (dst may be src)

Why: Numba's loops (kernels_fp32._act_loops) vectorize these, but LLVM interleaves only small
loop bodies, and SiLU's exp is a chain of ~20 dependent vector operations an iteration. A CPU
whose scheduler cannot hold several iterations' worth then waits on the chain: on a first-
generation AMD EPYC (AVX2, each ymm operation two halves) the loop ran SiLU at 1.7-2.3 ns an
element (EfficientNet-B0: ~11 ms of a 45 ms call). Here each step computes CHAINS vectors,
their operations emitted stage by stage, so the chains overlap in the instruction stream
itself, and the exp takes fewer operations (see _exp): SiLU 1.65 -> 1.17 ns an element there
(onnxruntime's QuickGelu: ~1.45). A vector of 16 is two ymm on AVX2 (four chains in flight),
four q registers on NEON, one zmm on AVX-512. The exp's n comes from adding 1.5 * 2**23 + 127
(round to nearest, n + 127 in the low bits) instead of floor and a conversion: the same n
except where x * log2(e) is within a rounding of a half (either n keeps |r| <= ln2 / 2).

The last n % (CHAINS * VL) elements go through a zero-filled stack block of one step, so every
element is computed by the same instructions wherever a run starts or ends (a split of the
work into parts gives the serial bytes).

Exactness: hardswish and hardsigmoid are kernels_math's float32 steps (_div6_32, _relu6_32);
sigmoid and SiLU divide as fdiv does, on an exp within 1.2 x 2**-24 of exp32's accuracy (a
degree-6 fit in place of its degree-7 polynomial). Multiply-adds are `llvm.fmuladd` (one FMA
where the CPU has it, as the loops' FMA contraction gave). All within the ulp bounds that
tests/infer/test_act_vector.py checks against float64.
"""

from __future__ import annotations

import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from pocket.infer.kernels_math import _LOG2E
from pocket.infer.kernels_vnni import _const, _loop, _ptr, _splat

VL = 16  # floats a vector (two ymm on AVX2, four q registers on NEON, one zmm on AVX-512)
CHAINS = 2  # vectors a step
STEP = VL * CHAINS
# the codes of kernels_fp32.ACT these runs take (pocket/formats/ops.py)
SIGMOID, HARDSWISH, HARDSIGMOID, SILU = 3, 7, 8, 10
ACTS = (SIGMOID, HARDSWISH, HARDSIGMOID, SILU)
# LLVM IR: without Numba's JIT the loops of kernels_fp32 run instead
AVAILABLE = not numba.config.DISABLE_JIT

_F32, _I32 = ir.FloatType(), ir.IntType(32)
# 1.5 * 2**23 + 127: x + _MAGIC rounds x to an integer n, n + 127 in its low bits
_MAGIC = 12583039.0
# exp(r) on |r| <= ln2 / 2 (a degree-6 fit, relative error 3.7e-9; evaluated in float32 with
# FMAs within 1.2 x 2**-24 of exp, as exp32's degree-7 Taylor polynomial is within 1.04): one
# multiply-add fewer
_POLY = (1.0, 1.0, 0.4999997615814209, 0.16666461527347565, 0.04167237877845764,
         0.008372019045054913, 0.0013596528442576528)
_VF, _VI = ir.VectorType(_F32, VL), ir.VectorType(_I32, VL)


def _fc(v: float) -> ir.Constant:
    """A vector constant, every lane float32(v)."""
    return ir.Constant(_VF, [float(v)] * VL)


class _Stage:
    """The operations of one step, each applied to all CHAINS vectors before the next."""

    def __init__(self, builder):
        self.b = builder
        mod = builder.module
        self._fma = cgutils.get_or_insert_function(mod, ir.FunctionType(_VF, [_VF] * 3),
                                                   f"llvm.fmuladd.v{VL}f32")

    def fma(self, a, b, c):
        return [self.b.call(self._fma, [x, y, z]) for x, y, z in zip(a, b, c)]

    def op(self, name, a, b):
        return [getattr(self.b, name)(x, y) for x, y in zip(a, b)]

    def pick(self, cmp, a, b, yes, no):
        """[yes if a cmp b else no] (ordered compares: false where a NaN is involved)."""
        return [self.b.select(self.b.fcmp_ordered(cmp, x, y), s, t)
                for x, y, s, t in zip(a, b, yes, no)]


def _k(v: float) -> list:
    return [_fc(v)] * CHAINS


def _exp(s: _Stage, x, xn):
    """exp(x) for x in [-86.9, 89] (kernels_math._exp32_clamped's steps, fewer operations); xn
    is x, or 0 where x is NaN (n must be a number). n = round(x log2 e) comes from adding
    _MAGIC, whose low bits then hold n + 127: shifted, the bits of 2**n. From n = 128 (x past
    88.38, where exp is within a factor 1.4 of float32's largest) the scale is inf: SiLU and
    sigmoid are then 0 where their values are below 4e-37."""
    t = s.fma(xn, _k(_LOG2E), _k(_MAGIC))
    n = s.op("fsub", t, _k(_MAGIC))
    neg_n = [s.b.fneg(v) for v in n]
    r = s.fma(neg_n, _k(0.693359375), x)
    r = s.fma(neg_n, _k(-2.12194440e-4), r)
    p = _k(_POLY[-1])
    for c in _POLY[-2::-1]:
        p = s.fma(p, r, _k(c))
    bits = [s.b.shl(s.b.bitcast(v, _VI), ir.Constant(_VI, [23] * VL)) for v in t]
    return s.op("fmul", p, [s.b.bitcast(v, _VF) for v in bits])


def _div6(s: _Stage, p):
    """kernels_math._div6_32: q = p / 6 and one correction by the residual p - 6q."""
    q = s.op("fmul", p, _k(1.0 / 6.0))
    r = s.fma([s.b.fneg(v) for v in q], _k(6.0), p)
    return s.fma(r, _k(1.0 / 6.0), q)


def _relu6(s: _Stage, t):
    """kernels_math._relu6_32: min(max(t, 0), 6), NaN kept."""
    t = s.pick("<", t, _k(0.0), _k(0.0), t)
    return s.pick(">", t, _k(6.0), _k(6.0), t)


def _apply(s: _Stage, act: int, v):
    """The activation of kernels_fp32._act_loops' branch for `act`, on CHAINS vectors v."""
    one = _k(1.0)
    if act == SILU:
        # _exp32_silu: -v clamped as max then min (a NaN goes to -86.9: v / (1 + e) is NaN)
        x = [s.b.fneg(u) for u in v]
        x = s.pick(">", x, _k(-86.9), x, _k(-86.9))
        x = s.pick("<", x, _k(89.0), x, _k(89.0))
        return s.op("fdiv", v, s.op("fadd", one, _exp(s, x, x)))
    if act == SIGMOID:
        # exp32: NaN kept
        x = [s.b.fneg(u) for u in v]
        x = s.pick("<", x, _k(-86.9), _k(-86.9), x)
        x = s.pick(">", x, _k(89.0), _k(89.0), x)
        xn = s.pick("==", x, x, x, _k(0.0))
        return s.op("fdiv", one, s.op("fadd", one, _exp(s, x, xn)))
    t = _relu6(s, s.op("fadd", v, _k(3.0)))
    if act == HARDSIGMOID:
        return _div6(s, t)
    h = _div6(s, s.op("fmul", v, t))
    # from 3 on hardswish is v itself (exact; inf stays inf)
    return s.pick(">=", v, _k(3.0), v, h)


def _make_run(act: int):
    def codegen(context, builder, signature, args):
        dst, src, n, bo = args
        s = _Stage(builder)
        vbo = [_splat(builder, bo, _VF)] * CHAINS

        def step(d, x, biased=True):
            """The STEP elements at byte address x through the activation into address d."""
            v = [builder.load(_ptr(builder, builder.add(x, _const(4 * VL * c)), _VF), align=4)
                 for c in range(CHAINS)]
            out = _apply(s, act, s.op("fadd", v, vbo) if biased else v)
            for c in range(CHAINS):
                builder.store(out[c], _ptr(builder, builder.add(d, _const(4 * VL * c)), _VF),
                              align=4)

        def steps(biased):
            def body(i, carried):
                at = builder.mul(i, _const(4 * STEP))
                step(builder.add(dst, at), builder.add(src, at), biased)
                return []
            return body

        full = builder.sdiv(n, _const(STEP))
        # NOTE: without a bias (most calls: the GEMMs and the depthwise planes add theirs) a
        # loop without its add, one vector operation of ~17 (a -0.0 then stays -0.0). Not for
        # hardswish: in place, its `v if v >= 3` became a masked store of the other lanes
        # (vmaskmovps, microcoded on AMD: 0.56 -> 1.0 ns an element)
        no_bias = builder.fcmp_ordered("==", bo, ir.Constant(_F32, 0.0))
        if act in (HARDSWISH, HARDSIGMOID):
            no_bias = ir.Constant(ir.IntType(1), 0)
        with builder.if_else(no_bias) as (plain, biased):
            with plain:
                _loop(builder, full, [], steps(False))
            with biased:
                _loop(builder, full, [], steps(True))
        # the tail through a block of one step on the stack, zeros past its elements
        rest = builder.sub(n, builder.mul(full, _const(STEP)))
        block = cgutils.alloca_once(builder, ir.ArrayType(_F32, STEP))
        blk = builder.ptrtoint(block, ir.IntType(64))
        tail = builder.mul(full, _const(4 * STEP))
        with builder.if_then(builder.icmp_signed(">", rest, _const(0))):
            def fill(i, carried):
                at = builder.mul(i, _const(4))
                inside = builder.icmp_signed("<", i, rest)
                with builder.if_else(inside) as (yes, no):
                    with yes:
                        val = builder.load(_ptr(builder, builder.add(builder.add(src, tail), at),
                                                _F32), align=4)
                        builder.store(val, _ptr(builder, builder.add(blk, at), _F32), align=4)
                    with no:
                        builder.store(ir.Constant(_F32, 0.0),
                                      _ptr(builder, builder.add(blk, at), _F32), align=4)
                return []

            _loop(builder, _const(STEP), [], fill)
            step(blk, blk)

            def back(i, carried):
                at = builder.mul(i, _const(4))
                val = builder.load(_ptr(builder, builder.add(blk, at), _F32), align=4)
                builder.store(val, _ptr(builder, builder.add(builder.add(dst, tail), at), _F32),
                              align=4)
                return []

            _loop(builder, rest, [], back)
        return context.get_dummy_value()

    @intrinsic
    def run(typingctx, dst, src, n, bo):
        """dst[i] = activation(src[i] + bo) for i < n (byte addresses; dst may be src)."""
        return types.void(types.intp, types.intp, types.intp, types.float32), codegen

    return run


run_sigmoid, run_hardswish, run_hardsigmoid, run_silu = (_make_run(a) for a in ACTS)
