"""How the sequence layers (train/nn_seqattn.py) trace into the graph IR.

LayerNorm and Embedding are one op each; the composite layers emit their parts: multi-head
attention as linear -> reshape/transpose -> attention -> transpose/reshape -> linear, the
encoder block with its `add` residuals, the positional encodings as an `add` of a param, patches
as conv2d -> reshape -> transpose, and the mean over time as transpose -> reshape ->
global_avgpool -> flatten (ops the engine and ONNX already have).
"""

from __future__ import annotations

import math

from pocket.formats import ops
from pocket.train import nn_seqattn as NS
from pocket.train.trace import _p, register_module, trace_module


def _layernorm(b, m, prefix, x):
    ins = [x, b.param(_p(prefix, "weight")), b.param(_p(prefix, "bias"))]
    return b.node(prefix, "layernorm", ins, axis=int(m.axis), eps=float(m.eps))


def _embedding(b, m, prefix, x):
    return b.node(prefix, "embedding", [x, b.param(_p(prefix, "weight"))])


ops.register_table("trace", {"layernorm": _layernorm, "embedding": _embedding})


@register_module(NS.MultiheadAttention)
def _mha(b, m, prefix, x):
    def heads(name):  # (N, L, E) -> (N, H, L, Dh)
        y = trace_module(b, getattr(m, f"{name}_proj"), _p(prefix, f"{name}_proj"), x)
        y = b.node(_p(prefix, f"{name}_split"), "reshape", [y], shape=[-1, m.heads, m.head_dim])
        return b.node(_p(prefix, f"{name}_heads"), "transpose", [y], perm=[0, 2, 1, 3])

    q, k, v = heads("q"), heads("k"), heads("v")
    y = b.node(_p(prefix, "attention"), "attention", [q, k, v], causal=m.causal,
               scale=1.0 / math.sqrt(m.head_dim))
    y = b.node(_p(prefix, "merge"), "transpose", [y], perm=[0, 2, 1, 3])
    y = b.node(_p(prefix, "concat_heads"), "reshape", [y], shape=[-1, m.embed_dim])
    return trace_module(b, m.out_proj, _p(prefix, "out_proj"), y)


@register_module(NS.TransformerEncoderBlock)
def _encoder_block(b, m, prefix, x):
    h = x
    for name in ("ln1", "attn", "drop1"):
        h = trace_module(b, getattr(m, name), _p(prefix, name), h)
    x = b.node(_p(prefix, "add1"), "add", [x, h])
    h = x
    for name in ("ln2", "fc1", "act", "drop2", "fc2", "drop3"):
        h = trace_module(b, getattr(m, name), _p(prefix, name), h)
    return b.node(_p(prefix, "add2"), "add", [x, h])


@register_module(NS.LearnedPositionalEncoding)
def _learned_pe(b, m, prefix, x):
    return b.node(prefix, "add", [x, b.param(_p(prefix, "weight"))])


@register_module(NS.SinusoidalPositionalEncoding)
def _sinusoidal_pe(b, m, prefix, x):
    return b.node(prefix, "add", [x, b.param(_p(prefix, "table"))])


@register_module(NS.PatchEmbedding)
def _patches(b, m, prefix, x):
    y = trace_module(b, m.proj, _p(prefix, "proj"), x)  # (N, D, h, w)
    y = b.node(_p(prefix, "flatten"), "reshape", [y], shape=[m.dim, -1])
    return b.node(_p(prefix, "tokens"), "transpose", [y], perm=[0, 2, 1])  # (N, L, D)


@register_module(NS.SequenceMeanPool)
def _mean_pool(b, m, prefix, x):
    y = b.node(_p(prefix, "features_first"), "transpose", [x], perm=[0, 2, 1])  # (N, D, L)
    y = b.node(_p(prefix, "as_image"), "reshape", [y], shape=[m.dim, -1, 1])
    y = b.node(_p(prefix, "mean"), "global_avgpool", [y])
    return b.node(_p(prefix, "flatten"), "flatten", [y])
