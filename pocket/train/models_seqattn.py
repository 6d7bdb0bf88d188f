"""Zoo models `transformer` and `vit`, and the layer-list kinds of the sequence layers."""

from __future__ import annotations

from pocket.train import nn
from pocket.train import nn_seqattn as NS
from pocket.train.models import ModelError, register_layer, register_model


def _blocks(dim: int, depth: int, heads: int, mlp_ratio: float, dropout: float, causal: bool,
            rng) -> list[nn.Module]:
    if depth < 1 or heads < 1 or dim < 1:
        raise ModelError("[model] dim, depth and heads must be positive integers")
    if dim % heads:
        raise ModelError(f"[model] dim ({dim}) must be divisible by heads ({heads})")
    if mlp_ratio <= 0:
        raise ModelError(f"[model] mlp_ratio must be positive, got {mlp_ratio}")
    return [NS.TransformerEncoderBlock(dim, heads, mlp_ratio, dropout, causal, rng=rng)
            for _ in range(depth)]


def _head(dim: int, num_outputs: int, rng) -> list[nn.Module]:
    return [NS.LayerNorm(dim), NS.SequenceMeanPool(dim), nn.Linear(dim, num_outputs, rng=rng)]


@register_model("transformer")
def transformer(input_shape, num_outputs, *, dim=64, depth=2, heads=4, mlp_ratio=2.0,
                dropout=0.0, vocab=0, positional="learned", causal=False, rng=None, **_):
    """A Transformer encoder (Vaswani et al., 2017; pre-LN blocks as Xiong et al., 2020) over
    (L, F) features per step (a linear to `dim`) or, with `vocab` > 0, (L,) token ids (an
    embedding); learned or sinusoidal positions, `depth` blocks, a final LayerNorm, the mean
    over time and a linear head."""
    if vocab:
        if len(input_shape) != 1:
            raise ModelError(f"transformer with vocab takes (L,) token ids, got input "
                             f"{list(input_shape)}")
        length, stem = input_shape[0], NS.Embedding(vocab, dim, rng=rng)
    else:
        if len(input_shape) != 2:
            raise ModelError(f"transformer takes (L, F) features per step (or token ids with "
                             f"vocab), got input {list(input_shape)}")
        length, stem = input_shape[0], nn.Linear(input_shape[1], dim, rng=rng)
    if positional not in ("learned", "sinusoidal"):
        raise ModelError(f"[model] positional must be learned or sinusoidal, got {positional!r}")
    pe = (NS.LearnedPositionalEncoding(length, dim, rng=rng) if positional == "learned"
          else NS.SinusoidalPositionalEncoding(length, dim))
    return nn.Sequential(stem, pe, *_blocks(dim, depth, heads, mlp_ratio, dropout, causal, rng),
                         *_head(dim, num_outputs, rng))


@register_model("vit", input_rank=3)
def vit(input_shape, num_outputs, *, patch=0, dim=64, depth=4, heads=4, mlp_ratio=2.0,
        dropout=0.0, rng=None, **_):
    """A Vision Transformer (Dosovitskiy et al., 2021): non-overlapping patch x patch patches
    embedded by a conv with stride = patch, learned positions, pre-LN encoder blocks, a final
    LayerNorm and mean pooling over the patches (no class token: as Beyer et al., 2022, it
    trains as well at this size and needs no broadcast of a token across the batch), linear
    head. patch 0 picks 2 for images up to 16 pixels (digits 8x8: 16 patches) and 4 above
    (CIFAR 32x32: 64 patches)."""
    c, h, w = input_shape
    p = patch or (2 if max(h, w) <= 16 else 4)
    if p < 1 or h % p or w % p:
        raise ModelError(f"vit: patch {p} must divide the image size {h}x{w}")
    length = (h // p) * (w // p)
    return nn.Sequential(NS.PatchEmbedding(c, dim, p, rng=rng),
                         NS.LearnedPositionalEncoding(length, dim, rng=rng),
                         *_blocks(dim, depth, heads, mlp_ratio, dropout, False, rng),
                         *_head(dim, num_outputs, rng))


# --------------------------------------------------------------------------- layer lists


def _seq(shape, kind: str) -> tuple[int, int]:
    if len(shape) != 2:
        raise ValueError(f"{kind} needs (L, D) sequence input")
    return shape


@register_layer("layernorm", {"eps"})
def _layernorm(spec, shape, num_outputs, last, rng):
    return NS.LayerNorm(shape[-1], spec.get("eps", 1e-5)), shape


@register_layer("embedding", {"vocab", "dim"})
def _embedding(spec, shape, num_outputs, last, rng):
    if len(shape) != 1:
        raise ValueError("embedding needs (L,) token ids")
    return NS.Embedding(spec["vocab"], spec["dim"], rng=rng), (shape[0], spec["dim"])


@register_layer("attention", {"heads", "dropout", "causal"})
def _attention(spec, shape, num_outputs, last, rng):
    _, d = _seq(shape, "attention")
    return NS.MultiheadAttention(d, spec.get("heads", 1), spec.get("dropout", 0.0),
                                 spec.get("causal", False), rng=rng), shape


@register_layer("transformer_block", {"heads", "mlp_ratio", "dropout", "causal"})
def _block(spec, shape, num_outputs, last, rng):
    _, d = _seq(shape, "transformer_block")
    return NS.TransformerEncoderBlock(d, spec.get("heads", 1), spec.get("mlp_ratio", 4.0),
                                      spec.get("dropout", 0.0), spec.get("causal", False),
                                      rng=rng), shape


@register_layer("positional_encoding", {"kind"})
def _positional(spec, shape, num_outputs, last, rng):
    length, d = _seq(shape, "positional_encoding")
    kind = spec.get("kind", "learned")
    if kind == "learned":
        return NS.LearnedPositionalEncoding(length, d, rng=rng), shape
    if kind == "sinusoidal":
        return NS.SinusoidalPositionalEncoding(length, d), shape
    raise ValueError(f"kind must be learned or sinusoidal, got {kind!r}")


@register_layer("patch_embedding", {"dim", "patch"})
def _patch_embedding(spec, shape, num_outputs, last, rng):
    if len(shape) != 3:
        raise ValueError("patch_embedding needs (C, H, W) input")
    c, h, w = shape
    p = spec.get("patch", 2)
    if h % p or w % p:
        raise ValueError(f"patch {p} must divide the image size {h}x{w}")
    return NS.PatchEmbedding(c, spec["dim"], p, rng=rng), ((h // p) * (w // p), spec["dim"])


@register_layer("mean_pool")
def _mean_pool(spec, shape, num_outputs, last, rng):
    _, d = _seq(shape, "mean_pool")
    return NS.SequenceMeanPool(d), (d,)
