"""Chained linears: a plan-level fusion between linear_fma (or linear_vnni) nodes.

A linear whose only reader is a linear on the same tile route (an int8 one with an int8
result) leaves, from CHAIN_ROWS rows on, its result in the next one's packed layout: (O, Mc)
float32 or (O/4, Mp) words of four int8 codes, in its own buffer, and the next one reads it
there. That saves a transposing copy and a transpose back (mlp fp32 batch 64: ~20 of 225 us).
The IR is unchanged.
"""

from __future__ import annotations

from pocket.infer import kernels_fma as kfma
from pocket.infer.lowering_common import _tile_cols
from pocket.infer.routes.base import sample_rows

# The rows from which linear_fma and linear_vnni both run as tile GEMMs with the rows as the
# columns of a packed operand (their FMA_LINEAR_ROWS and VNNI_TILE_ROWS; a test checks)
CHAIN_ROWS = 16


def chain_route(ctx, step: int) -> str | None:
    """'fma' or 'vnni' where linear `step` runs, from CHAIN_ROWS rows on, as a GEMM with its
    rows as the columns of a packed operand (kernels_fma on AVX-512, kernels_vnni's tiles)."""
    node, d = ctx.graph.nodes[step], ctx.prep[step]
    # NOTE: a linear over (N, ..., in) does not chain: the packed buffers and the CHAIN_ROWS
    # test count batch rows
    if node.op != "linear" or ctx.max_batch < CHAIN_ROWS or sample_rows(ctx, node) != 1:
        return None
    if d.get("route") == "linear_fma":
        return "fma"
    if d.get("route") == "linear_vnni" and d["w"].shape[1] % 4 == 0:
        return "vnni"
    return None


def chained_linears(ctx) -> dict[int, tuple[int, int]]:
    """{step: (next step, bytes)} for each chained linear (see the module docstring): bytes is
    its result's size in the next one's packed layout at max_batch."""
    chained = {}
    for step, node in enumerate(ctx.graph.nodes):
        route, out = chain_route(ctx, step), node.outputs[0]
        nxt = ctx.readers.get(out, [])
        if route is None or out in ctx.graph.outputs or len(nxt) != 1 or chain_route(ctx, nxt[0]) != route:
            continue
        o = ctx.params[node.inputs[1]].shape[0]
        if route == "fma":
            chained[step] = (nxt[0], o * kfma.tile_cols(ctx.max_batch) * 4)
        elif ctx.prep[step]["to_int8"]:
            chained[step] = (nxt[0], o * _tile_cols(ctx.max_batch))
    return chained


def chained_input(ctx, step: int, n: int) -> bool:
    """Whether linear `step` at batch n reads its input in its packed layout."""
    return n >= CHAIN_ROWS and any(nxt == step for nxt, _ in ctx.chained.values())


def chained_output(ctx, step: int, n: int) -> bool:
    """Whether linear `step` at batch n leaves its result in the next one's packed layout."""
    return step in ctx.chained and n >= CHAIN_ROWS
