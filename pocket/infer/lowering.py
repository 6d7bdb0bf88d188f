"""How each IR op becomes kernel calls: the engine's per-op preparation and builders.

A prepare function runs once at load: kernel-friendly views of the weights (a copy only where a
route needs another layout, made once: routes.base.prepared), int8 constants, and the node's
scratch size in the arena. A builder binds one node to the
arena views of one batch size and returns the calls to make, in order (partials of Numba
kernels or of NumPy's BLAS matmul with out=). See engine.py for the plan and the arena.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np

from pocket.formats import ops
from pocket.formats.ir import Node
from pocket.infer import kernels_fma_pool as kfp
from pocket.infer import kernels_fp32 as kf
from pocket.infer import kernels_int8 as ki
from pocket.infer import kernels_pool as kp
from pocket.infer import lowering_seqattn, lowering_spiking, lowering_vision, routes
from pocket.infer.lowering_common import _act_code, _pool_geom
from pocket.infer.lowering_conv import _b_conv2d, _prep_conv2d, fusable_pools, padded_pairs
from pocket.infer.plan import NP_DTYPES, PlanContext
from pocket.infer.routes.base import route_at
from pocket.infer.routes.linear_chain import CHAIN_ROWS, chained_linears

__all__ = ["BUILDERS", "CHAIN_ROWS", "PREPARE", "chained_linears", "fusable_pools", "fused_add_relus",
           "no_prep", "padded_pairs", "residual_convs"]

def no_prep(ctx: PlanContext, node: Node) -> dict:
    return {}


def _prep_linear(ctx: PlanContext, node: Node) -> dict:
    # fp32 (N, ..., in): one GEMM over the rows (linear_rows). An int8 one takes the 2-D int8
    # routes, which run its N * ... rows (routes.base.sample_rows)
    if lowering_seqattn.rows_linear(ctx, node) and "x_scale" not in node.attrs:
        return routes.ROUTES["linear_rows"].prepare(ctx, node)
    return routes.prepare(ctx, node)


def _pool_fma(ctx: PlanContext, node: Node) -> bool:
    """Whether maxpool node runs as kernels_fma_pool.maxpool_fma (AVX-512, fp32, its windows)."""
    kh, kw, sh, sw, ph, pw = _pool_geom(node.attrs)
    return ctx.cpu.fma and ctx.infos[node.inputs[0]].dtype == "f32" and kfp.fast(kw, sw)


def _prep_maxpool2d(ctx: PlanContext, node: Node) -> dict:
    """kernels_pool.maxpool_sep's row buffers: one a thread (maxpool_fma keeps its rows in
    registers)."""
    if _pool_fma(ctx, node):
        return {"pool_rows": (max(1, ctx.threads), 0)}
    kh, kw, sh, sw, ph, pw = _pool_geom(node.attrs)
    w, wo = ctx.sample[node.inputs[0]][2], ctx.sample[node.outputs[0]][2]
    width = kp.row_width(w, wo, kw, sw, pw)
    rows = max(1, ctx.threads)
    itemsize = np.dtype(NP_DTYPES[ctx.infos[node.inputs[0]].dtype]).itemsize
    return {"pool_rows": (rows, width), "scratch_bytes": rows * width * itemsize}


PREPARE = {"linear": _prep_linear, "conv2d": _prep_conv2d, "maxpool2d": _prep_maxpool2d,
           **lowering_seqattn.PREPARE,
           **lowering_spiking.PREPARE}


def _b_linear(ctx: PlanContext, step: int, node: Node, n: int) -> list:
    route, d = route_at(ctx, step, n)
    return route.bind(ctx, step, node, d, n)


def _b_unary(ctx: PlanContext, step: int, node: Node, n: int) -> list:
    a = node.attrs
    code = kf.ACT["gelu_tanh" if a.get("approximate") == "tanh" else node.op]
    x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
    return [partial(kf.unary, y.reshape(-1), x.reshape(-1), code, a.get("alpha", 0.0))]


def _b_maxpool2d(ctx, step, node, n):
    x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
    rows, width = ctx.prep[step]["pool_rows"]
    planes = n * x.shape[1]
    parts = min(rows, ctx.threads, planes)
    if not ctx.parallel_elements(planes * x.shape[2] * x.shape[3]):
        parts = 1
    geom = _pool_geom(node.attrs)
    if _pool_fma(ctx, node):
        return [partial(kfp.maxpool_fma, y, x, parts, *geom)]
    buf = ctx.scratch(step, x.dtype, (parts, width))
    lowest = x.dtype.type(np.iinfo(x.dtype).min if x.dtype.kind in "iu" else -np.inf)
    return [partial(kp.maxpool_sep, y, x, buf, *geom, lowest)]


def _b_avgpool2d(ctx, step, node, n):
    x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
    return [partial(kf.avgpool2d, y, x, *_pool_geom(node.attrs), node.attrs["count_include_pad"])]


def _b_global_avgpool(ctx, step, node, n):
    x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
    return [partial(kf.global_avgpool, y.reshape(n, -1), x.reshape(n, x.shape[1], -1))]


def _b_batchnorm(ctx, step, node, n):
    x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
    params = [ctx.params[v] for v in node.inputs[1:]]
    return [partial(kf.batchnorm, y.reshape(n, y.shape[1], -1), x.reshape(n, x.shape[1], -1),
                    *params, node.attrs["eps"])]


def _b_alias(ctx, step, node, n):
    return []


def fused_add_relus(ctx: PlanContext) -> dict[int, int]:
    """{add step: relu step} where a float32 add of two same-shape values has one reader, a
    ReLU: the add applies it as it writes (kernels_fp32.add_relu) and the engine lays the
    ReLU's output over the add's, so the ReLU binds nothing.

    NOTE: ResNet-18's 8 residual ReLUs were a pass of their own over 50-200 K floats each:
    119 us of its 20 ms on one thread, 140 on two (slower: each its own fork and join)."""
    fused = {}
    for step, node in enumerate(ctx.graph.nodes):
        out = node.outputs[0]
        relu = ctx.only_reader(out)
        if (node.op != "add" or relu is None or ctx.graph.nodes[relu].op != "relu"
                or ctx.infos[out].dtype != "f32"
                or any(v in ctx.params or ctx.sample[v] != ctx.sample[out] for v in node.inputs)):
            continue
        fused[step] = relu
    return fused


def residual_convs(ctx: PlanContext) -> dict[int, int]:
    """{conv step: add step} where a float32 conv with no activation (and no fused pool) has
    one reader, an add of its output and a value computed before the conv, of the same shape
    (a residual block's last conv): a route that can (conv_winograd, kernels_fma_winograd's
    output transform) then writes the add's output itself, adding the other value and the
    add's fused ReLU (fused_add_relus) as it writes, and the add binds nothing. The engine
    starts the add's output at the conv (Engine._plan_arena); where the conv's route at a batch
    size does not fuse, the add runs as usual.

    NOTE: ResNet-18's residual adds (with their ReLU) were passes of their own over 25-200 K
    floats: 35-41 us each at 56 x 56 on two threads."""
    g = ctx.graph
    made = {v: step for step, node in enumerate(g.nodes) for v in node.outputs}
    taken = {v[-1] for v in (*ctx.blocks.values(), *ctx.se_blocks.values())}
    found = {}
    for step, node in enumerate(g.nodes):
        out = node.outputs[0]
        add = ctx.only_reader(out)
        if (node.op != "conv2d" or add is None or add in taken or step in ctx.pool_after
                or step in ctx.pad_after or _act_code(node.attrs) != 0 or ctx.infos[out].dtype != "f32"):
            continue
        a = g.nodes[add]
        other = [v for v in a.inputs if v != out]
        if (a.op != "add" or len(a.inputs) != 2 or len(other) != 1 or other[0] in ctx.params
                or made.get(other[0], -1) >= step or ctx.infos[a.outputs[0]].dtype != "f32"
                or any(ctx.sample[v] != ctx.sample[a.outputs[0]] for v in a.inputs)):
            continue
        found[step] = add
    return found


def _b_add(ctx, step, node, n):
    a, b = (ctx.view(v, n) for v in node.inputs)
    y = ctx.view(node.outputs[0], n)
    relu = ctx.add_relu.get(step)
    if relu is not None:
        ctx.skip.add(relu)  # (its output's bytes are y's: Engine._plan_arena)
        return [partial(kf.add_relu, y.reshape(-1), a.reshape(-1), b.reshape(-1))]
    if a.shape == b.shape == y.shape:
        return [partial(kf.add, y.reshape(-1), a.reshape(-1), b.reshape(-1))]
    return [partial(np.add, a, b, out=y)]


def _b_concat(ctx, step, node, n):
    y = ctx.view(node.outputs[0], n)
    axis = node.attrs["axis"] % y.ndim
    rows = math.prod(y.shape[:axis])
    y2 = y.reshape(rows, -1)
    calls, start = [], 0
    for v in node.inputs:
        x2 = ctx.view(v, n).reshape(rows, -1)
        if ctx.root.get(v) != ctx.root[node.outputs[0]]:  # else written in place
            # (engine._concat_slices)
            calls.append(partial(kf.copy_cols, y2, x2, start))
        start += x2.shape[1]
    return calls


def _b_softmax(ctx, step, node, n):
    x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
    axis = node.attrs["axis"] % x.ndim
    shape = (math.prod(x.shape[:axis]), x.shape[axis], math.prod(x.shape[axis + 1:]))
    return [partial(kf.softmax, y.reshape(shape), x.reshape(shape))]


def _b_quantize(ctx, step, node, n):
    x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
    a = node.attrs
    kernel = ki.quantize if node.op == "quantize" else ki.dequantize
    return [partial(kernel, y.reshape(-1), x.reshape(-1), a["scale"], a["zero_point"])]


def _b_lut(ctx, step, node, n):
    x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
    return [partial(ki.lut, y.reshape(-1), x.reshape(-1), ctx.params[node.inputs[1]])]


BUILDERS = ops.register_table("engine", {
    # kernels_fp32.unary on the op's ACT code, for the activations no family builds itself
    **{op: _b_unary for op in ops.activations() if op not in lowering_vision.BUILDERS},
    "linear": _b_linear, "conv2d": _b_conv2d, "batchnorm": _b_batchnorm,
    "maxpool2d": _b_maxpool2d, "avgpool2d": _b_avgpool2d,
    "global_avgpool": _b_global_avgpool, "flatten": _b_alias, "reshape": _b_alias,
    "dropout": _b_alias, "add": _b_add, "concat": _b_concat, "softmax": _b_softmax,
    "quantize": _b_quantize, "dequantize": _b_quantize, "lut": _b_lut, **lowering_spiking.BUILDERS,
})
BUILDERS.update(lowering_vision.BUILDERS)
BUILDERS.update(lowering_seqattn.BUILDERS)

# Op families' lowerings (lowering_<family>.py) register their builders; the engine reads
# both tables from here.
from pocket.infer import lowering_embed, lowering_seqconv, lowering_ssm  # noqa: E402

for _family in (lowering_seqconv, lowering_ssm, lowering_embed):
    PREPARE.update(_family.PREPARE)
    BUILDERS.update(_family.BUILDERS)
