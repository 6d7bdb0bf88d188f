"""The engine's routes: each way to run a conv2d or a linear, one module each, and the ordered
table that picks one per node at load.

A node takes the first route of its op's table that is eligible for its geometry, dtype and
this CPU (Route.limits: the hard limits, e.g. AVX-512, groups, the padding a pitch route can
read) and does not decline it (Route.declines: a cost rule, e.g. Winograd below 64 channels).
POCKET_ROUTE=<name>[,<name>...] forces routes: a node takes the first named route of its op
that is eligible (declines ignored); a node of that op for which none is eligible, or an
unknown name, is an EngineError naming the node, the route and why.
"""

from __future__ import annotations

import os

from pocket.formats.ir import Node
from pocket.infer.plan import EngineError, PlanContext

# NOTE: each module registers its route in base.ROUTES as it is imported
from pocket.infer.routes import (  # noqa: F401
    conv_depthwise,
    conv_depthwise_int8,
    conv_direct,
    conv_fma_1x1,
    conv_fma_cols,
    conv_fma_depthwise,
    conv_fma_phase,
    conv_fma_pitch,
    conv_gemm,
    conv_gemm_pitch,
    conv_gemv,
    conv_im2col,
    conv_int8_blas,
    conv_int8_im2row,
    conv_pointwise,
    conv_pw,
    conv_pw_int8,
    conv_sdot,
    conv_sdot_taps,
    conv_tile,
    conv_vnni,
    conv_vnni_quad,
    conv_winograd,
    conv_winograd_fused,
    linear_blas,
    linear_fma,
    linear_gemv,
    linear_int8,
    linear_rows,
    linear_sdot,
    linear_smull,
    linear_vnni,
)
from pocket.infer.routes.base import ROUTES, Route, dtype_of, geometry_of

# First eligible wins, so each CPU's preferred route comes first: the depthwise kernels (only
# depthwise convs are eligible), AVX-512 (VNNI) and ARM dotprod (sdot) routes, eligible only there, then
# Winograd, the pitch routes, and the im2col routes any conv runs.
TABLE: dict[str, tuple[Route, ...]] = {op: tuple(ROUTES[r] for r in names) for op, names in {
    "conv2d": ("conv_fma_depthwise", "conv_depthwise", "conv_depthwise_int8", "conv_direct",
               "conv_vnni_quad", "conv_vnni", "conv_sdot", "conv_sdot_taps", "conv_smull",
               "conv_smull_taps", "conv_pw_int8", "conv_tile_q",
               "conv_tile_q_cols", "conv_int8_blas",
               "conv_int8_im2row", "conv_winograd_fused", "conv_winograd",
               "conv_fma_1x1", "conv_fma_pitch", "conv_fma_phase", "conv_fma_cols", "conv_tile_phase",
               "conv_gemv", "conv_tile",
               "conv_pw", "conv_pointwise", "conv_gemm_pitch", "conv_tile_cols", "conv_gemm",
               "conv_im2col"),
    "linear": ("linear_vnni", "linear_sdot", "linear_smull", "linear_int8", "linear_fma", "linear_gemv",
               "linear_blas", "linear_rows"),
}.items()}
NAMES = tuple(r.name for routes in TABLE.values() for r in routes)


def forced_routes(env: str | None = None) -> tuple[str, ...]:
    """POCKET_ROUTE's names (or env's), checked: an unknown name is an EngineError."""
    env = os.environ.get("POCKET_ROUTE", "") if env is None else env
    names = tuple(s.strip() for s in env.split(",") if s.strip())
    unknown = [s for s in names if s not in ROUTES]
    if unknown:
        raise EngineError(f"POCKET_ROUTE: unknown route(s) {', '.join(unknown)}; the routes are "
                          f"{', '.join(NAMES)}")
    return names


def select(ctx: PlanContext, node: Node) -> Route:
    """The route node takes (see the module docstring)."""
    geo, dtype = geometry_of(ctx, node), dtype_of(node)
    table = TABLE[node.op]
    forced = [ROUTES[s] for s in ctx.forced if ROUTES[s].op == node.op]
    if forced:
        why = []
        for r in forced:
            reason = r.limits(geo, dtype, ctx.cpu)
            if reason is None:
                return r
            why.append(f"{r.name}: {reason}")
        raise EngineError(f"node '{node.name}' ({node.op}): POCKET_ROUTE forces a route that cannot "
                          f"run it ({'; '.join(why)})")
    for r in table:
        if r.limits(geo, dtype, ctx.cpu) is None and r.declines(geo, dtype, ctx.cpu) is None:
            return r
    raise EngineError(f"node '{node.name}' ({node.op}): no route can run it")  # (im2col routes take any)


def prepare(ctx: PlanContext, node: Node) -> dict:
    """Node's prepared dict on its route (prep["route"] names it)."""
    return select(ctx, node).prepare(ctx, node)


__all__ = ["NAMES", "ROUTES", "TABLE", "Route", "forced_routes", "prepare", "select"]
