"""The vision ops of MobileNet/ShuffleNet/EfficientNet-class models that are not activations:
`mul` (squeeze-and-excitation's channel gate), `channel_shuffle` and `slice` (ShuffleNetV2's
shuffle and channel split). clip (relu6) and silu are activations and live in ops.py's list.

Written against `opschema` alone; ops.py adds ENTRIES to the registry.
"""

from __future__ import annotations

from pocket.formats.opschema import (
    INT8_PASS,
    Attr,
    Onnx,
    Op,
    Out,
    broadcast,
    need,
    norm_axis,
)


def _infer_mul(node, ins, where: str) -> Out:
    a, b = ins
    need(a.dtype == b.dtype == "f32", where, f"mul runs on f32, got {a.dtype} and {b.dtype}")
    return [("f32", broadcast(a.shape, b.shape, where))]


def _infer_channel_shuffle(node, ins, where: str) -> Out:
    x = ins[0]
    g = node.attrs["groups"]
    need(x.dtype in ("f32", "i8"), where, f"channel_shuffle runs on f32 or i8, got {x.dtype}")
    need(len(x.shape) == 4, where, f"input must be 4-D (N, C, H, W), got {list(x.shape)}")
    c = x.shape[1]
    need(g >= 1, where, f"groups must be >= 1, got {g}")
    need(isinstance(c, int) and c % g == 0, where,
         f"channels ({c}) must be divisible by groups ({g})")
    return [(x.dtype, x.shape)]


def _infer_slice(node, ins, where: str) -> Out:
    x = ins[0]
    a = node.attrs
    need(x.dtype in ("f32", "i8"), where, f"slice runs on f32 or i8, got {x.dtype}")
    ax = norm_axis(a["axis"], len(x.shape), where)
    need(ax != 0, where, "slice along the batch axis is not supported")
    size = x.shape[ax]
    need(isinstance(size, int), where, "the sliced axis must be a fixed size")
    need(0 <= a["start"] < a["end"] <= size, where,
         f"need 0 <= start < end <= {size} (the size of axis {ax}), got start {a['start']}, "
         f"end {a['end']}")
    shape = list(x.shape)
    shape[ax] = a["end"] - a["start"]
    return [(x.dtype, tuple(shape))]


ENTRIES = [
    # like add, mul comes out of a container's tracer (a squeeze-and-excitation gate)
    Op("mul", 2, 2, {}, _infer_mul, "elementwise with NumPy broadcasting, e.g. (N, C, H, W) * "
       "(N, C, 1, 1)", onnx=Onnx("Mul"), traceable=False),
    Op("channel_shuffle", 1, 1, {"groups": Attr("int")}, _infer_channel_shuffle,
       "(N, C, H, W) -> reshape (N, g, C/g, H, W) -> swap axes 1, 2 -> (N, C, H, W) "
       "(Zhang et al., 2018, ShuffleNet)", int8=INT8_PASS),
    Op("slice", 1, 1, {"axis": Attr("int", 1), "start": Attr("int"), "end": Attr("int")},
       _infer_slice, "x[..., start:end, ...] along axis, step 1; 0 <= start < end <= size",
       int8=INT8_PASS),
]
