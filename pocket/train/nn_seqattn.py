"""Sequence layers: LayerNorm, Embedding, multi-head attention, the pre-LN Transformer encoder
block, positional encodings, and the two adapters a sequence model needs around them (image
patches to tokens, mean over time). Tensors are (N, L, D): batch, time, features.
"""

from __future__ import annotations

import math

import numpy as np

from pocket.train import functional as F
from pocket.train import functional_seqattn as FS
from pocket.train import init
from pocket.train.nn import GELU, Conv2d, Dropout, Linear, Module
from pocket.train.tensor import Parameter


def _shape(v) -> tuple[int, ...]:
    return (int(v),) if isinstance(v, int | np.integer) else tuple(int(d) for d in v)


class LayerNorm(Module):
    """Layer normalisation over the trailing `normalized_shape` dims (Ba, Kiros & Hinton,
    2016), as torch.nn.LayerNorm; without affine the weight and bias stay 1 and 0, frozen."""

    op = "layernorm"

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True):
        super().__init__()
        self.normalized_shape = _shape(normalized_shape)
        self.eps, self.elementwise_affine = float(eps), bool(elementwise_affine)
        self.weight = Parameter(init.ones(self.normalized_shape), requires_grad=elementwise_affine)
        self.bias = Parameter(init.zeros(self.normalized_shape), requires_grad=elementwise_affine)

    @property
    def axis(self) -> int:
        return -len(self.normalized_shape)

    def forward(self, x):
        return FS.layer_norm(x, self.weight, self.bias, self.axis, self.eps)

    def extra_repr(self) -> str:
        return f"{list(self.normalized_shape)}, eps={self.eps}"


class Embedding(Module):
    """Token ids (N, L) in [0, V) -> vectors (N, L, D); weight N(0, 1) as torch's."""

    op = "embedding"

    def __init__(self, num_embeddings: int, embedding_dim: int, rng=None):
        super().__init__()
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        self.weight = Parameter(init.normal((num_embeddings, embedding_dim), 1.0, rng))

    def forward(self, ids):
        return FS.embedding(ids, self.weight)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class MultiheadAttention(Module):
    """Self-attention with `heads` heads (Vaswani et al., 2017): q/k/v projections, scaled
    dot-product attention per head (dropout on the attention weights), output projection.
    Traced as linear -> reshape/transpose -> attention -> transpose/reshape -> linear."""

    def __init__(self, embed_dim: int, heads: int, dropout: float = 0.0, causal: bool = False,
                 rng=None):
        super().__init__()
        if embed_dim % heads:
            raise ValueError(f"embed_dim {embed_dim} is not divisible by heads {heads}")
        self.embed_dim, self.heads = int(embed_dim), int(heads)
        self.dropout, self.causal = float(dropout), bool(causal)
        self.rng = rng
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            setattr(self, name, Linear(embed_dim, embed_dim, rng=rng))

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.heads

    def _fused(self, x) -> bool:
        # FS.self_attention needs the three projections as plain Linears with a bias (LoRA
        # wraps them; those take the composed path)
        projs = (self.q_proj, self.k_proj, self.v_proj)
        return (all(type(m) is Linear and m.bias is not None for m in projs)
                and FS.fused_self_attention_ok(x, *(t for m in projs for t in (m.weight, m.bias))))

    def forward(self, x):
        # x (N, L, E) -> (N, L, E)
        n, length, _ = x.shape
        if self._fused(x):
            y = FS.self_attention(x, self.q_proj.weight, self.q_proj.bias, self.k_proj.weight,
                                  self.k_proj.bias, self.v_proj.weight, self.v_proj.bias,
                                  self.heads, self.causal,
                                  self.dropout if self.training else 0.0, self.rng)
            return self.out_proj(y)

        def heads(t):  # (N, L, E) -> (N, H, L, Dh)
            return t.reshape(n, length, self.heads, self.head_dim).transpose(0, 2, 1, 3)

        y = FS.attention(heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x)),
                         self.causal, None, self.dropout if self.training else 0.0, self.rng)
        return self.out_proj(y.transpose(0, 2, 1, 3).reshape(n, length, self.embed_dim))

    def extra_repr(self) -> str:
        return f"{self.embed_dim}, heads={self.heads}, causal={self.causal}"


