"""The sequence-convolution ops: conv1d, maxpool1d / avgpool1d, global pooling over time.

Layout (N, C, L): channels (features) by time; conv1d weights (O, C/groups, K). conv1d pads
asymmetrically ([left, right]) so a causal conv is one node ([(K-1)*dilation, 0]); it is an int8
layer like conv2d and fuses the same activations, and maxpool1d passes int8 through as
maxpool2d does (ops.py gives it conv2d's `activation`,
`alpha` and int8 attrs: the names in FUSES). The pools take single ints (kernel, stride,
padding) and pad symmetrically, as ONNX's 1-D MaxPool / AveragePool and torch's pool1d do.
"""

from __future__ import annotations

from pocket.formats.opschema import (
    INT8_LAYER,
    INT8_PASS,
    Attr,
    Op,
    Out,
    check_groups,
    check_weights,
    check_x_dtype,
    need,
    out_dtype,
)

# The ops that take conv2d/linear's fused-activation and int8 attrs (added by ops.py, which
# owns the list of activations).
FUSES = ("conv1d",)


def _out_len(size, k: int, s: int, left: int, right: int, d: int, where: str) -> int:
    need(isinstance(size, int), where, "the time axis must be a fixed integer")
    out = (size + left + right - d * (k - 1) - 1) // s + 1
    need(out >= 1, where, f"output length would be {out} (input {size}, kernel {k}, stride {s}, "
         f"padding [{left}, {right}], dilation {d}); make the input longer or the kernel smaller")
    return out


def _x3(node, x, where: str) -> None:
    need(len(x.shape) == 3, where, f"input must be 3-D (N, C, L), got {list(x.shape)}")


def _infer_conv1d(node, ins, where: str) -> Out:
    x, w = ins[0], ins[1]
    a = node.attrs
    check_x_dtype(node, x, where)
    _x3(node, x, where)
    need(len(w.shape) == 3, where, f"weight must be 3-D [O, C/groups, K], got {list(w.shape)}")
    o = check_groups(node, x, w, where)
    check_weights(node, ins, where, o)
    p = a["padding"]
    need(len(p) == 2, where, f"padding must be [left, right], got {p}")
    need(a["stride"] >= 1 and a["dilation"] >= 1 and min(p) >= 0, where,
         "stride and dilation must be >= 1, padding >= 0")
    lo = _out_len(x.shape[2], w.shape[2], a["stride"], p[0], p[1], a["dilation"], where)
    return [(out_dtype(node), (x.shape[0], o, lo))]


def _infer_pool1d(node, ins, where: str) -> Out:
    x = ins[0]
    a = node.attrs
    ok = ("f32", "i8") if node.op == "maxpool1d" else ("f32",)
    need(x.dtype in ok, where, f"{node.op} runs on {' or '.join(ok)}, got {x.dtype}")
    _x3(node, x, where)
    k, p = a["kernel"], a["padding"]
    s = a.get("stride") or k
    need(k >= 1 and s >= 1 and p >= 0, where, "kernel and stride must be >= 1, padding >= 0")
    need(p * 2 <= k, where, "padding must be at most half the kernel")
    return [(x.dtype, (x.shape[0], x.shape[1], _out_len(x.shape[2], k, s, p, p, 1, where)))]


def _infer_global1d(node, ins, where: str) -> Out:
    x = ins[0]
    need(x.dtype == "f32", where, f"{node.op} runs on f32, got {x.dtype}")
    _x3(node, x, where)
    need(isinstance(x.shape[2], int) and x.shape[2] >= 1, where,
         "the time axis must be a fixed length >= 1")
    return [("f32", (x.shape[0], x.shape[1]))]


_POOL1D = {"kernel": Attr("int"), "stride": Attr("int", None), "padding": Attr("int", 0)}

ENTRIES = [
    Op("conv1d", 2, 3, {"stride": Attr("int", 1), "padding": Attr("ints", [0, 0]),
                        "dilation": Attr("int", 1), "groups": Attr("int", 1)}, _infer_conv1d,
       "grouped 1-D cross-correlation, zero padding [left, right] (causal: [(K-1)*dilation, 0]), "
       "then the fused activation", int8=INT8_LAYER),
    Op("maxpool1d", 1, 1, dict(_POOL1D), _infer_pool1d,
       "padding counts as -inf; stride defaults to the kernel", int8=INT8_PASS),
    Op("avgpool1d", 1, 1, {**_POOL1D, "count_include_pad": Attr("bool", True)}, _infer_pool1d),
    Op("global_avgpool1d", 1, 1, {}, _infer_global1d, "(N, C, L) -> (N, C): the mean over time"),
    Op("global_maxpool1d", 1, 1, {}, _infer_global1d,
       "(N, C, L) -> (N, C): the max over time; NaN wins"),
]
# ONNX: Conv / MaxPool / AveragePool (1-D), GlobalAveragePool / GlobalMaxPool then Squeeze, in
# export/onnx_export_seqconv.py (so no entry names a single `onnx` op).
