"""What the op lowerings and routes share (lowering*.py, routes/): scratch budgets, int8 constants,
scratch sizes of the VNNI routes, activation codes."""

from __future__ import annotations

import math
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from pocket.formats import quant as qm
from pocket.formats.errors import FormatError
from pocket.formats.ir import Node
from pocket.infer import kernels_cols as kcols
from pocket.infer import kernels_fma as kfma
from pocket.infer import kernels_fma_im2col as kfi
from pocket.infer import kernels_fp32 as kf
from pocket.infer import kernels_int8 as ki
from pocket.infer import kernels_vnni as kv
from pocket.infer.plan import ALIGN

if TYPE_CHECKING:
    from pocket.infer.plan import PlanContext

SCRATCH_BYTES = 8 << 20  # im2col + GEMM result per chunk: a few MiB, in cache, few GEMM calls
# With AVX-512 (kernels_fma), an fp32 conv's GEMM result and inputs per chunk: small enough to
# stay in L2 between the GEMM and its epilogue.
FMA_SCRATCH_BYTES = 2 << 20
# With AVX-512 VNNI, an int8 conv's packed inputs and int32 sums per chunk, per thread: the
# sums stay in L2 for the epilogue (cnn_cifar int8 at batch 64, one thread: 50.9 ms at 8 MiB,
# 48.5 at 1; two threads: 28.2 at 8 MiB, 28.6 at 2, 30.1 at 1, the calls too short to split)
VNNI_SCRATCH_BYTES = 1 << 20
# An int8 conv/linear with at least this many output rows (batch x pixels) per weight runs as
# float32 BLAS GEMMs on the int8 codes (exact, see kernels_int8.requant_sum): BLAS sgemm is 3-4x
# faster than a vectorized int8 dot in Numba, and converting the weights each call costs one
# pass over them, which this many rows amortize. Below it, the int8 dot kernel (gemm_q).
F32_ROUTE_ROWS = 16
# A linear's GEMM result (kernels_fma, kernels_vnni tiles) has rows this many floats longer
# than its columns: at 64 columns (256 bytes) apart, the transposing epilogue's 256 reads per
# row fell in a few L1 sets (6x slower)
_LINEAR_SKEW = 16


# NOTE: read-only like the mmapped biases it stands in for: a writable empty bias made Numba
# compile every bias kernel a second time (the readonly flag is part of its signature)
_EMPTY_F32 = np.zeros(0, np.float32)
_EMPTY_F32.flags.writeable = False
_EMPTY_I32 = np.zeros(0, np.int32)
_EMPTY_I32.flags.writeable = False


def _act_code(a: dict) -> int:
    return kf.ACT[a.get("activation", "none")]


def _act_alpha(a: dict) -> float:
    """The one activation parameter the kernels take: leaky_relu's slope, a fused clip's max."""
    return a.get("max", 6.0) if a.get("activation", "none") == "clip" else a["alpha"]


def _int8_consts(ctx: PlanContext, node: Node, w: np.ndarray) -> dict:
    a = node.attrs
    qp = ctx.quant(node.inputs[1])
    o = w.shape[0]
    if qp is None or len(qp.get("scale", [])) != o or qp.get("axis", 0) not in (0, None):
        raise FormatError(f"node '{node.name}': int8 weight '{node.inputs[1]}' needs {o} "
                          "per-output-channel scales (axis 0) in the container")
    w_scale = np.asarray(qp["scale"], np.float32)
    wsum = ki.weight_sums(w.reshape(o, -1))
    b = ctx.params[node.inputs[2]] if len(node.inputs) > 2 else np.zeros(o, np.int32)
    to_int8 = a.get("y_scale") is not None
    act = a.get("activation", "none")
    relu = act in ("relu", "clip")  # both clamp at 0 (a fused clip has min 0)
    y_zp = a["y_zero_point"] if to_int8 else 0
    # kernels_int8._epilogue's clamp: the lowest and highest int8 code, and the ceiling of a
    # float32 output; a fused clip's max quantizes like any value (quant.requantize)
    top = np.float32(a.get("max", 6.0))
    hi_q = qm.quantize(top, a["y_scale"], y_zp) if to_int8 and act == "clip" else qm.QMAX
    hi_f = float(top) if act == "clip" else math.inf
    return {
        # NOTE: int64, so b_q - x_zp * wsum never wraps, whatever the weights.
        "bias_adj": b.astype(np.int64) - np.int64(a["x_zero_point"]) * wsum.astype(np.int64),
        # the VNNI kernels read x_q + 128 as unsigned bytes: the shift folds in like x_zp
        "bias_u8": b.astype(np.int64) - np.int64(a["x_zero_point"] + 128) * wsum.astype(np.int64),
        "m": qm.requant_multiplier(a["x_scale"], w_scale, a.get("y_scale")),
        "to_int8": to_int8, "y_zp": float(y_zp), "relu": relu,
        "lo": (float(y_zp if relu else qm.QMIN), float(hi_q), hi_f),
    }


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def append_scratch(d: dict, nbytes: int) -> int:
    """Room for nbytes more in prepared node d's scratch, after what it has (aligned): its
    offset there (a fusion that borrows the node's scratch: gated weights, a block's sums)."""
    at = _aligned(d.get("scratch_bytes", 0))
    d["scratch_bytes"] = at + nbytes
    return at


