"""`Block`: branches of layers from one input, merged by add, concat or mul, then an activation.

The one container behind the edge architectures' building blocks, and what a config's
`{type = "block", ...}` layer builds (train/models_block.py):

    inverted residual (MobileNetV2)   [[expand, depthwise, project], []]         merge add
    fire module (SqueezeNet)          [[conv1x1, relu], [conv3x3, relu]]         merge concat
    squeeze-and-excitation            [[], [gap, conv1x1, relu, conv1x1, hsig]]  merge mul
    ShuffleNetV2 unit                 [[slice], [slice, conv1x1, dw, conv1x1]]   merge concat
    basic residual (ResNet)           [[conv, bn, relu, conv, bn], []]           add, relu

An empty branch is the identity. Its tracer (registered here, so any Block is traceable)
emits each branch's nodes, then the merge (`add`/`mul` chained pairwise in branch order,
`concat` on axis 1 in one node), then the activation.
"""

from __future__ import annotations

from pocket.train import functional as F
from pocket.train import nn, trace

MERGES = ("add", "concat", "mul")


class Block(nn.Module):
    """Branches (each a Sequential or a single module; None or an empty Sequential is the
    identity) applied to the same input, merged by `merge`, then `activation` (a module or
    None). Children are named branch0, branch1, ... and act, so the state dict reads
    `branch0.1.weight`."""

    def __init__(self, branches, merge: str = "add", activation: nn.Module | None = None):
        super().__init__()
        if merge not in MERGES:
            raise ValueError(f"block merge must be one of {', '.join(MERGES)}, got {merge!r}")
        branches = list(branches)
        if len(branches) < 2:
            raise ValueError(f"a block merges at least two branches, got {len(branches)}")
        self.merge = merge
        self.num_branches = len(branches)
        for i, br in enumerate(branches):
            if br is None:
                br = nn.Sequential()
            elif not isinstance(br, nn.Module):
                br = nn.Sequential(*br)
            setattr(self, f"branch{i}", br)
        self.act = activation

    @property
    def branches(self) -> list[nn.Module]:
        return [getattr(self, f"branch{i}") for i in range(self.num_branches)]

    def forward(self, x):
        outs = [br(x) for br in self.branches]
        if self.merge == "concat":
            y = F.concat(outs, axis=1)
        else:
            fn = F.add if self.merge == "add" else F.mul
            y = outs[0]
            for o in outs[1:]:
                y = fn(y, o)
        return y if self.act is None else self.act(y)

    def extra_repr(self) -> str:
        return f"merge={self.merge!r}"


@trace.register_module(Block)
def _trace_block(b: trace.Builder, m: Block, prefix: str, x: str) -> str:
    def at(name: str) -> str:
        return f"{prefix}.{name}" if prefix else name

    outs = [trace.trace_module(b, br, at(f"branch{i}"), x) for i, br in enumerate(m.branches)]
    if m.merge == "concat":
        y = b.node(at("concat"), "concat", outs, axis=1)
    else:
        y = outs[0]
        for o in outs[1:]:
            y = b.node(at(m.merge), m.merge, [y, o])
    return y if m.act is None else trace.trace_module(b, m.act, at("act"), y)
