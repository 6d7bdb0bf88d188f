"""The graph IR shared by the checkpoint, the exporter, the engine and the ONNX mapping.

A graph is plain JSON:

    {"inputs":  [{"name": "x", "dtype": "f32", "shape": ["N", 1, 8, 8]}],
     "outputs": ["logits"],
     "params":  {"conv1.weight": {"dtype": "f32", "shape": [8, 1, 3, 3]}, ...},
     "nodes":   [{"name": "conv1", "op": "conv2d", "inputs": ["x", "conv1.weight", "conv1.bias"],
                  "outputs": ["conv1:0"], "attrs": {"stride": [1, 1], ...}}, ...],
     "metadata": {...}}

Layout is NCHW, conv weights OIHW, linear weights [out, in]. A dimension is an int or a symbol
(a string such as "N", the batch). `params` lists the constant tensors (weights, buffers) the
nodes read; their bytes live in the container's data section. Nodes are in topological order.

int8 graphs (DESIGN §6) use the same ops: `quantize`/`dequantize` mark the edges of int8
regions; a `conv2d` or `linear` node whose attrs carry `x_scale` reads an int8 activation, holds
int8 weights (per output channel, symmetric) and an int32 bias, and writes int8 when it also
carries `y_scale`, else f32. `maxpool2d`, `flatten`, `reshape` and `dropout` pass int8 through.
The exact arithmetic is in `pocket.formats.quant` and `pocket.formats.reference`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pocket.formats.errors import FormatError

DTYPES = ("f32", "f16", "i8", "u8", "i32", "i64")
ACTIVATIONS = ("none", "relu", "leaky_relu", "sigmoid", "tanh", "gelu")
TASKS = ("classification", "regression")
Dim = int | str
Shape = tuple[Dim, ...]

# --------------------------------------------------------------------------- attribute schema

_MISSING = object()


@dataclass(frozen=True)
class Attr:
    kind: str  # "int", "float", "bool", "str", "ints2" (pair of ints), "ints" (list of ints)
    default: Any = _MISSING
    choices: tuple = ()

    @property
    def required(self) -> bool:
        return self.default is _MISSING


def _check_attr(where: str, name: str, spec: Attr, value: Any) -> Any:
    def bad(what: str) -> FormatError:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return FormatError(f"{where}: attribute '{name}' {what}, got {shown}")

    if spec.kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("must be an integer")
    elif spec.kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad("must be a number")
        try:
            value = float(value)
        except OverflowError:
            raise bad("must be finite") from None
        if not math.isfinite(value):
            raise bad("must be finite")
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


# --------------------------------------------------------------------------- values and nodes


@dataclass
class ValueInfo:
    """The dtype and shape of one named value (graph input, param, or node output)."""

    dtype: str
    shape: Shape

    def to_dict(self) -> dict:
        return {"dtype": self.dtype, "shape": list(self.shape)}


@dataclass
class Node:
    name: str
    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "op": self.op,
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "attrs": dict(self.attrs),
        }


# --------------------------------------------------------------------------- shape inference
# Each rule takes (node, input infos, where) and returns the output infos. Dims may be symbols;
# arithmetic on a symbol yields the symbol only where the dim passes through unchanged.


def _is_int8_node(node: Node) -> bool:
    return "x_scale" in node.attrs


def _need(cond: bool, where: str, what: str) -> None:
    if not cond:
        raise FormatError(f"{where}: {what}")


def _out_dtype(node: Node) -> str:
    if _is_int8_node(node):
        return "i8" if "y_scale" in node.attrs else "f32"
    return "f32"


def _check_x_dtype(node: Node, x: ValueInfo, where: str) -> None:
    want = "i8" if _is_int8_node(node) else "f32"
    _need(x.dtype == want, where, f"input '{node.inputs[0]}' must be {want}, got {x.dtype}")


def _check_weights(node: Node, ins: list[ValueInfo], where: str, out_features: int) -> None:
    w = ins[1]
    int8 = _is_int8_node(node)
    _need(w.dtype == ("i8" if int8 else "f32"), where,
          f"weight '{node.inputs[1]}' must be {'i8' if int8 else 'f32'}, got {w.dtype}")
    if len(ins) > 2:
        b = ins[2]
        _need(b.dtype == ("i32" if int8 else "f32"), where,
              f"bias '{node.inputs[2]}' must be {'i32' if int8 else 'f32'}, got {b.dtype}")
        _need(tuple(b.shape) == (out_features,), where,
              f"bias '{node.inputs[2]}' must have shape [{out_features}], got {list(b.shape)}")


def _conv_out(size: Dim, k: int, s: int, p: int, d: int, where: str, axis: str) -> int:
    _need(isinstance(size, int), where, f"spatial {axis} must be a fixed integer")
    out = (size + 2 * p - d * (k - 1) - 1) // s + 1
    _need(out >= 1, where, f"output {axis} would be {out} (input {size}, kernel {k}, "
          f"stride {s}, padding {p}, dilation {d}); make the input larger or the kernel smaller")
    return out


def _infer_linear(node: Node, ins: list[ValueInfo], where: str) -> list[ValueInfo]:
    x, w = ins[0], ins[1]
    _check_x_dtype(node, x, where)
    _need(len(x.shape) == 2, where, f"input must be 2-D (N, features), got {list(x.shape)}")
    _need(len(w.shape) == 2, where, f"weight must be 2-D [out, in], got {list(w.shape)}")
    _need(x.shape[1] == w.shape[1], where,
          f"input has {x.shape[1]} features but weight expects {w.shape[1]}")
    _check_weights(node, ins, where, w.shape[0])
    return [ValueInfo(_out_dtype(node), (x.shape[0], w.shape[0]))]


def _infer_conv2d(node: Node, ins: list[ValueInfo], where: str) -> list[ValueInfo]:
    x, w = ins[0], ins[1]
    a = node.attrs
    _check_x_dtype(node, x, where)
    _need(len(x.shape) == 4, where, f"input must be 4-D (N, C, H, W), got {list(x.shape)}")
    _need(len(w.shape) == 4, where, f"weight must be 4-D [O, C/groups, kh, kw], got {list(w.shape)}")
    g = a["groups"]
    _need(g >= 1, where, "groups must be >= 1")
    c, o = x.shape[1], w.shape[0]
    _need(isinstance(c, int) and c % g == 0 and o % g == 0, where,
          f"channels in ({c}) and out ({o}) must both be divisible by groups ({g})")
    _need(w.shape[1] * g == c, where,
          f"weight expects {w.shape[1] * g} input channels but the input has {c}")
    _check_weights(node, ins, where, o)
    s, p, d = a["stride"], a["padding"], a["dilation"]
    _need(min(s) >= 1 and min(d) >= 1 and min(p) >= 0, where,
          "stride and dilation must be >= 1, padding >= 0")
    ho = _conv_out(x.shape[2], w.shape[2], s[0], p[0], d[0], where, "height")
    wo = _conv_out(x.shape[3], w.shape[3], s[1], p[1], d[1], where, "width")
    return [ValueInfo(_out_dtype(node), (x.shape[0], o, ho, wo))]


def _infer_batchnorm(node: Node, ins: list[ValueInfo], where: str) -> list[ValueInfo]:
    x = ins[0]
    _need(x.dtype == "f32", where, "batchnorm runs on f32")
    _need(len(x.shape) in (2, 4), where, f"input must be (N, C) or (N, C, H, W), got {list(x.shape)}")
    for name, p in zip(node.inputs[1:], ins[1:]):
        _need(tuple(p.shape) == (x.shape[1],), where,
              f"'{name}' must have shape [{x.shape[1]}], got {list(p.shape)}")
    return [ValueInfo("f32", x.shape)]


def _infer_unary_f32(node: Node, ins: list[ValueInfo], where: str) -> list[ValueInfo]:
    _need(ins[0].dtype == "f32", where, f"{node.op} runs on f32, got {ins[0].dtype}")
    return [ValueInfo("f32", ins[0].shape)]


def _infer_passthrough(node: Node, ins: list[ValueInfo], where: str) -> list[ValueInfo]:
    return [ValueInfo(ins[0].dtype, ins[0].shape)]


def _infer_pool(node: Node, ins: list[ValueInfo], where: str) -> list[ValueInfo]:
    x = ins[0]
    a = node.attrs
    ok = ("f32", "i8") if node.op == "maxpool2d" else ("f32",)
    _need(x.dtype in ok, where, f"{node.op} runs on {' or '.join(ok)}, got {x.dtype}")
    _need(len(x.shape) == 4, where, f"input must be 4-D (N, C, H, W), got {list(x.shape)}")
    k = a["kernel"]
    s = a.get("stride") or k
    p = a["padding"]
    _need(min(k) >= 1 and min(s) >= 1 and min(p) >= 0, where,
          "kernel and stride must be >= 1, padding >= 0")
    _need(p[0] * 2 <= k[0] and p[1] * 2 <= k[1], where, "padding must be at most half the kernel")
    ho = _conv_out(x.shape[2], k[0], s[0], p[0], 1, where, "height")
    wo = _conv_out(x.shape[3], k[1], s[1], p[1], 1, where, "width")
    return [ValueInfo(x.dtype, (x.shape[0], x.shape[1], ho, wo))]


def _infer_global_avgpool(node: Node, ins: list[ValueInfo], where: str) -> list[ValueInfo]:
    x = ins[0]
    _need(x.dtype == "f32", where, f"global_avgpool runs on f32, got {x.dtype}")
    _need(len(x.shape) == 4, where, f"input must be 4-D (N, C, H, W), got {list(x.shape)}")
    return [ValueInfo("f32", (x.shape[0], x.shape[1], 1, 1))]


def _prod(dims) -> Dim:
    out = 1
    for d in dims:
        if not isinstance(d, int):
            return "?"
        out *= d
    return out


def _infer_flatten(node: Node, ins: list[ValueInfo], where: str) -> list[ValueInfo]:
    x = ins[0]
    _need(len(x.shape) >= 2, where, f"input must have at least 2 dims, got {list(x.shape)}")
    rest = _prod(x.shape[1:])
    _need(isinstance(rest, int), where, "dims after the batch must be fixed integers")
    return [ValueInfo(x.dtype, (x.shape[0], rest))]


def _infer_reshape(node: Node, ins: list[ValueInfo], where: str) -> list[ValueInfo]:
    # `shape` excludes the batch dim, which always passes through; one entry may be -1.
    x = ins[0]
    shape = list(node.attrs["shape"])
    have = _prod(x.shape[1:])
    _need(isinstance(have, int), where, "dims after the batch must be fixed integers")
    _need(shape.count(-1) <= 1 and all(d == -1 or d >= 1 for d in shape), where,
          f"shape {shape} may hold positive sizes and at most one -1")
    known = _prod([d for d in shape if d != -1])
    if -1 in shape:
        _need(known > 0 and have % known == 0, where, f"cannot reshape {have} values to {shape}")
        shape[shape.index(-1)] = have // known
    _need(_prod(shape) == have, where, f"cannot reshape {list(x.shape[1:])} to {shape}")
    return [ValueInfo(x.dtype, (x.shape[0], *shape))]


def _broadcast(a: Shape, b: Shape, where: str) -> Shape:
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


def _infer_add(node: Node, ins: list[ValueInfo], where: str) -> list[ValueInfo]:
    a, b = ins
    _need(a.dtype == b.dtype == "f32", where, f"add runs on f32, got {a.dtype} and {b.dtype}")
    return [ValueInfo("f32", _broadcast(a.shape, b.shape, where))]


def _axis(axis: int, ndim: int, where: str) -> int:
    _need(-ndim <= axis < ndim, where, f"axis {axis} is out of range for {ndim} dims")
    return axis % ndim


def _infer_concat(node: Node, ins: list[ValueInfo], where: str) -> list[ValueInfo]:
    first = ins[0]
    ax = _axis(node.attrs["axis"], len(first.shape), where)
    _need(ax != 0, where, "concat along the batch axis is not supported")
    total = 0
    for name, v in zip(node.inputs, ins):
        _need(v.dtype == first.dtype, where, f"'{name}' has dtype {v.dtype}, expected {first.dtype}")
        _need(len(v.shape) == len(first.shape) and all(
            i == ax or v.shape[i] == first.shape[i] for i in range(len(v.shape))
        ), where, f"'{name}' shape {list(v.shape)} does not match {list(first.shape)} off axis {ax}")
        _need(isinstance(v.shape[ax], int), where, "concat axis must be a fixed size")
        total += v.shape[ax]
    shape = list(first.shape)
    shape[ax] = total
    return [ValueInfo(first.dtype, tuple(shape))]


def _infer_softmax(node: Node, ins: list[ValueInfo], where: str) -> list[ValueInfo]:
    _axis(node.attrs["axis"], len(ins[0].shape), where)
    return _infer_unary_f32(node, ins, where)


def _infer_quantize(node: Node, ins: list[ValueInfo], where: str) -> list[ValueInfo]:
    _need(ins[0].dtype == "f32", where, f"quantize reads f32, got {ins[0].dtype}")
    _check_qparams(node, "", where)
    return [ValueInfo("i8", ins[0].shape)]


def _infer_dequantize(node: Node, ins: list[ValueInfo], where: str) -> list[ValueInfo]:
    _need(ins[0].dtype == "i8", where, f"dequantize reads i8, got {ins[0].dtype}")
    _check_qparams(node, "", where)
    return [ValueInfo("f32", ins[0].shape)]


def _check_qparams(node: Node, prefix: str, where: str) -> None:
    scale = node.attrs.get(prefix + "scale")
    zp = node.attrs.get(prefix + "zero_point")
    _need(scale is not None and scale > 0, where, f"'{prefix}scale' must be a positive number")
    _need(zp is not None and -128 <= zp <= 127, where, f"'{prefix}zero_point' must be in [-128, 127]")


# --------------------------------------------------------------------------- op schemas


@dataclass(frozen=True)
class OpSchema:
    name: str
    min_inputs: int
    max_inputs: int
    attrs: dict[str, Attr]
    infer: Callable[[Node, list[ValueInfo], str], list[ValueInfo]]
    doc: str = ""


_INT8 = {
    "x_scale": Attr("float", None),
    "x_zero_point": Attr("int", None),
    "y_scale": Attr("float", None),
    "y_zero_point": Attr("int", None),
}
_POOL = {"kernel": Attr("ints2"), "stride": Attr("ints2", None), "padding": Attr("ints2", [0, 0])}

OPS: dict[str, OpSchema] = {
    s.name: s
    for s in [
        OpSchema("linear", 2, 3, {"activation": Attr("str", "none", ACTIVATIONS),
                                  "alpha": Attr("float", 0.01), **_INT8}, _infer_linear,
                 "y = x @ weight.T + bias, then the fused activation"),
        OpSchema("conv2d", 2, 3, {"stride": Attr("ints2", [1, 1]), "padding": Attr("ints2", [0, 0]),
                                  "dilation": Attr("ints2", [1, 1]), "groups": Attr("int", 1),
                                  "activation": Attr("str", "none", ACTIVATIONS),
                                  "alpha": Attr("float", 0.01), **_INT8}, _infer_conv2d,
                 "grouped 2-D cross-correlation with zero padding, then the fused activation"),
        OpSchema("batchnorm", 5, 5, {"eps": Attr("float", 1e-5)}, _infer_batchnorm,
                 "inputs x, gamma, beta, running_mean, running_var; normalizes over axis 1"),
        OpSchema("relu", 1, 1, {}, _infer_unary_f32),
        OpSchema("leaky_relu", 1, 1, {"alpha": Attr("float", 0.01)}, _infer_unary_f32),
        OpSchema("sigmoid", 1, 1, {}, _infer_unary_f32),
        OpSchema("tanh", 1, 1, {}, _infer_unary_f32),
        OpSchema("gelu", 1, 1, {"approximate": Attr("str", "none", ("none", "tanh"))},
                 _infer_unary_f32),
        OpSchema("maxpool2d", 1, 1, dict(_POOL), _infer_pool,
                 "padding counts as -inf; stride defaults to the kernel"),
        OpSchema("avgpool2d", 1, 1, {**_POOL, "count_include_pad": Attr("bool", True)},
                 _infer_pool),
        OpSchema("global_avgpool", 1, 1, {}, _infer_global_avgpool, "(N, C, H, W) -> (N, C, 1, 1)"),
        OpSchema("flatten", 1, 1, {}, _infer_flatten, "(N, ...) -> (N, prod(...))"),
        OpSchema("reshape", 1, 1, {"shape": Attr("ints")}, _infer_reshape,
                 "shape excludes the batch dim, which passes through"),
        OpSchema("add", 2, 2, {}, _infer_add, "elementwise with NumPy broadcasting"),
        OpSchema("concat", 1, 64, {"axis": Attr("int", 1)}, _infer_concat),
        OpSchema("dropout", 1, 1, {"p": Attr("float", 0.5)}, _infer_passthrough,
                 "identity at inference"),
        OpSchema("softmax", 1, 1, {"axis": Attr("int", -1)}, _infer_softmax),
        OpSchema("quantize", 1, 1, {"scale": Attr("float"), "zero_point": Attr("int")},
                 _infer_quantize, "q = clip(round_half_even(x / scale) + zero_point, -128, 127)"),
        OpSchema("dequantize", 1, 1, {"scale": Attr("float"), "zero_point": Attr("int")},
                 _infer_dequantize, "x = (q - zero_point) * scale"),
    ]
}


def normalize_attrs(node: Node, where: str) -> dict[str, Any]:
    """Check a node's attrs against its schema and fill in defaults."""
    schema = OPS[node.op]
    unknown = sorted(set(node.attrs) - set(schema.attrs))
    if unknown:
        raise FormatError(f"{where}: unknown attribute(s) {', '.join(unknown)}; "
                          f"{node.op} takes {', '.join(schema.attrs) or 'none'}")
    out = {}
    for name, spec in schema.attrs.items():
        if name in node.attrs and node.attrs[name] is not None:
            out[name] = _check_attr(where, name, spec, node.attrs[name])
        elif spec.required:
            raise FormatError(f"{where}: missing required attribute '{name}'")
        elif spec.default is not None:
            out[name] = list(spec.default) if isinstance(spec.default, list) else spec.default
    if "x_scale" in out:
        _check_qparams(Node(node.name, node.op, [], [], out), "x_", where)
        if "y_scale" in out or "y_zero_point" in out:
            _check_qparams(Node(node.name, node.op, [], [], out), "y_", where)
        if out.get("activation", "none") not in ("none", "relu"):
            raise FormatError(f"{where}: an int8 node can fuse only relu, "
                              f"not {out['activation']}")
    elif any(k in out for k in ("x_zero_point", "y_scale", "y_zero_point")):
        raise FormatError(f"{where}: int8 attributes need 'x_scale' and 'x_zero_point'")
    return out


