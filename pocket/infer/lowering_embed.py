"""Engine lowering of the embedding family: `l2norm` as kernels_embed.l2norm over (A, L, B)."""

from __future__ import annotations

import math
from functools import partial

from pocket.formats import ops
from pocket.infer import kernels_embed as ke
from pocket.infer.plan import PlanContext


def _b_l2norm(ctx: PlanContext, step: int, node, n: int) -> list:
    x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
    axis = node.attrs["axis"] % x.ndim
    shape = (math.prod(x.shape[:axis]), x.shape[axis], math.prod(x.shape[axis + 1:]))
    return [partial(ke.l2norm, y.reshape(shape), x.reshape(shape), float(node.attrs["eps"]))]


PREPARE: dict = {}
BUILDERS = ops.register_table("engine", {"l2norm": _b_l2norm})
