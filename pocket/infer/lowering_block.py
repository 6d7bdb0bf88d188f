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
from pocket.infer import kernels_fma_cv as kcv
from pocket.infer import kernels_fma_dwcv as kdc
from pocket.infer.lowering_common import _act_alpha, _act_code, append_scratch, register_epi
from pocket.infer.plan import PlanContext
from pocket.infer.routes.base import prepared

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
        blocks[e] = (dw, proj, _residual(ctx, proj))
    return blocks


def _residual_view(ctx: PlanContext, proj: int, add: int | None, shape: tuple[int, int]) -> np.ndarray:
    """The residual a block's last call adds at batch 1: add's other input (its only one when
    it adds the project's output to itself), or none."""
    if add is None:
        return _NO_RESIDUAL
    pv = ctx.graph.nodes[proj].outputs[0]
    other = [v for v in ctx.graph.nodes[add].inputs if v != pv] or [pv]
    return ctx.view(other[0], 1).reshape(shape)


def block_steps(ctx: PlanContext, e: int) -> tuple[int, str]:
    """The last step of block e and the value it ends with (the add's, or the project's)."""
    _, proj, add = ctx.blocks[e]
    return _end(ctx, proj, add)


def _end(ctx: PlanContext, proj: int, add: int | None) -> tuple[int, str]:
    last = add if add is not None else proj
    return last, ctx.graph.nodes[last].outputs[0]


def block_lifetimes(ctx: PlanContext, buffers: dict, root: dict) -> None:
    """The arena's lifetimes (Engine._plan_arena's buffers of each value's root) as the fused
    blocks bind at batch 1: an inverted residual block's expand step writes its maps, partial
    sums and end; an SE block's writes the depthwise map and its means, and its project step
    reads that map (gated or not) and writes the block's end."""
    g = ctx.graph
    for e, (dw, _, _) in ctx.blocks.items():
        last, end = block_steps(ctx, e)
        for v in (g.nodes[e].outputs[0], g.nodes[dw].outputs[0]):
            buffers[root[v]].first = min(buffers[root[v]].first, e)
            buffers[root[v]].last = max(buffers[root[v]].last, last)
        buffers[root[end]].first = min(buffers[root[end]].first, e)
        buffers[f"#scratch{e}"].last = max(buffers[f"#scratch{e}"].last, last)
    for e, (dw, gap, mul, proj, _) in ctx.se_blocks.items():
        dname = g.nodes[dw].outputs[0]
        for v in (dname, g.nodes[gap].outputs[0]):
            buffers[root[v]].first = min(buffers[root[v]].first, e)
        # NOTE: the project step reads the map and the gate (its last reader in the graph is
        # the skipped mul): without this, MobileNetV3-small's gate-on-rows blocks placed the
        # project's partial sums over the gate, and on two threads one part's sums overwrote
        # gate values the other part still read (a different output in ~1 call of 6)
        for v in (dname, _gate(ctx, mul, dname)):
            buffers[root[v]].last = max(buffers[root[v]].last, proj)
        end = buffers[root[se_end(ctx, e)[1]]]
        end.first = min(end.first, proj)


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
    res = _residual_view(ctx, proj, add, (c3, m2))
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


# --------------------------------------------------------------------------- squeeze-and-excitation

_DW_KIND = {"row": kb.DW_ROWS, "masks": kb.DW_FLAT, "cv": kb.DW_CV}


# The SE blocks that split by channels (fusable_se_blocks). NOTE: interleaved A/B against the
# node calls, EfficientNet-B0 at two threads, team / solo calls: its first two blocks (96 x 112 x
# 112 and 144 x 56 x 56 expanded maps, 4.8 and 1.8 MB) lost both ways (778 -> 812 / 1320 ->
# 1500 us, 540 -> 575 / 940 -> 954); one whose project runs on kernels_fma_cv over 49 pixels
# (672 -> 192 at 7 x 7) lost 10% solo for nothing in team; those of 240 x 28 x 28 and smaller,
# and kernels_fma_cv projects over 196 pixels, won 8-13% in team for 0-8% solo.
SE_MAP_BYTES = 1 << 20  # at most this much expanded map
SE_CV_PIXELS = 64  # a project on kernels_fma_cv: at least this many pixels


