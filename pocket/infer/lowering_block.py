"""Inverted residual blocks as one parallel call (kernels_fma_block): which expand ->
depthwise -> project (-> residual add) chains fuse, and their calls at batch 1.

The IR keeps every node; at batch 1 the expand conv's builder binds the block's two calls and
skips the other nodes, and the engine keeps the block's maps live across its steps (their bytes
are written at the expand step). Other batch sizes run the nodes one by one, as before.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from pocket.infer import kernels_fma_block as kb
from pocket.infer.lowering_common import _act_alpha, _act_code, append_scratch, register_epi
from pocket.infer.plan import PlanContext

_NO_RESIDUAL = np.zeros((0, 1), np.float32)
_NO_ROWS = np.zeros((0, 1), np.float32)  # (the flat depthwise kernel: no row scratch)
_NO_MASKS = np.zeros((0, 1), np.int64)  # (the row kernels: no masks)


def _pointwise(ctx: PlanContext, step: int) -> bool:
    """A 1x1 conv on kernels_fma.gemm (not kernels_fma_cv, no gate in its weights)."""
    d = ctx.prep[step]
    return (d.get("route") == "conv_fma_1x1" and "cv_parts" not in d and d["p"] > 1
            and all(conv != step for conv, _ in ctx.gated.values()))


def fusable_blocks(ctx: PlanContext) -> dict[int, tuple[int, int, int | None]]:
    """{expand step: (depthwise step, project step, add step or None)} for each chain of a 1x1
    conv with an activation the GEMM's registers do, a depthwise conv on kernels_fma_dw's flat
    or row kernels (not kernels_fma_dwcv), a 1x1 conv with no activation and,
    where the project's only reader is one, a float32 add of the same shape (the residual),
    each value read by the next node alone."""
    blocks = {}
    g = ctx.graph
    for e, node in enumerate(g.nodes):
        if node.op != "conv2d" or not _pointwise(ctx, e) or e in ctx.pool_after:
            continue
        if register_epi(_act_code(node.attrs), _act_alpha(node.attrs)) is None:
            continue
        dw = ctx.only_reader(node.outputs[0])
        if dw is None or g.nodes[dw].op != "conv2d" or g.nodes[dw].inputs[0] != node.outputs[0]:
            continue
        d2 = ctx.prep[dw]
        if (d2.get("route") != "conv_fma_depthwise" or not ("masks" in d2 or "row" in d2)
                or dw in ctx.pool_after):
            continue
        proj = ctx.only_reader(g.nodes[dw].outputs[0])
        if (proj is None or g.nodes[proj].op != "conv2d" or g.nodes[proj].inputs[0] != g.nodes[dw].outputs[0]
                or not _pointwise(ctx, proj) or _act_code(g.nodes[proj].attrs) != 0
                or proj in ctx.pool_after):
            continue
        add = ctx.only_reader(g.nodes[proj].outputs[0])
        if add is not None:
            a = g.nodes[add]
            if (a.op != "add" or add in ctx.add_relu or ctx.infos[a.outputs[0]].dtype != "f32"
                    or any(v in ctx.params or ctx.sample[v] != ctx.sample[a.outputs[0]] for v in a.inputs)):
                add = None
        blocks[e] = (dw, proj, add)
    return blocks


def block_steps(ctx: PlanContext, e: int) -> tuple[int, str]:
    """The last step of block e and the value it ends with (the add's, or the project's)."""
    dw, proj, add = ctx.blocks[e]
    last = add if add is not None else proj
    return last, ctx.graph.nodes[last].outputs[0]


def reserve(ctx: PlanContext, e: int) -> None:
    """Room in the expand conv's scratch for block e's partial sums and the depthwise row
    kernels' rows (block_at, rows_at), one part a thread of the engine's as it plans (at most
    that many parts later: bind_block)."""
    dw, proj, _ = ctx.blocks[e]
    d = ctx.prep[e]
    parts = d["block_parts"] = max(1, ctx.threads)
    d["block_at"] = append_scratch(d, parts * ctx.prep[proj]["o"] * ctx.prep[proj]["p"] * 4)
    d["rows_at"] = append_scratch(d, parts * ctx.prep[dw].get("row", 0) * 4)


def bind_block(ctx: PlanContext, e: int) -> list:
    """Block e's two calls at batch 1 (their scratch: reserve); the other steps of the block
    go to ctx.skip."""
    g = ctx.graph
    dw, proj, add = ctx.blocks[e]
    ctx.skip.update(s for s in (dw, proj, add) if s is not None)
    d1, d2, d3 = ctx.prep[e], ctx.prep[dw], ctx.prep[proj]
    k, c1, c3, m, m2 = d1["k"], d1["o"], d3["o"], d1["p"], d3["p"]
    x = ctx.view(g.nodes[e].inputs[0], 1).reshape(k, m)
    ev = ctx.view(g.nodes[e].outputs[0], 1)
    dv = ctx.view(g.nodes[dw].outputs[0], 1)
    out = ctx.view(block_steps(ctx, e)[1], 1).reshape(c3, m2)
    res = _NO_RESIDUAL
    if add is not None:
        pv = g.nodes[proj].outputs[0]
        other = [v for v in g.nodes[add].inputs if v != pv] or [pv]
        res = ctx.view(other[0], 1).reshape(c3, m2)
    a1, a2 = g.nodes[e].attrs, g.nodes[dw].attrs
    epi1 = register_epi(_act_code(a1), _act_alpha(a1))
    epi2 = register_epi(_act_code(a2), _act_alpha(a2))
    work = 4 * c1 * (m * k + m2 * c3)  # (pools.call_work's measure of kernels_fma.gemm)
    parts = min(max(1, ctx.threads), d1["block_parts"]) if ctx.parallel(work) else 1
    psum = ctx.scratch(e, np.float32, (parts, c3, m2), d1["block_at"])
    if "row" in d2:
        rows, masks = ctx.scratch(e, np.float32, (parts, d2["row"]), d1["rows_at"]), _NO_MASKS
    else:
        rows, masks = _NO_ROWS, d2["masks"]
    _, _, sh, _, ph, pw, _, _ = d2["geom"]
    return [partial(kb.block_parts, psum, ev, dv, x, d1["w2"], d1["b_reg"], epi1, d1["offs"], d2["w"],
                    d2["b"], masks, rows, sh, ph, pw, -1 if epi2 is None else epi2 - 1, _act_code(a2),
                    _act_alpha(a2), d3["w2"], d3["offs"]),
            partial(kb.block_sum, out, psum, d3["b_reg"], res)]
