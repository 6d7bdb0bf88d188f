"""The sequence-convolution ops as ONNX (opset 17): 1-D Conv (fp32 or QDQ int8, as conv2d),
1-D MaxPool / AveragePool, and GlobalAveragePool / GlobalMaxPool then Squeeze of the time axis."""

from __future__ import annotations

import numpy as np

from pocket.export import onnx_export as ox
from pocket.formats import ops
from pocket.formats.ir import Node


def _conv1d_attrs(b, n: Node) -> dict:
    a = n.attrs
    # ONNX 1-D pads are [begin, end]: the IR's [left, right] as they are
    return {"kernel_shape": [int(b.params[n.inputs[1]].shape[2])], "strides": [a["stride"]],
            "pads": list(a["padding"]), "dilations": [a["dilation"]], "group": a["groups"]}


def _pool1d(onnx_op: str):
    def emit(b, n: Node) -> None:
        a = n.attrs
        attrs = {"kernel_shape": [a["kernel"]], "strides": [a.get("stride") or a["kernel"]],
                 "pads": [a["padding"], a["padding"]]}
        if n.op == "avgpool1d":
            attrs["count_include_pad"] = int(a["count_include_pad"])
        b.node(onnx_op, [n.inputs[0]], n.outputs[0], n.name, **attrs)
    return emit


def _global1d(onnx_op: str):
    def emit(b, n: Node) -> None:
        pooled = b.node(onnx_op, [n.inputs[0]], f"{n.name}/pooled", n.name)  # (N, C, 1)
        axes = b.const(f"{n.name}.axes", np.asarray([2], np.int64))
        b.node("Squeeze", [pooled, axes], n.outputs[0], f"{n.name}/squeeze")
    return emit


ops.register_table("onnx_export", {
    "conv1d": ox._layer("Conv", _conv1d_attrs),
    "maxpool1d": _pool1d("MaxPool"),
    "avgpool1d": _pool1d("AveragePool"),
    "global_avgpool1d": _global1d("GlobalAveragePool"),
    "global_maxpool1d": _global1d("GlobalMaxPool"),
})
