"""Builders of the vision ops (see lowering.py): a standalone clip, broadcast mul, channel
shuffle and slice. silu (and a clip that fused) are activation codes of kernels_fp32; silu's
standalone node is lowering.py's unary builder. lowering.py imports this module before its own
table, which then leaves these ops to the builders here.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np

from pocket.formats import ops
from pocket.formats.ir import Node
from pocket.infer import kernels_vision as kv
from pocket.infer.plan import PlanContext


def _b_clip(ctx: PlanContext, step: int, node: Node, n: int) -> list:
    a = node.attrs
    x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
    return [partial(kv.clip, y.reshape(-1), x.reshape(-1), np.float32(a["min"]),
                    np.float32(a["max"]))]


def _gate_rows(big: np.ndarray, small: np.ndarray) -> int | None:
    """How many leading dims of `small` match `big` when all the others are 1 (the SE gate's
    (N, C, 1, 1) against (N, C, H, W)), or None."""
    if small.ndim != big.ndim:
        return None
    k = small.ndim
    while k and small.shape[k - 1] == 1:
        k -= 1
    return k if small.shape[:k] == big.shape[:k] and k < big.ndim else None


def _b_mul(ctx: PlanContext, step: int, node: Node, n: int) -> list:
    a, b = (ctx.view(v, n) for v in node.inputs)
    y = ctx.view(node.outputs[0], n)
    if a.shape == b.shape == y.shape:
        return [partial(kv.mul, y.reshape(-1), a.reshape(-1), b.reshape(-1))]
    for big, small in ((a, b), (b, a)):
        k = _gate_rows(big, small) if big.shape == y.shape else None
        if k is not None:
            rows = math.prod(y.shape[:k])
            return [partial(kv.mul_rows, y.reshape(rows, -1), big.reshape(rows, -1),
                            small.reshape(-1))]
    if y.ndim > 4:
        return [partial(np.multiply, a, b, out=y)]
    lead = (1,) * (4 - y.ndim)
    a4, b4 = (np.broadcast_to(v, y.shape).reshape(lead + y.shape) for v in (a, b))
    return [partial(kv.mul_bcast, y.reshape(lead + y.shape), a4, b4)]


def _b_channel_shuffle(ctx: PlanContext, step: int, node: Node, n: int) -> list:
    x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
    c = x.shape[1]
    return [partial(kv.channel_shuffle, y.reshape(n, c, -1), x.reshape(n, c, -1),
                    node.attrs["groups"])]


def _b_slice(ctx: PlanContext, step: int, node: Node, n: int) -> list:
    a = node.attrs
    if ctx.root.get(node.outputs[0]) == ctx.root.get(node.inputs[0]):
        return []  # a view of its input (engine._slice_view)
    x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
    axis = a["axis"] % x.ndim
    rows = math.prod(x.shape[:axis])
    inner = math.prod(x.shape[axis + 1:])
    return [partial(kv.slice_cols, y.reshape(rows, -1), x.reshape(rows, -1), a["start"] * inner)]


BUILDERS = ops.register_table("engine", {
    "clip": _b_clip, "mul": _b_mul, "channel_shuffle": _b_channel_shuffle, "slice": _b_slice,
})
