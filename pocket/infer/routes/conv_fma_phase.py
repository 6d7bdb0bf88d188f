"""fp32 stride-2 conv (groups 1, dilation 1) on kernels_fma (AVX-512) over its input's four
phases (kernels_phase): the GEMM reads the phase planes in place, each row of K a constant
shift, and writes the outputs at the phases' pitch with the bias and the activation in
registers where it can; one pass copies the valid columns out (or pools them). Ahead of
conv_fma_cols, whose im2col columns it replaces.

NOTE: ResNet-18's 7x7/2 stem (3 -> 64 channels, 224 x 224) on one thread: im2col 1.46 ms and
a GEMM of 5.1 ms over its 7.4 MB of columns, where onnxruntime took 2.1 ms for the conv.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_fma as kfma
from pocket.infer import kernels_fma_pool as kfp
from pocket.infer import kernels_fp32 as kf
from pocket.infer import kernels_phase as kq
from pocket.infer import lowering_common as lc
from pocket.infer.lowering_common import (
    _EMPTY_F32,
    _act_alpha,
    _act_code,
    _aligned,
    register_bias,
    register_epi,
)
from pocket.infer.routes.base import Route, conv_prep, register
from pocket.infer.routes.conv_fma_cols import fma_limits


@register
class ConvFmaPhase(Route):
    name, op = "conv_fma_phase", "conv2d"
    fuses_pool = fuses_padded_pool = True

    def limits(self, geo, dtype, cpu):
        why = fma_limits(geo, dtype, cpu)
        if why is not None:
            return why
        if (geo.sh, geo.sw) != (2, 2) or (geo.dh, geo.dw) != (1, 1):
            return "needs stride 2 both ways and dilation 1"
        return None

    def declines(self, geo, dtype, cpu):
        # a 1x1 kernel reads one phase of four: im2col's strided copy is a quarter of the
        # phases (ResNet-18's 1x1/2 shortcuts: 0.40 ms a conv, 0.24 through im2col)
        return "a 1x1 kernel reads one phase of four" if geo.kh == geo.kw == 1 else None

    def prepare(self, ctx, node):
        d = conv_prep(ctx, node, self.name)
        geo = d["geo"]
        o, k = d["o"], d["k"]
        hq, wq = kq.phase_shape(geo.h, geo.w, geo.ph, geo.pw)
        offs = kq.phase_offsets(geo.c, geo.kh, geo.kw, hq, wq)
        mpi = kfma.tile_cols(geo.ho * wq)
        per = 4 * geo.c * hq * wq  # an image's phase floats
        # the last tile of the last image reads past its phases (junk columns)
        slack = max(0, int(offs.max()) // 4 + mpi - per) + 16
        chunk = max(1, min(ctx.max_batch, lc.FMA_SCRATCH_BYTES // ((per + o * mpi) * 4)))
        d.update(w2=d["w"].reshape(o, k), offs=offs, hq=hq, wq=wq, mpi=mpi, per=per, slack=slack,
                 chunk=chunk, b_reg=register_bias(d),
                 epi_ok=register_epi(_act_code(node.attrs), _act_alpha(node.attrs)) is not None)
        d["scratch_bytes"] = _aligned((chunk * per + slack) * 4) + _aligned(o * chunk * mpi * 4)
        return d

    def pool_ok(self, d, n, pool_geom):
        """Unpadded pools always (bias_act_pool_pitch, or the AVX-512 pool below); a padded one
        only where the AVX-512 pool reads one image's whole planes at their pitch, its windows
        short of the junk columns past Wo (the -inf padding is the pool's own, outside its
        rows and columns).

        NOTE: ResNet-18's and ShuffleNetV2's stems (7x7/2 and 3x3/2 convs, then a 3x3/2
        maxpool of padding 1): the copy-out pass before the pool (bias_act_pitch, 0.30 ms of
        ResNet-18's 22 on one thread) goes."""
        if len(pool_geom) == 4:
            return True
        kh, kw, sh, sw, ph, pw = pool_geom
        geo = d["geo"]
        wo_pool = (geo.wo + 2 * pw - kw) // sw + 1
        return (n == 1 and d["epi_ok"] and d["mpi"] == geo.ho * d["wq"] and kfp.fast(kw, sw)
                and (wo_pool - 1) * sw - pw + kw - 1 < geo.wo)

    def bind(self, ctx, step, node, d, n, pool=None):
        a = node.attrs
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        o, k, wq, mpi, per = d["o"], d["k"], d["wq"], d["mpi"], d["per"]
        kh, kw, sh, sw, ph, pw, dh, dw = d["geom"]
        act, alpha = _act_code(a), _act_alpha(a)
        epi = register_epi(act, alpha)
        pool, pool_geom = pool or (None, ())
        calls = []
        for start in range(0, n, d["chunk"]):
            m = min(d["chunk"], n - start)
            xq = ctx.scratch(step, np.float32, (m * per + d["slack"],))
            yw = ctx.scratch(step, np.float32, (o, m * mpi), _aligned((d["chunk"] * per + d["slack"]) * 4))
            calls.append(partial(kq.pad_phases, xq, x[start:start + m], ph, pw, d["hq"], wq))
            b, e = (d["b_reg"], epi) if epi is not None else (_EMPTY_F32, 0)
            ho, wo = d["geo"].ho, d["geo"].wo
            if m == 1 and pool is None and epi is not None and wo >= 64 and (wo % 16 == 0 or wo >= 96):
                # NOTE: one GEMM a row of the output (its Wo pixels read from the phases at
                # their pitch, written to the NCHW row): no copy-out pass past the junk
                # columns (bias_act_pitch: MobileNetV3-small's stem 40 us of its 1.6 ms,
                # EfficientNet-B0's 108 us). Only rows that fill the tiles' vectors: ResNet-18's
                # 3x3/2 convs to 28x28 and 14x14 ran 1.1x slower a GEMM of 28 or 14 pixels
                calls.append(partial(kfma.gemm, y[start].reshape(o, ho * wo), d["w2"], xq, d["offs"], ho, o,
                                     wo, wq, 0, k, wo, ho * wo, b, e))
                continue
            calls.append(partial(kfma.gemm, yw, d["w2"], xq, d["offs"], m, o, mpi, per, 0, k, mpi, m * mpi,
                                 b, e))
            rest = (_EMPTY_F32, 0, 0.0) if epi is not None else (d["b"], act, alpha)
            if pool is None:
                calls.append(partial(kf.bias_act_pitch, y[start:start + m], yw, wq, mpi, *rest))
            elif (m == 1 and mpi == d["geo"].ho * wq and epi is not None
                  and kfp.fast(pool_geom[1], pool_geom[3])):
                # one image's planes are whole: the AVX-512 pool reads them at their pitch (its
                # windows never reach the junk columns: an unpadded pool stays inside Wo)
                maps = yw.reshape(1, o, d["geo"].ho, wq)
                parts = max(1, ctx.threads) if ctx.parallel_elements(maps.size) else 1
                pad = pool_geom[4:] or (0, 0)
                calls.append(partial(kfp.maxpool_fma, pool[start:start + 1], maps, parts, *pool_geom[:4],
                                     *pad))
            else:
                calls.append(partial(kf.bias_act_pool_pitch, pool[start:start + m], yw, wq, mpi, *pool_geom,
                                     *rest))
        return calls
