"""ONNX (opset 17) forms of the vision ops; `mul` is one ONNX Mul through its registry entry.

    clip             -> Clip(x, min, max), the bounds as float32 scalar inputs (as opset 11+ wants);
                        a clip fused into a conv2d/linear has min 0 (ops.py)
    silu             -> Sigmoid, Mul (opset 17 has no SiLU/Swish)
    channel_shuffle  -> Reshape (N, g, C/g, H*W), Transpose (0, 2, 1, 3), Reshape (N, C, H, W)
    slice            -> Slice(x, [start], [end], [axis])

Int8 graphs need nothing here: onnx_export.py wraps the int8 pass-through ops (shuffle, slice)
in DequantizeLinear / QuantizeLinear with the input's qparams, and a fused clip sits between
the Conv/Gemm and the QuantizeLinear of its layer, which then equals the engine's clamp.
"""

from __future__ import annotations

import numpy as np

from pocket.export.onnx_export import _Builder
from pocket.formats import ops
from pocket.formats.ir import Node


def _clip(b: _Builder, n: Node) -> None:
    a = n.attrs
    lo = b.const(f"{n.name}.min", np.float32(a.get("min", 0.0)))
    hi = b.const(f"{n.name}.max", np.float32(a.get("max", 6.0)))
    b.node("Clip", [n.inputs[0], lo, hi], n.outputs[0], n.name)


def _silu(b: _Builder, n: Node) -> None:
    x = n.inputs[0]
    s = b.node("Sigmoid", [x], f"{n.name}/sigmoid", f"{n.name}/sigmoid")
    b.node("Mul", [x, s], n.outputs[0], n.name)


def _input_shape(b: _Builder, n: Node) -> tuple:
    # by the node's name: an int8 pass-through node arrives renamed onto "<node>/x" (to_onnx)
    src = next(m for m in b.graph.nodes if m.name == n.name)
    return b.graph.validate()[src.inputs[0]].shape


def _channel_shuffle(b: _Builder, n: Node) -> None:
    _, c, h, w = _input_shape(b, n)
    g = n.attrs["groups"]
    # 0 copies the batch dim, so the model keeps its dynamic batch.
    split = b.const(f"{n.name}.split", np.asarray([0, g, c // g, h * w], np.int64))
    back = b.const(f"{n.name}.shape", np.asarray([0, c, h, w], np.int64))
    y = b.node("Reshape", [n.inputs[0], split], f"{n.name}/split", f"{n.name}/split")
    y = b.node("Transpose", [y], f"{n.name}/swap", f"{n.name}/swap", perm=[0, 2, 1, 3])
    b.node("Reshape", [y, back], n.outputs[0], n.name)


def _slice(b: _Builder, n: Node) -> None:
    a = n.attrs
    args = [b.const(f"{n.name}.{k}", np.asarray([a[k]], np.int64))
            for k in ("start", "end", "axis")]
    b.node("Slice", [n.inputs[0], *args], n.outputs[0], n.name)


ops.register_table("onnx_export", {"clip": _clip, "silu": _silu,
                                   "channel_shuffle": _channel_shuffle, "slice": _slice})