# --------------------------------------------------------------------------- the graph


def _is_dim(d: Any) -> bool:
    return (isinstance(d, int) and not isinstance(d, bool) and d >= 0) or (
        isinstance(d, str) and d.isidentifier()
    )


def _value_info(where: str, d: Any) -> ValueInfo:
    if not isinstance(d, dict):
        raise FormatError(f"{where}: must be an object with dtype and shape")
    extra = set(d) - {"dtype", "shape", "name"}
    if extra:
        raise FormatError(f"{where}: unknown field(s) {', '.join(sorted(extra))}")
    dtype, shape = d.get("dtype"), d.get("shape")
    if dtype not in DTYPES:
        raise FormatError(f"{where}.dtype: unknown dtype {dtype!r}; expected one of {DTYPES}")
    if not isinstance(shape, list) or not all(_is_dim(x) for x in shape) or len(shape) > 8:
        raise FormatError(f"{where}.shape: must be a list of at most 8 sizes or symbols, got {shape!r}")
    return ValueInfo(dtype, tuple(shape))


def _name(where: str, v: Any) -> str:
    if not isinstance(v, str) or not v or len(v) > 256:
        raise FormatError(f"{where}: must be a non-empty string of at most 256 characters")
    return v


@dataclass
class Graph:
    inputs: dict[str, ValueInfo]
    outputs: list[str]
    nodes: list[Node]
    params: dict[str, ValueInfo] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    # ---- serialization

    def to_dict(self) -> dict:
        return {
            "inputs": [{"name": n, **v.to_dict()} for n, v in self.inputs.items()],
            "outputs": list(self.outputs),
            "params": {n: v.to_dict() for n, v in self.params.items()},
            "nodes": [n.to_dict() for n in self.nodes],
            "metadata": self.metadata,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: Any) -> Graph:
        """Build and validate a graph from its JSON form; any problem is a FormatError."""
        if not isinstance(d, dict):
            raise FormatError("graph: must be a JSON object")
        extra = set(d) - {"inputs", "outputs", "params", "nodes", "metadata"}
        if extra:
            raise FormatError(f"graph: unknown field(s) {', '.join(sorted(extra))}")
        for key, typ in (("inputs", list), ("outputs", list), ("nodes", list)):
            if not isinstance(d.get(key), typ):
                raise FormatError(f"graph.{key}: must be a list")
        params_d = d.get("params", {})
        meta = d.get("metadata", {})
        if not isinstance(params_d, dict):
            raise FormatError("graph.params: must be an object")
        if not isinstance(meta, dict):
            raise FormatError("graph.metadata: must be an object")
        inputs = {}
        for i, v in enumerate(d["inputs"]):
            where = f"graph.inputs[{i}]"
            name = _name(where + ".name", v.get("name") if isinstance(v, dict) else None)
            inputs[name] = _value_info(where, v)
        params = {_name("graph.params", k): _value_info(f"graph.params['{k}']", v)
                  for k, v in params_d.items()}
        nodes = []
        for i, n in enumerate(d["nodes"]):
            where = f"graph.nodes[{i}]"
            if not isinstance(n, dict):
                raise FormatError(f"{where}: must be an object")
            extra = set(n) - {"name", "op", "inputs", "outputs", "attrs"}
            if extra:
                raise FormatError(f"{where}: unknown field(s) {', '.join(sorted(extra))}")
            ins, outs, attrs = n.get("inputs"), n.get("outputs"), n.get("attrs", {})
            if not isinstance(ins, list) or not isinstance(outs, list) or not isinstance(attrs, dict):
                raise FormatError(f"{where}: inputs and outputs must be lists, attrs an object")
            nodes.append(Node(
                _name(where + ".name", n.get("name")), _name(where + ".op", n.get("op")),
                [_name(where + ".inputs", x) for x in ins],
                [_name(where + ".outputs", x) for x in outs], dict(attrs)))
        outputs = [_name("graph.outputs", o) for o in d["outputs"]]
        g = cls(inputs, outputs, nodes, params, meta)
        g.validate()
        return g

    @classmethod
    def from_json(cls, text: str) -> Graph:
        return cls.from_dict(json.loads(text))

    # ---- checks

    def validate(self) -> dict[str, ValueInfo]:
        """Check ops, attrs, names, topological order and shapes; return every value's info.

        Normalizes each node's attrs in place (defaults filled in), so a validated graph
        always carries every attribute explicitly.
        """
        if not self.inputs:
            raise FormatError("graph.inputs: a graph needs at least one input")
        if not self.outputs:
            raise FormatError("graph.outputs: a graph needs at least one output")
        _check_metadata(self.metadata)
        both = sorted(set(self.inputs) & set(self.params))
        if both:
            raise FormatError(f"graph: '{both[0]}' is both an input and a param")
        for name, v in self.params.items():
            if not all(isinstance(d, int) for d in v.shape):
                raise FormatError(f"graph.params['{name}'].shape: params need fixed integer "
                                  f"sizes, got {list(v.shape)}")
        infos: dict[str, ValueInfo] = {**self.inputs, **self.params}
        seen_nodes = set()
        for node in self.nodes:
            where = f"node '{node.name}' ({node.op})"
            if node.name in seen_nodes:
                raise FormatError(f"{where}: duplicate node name")
            seen_nodes.add(node.name)
            schema = OPS.get(node.op)
            if schema is None:
                raise FormatError(f"{where}: unknown op '{node.op}'; known ops: "
                                  f"{', '.join(sorted(OPS))}")
            if not schema.min_inputs <= len(node.inputs) <= schema.max_inputs:
                raise FormatError(f"{where}: takes {schema.min_inputs}..{schema.max_inputs} "
                                  f"inputs, got {len(node.inputs)}")
            if len(node.outputs) != 1:
                raise FormatError(f"{where}: must have exactly one output")
            for x in node.inputs:
                if x not in infos:
                    raise FormatError(f"{where}: input '{x}' is not a graph input, a param, "
                                      "or the output of an earlier node")
            node.attrs = normalize_attrs(node, where)
            outs = schema.infer(node, [infos[x] for x in node.inputs], where)
            for name, info in zip(node.outputs, outs):
                if name in infos:
                    raise FormatError(f"{where}: output '{name}' is already defined")
                infos[name] = info
        for o in self.outputs:
            if o not in infos:
                raise FormatError(f"graph.outputs: '{o}' is not produced by any node or input")
        return infos

    def infer_shapes(self) -> dict[str, ValueInfo]:
        return self.validate()

    def output_infos(self) -> list[ValueInfo]:
        infos = self.validate()
        return [infos[o] for o in self.outputs]


