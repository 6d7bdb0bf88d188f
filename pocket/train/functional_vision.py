"""The vision ops' differentiable forms: clip (relu6), silu, broadcast mul, channel shuffle and
slice. clip and silu are primitives (forward and backward below); mul is functional.mul, and
shuffle and slice compose reshape / transpose / getitem, whose backwards are their own.
"""

from __future__ import annotations

import builtins

from pocket.formats import ops
from pocket.train import backend
from pocket.train import functional as F
from pocket.train.tensor import Tensor, as_tensor, primitive


def _xp(a):
    return backend.get_array_module(a)


def _clip_fwd(ctx, x, lo=0.0, hi=6.0):
    ctx.save(x)
    ctx.attrs.update(lo=lo, hi=hi)
    return _xp(x).clip(x, lo, hi)  # NaN stays NaN


def _clip_bwd(ctx, gy):
    (x,) = ctx.saved
    lo, hi = ctx.attrs["lo"], ctx.attrs["hi"]
    # NOTE: strict at both bounds, as PyTorch's relu6/hardtanh (and our relu at 0)
    return (gy * ((x > lo) & (x < hi)).astype(gy.dtype),)


def _silu_fwd(ctx, x):
    xp = _xp(x)
    # NOTE: exp of -|x| only, so large |x| never overflows (as functional.sigmoid).
    e = xp.exp(-xp.abs(x))
    s = xp.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)
    ctx.save(x, s)
    return x * s


def _silu_bwd(ctx, gy):
    x, s = ctx.saved
    # d/dx x s(x) = s + x s (1 - s)
    return (gy * (s * (1 + x * (1 - s))),)


_clip = primitive("clip", _clip_fwd, _clip_bwd)
silu = primitive("silu", _silu_fwd, _silu_bwd)  # Ramachandran et al., 2017; EfficientNet's swish


def clip(x, min: float = 0.0, max: float = 6.0) -> Tensor:  # noqa: A002 - the IR's attr names
    if min > max:
        raise ValueError(f"clip: min ({min}) must be at most max ({max})")
    return _clip(as_tensor(x), lo=float(min), hi=float(max))


def relu6(x) -> Tensor:
    """min(max(x, 0), 6); Howard et al., 2017 / Sandler et al., 2018 (MobileNetV1/V2)."""
    return clip(x, 0.0, 6.0)


def channel_shuffle(x, groups: int) -> Tensor:
    """x (N, C, H, W) -> the same shape, channel c*g + i taken from i*(C/g) + c (ShuffleNet)."""
    x = as_tensor(x)
    n, c, h, w = x.shape
    if groups < 1 or c % groups:
        raise ValueError(f"channel_shuffle: {c} channels are not divisible by groups {groups}")
    y = F.transpose(F.reshape(x, (n, groups, c // groups, h, w)), (0, 2, 1, 3, 4))
    return F.reshape(y, (n, c, h, w))


def slice(x, axis: int = 1, start: int = 0, end: int = 0) -> Tensor:  # noqa: A001 - IR name
    """x[..., start:end, ...] along `axis` (not the batch), step 1, 0 <= start < end <= size."""
    x = as_tensor(x)
    ax = axis % x.ndim if -x.ndim <= axis < x.ndim else None
    if ax is None or ax == 0:
        raise ValueError(f"slice: axis {axis} must be a non-batch axis of a {x.ndim}-D input")
    if not 0 <= start < end <= x.shape[ax]:
        raise ValueError(f"slice: need 0 <= start < end <= {x.shape[ax]}, got {start}, {end}")
    index = (builtins.slice(None),) * ax + (builtins.slice(start, end),)
    return F.getitem(x, index)


ops.register_table("train", {"clip": clip, "silu": silu, "mul": F.mul,
                             "channel_shuffle": channel_shuffle, "slice": slice})