class TransformerEncoderBlock(Module):
    """Pre-LayerNorm encoder block (Xiong et al., 2020): x + attn(LN(x)), then
    x + MLP(LN(x)) with a GELU MLP of `mlp_ratio` x width; dropout after the attention, inside
    the MLP and after it."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float = 4.0, dropout: float = 0.0,
                 causal: bool = False, rng=None):
        super().__init__()
        hidden = max(1, int(round(dim * mlp_ratio)))
        self.dim, self.heads, self.mlp_ratio = int(dim), int(heads), float(mlp_ratio)
        self.ln1 = LayerNorm(dim)
        self.attn = MultiheadAttention(dim, heads, dropout, causal, rng=rng)
        self.drop1 = Dropout(dropout, rng)
        self.ln2 = LayerNorm(dim)
        self.fc1 = Linear(dim, hidden, rng=rng)
        self.act = GELU()
        self.drop2 = Dropout(dropout, rng)
        self.fc2 = Linear(hidden, dim, rng=rng)
        self.drop3 = Dropout(dropout, rng)

    def forward(self, x):
        x = x + self.drop1(self.attn(self.ln1(x)))
        return x + self.drop3(self.fc2(self.drop2(self.act(self.fc1(self.ln2(x))))))

    def extra_repr(self) -> str:
        return f"{self.dim}, heads={self.heads}, mlp_ratio={self.mlp_ratio}"


class LearnedPositionalEncoding(Module):
    """x (N, L, D) + a learned (L, D) table, N(0, 0.02) at start (as BERT and ViT)."""

    def __init__(self, length: int, dim: int, rng=None):
        super().__init__()
        self.length, self.dim = int(length), int(dim)
        self.weight = Parameter(init.normal((length, dim), 0.02, rng))

    def forward(self, x):
        return F.add(x, self.weight)


def sinusoid_table(length: int, dim: int) -> np.ndarray:
    """(L, D): sin on even features, cos on odd, wavelengths 2pi..10000*2pi (Vaswani et al.,
    2017, section 3.5)."""
    pos = np.arange(length, dtype=np.float64)[:, None]
    freq = np.exp(-math.log(10000.0) * (np.arange(0, dim, 2, dtype=np.float64) / dim))
    table = np.zeros((length, dim))
    table[:, 0::2] = np.sin(pos * freq)
    table[:, 1::2] = np.cos(pos * freq[: dim // 2])
    return table.astype(np.float32)


class SinusoidalPositionalEncoding(Module):
    """x (N, L, D) + the fixed sinusoid table, kept as a buffer (it travels in the state dict
    and the graph as a constant)."""

    def __init__(self, length: int, dim: int):
        super().__init__()
        self.length, self.dim = int(length), int(dim)
        self.register_buffer("table", sinusoid_table(length, dim))

    def forward(self, x):
        return F.add(x, self.table)


class PatchEmbedding(Module):
    """Image (N, C, H, W) -> tokens (N, L, D): a conv with stride = kernel = patch size, one
    token per patch in row-major order (Dosovitskiy et al., 2021)."""

    def __init__(self, in_channels: int, dim: int, patch: int, rng=None):
        super().__init__()
        self.patch, self.dim = int(patch), int(dim)
        self.proj = Conv2d(in_channels, dim, patch, stride=patch, rng=rng)

    def forward(self, x):
        y = self.proj(x)
        n = y.shape[0]
        return y.reshape(n, self.dim, -1).transpose(0, 2, 1)


class SequenceMeanPool(Module):
    """(N, L, D) -> (N, D): the mean over time."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = int(dim)

    def forward(self, x):
        return F.mean(x, axis=1)
