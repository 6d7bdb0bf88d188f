"""Layer-list kinds of the vision ops that are not nn.ELEMENTWISE (clip and silu are, under
their IR names): `relu6`, `channel_shuffle` (groups) and `slice` (axis, start, end)."""

from __future__ import annotations

from pocket.train import nn
from pocket.train.models import register_layer


@register_layer("relu6")
def _relu6(spec, shape, num_outputs, last, rng):
    return nn.ReLU6(), shape


@register_layer("channel_shuffle", {"groups"})
def _channel_shuffle(spec, shape, num_outputs, last, rng):
    if len(shape) != 3:
        raise ValueError("channel_shuffle needs (C, H, W) input")
    if "groups" not in spec:
        raise ValueError("give 'groups'")
    g = spec["groups"]
    m = nn.ChannelShuffle(g)
    if shape[0] % g:
        raise ValueError(f"{shape[0]} channels are not divisible by groups {g}")
    return m, shape


@register_layer("slice", {"axis", "start", "end"})
def _slice(spec, shape, num_outputs, last, rng):
    # axis counts the batch as 0, as in the IR; the layer list's shapes leave the batch out
    axis = spec.get("axis", 1)
    if isinstance(axis, bool) or not isinstance(axis, int) or not 1 <= axis <= len(shape):
        raise ValueError(f"axis must be 1..{len(shape)} (0 is the batch), got {axis!r}")
    if "start" not in spec or "end" not in spec:
        raise ValueError("give 'start' and 'end'")
    m = nn.Slice(axis, spec["start"], spec["end"])
    size = shape[axis - 1]
    if m.end > size:
        raise ValueError(f"end {m.end} is past the size {size} of axis {axis}")
    out = list(shape)
    out[axis - 1] = m.end - m.start
    return m, tuple(out)