def fusable_se_blocks(ctx: PlanContext) -> dict[int, tuple[int, int, int, int, int | None]]:
    """{expand step: (depthwise step, means step, gate mul step, project step, add step or
    None)} for each squeeze-and-excitation block kernels_fma_block's se_parts and se_project
    take: a 1x1 conv as fusable_blocks' expand, a depthwise conv on any kernel of
    conv_fma_depthwise (rows, flat, kernels_fma_dwcv), whose output only a global average pool
    and a gate mul (by a (C, 1, 1) value) read, then a 1x1 conv on kernels_fma.gemm or _cv with
    no activation that the mul's gate goes into (its weights: gated_convs; else the map's
    rows), and where the project's only reader is one, the residual add as fusable_blocks';
    within SE_MAP_BYTES and SE_CV_PIXELS."""
    found = {}
    g = ctx.graph
    for e, node in enumerate(g.nodes):
        if (node.op != "conv2d" or not _pointwise(ctx, e) or e in ctx.pool_after or e in ctx.blocks
                or register_epi(_act_code(node.attrs), _act_alpha(node.attrs)) is None):
            continue
        dw = ctx.only_reader(node.outputs[0])
        if dw is None or g.nodes[dw].op != "conv2d" or g.nodes[dw].inputs[0] != node.outputs[0]:
            continue
        d2 = ctx.prep[dw]
        if (d2.get("route") != "conv_fma_depthwise" or dw in ctx.pool_after
                or not any(key in d2 for key in _DW_KIND)):
            continue
        dv = g.nodes[dw].outputs[0]
        readers = ctx.readers.get(dv, [])
        if len(readers) != 2 or dv in g.outputs:
            continue
        gap = next((r for r in readers if g.nodes[r].op == "global_avgpool"), None)
        mul = next((r for r in readers if g.nodes[r].op == "mul"), None)
        if gap is None or mul is None or g.nodes[gap].outputs[0] in g.outputs or _gate(ctx, mul, dv) is None:
            continue
        proj = ctx.gated[mul][0] if mul in ctx.gated else ctx.only_reader(g.nodes[mul].outputs[0])
        if (proj is None or g.nodes[proj].op != "conv2d" or g.nodes[proj].inputs[0] != g.nodes[mul].outputs[0]
                or ctx.prep[proj].get("route") != "conv_fma_1x1" or ctx.prep[proj]["p"] <= 1
                or _act_code(g.nodes[proj].attrs) != 0 or proj in ctx.pool_after):
            continue
        d1, d3 = ctx.prep[e], ctx.prep[proj]
        if d1["o"] * d1["p"] * 4 > SE_MAP_BYTES or ("cv_parts" in d3 and d3["p"] < SE_CV_PIXELS):
            continue
        found[e] = (dw, gap, mul, proj, _residual(ctx, proj))
    return found


def _gate(ctx: PlanContext, mul: int, dv: str) -> str | None:
    """The gate of mul step `mul` over map dv: its other input, of shape (C, 1, 1) against
    dv's (C, H, W) (a computed value), or None."""
    ins = ctx.graph.nodes[mul].inputs
    if len(ins) != 2 or dv not in ins or ins[0] == ins[1]:
        return None
    gate = ins[1] if ins[0] == dv else ins[0]
    shape = ctx.sample[dv]
    if gate in ctx.params or len(shape) != 3 or ctx.sample[gate] != (shape[0], 1, 1):
        return None
    return gate


def _residual(ctx: PlanContext, proj: int) -> int | None:
    """The add that is the only reader of conv proj's output, where it is a float32 add of two
    computed values of the same shape (the block's residual), or None."""
    g = ctx.graph
    add = ctx.only_reader(g.nodes[proj].outputs[0])
    if add is None:
        return None
    a = g.nodes[add]
    if (a.op != "add" or add in ctx.add_relu or ctx.infos[a.outputs[0]].dtype != "f32"
            or any(v in ctx.params or ctx.sample[v] != ctx.sample[a.outputs[0]] for v in a.inputs)):
        return None
    return add


def se_end(ctx: PlanContext, e: int) -> tuple[int, str]:
    """The last step of SE block e and the value it ends with (the add's, or the project's)."""
    _, _, _, proj, add = ctx.se_blocks[e]
    return _end(ctx, proj, add)


def reserve_se(ctx: PlanContext, e: int) -> None:
    """Room for SE block e: a depthwise scratch row a part in the expand conv's scratch
    (se_dw_at), the project's partial sums in the project's (se_at); one part a thread of the
    engine's as it plans (at most that many later: _se_parts)."""
    dw, _, _, proj, _ = ctx.se_blocks[e]
    d1, d2, d3 = ctx.prep[e], ctx.prep[dw], ctx.prep[proj]
    parts = d1["se_parts"] = max(1, ctx.threads)
    row = d2.get("cv", d2.get("row", 1))
    d1["se_row"] = row
    d1["se_dw_at"] = append_scratch(d1, parts * row * 4)
    d3["se_at"] = append_scratch(d3, parts * d3["o"] * d3["p"] * 4)


