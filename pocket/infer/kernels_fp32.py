"""float32 kernels of the engine. Each is the optimized twin of an op in formats/reference.py.

Every kernel writes into an output buffer passed in (the engine's arena) and allocates nothing.
Convolutions are im2col into a scratch buffer plus one BLAS GEMM per chunk of images, called by
the engine through `np.matmul(..., out=...)`: NumPy's own BLAS, so the edge install needs no
SciPy (Numba's in-kernel `np.dot` would). The column buffer is (C*kh*kw, N*Ho*Wo), so one sgemm
covers the whole chunk; bias, activation (and a fused maxpool) and the layout back to NCHW are
one epilogue pass.

Activation codes (ACT) are ints so that one compiled kernel serves them all.

Numba caches compiled kernels on disk next to this file, or under NUMBA_CACHE_DIR when set
(use it when the package folder is read-only).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from pocket.formats import ops
from pocket.infer import kernels_actvec as kav
from pocket.infer.jit import kernel

# the scalar math lives in kernels_math; importable from here as before (kernels_ssm, the tests)
from pocket.infer.kernels_math import (  # noqa: F401
    _INV_SQRT2,
    _div6,
    _div6_32,
    _exp32_silu,
    _relu6_32,
    activate,
    erf32,
    erfc32,
    exp32,
    fdiv,
)

ACT = ops.activation_codes()  # name -> code, each op's Fusion.code in pocket/formats/ops.py


@njit(cache=True, inline="always")
def act_run(dst, d0, src, s0, n, bo, act, alpha):
    """dst[d0 + i] = activation(src[s0 + i] + bo) for i < n, dst and src apart (in place:
    act_inplace): one loop per activation, so each vectorizes: none/ReLU/relu6
    exact in float32, hardswish and hardsigmoid in float32 as kernels_fma's tiles (within
    2 ulp of the float64 formula), sigmoid and SiLU in float32 on exp32, GELU on erfc32 (within a few ulp of
    activate(): float32 rounding, as the GEMMs' sums; GELU's left tail within 1e-6 relative
    to x = -4.2, 8e-6 to -13); the others scalar through activate().

    NOTE: the loops are a function of their own (_act_run_loops), not inlined: they took 2-3 s
    to compile, which inlined into each epilogue kernel made a cold first run (and the suite)
    minutes longer. This inlined shim gives it one type per argument: callers passed the
    offsets as int literals, int64 or uint64, and each was another signature, the loops
    compiled again (act_run and act_inplace had seven, ~10-15 s each on a cold cache)."""
    _act_run_loops(dst, np.int64(d0), src, np.int64(s0), np.int64(n), np.float32(bo), np.int64(act),
                   np.float64(alpha))


@njit(cache=True, inline="always")
def act_inplace(a, a0, n, bo, act, alpha):
    """act_run on the same elements: a[a0 + i] = activation(a[a0 + i] + bo) (the same shim)."""
    _act_inplace_loops(a, np.int64(a0), np.int64(n), np.float32(bo), np.int64(act), np.float64(alpha))


# NOTE: contract (FMA contraction only, see jit.kernel): exp32's polynomial as FMAs ran SiLU at
# 0.51 ns an element, 0.87 without; the results move by float32 rounding only
@njit(cache=True, fastmath={"contract"})
def _act_run_loops(dst, d0, src, s0, n, bo, act, alpha):
    _act_loops(dst, d0, src, s0, n, bo, act, alpha)


@njit(cache=True, fastmath={"contract"})
def _act_inplace_loops(a, a0, n, bo, act, alpha):
    """NOTE: one array: given the same one twice, LLVM's runtime alias check sent the loops to
    their scalar versions (SiLU on EfficientNet's depthwise outputs: 917 -> 398 us a layer)."""
    _act_loops(a, a0, a, a0, n, bo, act, alpha)


@njit(cache=True, inline="always")
def _act_loops(dst, d0, src, s0, n, bo, act, alpha):
    """act_run's loops (the activation written out in each loop: through a helper taking act
    as an argument, even a literal one, the loops stayed scalar)."""
    d, s = np.uint64(d0), np.uint64(s0)
    if act == 0:
        for i in range(n):
            dst[d + np.uint64(i)] = src[s + np.uint64(i)] + bo
    elif act == 1:
        for i in range(n):
            dst[d + np.uint64(i)] = relu(src[s + np.uint64(i)] + bo)
    elif act == 9:
        hi = np.float32(alpha)  # relu6 in float32 equals activate's: rounding is monotone
        for i in range(n):
            v = relu(src[s + np.uint64(i)] + bo)
            dst[d + np.uint64(i)] = hi if v > hi else v
    elif kav.AVAILABLE and (act == 3 or act == 7 or act == 8 or act == 10):
        # the costly ones as interleaved vector chains (kernels_actvec)
        da, sa = dst.ctypes.data + d0 * 4, src.ctypes.data + s0 * 4
        if act == 10:
            kav.run_silu(da, sa, n, bo)
        elif act == 7:
            kav.run_hardswish(da, sa, n, bo)
        elif act == 8:
            kav.run_hardsigmoid(da, sa, n, bo)
        else:
            kav.run_sigmoid(da, sa, n, bo)
    elif act == 3:
        for i in range(n):
            v = src[s + np.uint64(i)] + bo
            dst[d + np.uint64(i)] = fdiv(np.float32(1.0), np.float32(1.0) + exp32(-v))
    elif act == 10:
        for i in range(n):
            v = src[s + np.uint64(i)] + bo
            dst[d + np.uint64(i)] = fdiv(v, np.float32(1.0) + _exp32_silu(-v))  # silu
    elif act == 5:
        for i in range(n):
            v = src[s + np.uint64(i)] + bo
            dst[d + np.uint64(i)] = np.float32(0.5) * v * erfc32(v * np.float32(-_INV_SQRT2))
    elif act == 7:
        for i in range(n):
            v = src[s + np.uint64(i)] + bo
            # (from 3 on the formula is v itself: exact, and inf stays inf)
            h = _div6_32(v * _relu6_32(v + np.float32(3.0)))
            dst[d + np.uint64(i)] = v if v >= np.float32(3.0) else h
    elif act == 8:
        for i in range(n):
            v = src[s + np.uint64(i)] + bo
            dst[d + np.uint64(i)] = _div6_32(_relu6_32(v + np.float32(3.0)))  # hardsigmoid
    else:
        for i in range(n):
            dst[d + np.uint64(i)] = activate(np.float64(src[s + np.uint64(i)] + bo), act, alpha)


# NOTE: NaN propagates through ReLU and max pooling, as in formats/reference.py (np.maximum),
# NumPy, PyTorch and onnxruntime: `0 if v < 0 else v` (not `v if v > 0 else 0`, which maps NaN
# to 0) and nanmax below. LLVM vectorizes both as it did the old forms: the ReLU is still one
# compare and a select, and nanmax one max, one unordered compare (a NaN in either), one add
# (NaN there) and a select. A 2x2/2 pool after a ReLU on a 256 x 32 x 32 map ran as fast as
# with Python's max (57.6 vs 51.7 us, serial, min of 300); `b if b > a or b != b else a`
# took 132.


@njit(cache=True, inline="always")
def relu(v):
    """max(v, 0) with NaN passed through (float32 in, float32 out)."""
    return np.float32(0.0) if v < 0 else v


@njit(cache=True, inline="always")
def nanmax(a, b):
    """max(a, b), NaN if either is NaN (np.maximum's rule; Python's max drops a NaN b)."""
    return a + b if a != a or b != b else max(a, b)


@kernel
def bias_act(out, y, rb, cb, b, act, alpha):
    """out (N, O, P) = activation(y + b (O,)) (b may be empty); out may be y.

    y is 2-D: the row of (image i, channel o) is y[i*rb + o, i*cb:i*cb + P], so (rb, cb) =
    (O, 0) reads y (N*O, P) and (0, P) reads a wide GEMM's (O, N*P), which the epilogue then
    lays out as NCHW.
    """
    n, o, p = out.shape
    has_bias = b.shape[0] > 0
    for r in prange(n * o):
        bi, oc = r // o, r % o
        bias_act_run(out[bi, oc], y[bi * rb + oc, bi * cb:bi * cb + p], p,
                     b[oc] if has_bias else np.float32(0.0), act, alpha)


@njit(cache=True, inline="always")
def bias_act_run(dst, src, n, bo, act, alpha):
    """dst[:n] = activation(src[:n] + bo) (dst may be src): none, ReLU and relu6 inlined,
    the others through act_run."""
    if act == 0:
        for i in range(n):
            dst[i] = src[i] + bo
    elif act == 1:
        for i in range(n):
            dst[i] = relu(src[i] + bo)
    elif act == 9:
        hi = np.float32(alpha)  # relu6 in float32 equals activate's: rounding is monotone
        for i in range(n):
            v = relu(src[i] + bo)
            dst[i] = hi if v > hi else v
    elif dst.ctypes.data == src.ctypes.data:
        act_inplace(dst, 0, n, bo, act, alpha)
    else:
        act_run(dst, 0, src, 0, n, bo, act, alpha)


@kernel
def bias_act_cols(c, n, b, act, alpha):
    """c (O, M) f32, column i < n the sums of row i -> activation(c + b[o]) in place and
    columns n..M zeros (b may be empty): a linear's result left in the layout of the next
    linear's GEMM inputs (see lowering.chained_linears); zeros, so that the next GEMM's last
    tile never meets NaN or denormal junk."""
    o, m = c.shape
    has_bias = b.shape[0] > 0
    for j in prange(o):
        row = c[j]
        bias_act_run(row, row, n, b[j] if has_bias else np.float32(0.0), act, alpha)
        for i in range(n, m):
            row[i] = np.float32(0.0)


@kernel
def bias_act_rows(out, y, b, act, alpha):
    """out (N, O) = activation(y (N, O) + b (O,)) (b may be empty); out may be y.

    NOTE: a linear's epilogue. Through `bias_act` its rows are 1 element long (P = 1), and
    the per-row slicing cost ~9 ns per element, as much as the GEMM itself at batch 64; here
    the inner loop runs along O, contiguous and vectorizable.
    """
    n, o = out.shape
    has_bias = b.shape[0] > 0
    for i in prange(n):
        row, dst = y[i], out[i]
        if act == 0:
            for j in range(o):
                dst[j] = row[j] + (b[j] if has_bias else np.float32(0.0))
        elif act == 1:
            for j in range(o):
                dst[j] = relu(row[j] + (b[j] if has_bias else np.float32(0.0)))
        else:
            if has_bias:
                for j in range(o):
                    dst[j] = row[j] + b[j]
                act_inplace(dst, 0, o, np.float32(0.0), act, alpha)
            else:
                bias_act_run(dst, row, o, np.float32(0.0), act, alpha)


_UNARY_BLOCK = 4096  # elements a task of unary


@kernel
def unary(out, x, act, alpha):
    """out (M,) = activation(x (M,)); out may be x (act_run's vector loops, in blocks)."""
    m = x.shape[0]
    for t in prange(-(-m // _UNARY_BLOCK)):
        lo = t * _UNARY_BLOCK
        if out.ctypes.data == x.ctypes.data:
            act_inplace(out, lo, min(_UNARY_BLOCK, m - lo), np.float32(0.0), act, alpha)
        else:
            act_run(out, lo, x, lo, min(_UNARY_BLOCK, m - lo), np.float32(0.0), act, alpha)


@kernel
def im2col(col, x, kh, kw, sh, sw, ph, pw, dh, dw, pad, rb, cb):
    """x (N, C, H, W) -> col, 2-D: image b's row (c, i, j) (as in OIHW) of Ho*Wo pixels lands at
    col[b*rb + (c*kh + i)*kw + j, b*cb:b*cb + Ho*Wo]; outside the image = pad.

    (rb, cb) = (0, Ho*Wo): col (K, N*P), one wide GEMM for the chunk; (K, 0): col (N*K, P).
    """
    n, c, h, w = x.shape
    wo = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    for nc in prange(n * c):
        b, ch = nc // c, nc % c
        xs = x[b, ch].ravel()
        for j in range(kw):
            # ow in [lo, hi) reads inside the row: the copy loop carries no bounds test
            lo = min(wo, max(0, -(-(pw - j * dw) // sw)))
            hi = max(lo, min(wo, -(-(w + pw - j * dw) // sw)))
            for i in range(kh):
                row = col[b * rb + (ch * kh + i) * kw + j]
                for oh in range(ho):
                    ih = oh * sh - ph + i * dh
                    base = b * cb + oh * wo
                    if 0 <= ih < h:
                        src = ih * w + j * dw - pw
                        for ow in range(lo):
                            row[base + ow] = pad
                        # NOTE: unsigned indices (both are >= 0 here) spare Numba its
                        # negative-index wrap-around, so LLVM vectorizes the copy (3x).
                        if sw == 2:
                            # NOTE: the stride a constant: LLVM vectorizes the strided load
                            # (the 224x224 stems: 1.3-1.6x); a literal 1 ran slower than this
                            for ow in range(lo, hi):
                                row[np.uint64(base + ow)] = xs[np.uint64(src + ow * 2)]
                        else:
                            for ow in range(lo, hi):
                                row[np.uint64(base + ow)] = xs[np.uint64(src + ow * sw)]
                        for ow in range(hi, wo):
                            row[base + ow] = pad
                    else:
                        for ow in range(wo):
                            row[base + ow] = pad


def same_valid(h: int, w: int, kh: int, kw: int, ph: int, pw: int, dh: int, dw: int) -> np.ndarray:
    """(kh*kw, H*W) uint8: 1 where output pixel t = oh*W + ow of a stride-1, size-keeping conv
    reads inside the image through kernel tap (i, j), 0 where it reads the padding."""
    oh, ow = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    ih = oh[None, None] - ph + np.arange(kh)[:, None, None, None] * dh
    iw = ow[None, None] - pw + np.arange(kw)[None, :, None, None] * dw
    return ((ih >= 0) & (ih < h) & (iw >= 0) & (iw < w)).reshape(kh * kw, h * w).astype(np.uint8)


@kernel
def im2col_same(col, x, valid, kh, kw, ph, pw, dh, dw, pad, rb, cb):
    """im2col (same layout and arguments) for a stride-1 conv whose output is the input's size
    (Ho, Wo = H, W), with valid = same_valid(...).

    NOTE: output pixel t = oh*W + ow reads the input's flat pixel t + s, s = (i*dh - ph)*W +
    (j*dw - pw), wherever it reads inside the image; so each row is one run over the whole
    plane, the padding selected by the mask. On 8x8 and 4x4 maps im2col's runs of Wo floats
    were too short for LLVM's vector loops: this is 2.3-2.8x faster there.
    """
    n, c, h, w = x.shape
    hw = h * w
    ld = col.shape[1]
    cf, xf, vf = col.reshape(-1), x.reshape(-1), valid.reshape(-1)
    for nc in prange(n * c):
        b, ch = nc // c, nc % c
        for i in range(kh):
            for j in range(kw):
                s = (i * dh - ph) * w + (j * dw - pw)
                row = np.uint64((b * rb + (ch * kh + i) * kw + j) * ld + b * cb)
                # outside [lo, hi) the source is off the plane: padding, whatever the mask
                lo, hi = min(hw, max(0, -s)), max(0, min(hw, hw - s))
                for t in range(lo):
                    cf[row + np.uint64(t)] = pad
                src = np.uint64(nc * hw + s + lo)
                dst, m = row + np.uint64(lo), np.uint64((i * kw + j) * hw + lo)
                for t in range(hi - lo):
                    u = np.uint64(t)
                    v = xf[src + u]
                    cf[dst + u] = v if vf[m + u] else pad
                for t in range(max(lo, hi), hw):
                    cf[row + np.uint64(t)] = pad


@kernel
def conv2d_direct(out, x, w, b, sh, sw, ph, pw, dh, dw, act, alpha):
    """x (N, C, H, W), w (O, C/g, kh, kw), b (O,) or empty -> out (N, O, Ho, Wo).

    Direct loops: the engine uses it where im2col buys nothing (depthwise, C/g == 1).
    """
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    ho, wo = out.shape[2], out.shape[3]
    og = o // (c // cg)
    for no in prange(n * o):
        bi, oc = no // o, no % o
        c0 = (oc // og) * cg
        bo = b[oc] if b.shape[0] > 0 else 0.0
        for oh in range(ho):
            for ow in range(wo):
                acc = 0.0
                for ci in range(cg):
                    for i in range(kh):
                        ih = oh * sh - ph + i * dh
                        if 0 <= ih < h:
                            for j in range(kw):
                                iw = ow * sw - pw + j * dw
                                if 0 <= iw < wd:
                                    acc += x[bi, c0 + ci, ih, iw] * w[oc, ci, i, j]
                out[bi, oc, oh, ow] = activate(acc + bo, act, alpha)


@kernel
def maxpool2d(out, x, kh, kw, sh, sw, ph, pw):
    """x (N, C, H, W) f32 or i8 -> out (N, C, Ho, Wo); padding never wins."""
    n, c, h, w = x.shape
    ho, wo = out.shape[2], out.shape[3]
    if ph == 0 and pw == 0:
        _maxpool_valid(out, x, kh, kw, sh, sw)
        return
    for nc in prange(n * c):
        b, ch = nc // c, nc % c
        for oh in range(ho):
            for ow in range(wo):
                m = x[b, ch, max(oh * sh - ph, 0), max(ow * sw - pw, 0)]
                for i in range(max(oh * sh - ph, 0), min(oh * sh - ph + kh, h)):
                    for j in range(max(ow * sw - pw, 0), min(ow * sw - pw + kw, w)):
                        m = nanmax(m, x[b, ch, i, j])
                out[b, ch, oh, ow] = m


@kernel
def _maxpool_valid(out, x, kh, kw, sh, sw):
    """maxpool2d without padding: every window is in bounds, so the loops carry no clamping."""
    n, c = x.shape[0], x.shape[1]
    ho, wo = out.shape[2], out.shape[3]
    for nc in prange(n * c):
        xs, os_ = x[nc // c, nc % c], out[nc // c, nc % c]
        for oh in range(ho):
            for ow in range(wo):
                m = xs[oh * sh, ow * sw]
                for i in range(kh):
                    for j in range(kw):
                        m = nanmax(m, xs[oh * sh + i, ow * sw + j])
                os_[oh, ow] = m


@kernel
def avgpool2d(out, x, kh, kw, sh, sw, ph, pw, count_include_pad):
    """x (N, C, H, W) -> out (N, C, Ho, Wo); divisor kh*kw or the in-bounds count."""
    n, c, h, w = x.shape
    ho, wo = out.shape[2], out.shape[3]
    for nc in prange(n * c):
        b, ch = nc // c, nc % c
        for oh in range(ho):
            for ow in range(wo):
                acc = 0.0
                cnt = 0
                for i in range(max(oh * sh - ph, 0), min(oh * sh - ph + kh, h)):
                    for j in range(max(ow * sw - pw, 0), min(ow * sw - pw + kw, w)):
                        acc += x[b, ch, i, j]
                        cnt += 1
                out[b, ch, oh, ow] = acc / (kh * kw if count_include_pad else cnt)


@kernel(reassoc=True)
def global_avgpool(out, x):
    """x (N, C, P) -> out (N, C), mean over P in float64.

    NOTE: reassoc lets LLVM sum on vector lanes (in order, the float64 adds ran one at a
    time: EfficientNet-B0's 17 pools took 1.8 ms, one of 96 x 112 x 112 0.86, now 0.18); the
    sum moves by float64 rounding, far below the float32 result's."""
    n, c, p = x.shape
    for nc in prange(n * c):
        out[nc // c, nc % c] = mean_row(x[nc // c, nc % c])


@njit(cache=True, fastmath={"reassoc"})
def mean_row(row):
    """The mean of a 1-D row, summed in float64 on vector lanes (global_avgpool's, and
    kernels_fma_block.se_parts' channel means: the same bits)."""
    acc = 0.0
    for i in range(row.shape[0]):
        acc += row[i]
    return acc / row.shape[0]


@kernel
def batchnorm(out, x, gamma, beta, mean, var, eps):
    """x (N, C, P) -> out (N, C, P): (x - mean) / sqrt(var + eps) * gamma + beta per channel."""
    n, c, p = x.shape
    for nc in prange(n * c):
        ch = nc % c
        k = gamma[ch] / math.sqrt(np.float64(var[ch]) + eps)
        for i in range(p):
            out[nc // c, ch, i] = (x[nc // c, ch, i] - np.float64(mean[ch])) * k + beta[ch]


@kernel
def add(out, a, b):
    """out (M,) = a (M,) + b (M,), same shapes (broadcasting goes through np.add)."""
    for i in prange(out.shape[0]):
        out[i] = a[i] + b[i]


@kernel
def add_relu(out, a, b):
    """out (M,) = relu(a (M,) + b (M,)): a residual add and the ReLU after it in one pass
    (lowering.fused_add_relus); the float32 sum rounded once, then relu's max (NaN kept)."""
    for i in prange(out.shape[0]):
        out[i] = relu(a[i] + b[i])


@kernel
def softmax(out, x):
    """x (A, L, B) -> out (A, L, B), softmax along L, max-shifted, summed in float64."""
    a, l, b = x.shape
    for r in prange(a * b):
        i, k = r // b, r % b
        m = x[i, 0, k]
        for j in range(l):
            m = max(m, x[i, j, k])
        s = 0.0
        for j in range(l):
            s += math.exp(np.float64(x[i, j, k]) - m)
        for j in range(l):
            out[i, j, k] = math.exp(np.float64(x[i, j, k]) - m) / s


@kernel
def copy_cols(out, x, start):
    """x (R, L) -> out[:, start:start+L] with out (R, M); concat writes each input this way."""
    r, l = x.shape
    for i in prange(r):
        for j in range(l):
            out[i, start + j] = x[i, j]


MONOTONE_ACTS = ops.monotone_codes()  # non-decreasing (leaky_relu: alpha >= 0): pool commutes


@kernel
def bias_act_pool(out, y, rb, cb, wd, kh, kw, sh, sw, b, act, alpha):
    """y 2-D as in bias_act, rows of H*W with row width wd -> out (N, O, Ho, Wo) =
    maxpool(act(y + b)), unpadded. y is scratch: a pool other than 2x2/2 overwrites it.

    NOTE: exact for a non-decreasing activation: float32 rounding of v + b and the activation
    preserve order, so the max can be taken before them; one activation per output.
    """
    n, o = out.shape[:2]
    has_bias = b.shape[0] > 0
    for r in prange(n * o):
        bi, oc = r // o, r % o
        _pool_plane(out[bi, oc], y[bi * rb + oc, bi * cb:], wd, kh, kw, sh, sw,
                    b[oc] if has_bias else np.float32(0.0), act, alpha)


@njit(cache=True)
def _pool_plane(d, row, wd, kh, kw, sh, sw, bo, act, alpha):
    """d (Ho, Wo) = maxpool(act(row + bo)) of one plane, its pixel (i, j) at row[i*wd + j];
    row is scratch (overwritten, but for a 2x2/2 pool)."""
    ho, wo = d.shape
    if kh == 2 and kw == 2 and sh == 2 and sw == 2:
        # NOTE: the common 2x2/2 pool with its window unrolled: on 4x4 outputs the rows below
        # (short loops over the window and the row) cost 2.8 ns an input, this 0.35
        w1, one = np.uint64(wd), np.uint64(1)
        for oh in range(ho):
            for ow in range(wo):
                a = np.uint64(2 * oh * wd + 2 * ow)
                v = nanmax(nanmax(row[a], row[a + one]), nanmax(row[a + w1], row[a + w1 + one])) + bo
                if act == 1:
                    d[oh, ow] = relu(v)
                else:
                    d[oh, ow] = activate(np.float64(v), act, alpha)
        return
    # Separable, in place: the max over the window's rows goes into its first row, which no
    # later window reads (they start lower); then the max along that row per window column.
    # NOTE: on squeezenet's 3x3/2 over 64 x 111 x 111 the max per window cell took 1.6 ms
    cols = (wo - 1) * sw + kw
    for oh in range(ho):
        r = d[oh]
        base = np.uint64(oh * sh * wd)
        for i in range(1, kh):
            s0 = base + np.uint64(i * wd)
            for j in range(cols):
                row[base + np.uint64(j)] = nanmax(row[base + np.uint64(j)], row[s0 + np.uint64(j)])
        if kw == 3 and sw == 2:
            for ow in range(wo):
                a = base + np.uint64(2 * ow)
                r[ow] = nanmax(nanmax(row[a], row[a + np.uint64(1)]), row[a + np.uint64(2)])
        else:
            # NOTE: unsigned indices let LLVM vectorize the strided max (see im2col)
            for ow in range(wo):
                r[ow] = row[base + np.uint64(ow * sw)]
            for j in range(1, kw):
                for ow in range(wo):
                    r[ow] = nanmax(r[ow], row[base + np.uint64(ow * sw + j)])
        bias_act_run(r, r, wo, bo, act, alpha)


# A GEMM run over the two halves of K (two cores, each on the rows of inputs its core
# wrote; see routes.conv_fma_cols.FMA_KSPLIT_COLS) leaves y (2*O, ...): image i's plane of channel o
# at y[o, i*cb:] and y[O + o, i*cb:]. These sum the halves into the first (float32, as an add
# would), then run bias_act / bias_act_pool's epilogue, one plane per step, on every core.
# NOTE: as two serial calls (the add, then the epilogue) one core read all of the other
# core's half: cnn_cifar fp32 at batch 1 spent 14 and 25 us on them per 8x8 layer.


@kernel
def bias_act_sum(out, y, cb, b, act, alpha):
    """out (N, O, P) = activation(y's two halves summed + b) (b may be empty)."""
    n, o, p = out.shape
    has_bias = b.shape[0] > 0
    for r in prange(n * o):
        bi, oc = r // o, r % o
        first, second = y[oc, bi * cb:bi * cb + p], y[o + oc, bi * cb:bi * cb + p]
        for i in range(p):
            first[i] += second[i]
        bias_act_run(out[bi, oc], first, p, b[oc] if has_bias else np.float32(0.0), act, alpha)


@kernel
def bias_act_pool_sum(out, y, cb, wd, kh, kw, sh, sw, b, act, alpha):
    """out (N, O, Ho, Wo) = maxpool(act(y's two halves summed + b)), as bias_act_pool; each
    plane H*W = cb floats (an im2col GEMM's columns)."""
    n, o = out.shape[:2]
    has_bias = b.shape[0] > 0
    for r in prange(n * o):
        bi, oc = r // o, r % o
        first, second = y[oc, bi * cb:(bi + 1) * cb], y[o + oc, bi * cb:(bi + 1) * cb]
        for i in range(cb):
            first[i] += second[i]
        _pool_plane(out[bi, oc], first, wd, kh, kw, sh, sw, b[oc] if has_bias else np.float32(0.0),
                    act, alpha)


# --------------------------------------------------------------------------- stride-1 convs at
# a pixel pitch of Wp: pad the images once, then each im2col row is one contiguous run of them


@kernel
def pad_images(xpad, x, ph, pw, hp, wp, pad):
    """x (N, C, H, W) -> xpad (>= N*C*Hp*Wp,): the images in planes of Hp x Wp (at least
    H + ph and W + pw; usually H + 2ph, W + 2pw) with x at (ph, pw) and `pad` around it (flat
    unsigned indices, see kernels_vnni.pad_shift). xpad's elements past the last plane are
    `pad` too: with W + pw wide rows a window off the last row's end reads them (and junk
    columns read them: zeros, never denormals)."""
    n, c, h, w = x.shape
    xf = x.reshape(-1)
    plane = np.uint64(hp * wp)
    for t in prange(n * c):
        d, s = np.uint64(t) * plane, np.uint64(t * h * w)
        for j in range(plane):
            xpad[d + np.uint64(j)] = pad
        for i in range(h):
            r, q = d + np.uint64((ph + i) * wp + pw), s + np.uint64(i * w)
            for j in range(w):
                xpad[r + np.uint64(j)] = xf[q + np.uint64(j)]
    for j in range(n * c * hp * wp, xpad.shape[0]):
        xpad[j] = pad


@kernel
def im2col_pitch(col, xpad, n, c, hp, wp, kh, kw, dh, dw, ho):
    """xpad (N images (C, Hp, Wp), flat) -> col (K, Mp): row k = (c, i, j) (OIHW order) holds,
    for image b at columns b*Ho*Wp on, the run xpad[b*C*Hp*Wp + (c*Hp + i*dh)*Wp + j*dw:]
    [:Ho*Wp]: a stride-1 convolution's inputs with output pixel (oh, ow) at oh*Wp + ow.
    Columns ow >= Wo are junk that the epilogue skips (as in kernels_vnni.pack_cols); xpad
    needs (kw-1)*dw elements of slack after the last image."""
    k, mp = col.shape
    khw = kh * kw
    pix = ho * wp
    img = np.uint64(c * hp * wp)
    cf = col.reshape(-1)
    for kq in prange(k):
        ch, i, j = kq // khw, (kq % khw) // kw, kq % kw
        a = np.uint64((ch * hp + i * dh) * wp + j * dw)
        for b in range(n):
            src, dst = np.uint64(b) * img + a, np.uint64(kq * mp + b * pix)
            for t in range(pix):
                cf[dst + np.uint64(t)] = xpad[src + np.uint64(t)]


@kernel
def bias_act_pitch(out, y, pitch, istride, b, act, alpha):
    """y (O, Mp), image i's row oh of channel o at y[o, i*istride + oh*pitch:][:Wo] ->
    out (N, O, Ho, Wo) = act(y + b) (b may be empty)."""
    n, o, ho, wo = out.shape
    mp = y.shape[1]
    yf, of = y.reshape(-1), out.reshape(-1)
    has_bias = b.shape[0] > 0
    whole = pitch == wo  # (a 1x1 conv: each plane's rows are one contiguous run)
    for r in prange(n * o):
        bi, oc = r // o, r % o
        bo = b[oc] if has_bias else np.float32(0.0)
        if whole and act not in (0, 1, 9):
            # NOTE: one act_run call a plane, not a row (MobileNetV3/EfficientNet's expand
            # convs: their hardswish/SiLU rows of 7-28 pixels ran in scalar remainders)
            act_run(of, np.uint64(r * ho * wo), yf, np.uint64(oc * mp + bi * istride), ho * wo,
                    bo, act, alpha)
            continue
        for oh in range(ho):
            src = np.uint64(oc * mp + bi * istride + oh * pitch)
            dst = np.uint64((r * ho + oh) * wo)
            # NOTE: none/ReLU/relu6 inline, the others through act_run, a vector loop a row;
            # with activate() an element (float64, a call each) MobileNetV2-0.5's 17 expand
            # convs took 1.3 ms of its 5.4
            if act == 0:
                for ow in range(wo):
                    of[dst + np.uint64(ow)] = yf[src + np.uint64(ow)] + bo
            elif act == 1:
                for ow in range(wo):
                    of[dst + np.uint64(ow)] = relu(yf[src + np.uint64(ow)] + bo)
            elif act == 9:
                hi = np.float32(alpha)  # as bias_act_run: float32 equals activate's here
                for ow in range(wo):
                    v = relu(yf[src + np.uint64(ow)] + bo)
                    of[dst + np.uint64(ow)] = hi if v > hi else v
            else:
                act_run(of, dst, yf, src, wo, bo, act, alpha)


@kernel
def bias_act_pool_pitch(out, y, pitch, istride, kh, kw, sh, sw, b, act, alpha):
    """y as in bias_act_pitch (the conv's output) -> out (N, O, Ho, Wo) =
    maxpool(act(y + b)), unpadded; exact for a non-decreasing activation (see bias_act_pool)."""
    n, o, ho, wo = out.shape
    mp = y.shape[1]
    yf, of = y.reshape(-1), out.reshape(-1)
    has_bias = b.shape[0] > 0
    w1, one = np.uint64(pitch), np.uint64(1)
    if kh == 2 and kw == 2 and sh == 2 and sw == 2 and act == 1:
        # NOTE: the common 2x2/2 pool after a ReLU with no test in the row loop: 20% faster
        # (its rows are 7-16 outputs, so most of each runs in the vector loop's scalar tail)
        for r in prange(n * o):
            bi, oc = r // o, r % o
            bo = b[oc] if has_bias else np.float32(0.0)
            for oh in range(ho):
                src = np.uint64(oc * mp + bi * istride + 2 * oh * pitch)
                dst = np.uint64((r * ho + oh) * wo)
                for ow in range(wo):
                    a = src + np.uint64(2 * ow)
                    v = nanmax(nanmax(yf[a], yf[a + one]), nanmax(yf[a + w1], yf[a + w1 + one])) + bo
                    of[dst + np.uint64(ow)] = relu(v)
        return
    for r in prange(n * o):
        bi, oc = r // o, r % o
        bo = b[oc] if has_bias else np.float32(0.0)
        for oh in range(ho):
            src = np.uint64(oc * mp + bi * istride + oh * sh * pitch)
            dst = np.uint64((r * ho + oh) * wo)
            for ow in range(wo):
                a = src + np.uint64(ow * sw)
                if kh == 2 and kw == 2:
                    f = nanmax(nanmax(yf[a], yf[a + one]), nanmax(yf[a + w1], yf[a + w1 + one]))
                else:
                    f = yf[a]
                    for i in range(kh):
                        for j in range(kw):
                            f = nanmax(f, yf[a + np.uint64(i * pitch + j)])
                v = f + bo
                if act == 1:
                    of[dst + np.uint64(ow)] = relu(v)
                else:
                    of[dst + np.uint64(ow)] = activate(np.float64(v), act, alpha)
