"""Engine builders of the sequence ops (layernorm, embedding, matmul, transpose, attention),
and which linears take routes/linear_rows.py; see lowering.py for the protocol."""

from __future__ import annotations

import math
from functools import partial

import numpy as np

from pocket.formats import ops
from pocket.formats.ir import Node
from pocket.infer import kernels_seqattn as ks
from pocket.infer.plan import EngineError, PlanContext, aligned


def rows_linear(ctx: PlanContext, node: Node) -> bool:
    """Whether this linear reads (N, ..., in) rather than (N, in)."""
    return node.op == "linear" and len(ctx.sample[node.inputs[0]]) > 1


def _prep_attention(ctx: PlanContext, node: Node) -> dict:
    h, lq, d = ctx.sample[node.inputs[0]]
    ls = ctx.sample[node.inputs[1]][1]
    at = aligned(ctx.max_batch * h * lq * ls * 4)  # the scores, then k transposed
    return {"scratch_bytes": at + aligned(ctx.max_batch * h * d * ls * 4), "kt_at": at}


PREPARE = {"attention": _prep_attention}


def _b_layernorm(ctx, step, node, n):
    x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
    w, b = (ctx.params[v] for v in node.inputs[1:])
    d = w.size
    return [partial(ks.layernorm, y.reshape(-1, d), x.reshape(-1, d), w.reshape(-1),
                    b.reshape(-1), float(node.attrs["eps"]))]


def _gather(name: str, out, ids, w) -> None:
    bad = ks.gather_rows(out, ids, w)
    if bad >= 0:
        raise EngineError(f"node '{name}': embedding id {int(ids[bad])} is outside [0, "
                          f"{w.shape[0]}) (the vocabulary has {w.shape[0]} entries)")


def _b_embedding(ctx, step, node, n):
    ids, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
    w = ctx.params[node.inputs[1]]
    return [partial(_gather, node.name, y.reshape(-1, w.shape[1]), ids.reshape(-1), w)]


def _b_matmul(ctx, step, node, n):
    a, b = (ctx.view(v, n) for v in node.inputs)
    return [partial(np.matmul, a, b, out=ctx.view(node.outputs[0], n))]


def _b_transpose(ctx, step, node, n):
    x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
    if list(node.attrs["perm"]) == [0, 2, 1, 3]:
        return [partial(ks.swap_mid, y, x)]
    return [partial(np.copyto, y, x.transpose(node.attrs["perm"]))]


def _b_attention(ctx, step, node, n):
    # NOTE: scores by one batched BLAS GEMM, the softmax in place, one more GEMM: 13x faster
    # than one fused loop per query row in Numba at (256, 16, 16) (0.16 + softmax vs 2.2 ms)
    q, k, v = (ctx.view(x, n) for x in node.inputs)
    y = ctx.view(node.outputs[0], n)
    nb, lq, ls = n * q.shape[1], q.shape[2], k.shape[2]
    scale = node.attrs.get("scale") or 1.0 / math.sqrt(q.shape[3])
    s = ctx.scratch(step, np.float32, (nb, lq, ls))
    kt = ctx.scratch(step, np.float32, (nb, q.shape[3], ls), ctx.prep[step]["kt_at"])
    return [partial(ks.swap_last, kt, k.reshape(nb, ls, -1)),
            partial(np.matmul, q.reshape(nb, lq, -1), kt, out=s),
            partial(ks.attention_probs, s.reshape(nb * lq, ls), float(scale),
                    bool(node.attrs["causal"]), lq),
            partial(np.matmul, s, v.reshape(nb, ls, -1), out=y.reshape(nb, lq, -1))]


BUILDERS = ops.register_table("engine", {
    "layernorm": _b_layernorm, "embedding": _b_embedding, "matmul": _b_matmul,
    "transpose": _b_transpose, "attention": _b_attention,
})
