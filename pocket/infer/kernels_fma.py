"""float32 GEMMs on x86 CPUs with AVX-512: our own register-tiled kernel in place of BLAS
for the convolutions, so that a stride-1 conv reads its padded input directly (no im2col),
Winograd's 16 GEMMs run as one parallel kernel, and Numba's thread pool is the only one.

One tile keeps TILE_O output channels x TILE_P pixels (8 x 2 zmm = 16 accumulators) and,
per step along K, loads two vectors of inputs and broadcasts one weight per channel into 16
fused multiply-adds. Each step's input row starts at its own byte offset (`offs[k]`), which
is what lets one kernel serve three layouts:

- a stride-1 conv at a pixel pitch of Wp (see kernels_fp32.im2col_pitch): row k = (c, i, j)
  of image b's columns is the padded image itself, shifted by (c*Hp + i*dh)*Wp + j*dw; so
  offs[k] is that shift and the GEMM reads the padded images in place (`conv_pitch`);
- explicit columns (K, M) (im2col, Winograd's V[e]): offs[k] = k * M * 4.

Exactness: like BLAS, the sums differ from formats/reference.py by float32 rounding only;
each output is one FMA chain along K in the weights' order.

The engine uses this module only when `AVAILABLE` (AVX-512 on the host and Numba compiling
for the host); ARM and older x86 keep NumPy's BLAS, and the LLVM here is never compiled.
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
from pocket.infer.kernels_vnni import _const, _loop, _ptr

TILE_O, TILE_P = 8, 32  # a tile's channels and pixels; 16 accumulators leave room for loads


def _detect() -> bool:
    """AVX-512F on the host and Numba compiling for the host; POCKET_FP32_FMA=0 opts out."""
    if os.environ.get("POCKET_FP32_FMA", "1") == "0":
        return False
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    import numba
    from llvmlite import binding

    # NOTE: as in kernels_vnni: a cache for a named CPU must run without these instructions
    if numba.config.CPU_NAME not in (None, "host") or numba.config.DISABLE_JIT:
        return False
    feats = binding.get_host_cpu_features()
    return all(feats.get(f, False) for f in ("avx512f", "fma"))


AVAILABLE = _detect()

_I32, _I64, _F32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
_VF = ir.VectorType(_F32, 16)


def _make_tile(rows: int):
    """c[r, 0:32] (+)= sum over k < nk of w[r, k] * x[offs[k] : offs[k] + 32] for r < rows.

    Addresses in bytes: w (rows of ldw, float32), x (the tile's first pixel), offs (int64 byte
    offsets from x, one per k), c (rows of ldc). With acc != 0 the sums start from c.
    """
    nv = TILE_P // 16

    @intrinsic
    def tile(typingctx, w, ldw, x, offs, nk, c, ldc, acc):
        sig = types.void(*[types.intp] * 8)

        def codegen(context, builder, signature, args):
            w, ldw, x, offs, nk, c, ldc, acc = args
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VF, [_VF] * 3),
                                                 "llvm.fma.v16f32")
            start = builder.icmp_signed("!=", acc, _const(0))
            c_at = [[builder.add(builder.add(c, builder.mul(_const(r), ldc)), _const(64 * v))
                     for v in range(nv)] for r in range(rows)]
            init = [builder.select(start, builder.load(_ptr(builder, a, _VF), align=4),
                                   ir.Constant(_VF, None)) for row in c_at for a in row]
            w_at = [builder.add(w, builder.mul(_const(r), ldw)) for r in range(rows)]
            splat = ir.Constant(ir.VectorType(_I32, 16), None)

            def step(i, accs):
                off = builder.load(_ptr(builder, builder.add(offs, builder.mul(i, _const(8))), _I64),
                                   align=8)
                xa = builder.add(x, off)
                xs = [builder.load(_ptr(builder, builder.add(xa, _const(64 * v)), _VF), align=4)
                      for v in range(nv)]
                k4 = builder.mul(i, _const(4))
                out = []
                for r in range(rows):
                    s = builder.load(_ptr(builder, builder.add(w_at[r], k4), _F32), align=4)
                    wb = builder.insert_element(ir.Constant(_VF, ir.Undefined), s, ir.Constant(_I32, 0))
                    wb = builder.shuffle_vector(wb, ir.Constant(_VF, ir.Undefined), splat)
                    out += [builder.call(fma, [wb, xs[v], accs[r * nv + v]]) for v in range(nv)]
                return out

            final = _loop(builder, nk, init, step)
            for a, v in zip((a for row in c_at for a in row), final):
                builder.store(v, _ptr(builder, a, _VF), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return tile


_t1, _t2, _t3, _t4, _t5, _t6, _t7, _t8 = (_make_tile(r) for r in range(1, 9))


@njit(cache=True, inline="always")
def _tile_rows(rows, w, ldw, x, offs, nk, c, ldc):
    if rows == 8:
        _t8(w, ldw, x, offs, nk, c, ldc, 0)
    elif rows == 7:
        _t7(w, ldw, x, offs, nk, c, ldc, 0)
    elif rows == 6:
        _t6(w, ldw, x, offs, nk, c, ldc, 0)
    elif rows == 5:
        _t5(w, ldw, x, offs, nk, c, ldc, 0)
    elif rows == 4:
        _t4(w, ldw, x, offs, nk, c, ldc, 0)
    elif rows == 3:
        _t3(w, ldw, x, offs, nk, c, ldc, 0)
    elif rows == 2:
        _t2(w, ldw, x, offs, nk, c, ldc, 0)
    else:
        _t1(w, ldw, x, offs, nk, c, ldc, 0)


def tile_cols(m: int) -> int:
    """Columns of a GEMM result for m pixels: whole tiles."""
    return -(-m // TILE_P) * TILE_P


@kernel
def gemm(c, w, x, offs, nb, o, m, xs, ws, cs, ldc):
    """nb independent GEMMs: for b < nb, C_b (o, m) = W_b (o, K) @ X_b, K = offs.shape[0],
    where W_b's rows start at w.flat[b*ws] (K apart), C_b's at c.flat[b*cs] (ldc apart),
    and X_b's row k at x.flat[b*xs] + offs[k] bytes (m % TILE_P == 0; every row's m floats
    must be readable). Strides in elements.

    NOTE: the (item, pixel tile) pairs are the parallel loop, and a small one (batch 1, a
    4x4 map) is split along the channels too, to give the threads at least 8 pieces; a
    tile's inputs (32 pixels x K) stay in L1/L2 while every channel block passes over them.
    """
    k = offs.shape[0]
    wa, xa, ca, oa = (np.int64(w.ctypes.data), np.int64(x.ctypes.data), np.int64(c.ctypes.data),
                      np.int64(offs.ctypes.data))
    n_p = m // TILE_P
    tiles_o = (o + TILE_O - 1) // TILE_O
    n_o = max(1, min(tiles_o, (8 + nb * n_p - 1) // (nb * n_p)))
    per_o = (tiles_o + n_o - 1) // n_o * TILE_O
    n_o = (o + per_o - 1) // per_o
    for t in prange(nb * n_p * n_o):
        b, rest = t // (n_p * n_o), t % (n_p * n_o)
        p0, ob = (rest // n_o) * TILE_P, (rest % n_o) * per_o
        xb = xa + (b * xs + p0) * 4
        for o0 in range(ob, min(o, ob + per_o), TILE_O):
            _tile_rows(min(TILE_O, o - o0), wa + (b * ws + o0 * k) * 4, k * 4, xb, oa, k,
                       ca + (b * cs + o0 * ldc + p0) * 4, ldc * 4)


def pitch_offsets(c: int, hp: int, wp: int, kh: int, kw: int, dh: int, dw: int) -> np.ndarray:
    """Byte offsets of a stride-1 conv's row k = (c, i, j) in one padded image (see gemm)."""
    ch, i, j = np.meshgrid(np.arange(c), np.arange(kh), np.arange(kw), indexing="ij")
    return (((ch * hp + i * dh) * wp + j * dw) * 4).reshape(-1).astype(np.int64)


def row_offsets(k: int, m: int) -> np.ndarray:
    """Byte offsets of explicit columns (K, M) f32: row k at k * M floats."""
    return np.arange(k, dtype=np.int64) * (m * 4)