def _check_metadata(meta: dict) -> None:
    """The metadata block is free-form JSON, but the fields the device reads must be sane."""
    labels = meta.get("labels")
    if labels is not None and not (
        isinstance(labels, list) and all(isinstance(x, str) for x in labels)
    ):
        raise FormatError("graph.metadata.labels: must be a list of strings")
    task = meta.get("task")
    if task is not None and task not in TASKS:
        raise FormatError(f"graph.metadata.task: must be one of {TASKS}, got {task!r}")
    pre = meta.get("preprocessing")
    if pre is not None:
        if not isinstance(pre, dict):
            raise FormatError("graph.metadata.preprocessing: must be an object")
        for key in ("mean", "std"):
            v = pre.get(key)
            if v is not None and not (
                isinstance(v, list) and all(isinstance(x, int | float) for x in v)
            ):
                raise FormatError(f"graph.metadata.preprocessing.{key}: must be a list of numbers")
        std = pre.get("std")
        if std is not None and any(x == 0 for x in std):
            raise FormatError("graph.metadata.preprocessing.std: must not contain zero")


def make_metadata(
    *,
    task: str,
    labels: list[str] | None = None,
    preprocessing: dict | None = None,
    dataset: str | None = None,
    metrics: dict | None = None,
    producer: str = "pocket",
    version: str | None = None,
) -> dict:
    """The metadata block that lets a device print '7 (0.98)'.

    preprocessing: {"layout": "NCHW"|"NC", "scale": float (raw pixel multiplier, e.g. 1/16),
    "mean": [...], "std": [...] (per channel, applied after scale), "image_size": [H, W],
    "channels": int, "columns": [...] (CSV feature names, for tabular models)}.
    """
    if version is None:
        from pocket import __version__ as version
    meta = {"task": task, "producer": {"name": producer, "version": version}}
    if labels is not None:
        meta["labels"] = list(labels)
    if preprocessing is not None:
        meta["preprocessing"] = dict(preprocessing)
    if dataset is not None:
        meta["dataset"] = dataset
    if metrics is not None:
        meta["metrics"] = dict(metrics)
    _check_metadata(meta)
    return meta
