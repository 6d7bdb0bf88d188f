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

Each op's schema (attrs, shape inference) lives in its entry in `pocket.formats.ops`; this
module holds the values, nodes and graphs and the validation walk over them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pocket.formats.errors import FormatError
from pocket.formats.ops import OPS, Dim, Shape, normalize_attrs

__all__ = ["DTYPES", "OPS", "TASKS", "Dim", "Graph", "Node", "Shape", "ValueInfo",
           "make_metadata", "normalize_attrs"]

DTYPES = ("f32", "f16", "i8", "u8", "i32", "i64")
TASKS = ("classification", "regression", "embedding")

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
        for name, v in self.inputs.items():
            # NOTE: every op reads axis 0 as the batch, and a size-0 input has nothing to run:
            # refused here, named, instead of an IndexError or a zero loop step further on.
            if not v.shape:
                raise FormatError(f"graph.inputs['{name}'].shape: an input needs a batch axis "
                                  "first, e.g. [\"N\", 3, 32, 32]; got []")
            if any(isinstance(d, int) and d < 1 for d in v.shape):
                raise FormatError(f"graph.inputs['{name}'].shape: every size must be at least "
                                  f"1, got {list(v.shape)}")
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
            for name, (dtype, shape) in zip(node.outputs, outs):
                if name in infos:
                    raise FormatError(f"{where}: output '{name}' is already defined")
                infos[name] = ValueInfo(dtype, shape)
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
