"""ONNX mapping of the embedding ops (pocket/formats/ops_embed.py).

`l2norm` is ReduceL2 (keepdims), Max with eps, Div: LpNormalization has no eps and gives NaN
for an all-zero row, where the IR gives zeros.
"""

from __future__ import annotations

import numpy as np

from pocket.formats import ops


@ops.register("onnx_export", "l2norm")
def _l2norm(b, n) -> None:
    name, x = n.name, n.inputs[0]
    norm = b.node("ReduceL2", [x], f"{name}/norm", f"{name}/norm", axes=[int(n.attrs["axis"])],
                  keepdims=1)
    d = b.node("Max", [norm, b.const(f"{name}.eps", np.float32(n.attrs["eps"]))], f"{name}/d",
               f"{name}/max")
    b.node("Div", [x, d], n.outputs[0], name)
