"""How a conv2d becomes kernel calls: its route (routes/conv_*.py) prepared once at load, bound
per batch size, with the plan-level fusions between convs and the maxpools after them."""

from __future__ import annotations

from pocket.formats.ir import Node
from pocket.infer import kernels_fp32 as kf
from pocket.infer import routes
from pocket.infer.lowering_block import bind_block, bind_se_block, bind_se_project, se_split
from pocket.infer.lowering_common import _pool_geom
from pocket.infer.plan import PlanContext
from pocket.infer.routes.base import route_at, route_of
from pocket.infer.routes.conv_fma_pitch import padded_pairs

__all__ = ["fusable_pools", "padded_pairs"]


def _prep_conv2d(ctx: PlanContext, node: Node) -> dict:
    return routes.prepare(ctx, node)


def fusable_pools(ctx: PlanContext) -> dict[int, int]:
    """{conv step: maxpool step} where the conv's only reader is an unpadded maxpool (or a
    padded one, where the route can: Route.fuses_padded_pool), its route can pool in its
    epilogue and its activation is non-decreasing: the conv's epilogue then writes the pooled
    output directly (the IR keeps both nodes; at a batch size the route may still decline, see
    Route.pool_ok)."""
    fused = {}
    for step, node in enumerate(ctx.graph.nodes):
        out, a = node.outputs[0], node.attrs
        steps = ctx.readers.get(out, [])
        if (node.op != "conv2d" or out in ctx.graph.outputs or len(steps) != 1
                or not route_of(ctx.prep[step]).fuses_pool):
            continue
        pool = ctx.graph.nodes[steps[0]]
        act = kf.ACT[a.get("activation", "none")]
        if (pool.op == "maxpool2d"
                and (list(pool.attrs["padding"]) == [0, 0] or route_of(ctx.prep[step]).fuses_padded_pool)
                and act in kf.MONOTONE_ACTS and a.get("alpha", 0.0) >= 0):
            fused[step] = steps[0]
    return fused


def _b_conv2d(ctx: PlanContext, step: int, node: Node, n: int) -> list:
    if n == 1 and step in ctx.blocks:  # an inverted residual block as one call (lowering_block)
        return bind_block(ctx, step)
    # a squeeze-and-excitation block's parts at batch 1 on 2+ threads (lowering_block)
    if n == 1 and step in ctx.se_blocks and se_split(ctx, step):
        return bind_se_block(ctx, step)
    if n == 1 and step in ctx.se_projects and se_split(ctx, ctx.se_projects[step]):
        return bind_se_project(ctx, ctx.se_projects[step])
    route, d = route_at(ctx, step, n)
    # a fused maxpool: the conv writes the pooled output; its own output buffer goes unused
    pool = None
    pstep = ctx.pool_after.get(step)
    if pstep is not None:
        pnode = ctx.graph.nodes[pstep]
        pool_geom = _pool_geom(pnode.attrs)
        pool_geom = pool_geom[:4] if pool_geom[4:] == (0, 0) else pool_geom
        if route.pool_ok(d, n, pool_geom):
            pool = (ctx.view(pnode.outputs[0], n), pool_geom)
            ctx.skip.add(pstep)
    route, d = route.with_pool(ctx, step, d, n, pool is not None)
    return route.bind(ctx, step, node, d, n, pool)
