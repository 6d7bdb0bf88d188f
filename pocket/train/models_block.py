"""The layer-list kind `block`: a user's own block in a config's [model] layers.

    {type = "block", merge = "add", activation = "relu6", branches = [
        [{type = "conv2d", out = 96, kernel = 1}, {type = "batchnorm"}, {type = "relu6"},
         {type = "conv2d", out = 96, kernel = 3, padding = 1, groups = 96}, ...],
        [],
    ]}

Each branch is a layer list of its own (nested blocks included), built from the block's input
shape; `[]` is the identity. The branches' output shapes must merge: equal for `add`/`mul`
(or NumPy-broadcastable, e.g. (C, H, W) * (C, 1, 1)), equal but for the channel count for
`concat`. `activation` names a one-input op (relu, relu6, hardswish, silu, ...).
"""

from __future__ import annotations

import numpy as np

from pocket.train import models, nn
from pocket.train.nn_block import MERGES, Block


def _activation(name) -> nn.Module | None:
    if name is None or name == "none":
        return None
    if name == "relu6" and "clip" in nn.ELEMENTWISE:
        return nn.ELEMENTWISE["clip"].from_ir(min=0.0, max=6.0)
    cls = nn.ELEMENTWISE.get(name) if isinstance(name, str) else None
    if cls is None or name in ("softmax", "global_avgpool"):
        known = sorted({*nn.ELEMENTWISE, *(("relu6",) if "clip" in nn.ELEMENTWISE else ())}
                       - {"softmax", "global_avgpool"})
        raise ValueError(f"activation {name!r} is not one; choose one of {', '.join(known)}")
    return cls.from_ir()


def merged_shape(merge: str, shapes: list[tuple]) -> tuple:
    """The shape (without the batch) that `merge` makes of the branches' shapes; a ValueError
    naming the branches whose shapes do not merge."""
    first = shapes[0]
    for j, s in enumerate(shapes[1:], 1):
        if len(s) != len(first):
            raise ValueError(f"branches[0] gives {list(first)} but branches[{j}] gives "
                             f"{list(s)}: different ranks cannot be merged by {merge}")
        if merge == "concat" and s[1:] != first[1:]:
            raise ValueError(f"branches[0] gives {list(first)} but branches[{j}] gives "
                             f"{list(s)}: concat (on channels) needs every other dim equal")
    if merge == "concat":
        return (sum(s[0] for s in shapes), *first[1:])
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        shown = ", ".join(f"branches[{j}] gives {list(s)}" for j, s in enumerate(shapes))
        raise ValueError(f"{shown}: these shapes cannot be merged by {merge} (they must be "
                         "equal or broadcast)") from None


@models.register_layer("block", {"merge", "branches", "activation"})
def _block(spec, shape, num_outputs, last, rng, *, where="[model] layers"):
    merge = spec.get("merge", "add")
    if merge not in MERGES:
        raise ValueError(f"merge must be one of {', '.join(MERGES)}, got {merge!r}")
    branches = spec.get("branches")
    if not isinstance(branches, list | tuple) or len(branches) < 2:
        raise ValueError("give branches = [[...layers...], [...]]: at least two layer lists "
                         "([] is the identity)")
    mods, shapes = [], []
    for j, layers in enumerate(branches):
        seq, out = models.build_layers(shape, num_outputs, layers, rng,
                                       where=f"{where} (block) branches[{j}]", head=False)
        mods.append(seq)
        shapes.append(out)
    out = merged_shape(merge, shapes)
    return Block(mods, merge, _activation(spec.get("activation"))), out
