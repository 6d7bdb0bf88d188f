"""fp32 conv (groups 1) on kernels_fma (AVX-512): im2col columns of a chunk of images, one
kernels_fma GEMM, one epilogue pass; one image has the GEMM write its NCHW output with the bias
and the activation in registers where they can (no epilogue)."""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_fma as kfma
from pocket.infer import kernels_fma_cv as kcv
from pocket.infer import kernels_fma_pool as kfp
from pocket.infer import kernels_fp32 as kf
from pocket.infer import lowering_common as lc
from pocket.infer.lowering_common import (
    _EMPTY_F32,
    _act_alpha,
    _act_code,
    _aligned,
    _im2col,
    register_bias,
    register_epi,
)
from pocket.infer.routes.base import Route, conv_prep, prepared, register

# On two or more threads an im2col conv with this many columns a chunk (batch 1 on 6x6 to
# 11x11 maps) runs its GEMM as two over the halves of K, then adds them: split by output
# channels, each core read the im2col rows the other core had written, and the 8x8 layers of
# cnn_cifar fp32 at batch 1 ran 15-20% slower after im2col than alone (whole model, 2 threads:
# ~2% faster). 4x4 maps gained nothing; one thread lost the add (1.5%).
FMA_KSPLIT_COLS = (32, 128)


def fma_limits(geo, dtype, cpu) -> str | None:
    if not cpu.fma:
        return "needs AVX-512 (kernels_fma; off with POCKET_FP32_FMA=0)"
    if dtype != "f32":
        return "fp32 only"
    if geo.groups != 1:
        return "groups 1 only"
    return None