def _register_epi(b: np.ndarray, act: int) -> int | None:
    """kernels_fma's epilogue code (gemm, gemv: 0 the plain sums, 1 + b, 2 + b then ReLU) for a
    bias b (may be empty) and activation code act, or None where it cannot do them (other
    activations, a ReLU without a bias) and a separate epilogue pass must."""
    if act not in (0, 1):
        return None
    if b.size:
        return 1 + act
    return 0 if act == 0 else None


def register_epi(act: int, alpha: float) -> int | None:
    """kernels_fma.gemm's epi (bias, then the tiles' activation) for ACT code act, or None."""
    if act == kf.ACT["clip"]:
        return 1 + kfma.MODE_RELU6 if alpha == 6.0 else None
    modes = {kf.ACT["none"]: 0, kf.ACT["relu"]: 1, kf.ACT["silu"]: kfma.MODE_SILU,
             kf.ACT["sigmoid"]: kfma.MODE_SIGMOID, kf.ACT["hardswish"]: kfma.MODE_HSWISH,
             kf.ACT["hardsigmoid"]: kfma.MODE_HSIGMOID}
    return 1 + modes[act] if act in modes else None


def register_bias(d: dict) -> np.ndarray:
    """The bias a register epilogue (register_epi) adds for a conv's prepared d: its own, or
    zeros where it has none."""
    return d["b"] if d["b"].size else np.zeros(d["o"], np.float32)


def _im2col(col, xs, geom, pad, rb: int, cb: int) -> partial:
    """The im2col call for images xs: im2col_same where the conv keeps the map's size at
    stride 1 (its mask made here, once a bind; kernels_fma's on float32 images where it is
    available, else kernels_fp32's), kernels_cols.im2col_s2 at stride 2 along W, else im2col."""
    kh, kw, sh, sw, ph, pw, dh, dw = geom
    h, w = xs.shape[2:]
    if (sh, sw) == (1, 1) and 2 * ph == dh * (kh - 1) and 2 * pw == dw * (kw - 1):
        valid = kf.same_valid(h, w, kh, kw, ph, pw, dh, dw)
        if kfma.AVAILABLE and xs.dtype == np.float32:
            return partial(kfi.im2col_same, col, xs, kfi.same_masks(valid), kh, kw, ph, pw, dh, dw, pad,
                           rb, cb)
        return partial(kf.im2col_same, col, xs, valid, kh, kw, ph, pw, dh, dw, pad, rb, cb)
    if col.dtype == np.float32 and kcols.eligible(xs.dtype, w, sh, sw, dw):
        return partial(kcols.im2col_s2, col, xs, kh, kw, sh, ph, pw, dh, pad, rb, cb)
    return partial(kf.im2col, col, xs, *geom, pad, rb, cb)


def _tile_cols(rows: int) -> int:
    """Columns of a VNNI packed operand: rows rounded up to whole vectors of 16 pixels."""
    return -(-rows // kv.COL_ALIGN) * kv.COL_ALIGN


def _vnni_rows_bytes(n: int, o: int, k: int) -> tuple[int, int]:
    """Scratch of the VNNI dot route for n rows: xu (n, Kp) u8 (Kp > K: room for the masked
    tail chunk) and c (n, O) i32."""
    return _aligned(n * (k // 64 + 1) * 64), _aligned(n * o * 4)


def _vnni_cols_bytes(rows: int, o: int, k: int) -> tuple[int, int]:
    """Scratch of the VNNI tile route for `rows` pixels: xp (K/4, Mp) u32 and c (O, Mp) i32
    (a linear's rows skewed, see requant_cols_t)."""
    mp = _tile_cols(rows)
    return _aligned(k * mp), _aligned(o * (mp + _LINEAR_SKEW) * 4)


def _pool_geom(a: dict) -> tuple[int, ...]:
    k = a["kernel"]
    s = a.get("stride") or k
    return (k[0], k[1], s[0], s[1], a["padding"][0], a["padding"][1])


def fused_residual(ctx: PlanContext, step: int, n: int) -> tuple | None:
    """(output view, residual view, relu) where conv `step` writes its add's output at batch n
    (lowering.residual_convs), marking the add (and its ReLU) as bound; None where it has none.
    A route calls it only where it fuses the add at that batch."""
    add = ctx.residual.get(step)
    if add is None:
        return None
    g = ctx.graph
    a = g.nodes[add]
    other = next(v for v in a.inputs if v != g.nodes[step].outputs[0])
    ctx.skip.add(add)
    relu = ctx.add_relu.get(add)
    if relu is not None:
        ctx.skip.add(relu)  # (its output's bytes are the add's: Engine._plan_arena)
    return ctx.view(a.outputs[0], n), ctx.view(other, n), relu is not None
