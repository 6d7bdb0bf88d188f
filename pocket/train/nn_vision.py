"""Layers of the vision ops: ReLU6 / Clip, SiLU, Mul, ChannelShuffle and Slice.

nn.py imports this module at its end and re-exports the classes (nn.ReLU6, ...). Clip and SiLU
are `Elementwise`, so the tracer and the layer list know them through nn.ELEMENTWISE; Mul is a
two-input merge that a container's tracer emits (as `add`); ChannelShuffle and Slice register
their trace functions here, and train/models_vision.py their layer-list kinds.
"""

from __future__ import annotations

from pocket.formats import ops
from pocket.train import functional as F
from pocket.train import functional_vision as FV
from pocket.train.nn import ELEMENTWISE, Elementwise, Module


class Clip(Elementwise):
    """min(max(x, min), max), the IR's `clip`; ReLU6 is Clip(0, 6)."""

    op = "clip"

    def __init__(self, min: float = 0.0, max: float = 6.0):  # noqa: A002 - the IR's attr names
        super().__init__()
        if min > max:
            raise ValueError(f"clip: min ({min}) must be at most max ({max})")
        self.min, self.max = float(min), float(max)

    def forward(self, x):
        return FV.clip(x, self.min, self.max)

    def ir_attrs(self) -> dict:
        return {"min": self.min, "max": self.max}

    def extra_repr(self) -> str:
        return f"min={self.min:g}, max={self.max:g}"


class ReLU6(Clip):
    """min(max(x, 0), 6); Sandler et al., 2018 (MobileNetV2). Traces to clip(0, 6)."""

    def __init__(self):
        super().__init__(0.0, 6.0)

    def extra_repr(self) -> str:
        return ""


ELEMENTWISE["clip"] = Clip  # ReLU6 entered itself as clip's layer; the general one is Clip


class SiLU(Elementwise):
    """x * sigmoid(x) (swish); Ramachandran et al., 2017; EfficientNet's activation."""

    op = "silu"

    def forward(self, x):
        return FV.silu(x)


class Mul(Module):
    """x * y with NumPy broadcasting (a squeeze-and-excitation gate: (N, C, H, W) * (N, C, 1, 1));
    a module so that the product appears as a `mul` node when a container traces it."""

    op = "mul"

    def forward(self, x, y):
        return F.mul(x, y)


class ChannelShuffle(Module):
    """(N, C, H, W) -> reshape (N, g, C/g, H, W), swap axes 1 and 2, back; Zhang et al., 2018."""

    op = "channel_shuffle"

    def __init__(self, groups: int):
        super().__init__()
        if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
            raise ValueError(f"channel_shuffle: groups must be a positive integer, got {groups!r}")
        self.groups = groups

    def forward(self, x):
        return FV.channel_shuffle(x, self.groups)

    def ir_attrs(self) -> dict:
        return {"groups": int(self.groups)}

    def extra_repr(self) -> str:
        return f"groups={self.groups}"


class Slice(Module):
    """x[..., start:end, ...] along `axis` (counting the batch as 0; not the batch), step 1:
    ShuffleNetV2's channel split is Slice(1, 0, C/2) and Slice(1, C/2, C)."""

    op = "slice"

    def __init__(self, axis: int, start: int, end: int):
        super().__init__()
        for name, v in (("axis", axis), ("start", start), ("end", end)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"slice: {name} must be an integer, got {v!r}")
        if not 0 <= start < end:
            raise ValueError(f"slice: need 0 <= start < end, got start {start}, end {end}")
        self.axis, self.start, self.end = axis, start, end

    def forward(self, x):
        return FV.slice(x, self.axis, self.start, self.end)

    def ir_attrs(self) -> dict:
        return {"axis": int(self.axis), "start": int(self.start), "end": int(self.end)}

    def extra_repr(self) -> str:
        return f"axis={self.axis}, start={self.start}, end={self.end}"


def _trace_attrs(b, m, prefix, x):
    # fn(builder, module, prefix, x) -> output value name (train/trace.py's Builder)
    return b.node(prefix, m.op, [x], **m.ir_attrs())


ops.register_table("trace", {"channel_shuffle": _trace_attrs, "slice": _trace_attrs})