@register
class ConvFmaCols(Route):
    name, op = "conv_fma_cols", "conv2d"
    fuses_pool = True

    def limits(self, geo, dtype, cpu):
        return fma_limits(geo, dtype, cpu)

    def prepare(self, ctx, node):
        d = conv_prep(ctx, node, self.name)
        o, k, p = d["o"], d["k"], d["p"]
        d["w2"] = d["w"].reshape(o, k)
        # the register epilogue adds a bias: zeros where the conv has none
        d["b_reg"] = register_bias(d)
        d["chunk"] = max(1, min(ctx.max_batch, lc.FMA_SCRATCH_BYTES // ((k + o) * p * 4)))
        cols = kfma.tile_cols(d["chunk"] * p)
        # (two results while the GEMM runs over the halves of K)
        halves_cols = 2 * min(cols, FMA_KSPLIT_COLS[1])
        d["scratch_bytes"] = _aligned(k * cols * 4) + _aligned(o * max(cols, halves_cols) * 4)
        # NOTE: on two threads only where the weights stream from memory (past STREAM_W_BYTES):
        # there each core's channels read half of them. Elsewhere each core's half of the
        # channels read all of im2col's rows, half of them written by the other core, a few
        # floats a row at a time (SqueezeNet's 192 x 432 @ 169: 112 -> 143 us; on one thread
        # 177 -> 163). ResNet-18's three 512 x 4608 @ 49 convs (9.4 MB of weights each) on two
        # threads, against two GEMMs over K's halves and their sum: the model 0.99x; and its
        # solo calls (pools.Pace: a busy machine) take the same kernels as one thread's plan
        # (20.8 -> 20.3 ms, 20.0 on one thread's plan)
        threads = max(1, ctx.threads)
        if kcv.pays(o, k, p, threads) and (threads == 1 or o * k * 4 > kfma.STREAM_W_BYTES):
            # (one image a chunk: see bind)
            split = kcv.cv_split(o, p, threads)
            d["cv_parts"], d["cv_split"] = threads, split
            cv_bytes = threads * kcv.scratch_floats(p, split[0]) * 4
            d["scratch_bytes"] = max(d["scratch_bytes"], _aligned(k * cols * 4) + cv_bytes)
        return d

    def bind(self, ctx, step, node, d, n, pool=None):
        a = node.attrs
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        o, k, p, geom = d["o"], d["k"], d["p"], d["geom"]
        act, alpha = _act_code(a), _act_alpha(a)
        y3, x_w = y.reshape(n, o, p), y.shape[3]
        pool, pool_geom = pool or (None, ())
        calls = []
        for start in range(0, n, d["chunk"]):
            m = min(d["chunk"], n - start)
            xs, ys = x[start:start + m], y3[start:start + m]
            cols = kfma.tile_cols(m * p)
            col = ctx.scratch(step, np.float32, (k, cols))
            # few columns: two GEMMs over the halves of K, each reading the rows its core's
            # half of im2col wrote, then their sum
            halves = 2 if (ctx.threads > 1 and FMA_KSPLIT_COLS[0] <= cols <= FMA_KSPLIT_COLS[1]
                           and k % 2 == 0) else 1
            yw = ctx.scratch(step, np.float32, (halves * o, cols),
                             _aligned(k * kfma.tile_cols(d["chunk"] * p) * 4))
            kpart = k // halves
            # one image: the GEMM's (O, P) is its NCHW output, so the GEMM writes it with the
            # bias and the activation in registers (conv_fma_1x1's: ReLU, relu6, SiLU, sigmoid;
            # the last P % 16 pixels masked), no epilogue pass (EfficientNet-B0's stem: a
            # SiLU pass over 32 x 112 x 112)
            epi = register_epi(act, alpha)
            if m == 1 and pool is None and epi is not None and "cv_parts" in d:
                # a small map's pixels fill vectors of 16 badly: the GEMM along the channels
                # (kernels_fma_cv), over columns of exactly P pixels (ResNet-18's 512 x 4608 @
                # 49, one thread: 1.77 -> 1.66 ms, its weights from memory each call)
                groups, splits = d["cv_split"]
                compact = ctx.scratch(step, np.float32, (k, p))
                scratch = ctx.scratch(step, np.float32, (d["cv_parts"], kcv.scratch_floats(p, groups)),
                                      _aligned(k * kfma.tile_cols(d["chunk"] * p) * 4))
                wp = prepared(d, "wp", lambda: kcv.pack(d["w2"]))
                bp = prepared(d, "bp", lambda: kcv.pad_bias(d["b_reg"], o))
                calls += [_im2col(compact, xs, geom, np.float32(0), 0, p),
                          partial(kcv.gemm_cv, ys, wp, compact.reshape(1, k, p), 1, o, p, bp, epi, groups,
                                  splits, scratch)]
                continue
            if m == 1 and halves == 1 and pool is None and epi is not None:
                # NOTE: this GEMM reads only the P columns (the last ones masked): the
                # columns past them need no zeros (SqueezeNet's 13x13 convs zeroed 7 x 432
                # floats a call, 2-8 us)
                calls += [_im2col(col, xs, geom, np.float32(0), 0, p),
                          partial(kfma.gemm, ys[0], d["w2"], col, kfma.row_offsets(k, cols), 1, o, p,
                                  0, 0, k, 0, p, d["b_reg"], epi)]
                continue
            # NOTE: the GEMMs below read only the m * p columns (the last ones masked), so the
            # columns past them need no zeros: ResNet-18's 7x7 convs on two threads zeroed
            # 4608 rows x 15 floats a call in 35-59 us, a strided NumPy fill
            calls.append(_im2col(col, xs, geom, np.float32(0), 0, p))
            # a fused max pool the AVX-512 pool takes: the GEMM writes the activated maps to
            # its scratch, the pool reads them (bias_act_pool's loops ran 0.42 ms over
            # SqueezeNet's 64 x 111 x 111 stem, mostly scalar)
            pooled = pool is not None and kfp.fast(pool_geom[1], pool_geom[3])
            if m == 1 and halves == 1 and pooled and epi is not None:
                maps = yw.reshape(-1)[:o * p].reshape(1, o, y.shape[2], x_w)
                calls.append(partial(kfma.gemm, maps[0], d["w2"], col, kfma.row_offsets(k, cols), 1, o, p,
                                     0, 0, k, 0, p, d["b_reg"], epi))
                kh, kw, sh, sw = pool_geom
                parts = max(1, ctx.threads) if ctx.parallel_elements(maps.size) else 1
                calls.append(partial(kfp.maxpool_fma, pool[start:start + 1], maps, parts, kh, kw, sh, sw,
                                     0, 0))
                continue
            calls.append(partial(kfma.gemm, yw, d["w2"], col, kfma.row_offsets(kpart, cols), halves, o, m * p,
                                 kpart * cols, kpart, k, o * cols, cols, _EMPTY_F32, 0))
            if halves == 2:  # the halves' sum in the epilogue (see kernels_fp32.bias_act_sum)
                calls.append(partial(kf.bias_act_sum, ys, yw, p, d["b"], act, alpha) if pool is None else
                             partial(kf.bias_act_pool_sum, pool[start:start + m], yw, p, x_w, *pool_geom,
                                     d["b"], act, alpha))
                continue
            calls += [partial(kf.bias_act, ys, yw, 0, p, d["b"], act, alpha) if pool is None else
                      partial(kf.bias_act_pool, pool[start:start + m], yw, 0, p, x_w, *pool_geom,
                              d["b"], act, alpha)]
        return calls
