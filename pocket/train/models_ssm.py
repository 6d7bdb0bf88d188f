"""The `ssm` zoo model and the state-space layer-list kinds (`ssm`, `glu`, `ssm_block`)."""

from __future__ import annotations

from pocket.train import nn
from pocket.train.models import register_layer, register_model
from pocket.train.nn_seqattn import LayerNorm
from pocket.train.nn_ssm import GLU, S4D, SSMBlock


@register_model("ssm", input_rank=2)
def ssm(input_shape, num_outputs, *, d_model=64, d_state=32, depth=4, dropout=0.0,
        bidirectional=False, mix="glu", rng=None, **_):
    """Stacked S4D blocks (Gu et al. 2022) over a sequence (L, F): a linear encoder F ->
    d_model per step, `depth` pre-norm residual blocks (LayerNorm -> S4D -> GELU -> GLU or
    linear -> dropout -> add), a final LayerNorm, then a linear head on the flattened
    (L * d_model) features. The flattened head reads every step: with a causal stack the last
    step alone already sees the whole window, but the whole window lets a forecast head weigh
    the recent steps itself; the window length is fixed at training either way."""
    for name, v in (("d_model", d_model), ("d_state", d_state), ("depth", depth)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"[model] {name} must be a positive integer, got {v!r}")
    if not isinstance(bidirectional, bool):
        raise ValueError(f"[model] bidirectional must be true or false, got {bidirectional!r}")
    length, features = input_shape
    layers = [nn.Linear(features, d_model, rng=rng)]
    layers += [SSMBlock(d_model, d_state, dropout, bidirectional, mix, rng=rng)
               for _ in range(depth)]
    layers += [LayerNorm(d_model), nn.Flatten(), nn.Linear(length * d_model, num_outputs, rng=rng)]
    return nn.Sequential(*layers)


def _need_seq(shape):
    if len(shape) != 2:
        raise ValueError("needs a sequence input (L, channels)")


@register_layer("ssm", {"d_state", "bidirectional"})
def _ssm_layer(spec, shape, num_outputs, last, rng):
    _need_seq(shape)
    return S4D(shape[1], spec.get("d_state", 32), spec.get("bidirectional", False), rng=rng), shape


@register_layer("glu", {"axis"})
def _glu_layer(spec, shape, num_outputs, last, rng):
    axis = spec.get("axis", -1)
    ax = axis % (len(shape) + 1) - 1
    if ax < 0 or shape[ax] % 2:
        raise ValueError(f"glu halves axis {axis}, which must be even and not the batch")
    out = list(shape)
    out[ax] //= 2
    return GLU(axis), tuple(out)


@register_layer("ssm_block", {"d_state", "dropout", "bidirectional", "mix"})
def _block_layer(spec, shape, num_outputs, last, rng):
    _need_seq(shape)
    return SSMBlock(shape[1], spec.get("d_state", 32), spec.get("dropout", 0.0),
                    spec.get("bidirectional", False), spec.get("mix", "glu"), rng=rng), shape
