"""The vocabulary op entries are written in: attribute specs, shape-inference helpers, and the
`Op` record with its `Fusion` and `Onnx` parts.

`pocket.formats.ops` holds the core entries and the registry. An op family in a module of its
own (`ops_<family>.py`) builds its entries from this module alone and lists them in `ENTRIES`;
ops.py imports the family and adds them, so there is no import cycle.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pocket.formats.errors import FormatError
from pocket.formats.quant import SCALE_RULE, is_scale

SLOTS = ("reference", "train", "trace", "onnx_export", "onnx_import", "engine")

# int8 policies: what an op does in an int8 graph (DESIGN §6, export/quantize.py).
INT8_LAYER = "layer"  # reads int8 activations with int8 weights (conv2d, linear)
INT8_PASS = "pass"  # passes int8 through unchanged (max commutes with a monotone quantizer)
INT8_FUSE = "fuse"  # fuses into an int8 layer's requantization (relu: a clamp at y_zero_point)
INT8_F32 = "f32"  # stays f32 between dequantize and quantize; a layer fusing it stays fp32
INT8_QDQ = "qdq"  # quantize / dequantize: the edges of int8 regions

Dim = int | str
Shape = tuple[Dim, ...]
Out = list[tuple[str, Shape]]

# --------------------------------------------------------------------------- attribute schema

_MISSING = object()


@dataclass(frozen=True)
class Attr:
    # "int", "float", "bool", "str", "ints2" (pair of ints), "ints" (list of ints), "scale" (a
    # quantization scale: quant.is_scale, a positive finite normal float32)
    kind: str
    default: Any = _MISSING
    choices: tuple = ()

    @property
    def required(self) -> bool:
        return self.default is _MISSING


def check_attr(where: str, name: str, spec: Attr, value: Any) -> Any:
    """value, checked against spec (and normalized: an int for ints2 becomes a pair)."""

    def bad(what: str) -> FormatError:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return FormatError(f"{where}: attribute '{name}' {what}, got {shown}")

    if spec.kind in ("float", "scale"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad("must be a number")
        try:
            value = float(value)
        except OverflowError:
            raise bad("must be finite") from None
        if not math.isfinite(value):
            raise bad("must be finite")
        if spec.kind == "scale" and not is_scale(value):
            raise bad(f"must be {SCALE_RULE}")
    elif spec.kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("must be an integer")
    elif spec.kind == "bool":
        if not isinstance(value, bool):
            raise bad("must be true or false")
    elif spec.kind == "str":
        if not isinstance(value, str):
            raise bad("must be a string")
    elif spec.kind in ("ints2", "ints"):
        if isinstance(value, int) and not isinstance(value, bool) and spec.kind == "ints2":
            value = [value, value]
        if not isinstance(value, list | tuple) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise bad("must be a list of integers")
        if spec.kind == "ints2" and len(value) != 2:
            raise bad("must be two integers [height, width]")
        value = [int(v) for v in value]
    if spec.choices and value not in spec.choices:
        raise bad(f"must be one of {', '.join(map(str, spec.choices))}")
    return value


# --------------------------------------------------------------------------- shape inference


def is_int8_node(node) -> bool:
    return "x_scale" in node.attrs


def need(cond: bool, where: str, what: str) -> None:
    if not cond:
        raise FormatError(f"{where}: {what}")


def out_dtype(node) -> str:
    if is_int8_node(node):
        return "i8" if "y_scale" in node.attrs else "f32"
    return "f32"


def check_x_dtype(node, x, where: str) -> None:
    want = "i8" if is_int8_node(node) else "f32"
    need(x.dtype == want, where, f"input '{node.inputs[0]}' must be {want}, got {x.dtype}")


def check_weights(node, ins, where: str, out_features: int) -> None:
    w = ins[1]
    int8 = is_int8_node(node)
    need(w.dtype == ("i8" if int8 else "f32"), where,
         f"weight '{node.inputs[1]}' must be {'i8' if int8 else 'f32'}, got {w.dtype}")
    if len(ins) > 2:
        b = ins[2]
        need(b.dtype == ("i32" if int8 else "f32"), where,
             f"bias '{node.inputs[2]}' must be {'i32' if int8 else 'f32'}, got {b.dtype}")
        need(tuple(b.shape) == (out_features,), where,
             f"bias '{node.inputs[2]}' must have shape [{out_features}], got {list(b.shape)}")


def check_groups(node, x, w, where: str) -> int:
    """A grouped conv's channel rules (conv2d, conv1d); returns the output channels."""
    g = node.attrs["groups"]
    need(g >= 1, where, "groups must be >= 1")
    c, o = x.shape[1], w.shape[0]
    need(isinstance(c, int) and c % g == 0 and o % g == 0, where,
         f"channels in ({c}) and out ({o}) must both be divisible by groups ({g})")
    need(w.shape[1] * g == c, where,
         f"weight expects {w.shape[1] * g} input channels but the input has {c}")
    return o


