"""fp32 1x1 conv (stride 1, no padding, groups 1) on kernels_fma (AVX-512): each image's
(C, H*W) is already the GEMM's X, so one GEMM over the images reads x in place and writes the
NCHW output with the bias and the activation (ReLU, relu6, SiLU, sigmoid) in registers; other
activations take one pass over the output, in place. The last pixels of an image (H*W not a
multiple of 16) run masked. On a 1x1 map (a squeeze-and-excitation conv after its pool) at
a small batch it is a linear's rows: dot products (kernels_fma.gemv), not a GEMM that fills one
lane in 16. Where a map's pixels fill vectors of 16 badly (7x7: 49 of 64 lanes) and the
channels fill them better, the GEMM runs vectorized along the channels instead
(kernels_fma_cv.gemm_cv, its weights packed once at load).

NOTE: conv_fma_pitch, before this, copied each image into its padded scratch and the result
out of its own (pad_images + bias_act_pitch): on SqueezeNet's and EfficientNet-B0's 1x1 convs
those two passes were 15% of the model's time.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_fma as kfma
from pocket.infer import kernels_fma_cv as kcv
from pocket.infer import kernels_fp32 as kf
from pocket.infer import kernels_vision as kv
from pocket.infer.lowering_common import (
    _EMPTY_F32,
    _act_alpha,
    _act_code,
    _register_epi,
    append_scratch,
    register_bias,
    register_epi,
)
from pocket.infer.lowering_vision import gate_of
from pocket.infer.routes.base import Route, conv_prep, prepared, register
from pocket.infer.routes.conv_fma_cols import fma_limits
from pocket.infer.routes.linear_fma import FMA_LINEAR_ROWS


@register
class ConvFma1x1(Route):
    name, op = "conv_fma_1x1", "conv2d"

    def limits(self, geo, dtype, cpu):
        if (geo.kh, geo.kw, geo.sh, geo.sw, geo.ph, geo.pw) != (1, 1, 1, 1, 0, 0):
            return "needs a 1x1 kernel, stride 1, no padding"
        return fma_limits(geo, dtype, cpu)

    def prepare(self, ctx, node):
        d = conv_prep(ctx, node, self.name)
        d["w2"] = d["w"].reshape(d["o"], d["k"])
        d["offs"] = kfma.row_offsets(d["k"], d["p"])
        # the register epilogue adds a bias: zeros where the conv has none
        d["b_reg"] = register_bias(d)
        parts = max(1, ctx.threads)
        if kcv.pays(d["o"], d["k"], d["p"], parts):
            d["cv_parts"] = parts
            d["cv_split"] = kcv.cv_split(d["o"], d["p"], parts)
            d["scratch_bytes"] = parts * kcv.scratch_floats(d["p"], d["cv_split"][0]) * 4
        return d

    @staticmethod
    def gate_scratch(d: dict, max_batch: int) -> None:
        """Room in the conv's scratch for its gated weights (lowering_vision.gated_convs), at
        d["gate_at"]: up to max_batch images' worth."""
        d["gate_at"] = append_scratch(d, max_batch * d["o"] * d["k"] * 4)

    def bind(self, ctx, step, node, d, n, pool=None):
        a = node.attrs
        x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
        o, k, p = d["o"], d["k"], d["p"]
        act, alpha = _act_code(a), _act_alpha(a)
        if p == 1 and n < FMA_LINEAR_ROWS:
            y2, x2 = y.reshape(n, o), x.reshape(n, k)
            epi = _register_epi(d["b"], act)
            if epi is not None:
                return [partial(kfma.gemv, y2, x2, d["w2"], d["b"], epi)]
            return [partial(kfma.gemv, y2, x2, d["w2"], _EMPTY_F32, 0),
                    partial(kf.bias_act_rows, y2, y2, d["b"], act, alpha)]
        epi = register_epi(act, alpha)
        gate = gate_of(ctx, step)
        s = None if gate is None else ctx.view(gate, n).reshape(n, k)
        if "cv_parts" in d:
            wp = prepared(d, "wp", lambda: kcv.pack(d["w2"]))
            bp = prepared(d, "bp", lambda: kcv.pad_bias(d["b_reg"], o))
            groups, splits = d["cv_split"]
            scratch = ctx.scratch(step, np.float32, (d["cv_parts"], kcv.scratch_floats(p, groups)))
            calls = [partial(kcv.gemm_cv, y.reshape(n, o, p), wp, x.reshape(n, k, p), n, o, p, bp,
                             1 if epi is None else epi, groups, splits, scratch)]
        else:
            w, ws = d["w2"], 0
            calls = []
            if s is not None:  # image i's weights at w.flat[i * o * k] (gemm's ws)
                wg = ctx.scratch(step, np.float32, (n, o, k), d["gate_at"])
                calls, w, ws = [partial(kv.gate_weights, wg, d["w2"], s)], wg.reshape(n * o, k), o * k
            calls.append(partial(kfma.gemm, y.reshape(n, o, p), w, x.reshape(n, k, p), d["offs"], n, o, p,
                                 k * p, ws, k, o * p, p, d["b_reg"], 1 if epi is None else epi))
        if epi is None:  # an activation the GEMM's registers do not do: one pass, in place
            flat = y.reshape(-1)
            calls.append(partial(kf.unary, flat, flat, act, alpha))
        return calls