def _se_parts(ctx: PlanContext, e: int) -> int:
    """The parts SE block e's two calls split into at batch 1 (se_channels' groups of 16)."""
    dw, _, _, proj, _ = ctx.se_blocks[e]
    d1, d2, d3 = ctx.prep[e], ctx.prep[dw], ctx.prep[proj]
    geo = d2["geo"]
    taps = geo.c * geo.ho * geo.wo * geo.kh * geo.kw
    work = 4 * d1["o"] * (d1["p"] * d1["k"] + d3["p"] * d3["o"]) + 4 * taps
    if not ctx.parallel(work):
        return 1
    return max(1, min(ctx.threads, d1["se_parts"], -(-d1["o"] // 16)))


def se_split(ctx: PlanContext, e: int) -> bool:
    """Whether SE block e binds as its parts: where they are two or more. On one part the
    nodes' own calls ran 2-3% faster (MobileNetV3-small, one thread), so a 1-thread plan keeps
    them."""
    return _se_parts(ctx, e) > 1


def bind_se_block(ctx: PlanContext, e: int) -> list:
    """SE block e's first call at batch 1 (se_parts: expand, depthwise, means); the depthwise
    and means steps go to ctx.skip (the gate's FCs run as their own steps)."""
    g = ctx.graph
    dw, gap, mul, _, _ = ctx.se_blocks[e]
    ctx.skip.update((dw, gap, mul))
    d1, d2 = ctx.prep[e], ctx.prep[dw]
    k, c1, m = d1["k"], d1["o"], d1["p"]
    x = ctx.view(g.nodes[e].inputs[0], 1).reshape(k, m)
    ev, dv = ctx.view(g.nodes[e].outputs[0], 1), ctx.view(g.nodes[dw].outputs[0], 1)
    means = ctx.view(g.nodes[gap].outputs[0], 1).reshape(c1)
    a1, a2 = g.nodes[e].attrs, g.nodes[dw].attrs
    epi1 = register_epi(_act_code(a1), _act_alpha(a1))
    epi2 = register_epi(_act_code(a2), _act_alpha(a2))
    parts = _se_parts(ctx, e)
    scratch = ctx.scratch(e, np.float32, (parts, d1["se_row"]), d1["se_dw_at"])
    kind = next(_DW_KIND[key] for key in _DW_KIND if key in d2)
    if kind == kb.DW_CV:
        w2 = prepared(d2, "wpk", lambda: kdc.pack(d2["w"]))
        b2 = prepared(d2, "bpk", lambda: kcv.pad_bias(d2["b"], c1))
    else:
        w2, b2 = d2["w"], d2["b"]
    masks = d2["masks"] if kind == kb.DW_FLAT else _NO_MASKS
    _, _, sh, _, ph, pw, _, _ = d2["geom"]
    return [partial(kb.se_parts, means, ev, dv, x, d1["w2"], d1["b_reg"], epi1, d1["offs"], kind, w2, b2,
                    masks, scratch, sh, ph, pw, -1 if epi2 is None else epi2 - 1, _act_code(a2),
                    _act_alpha(a2), parts)]


def bind_se_project(ctx: PlanContext, e: int) -> list:
    """SE block e's project at batch 1: se_project on bind_se_block's parts, then block_sum
    (the bias and the residual); the add step goes to ctx.skip."""
    g = ctx.graph
    dw, _, mul, proj, add = ctx.se_blocks[e]
    if add is not None:
        ctx.skip.add(add)
    d3 = ctx.prep[proj]
    c3, c1, m2 = d3["o"], d3["k"], d3["p"]
    dname = g.nodes[dw].outputs[0]
    gate = ctx.view(_gate(ctx, mul, dname), 1).reshape(c1)
    dv = ctx.view(dname, 1).reshape(c1, m2)
    parts = _se_parts(ctx, e)
    psum = ctx.scratch(proj, np.float32, (parts, c3, m2), d3["se_at"])
    rows = mul not in ctx.gated  # (the gate on the map's rows, as mul_rows: see se_project)
    wg = _NO_ROWS if rows else ctx.scratch(proj, np.float32, (c3, c1), d3["gate_at"])
    out = ctx.view(se_end(ctx, e)[1], 1).reshape(c3, m2)
    res = _residual_view(ctx, proj, add, (c3, m2))
    return [partial(kb.se_project, psum, dv, d3["w2"], gate, wg, d3["offs"], rows),
            partial(kb.block_sum, out, psum, d3["b_reg"], res)]