def conv_out(size: Dim, k: int, s: int, p: int, d: int, where: str, axis: str) -> int:
    need(isinstance(size, int), where, f"spatial {axis} must be a fixed integer")
    out = (size + 2 * p - d * (k - 1) - 1) // s + 1
    need(out >= 1, where, f"output {axis} would be {out} (input {size}, kernel {k}, "
         f"stride {s}, padding {p}, dilation {d}); make the input larger or the kernel smaller")
    return out


def infer_unary_f32(node, ins, where: str) -> Out:
    """An elementwise f32 op: the output is the input's shape."""
    need(ins[0].dtype == "f32", where, f"{node.op} runs on f32, got {ins[0].dtype}")
    return [("f32", ins[0].shape)]


def infer_passthrough(node, ins, where: str) -> Out:
    return [(ins[0].dtype, ins[0].shape)]



def prod_dims(dims) -> Dim:
    out = 1
    for d in dims:
        if not isinstance(d, int):
            return "?"
        out *= d
    return out


def broadcast(a: Shape, b: Shape, where: str) -> Shape:
    out = []
    for i in range(max(len(a), len(b))):
        da = a[len(a) - 1 - i] if i < len(a) else 1
        db = b[len(b) - 1 - i] if i < len(b) else 1
        if da == db or db == 1:
            out.append(da)
        elif da == 1:
            out.append(db)
        else:
            raise FormatError(f"{where}: shapes {list(a)} and {list(b)} do not broadcast")
    return tuple(reversed(out))


def norm_axis(axis: int, ndim: int, where: str) -> int:
    need(-ndim <= axis < ndim, where, f"axis {axis} is out of range for {ndim} dims")
    return axis % ndim


def check_qparams(attrs: Mapping[str, Any], prefix: str, where: str) -> None:
    scale = attrs.get(prefix + "scale")
    zp = attrs.get(prefix + "zero_point")
    need(scale is not None and scale > 0, where, f"'{prefix}scale' must be a positive number")
    need(zp is not None and -128 <= zp <= 127, where, f"'{prefix}zero_point' must be in [-128, 127]")


# --------------------------------------------------------------------------- the entry record


@dataclass(frozen=True)
class Fusion:
    """How an elementwise op moves into conv2d/linear's `activation` attr (export fuses it).

    The attrs named in `attrs` travel onto the layer under the same names; any other attr of
    the op must be at its default for the op to fuse (the layer has nowhere to keep it).
    """

    code: int  # its code in infer/kernels_fp32.activate, fused or standalone
    monotone: bool  # non-decreasing, so a maxpool after it commutes (leaky_relu: alpha >= 0)
    attrs: tuple[str, ...] = ()
    variant_codes: Mapping[str, int] = field(default_factory=dict)  # kernel codes of variants
    # that do not fuse (gelu's tanh approximation), by their name in kernels_fp32.ACT


@dataclass(frozen=True)
class Onnx:
    """An op that exports as exactly one ONNX node (opset 17): its type and attributes.

    attrs: constant ONNX attributes; from_attrs: ONNX attribute -> the IR attr it copies.
    """

    op_type: str
    attrs: Mapping[str, Any] = field(default_factory=dict)
    from_attrs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Op:
    name: str
    min_inputs: int
    max_inputs: int
    attrs: dict[str, Attr]
    infer: Callable[[Any, list, str], Out]
    doc: str = ""
    fusion: Fusion | None = None
    int8: str = INT8_F32
    onnx: Onnx | None = None  # None: export/onnx_export.py writes its own expansion
    trainable: bool = True  # train has a forward/backward for it
    traceable: bool = True  # a train layer traces to it on its own
    impls: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


INT8_ATTRS = {
    "x_scale": Attr("scale", None),
    "x_zero_point": Attr("int", None),
    "y_scale": Attr("scale", None),
    "y_zero_point": Attr("int", None),
}
POOL_ATTRS = {"kernel": Attr("ints2"), "stride": Attr("ints2", None), "padding": Attr("ints2", [0, 0])}
QDQ_ATTRS = {"scale": Attr("scale"), "zero_point": Attr("int")}
