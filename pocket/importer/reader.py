"""ONNX -> pocket IR: the walk over the ONNX graph that the per-op importers plug into.

Every ONNX value ends up as one of three things:
- a constant (an initializer, a Constant node, or any node whose inputs are all constant,
  evaluated with onnx's reference evaluator: constant subgraphs fold whatever their ops);
- a shape value: a small 1-D integer tensor some of whose entries are symbols (the dynamic
  batch), made by Shape and carried through Gather/Unsqueeze/Squeeze/Concat/Cast/Slice, so that
  `x.view(x.size(0), -1)` reaches Reshape with the batch still symbolic;
- an IR value: a graph input or the output of an IR node, with its dtype and shape.

An ONNX node whose inputs include an IR value goes to the importer registered for its IR op
(`ops.register("onnx_import", op)`, with `fn.onnx_types` naming the ONNX op types it takes).
An importer that cannot map a node raises `Unsupported(reason)`; the walk records it and goes
on, so that one error lists every node at fault. Nodes downstream of a failed one are checked
for their op type only (their input shapes are unknown).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pocket.errors import PocketError
from pocket.formats import ops
from pocket.formats.errors import FormatError
from pocket.formats.ir import Graph, Node, ValueInfo

MIN_OPSET = 11  # the oldest default-domain opset the importers are written against
BATCH = "N"
MAX_NAME = 256
# Ops whose value depends on more than their inputs: never folded, never imported.
_NONDETERMINISTIC = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                     "Bernoulli", "Multinomial"}


class ImportError_(PocketError):
    """The ONNX file cannot be imported as asked; the message says why (and lists every node)."""


class Unsupported(Exception):
    """Raised by an importer: this node cannot be mapped; the argument says why."""


def onnx_module():
    try:
        import onnx
    except ImportError:
        raise ImportError_("importing ONNX needs the onnx package; install it with: "
                           "pip install 'pocketnn[onnx]'") from None
    return onnx


_NP_OF = {1: np.float32, 2: np.uint8, 3: np.int8, 5: np.int16, 6: np.int32, 7: np.int64,
          9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64}
_IR_DTYPE = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", np.dtype(np.int8): "i8",
             np.dtype(np.uint8): "u8", np.dtype(np.int32): "i32", np.dtype(np.int64): "i64"}


@dataclass
class OnnxNode:
    """One ONNX node with its attributes decoded to Python values."""

    op_type: str
    name: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any]
    domain: str = ""
    proto: Any = field(default=None, repr=False)

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    @property
    def label(self) -> str:
        return f"{self.op_type} '{self.name}'"


@dataclass
class QConst:
    """A constant that DequantizeLinear made from an integer tensor: the int8 layer pass reads
    the integers back instead of the float values."""

    q: np.ndarray
    scale: np.ndarray
    zero_point: np.ndarray
    axis: int | None


class Context:
    """What an importer sees: the values so far, and the ways to add IR nodes and params."""

    def __init__(self, opset: int):
        self.opset = opset
        self.consts: dict[str, np.ndarray] = {}
        self.symvals: dict[str, np.ndarray] = {}  # object arrays of int | symbol
        self.alias: dict[str, str] = {}  # ONNX value -> IR value
        self.infos: dict[str, ValueInfo] = {}  # IR value -> dtype and shape
        self.inputs: dict[str, ValueInfo] = {}
        self.nodes: list[Node] = []
        self.params: dict[str, np.ndarray] = {}
        self.onnx_shapes: dict[str, tuple] = {}  # ONNX values whose shape is not their IR value's
        self.shifted: set[str] = set()  # IR i8 values that ONNX holds as uint8 (zp - 128)
        self.qconsts: dict[str, QConst] = {}  # ONNX const value or IR param -> its integers
        # ONNX values an importer left pending (a ReduceL2 norm): the walk hands every node that
        # reads one to its `consume(ctx, node)`, which emits the fused op or refuses with `reason`.
        self.partial: dict[str, Any] = {}
        self._param_of: dict[int, str] = {}  # id(const array) -> the param made from it
        self._names: set[str] = set()
        self.node: OnnxNode | None = None  # the node being imported

    # ---- looking at values

    def const(self, v: str) -> np.ndarray | None:
        return self.consts.get(v) if v else None

    def need_const(self, v: str, what: str) -> np.ndarray:
        c = self.const(v)
        if c is None:
            raise Unsupported(f"{what} ('{v}') must be a constant (an initializer or folded "
                              "from constants)")
        return c

    def is_value(self, v: str) -> bool:
        return v in self.alias

    def value(self, v: str) -> str:
        """The IR value for ONNX value v; a float constant becomes a param."""
        if v in self.alias:
            return self.alias[v]
        c = self.const(v)
        if c is not None:
            return self.param(np.asarray(c, np.float32) if c.dtype.kind == "f" else c, v)
        if v in self.symvals:
            raise Unsupported(f"'{v}' is shape arithmetic on a dynamic dim, used as data")
        raise Unsupported(f"input '{v}' is not available")

    def info(self, v: str) -> ValueInfo:
        c = self.const(v)
        if c is not None:
            return ValueInfo(_IR_DTYPE.get(c.dtype, str(c.dtype)), tuple(c.shape))
        return self.infos[self.value(v)]

    def shape(self, v: str) -> tuple:
        return tuple(self.info(v).shape)

    # ---- adding to the graph

    def fresh(self, name: str) -> str:
        name = _clean(name)
        out, i = name, 1
        while out in self._names:
            out = f"{name}_{i}"
            i += 1
        self._names.add(out)
        return out

    def param(self, a: np.ndarray, name: str) -> str:
        """a as a param (once per constant array; a fresh name for a derived one)."""
        key = id(self.consts.get(name))
        if name in self.consts and self.consts[name] is a and key in self._param_of:
            return self._param_of[key]
        a = np.ascontiguousarray(a)
        if a.dtype not in _IR_DTYPE:
            raise Unsupported(f"constant '{name}' has dtype {a.dtype}, which the format does not "
                              "store")
        p = self.fresh(name)
        self.params[p] = a
        self.infos[p] = ValueInfo(_IR_DTYPE[a.dtype], tuple(a.shape))
        if name in self.consts and self.consts[name] is a:
            self._param_of[key] = p
            if name in self.qconsts:
                self.qconsts[p] = self.qconsts[name]
        return p

    def emit(self, op: str, inputs: list[str], attrs: Mapping[str, Any] | None = None, *,
             out: str | None = None, name: str | None = None) -> str:
        """Add IR node `op` reading IR values `inputs`; returns its output (named after the
        ONNX output `out`, by default the node's first). Shape errors become Unsupported."""
        n = self.node
        out = out if out is not None else n.outputs[0]
        node = Node(self.fresh(name or n.name), op, list(inputs), [self.fresh(out)],
                    dict(attrs or {}))
        schema = ops.OPS[op]
        where = f"node '{node.name}' ({op})"
        try:
            if not schema.min_inputs <= len(inputs) <= schema.max_inputs:
                raise FormatError(f"{where}: takes {schema.min_inputs}..{schema.max_inputs} inputs")
            node.attrs = ops.normalize_attrs(node, where)
            (dtype, shape), = schema.infer(node, [self.infos[x] for x in inputs], where)
        except FormatError as e:
            raise Unsupported(str(e).replace(f"{where}: ", "")) from None
        self.infos[node.outputs[0]] = ValueInfo(dtype, shape)
        self.nodes.append(node)
        self.alias[out] = node.outputs[0]
        return node.outputs[0]

    def same(self, out: str, v: str) -> None:
        """ONNX value `out` is ONNX value `v` (Identity, Dropout)."""
        if v in self.alias:
            self.alias[out] = self.alias[v]
        elif v in self.consts:
            self.consts[out] = self.consts[v]
        elif v in self.symvals:
            self.symvals[out] = self.symvals[v]
        else:
            raise Unsupported(f"input '{v}' is not available")


def _clean(name: str) -> str:
    name = name or "value"
    if len(name) > MAX_NAME:
        import zlib

        name = f"{name[:MAX_NAME - 12]}~{zlib.crc32(name.encode()):08x}"
    return name


# --------------------------------------------------------------------------- dispatch


def importers() -> dict[str, Any]:
    """ONNX op type -> the importer registered for it (through its IR op's slot)."""
    from pocket.importer import ops_core, ops_embed, ops_vision  # noqa: F401 - register them

    table = {}
    for fn in ops.implementations("onnx_import").values():
        for t in fn.onnx_types:
            table[t] = fn
    return table


def supported_types() -> tuple[str, ...]:
    return tuple(sorted({*importers(), *_HANDLED}))


# Shape arithmetic on shape values (object arrays of int | symbol).

def _sym_slice(ctx, n, x):
    starts = ctx.need_const(n.inputs[1], "starts") if len(n.inputs) > 1 else n.attr("starts")
    ends = ctx.need_const(n.inputs[2], "ends") if len(n.inputs) > 2 else n.attr("ends")
    axes = ctx.const(n.inputs[3]) if len(n.inputs) > 3 and n.inputs[3] else n.attr("axes")
    steps = ctx.const(n.inputs[4]) if len(n.inputs) > 4 and n.inputs[4] else None
    if axes is not None and list(np.ravel(axes)) not in ([0], [-1]):
        raise Unsupported("Slice of a shape value along an axis other than 0")
    st = 1 if steps is None else int(np.ravel(steps)[0])
    return x[int(np.ravel(starts)[0]):int(np.clip(np.ravel(ends)[0], -2**62, 2**62)):st]


_FOLDS = {
    "Identity": lambda ctx, n, x: x,
    "Cast": lambda ctx, n, x: x,
    "Gather": lambda ctx, n, x: np.take(
        x, np.asarray(ctx.need_const(n.inputs[1], "indices"), np.int64), axis=n.attr("axis", 0)),
    "Unsqueeze": lambda ctx, n, x: x.reshape(-1) if x.ndim == 0 else x[None],
    "Squeeze": lambda ctx, n, x: x.reshape(()) if x.size == 1 else x,
    "Concat": None,  # reads several inputs: below
    "Slice": _sym_slice,
}


_HANDLED = {*_FOLDS, "Constant", "Shape"}  # op types the walk folds itself
# Op types with no importer of their own that can end a fused chain (ReduceL2 -> Max -> Div):
# downstream of a failed node they are not listed as unsupported (the failure is).
_IN_CHAINS = {"Max", "Div", "Expand"}


def _fold_symbolic(ctx: Context, n: OnnxNode) -> bool:
    """Shape arithmetic on shape values; True if n was folded that way."""
    if n.op_type not in _FOLDS or not any(v in ctx.symvals for v in n.inputs):
        return False
    if n.op_type == "Concat":
        parts = []
        for v in n.inputs:
            if v in ctx.symvals:
                parts.append(ctx.symvals[v])
            elif ctx.const(v) is not None:
                parts.append(np.asarray(ctx.consts[v], object))
            else:
                return False
        out = np.concatenate([p.reshape(-1) for p in parts])
    else:
        x = ctx.symvals.get(n.inputs[0])
        if x is None:
            return False
        out = _FOLDS[n.op_type](ctx, n, x)
    out = np.asarray(out, object)
    if all(isinstance(d, int | np.integer) for d in out.ravel()):
        ctx.consts[n.outputs[0]] = out.astype(np.int64)
    else:
        ctx.symvals[n.outputs[0]] = out
    return True


def _shape_of(ctx: Context, n: OnnxNode) -> None:
    shape = np.asarray(list(ctx.onnx_shapes.get(n.inputs[0]) or ctx.shape(n.inputs[0])), object)
    start, end = n.attr("start", 0), n.attr("end")
    shape = shape[start:end]
    if all(isinstance(d, int) for d in shape):
        ctx.consts[n.outputs[0]] = shape.astype(np.int64)
    else:
        ctx.symvals[n.outputs[0]] = shape


def _evaluate(onnx, n: OnnxNode, ins: list, opset: int) -> list[np.ndarray]:
    """Run one node on constants with onnx's reference evaluator."""
    from onnx.reference import ReferenceEvaluator

    helper = onnx.helper
    vals = [helper.make_tensor_value_info(v or f"_none{i}", 0, None)
            for i, v in enumerate(n.inputs)]
    outs = [helper.make_tensor_value_info(v, 0, None) for v in n.outputs if v]
    g = helper.make_graph([n.proto], "fold", [x for x, v in zip(vals, n.inputs) if v], outs)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid(n.domain, opset)])
    res = ReferenceEvaluator(model).run(None, {v: a for v, a in zip(n.inputs, ins) if v})
    return [np.asarray(r) for r in res]


# --------------------------------------------------------------------------- the walk


def _dims(t, where: str, shapes: Mapping[str, list] | None, name: str) -> list:
    if shapes and name in shapes:
        return list(shapes[name])
    if not t.type.HasField("tensor_type"):
        raise Unsupported(f"input '{name}' is not a tensor")
    tt = t.type.tensor_type
    if not tt.HasField("shape"):
        raise Unsupported(f"input '{name}' has no shape; pass --input-shape {name}=...")
    dims = []
    for i, d in enumerate(tt.shape.dim):
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif i == 0:
            dims.append(BATCH)
        else:
            shown = d.dim_param or "?"
            raise Unsupported(f"input '{name}' dim {i} is dynamic ({shown}); only the batch "
                              f"may be: pass --input-shape {name}=N,...")
    return dims


def read_model(model, *, input_shapes: Mapping[str, list] | None = None,
               name: str = "model") -> tuple[Graph, dict[str, np.ndarray], dict]:
    """Map an ONNX ModelProto to (IR graph, params, qconsts); ImportError_ lists every problem.

    The graph is not optimized yet (see passes.py); qconsts maps params to the integers
    DequantizeLinear made them from.
    """
    onnx = onnx_module()
    from onnx import numpy_helper

    problems: list[str] = []
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None:
        raise ImportError_(f"{name}: the model imports no default-domain opset")
    newest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= newest:
        # NOTE: up to the newest opset the installed onnx knows: the importers check the
        # attributes whose meaning changed between opsets (Softmax's axis, ReduceMean's axes).
        problems.append(f"the model's opset is {opset}; pocket imports opsets "
                        f"{MIN_OPSET}-{newest} (convert it with onnx.version_converter)")
    g = model.graph
    ctx = Context(opset)
    for t in g.initializer:
        ctx.consts[t.name] = numpy_helper.to_array(t)
    for t in getattr(g, "sparse_initializer", []):
        problems.append(f"sparse initializer '{t.values.name}' is not supported")
    known = set(ctx.consts)
    if input_shapes and "" in input_shapes:
        free = [t.name for t in g.input if t.name not in known]
        if len(free) != 1:
            raise ImportError_(f"{name}: --input-shape without NAME= needs a one-input model; "
                               f"this one has {', '.join(free)}")
        input_shapes = {free[0]: input_shapes[""]}
    for t in g.input:
        if t.name in known:
            continue
        try:
            elem = t.type.tensor_type.elem_type
            dims = _dims(t, name, input_shapes, t.name)
            if elem != 1:
                raise Unsupported(f"input '{t.name}' has element type "
                                  f"{onnx.TensorProto.DataType.Name(elem)}; pocket runs float32 "
                                  "inputs")
            v = ctx.fresh(t.name)
            if not dims or isinstance(dims[0], int) and dims[0] < 1:
                raise Unsupported(f"input '{t.name}' needs a batch axis first, got shape {dims}")
            ctx.inputs[v] = ctx.infos[v] = ValueInfo("f32", tuple(dims))
            ctx.alias[t.name] = v
        except Unsupported as e:
            problems.append(f"graph input: {e}")
    if input_shapes:
        extra = sorted(set(input_shapes) - {t.name for t in g.input})
        if extra:
            problems.append(f"--input-shape names {', '.join(extra)}, which the model has not as "
                            f"inputs ({', '.join(t.name for t in g.input if t.name not in known)})")

    table = importers()
    dead: set[str] = set()  # values downstream of a failed node
    for i, proto in enumerate(g.node):
        n = OnnxNode(proto.op_type, proto.name or f"{proto.op_type}_{i}", list(proto.input),
                     list(proto.output),
                     {a.name: onnx.helper.get_attribute_value(a) for a in proto.attribute},
                     proto.domain, proto)
        for k, v in list(n.attrs.items()):
            if isinstance(v, bytes):
                n.attrs[k] = v.decode("utf-8", "replace")
        ctx.node = n
        if any(v in dead for v in n.inputs if v):
            if n.op_type not in table and n.op_type not in _HANDLED | _IN_CHAINS:
                problems.append(f"{n.label}: op type {n.op_type} is not supported")
            dead.update(n.outputs)
            continue
        try:
            _import_node(onnx, ctx, n, table)
        except Unsupported as e:
            problems.append(f"{n.label}: {e}")
            dead.update(n.outputs)
        except (ValueError, TypeError, IndexError, KeyError, FormatError) as e:
            problems.append(f"{n.label}: cannot be imported ({type(e).__name__}: {e})")
            dead.update(n.outputs)

    outputs = []
    for t in g.output:
        if t.name in dead:
            continue
        try:
            outputs.append(_output(ctx, t.name))
        except Unsupported as e:
            problems.append(f"graph output: {e}")
    if problems:
        kinds = Counter(p.split(" ", 1)[0] for p in problems if p[:1].isupper())
        summary = ", ".join(f"{k} x{v}" for k, v in kinds.most_common())
        raise ImportError_(f"{name}: cannot import {len(problems)} "
                           f"node{'s' if len(problems) != 1 else ''}"
                           f"{f' ({summary})' if summary else ''}: " + "; ".join(problems))
    graph = Graph(ctx.inputs, outputs, ctx.nodes,
                  {p: ValueInfo(_IR_DTYPE[a.dtype], tuple(a.shape)) for p, a in ctx.params.items()},
                  _metadata(model))
    try:
        graph.validate()
    except FormatError as e:
        raise ImportError_(f"{name}: the imported graph is not valid: {e}") from None
    return graph, ctx.params, {p: q for p, q in ctx.qconsts.items() if p in ctx.params}


def _import_node(onnx, ctx: Context, n: OnnxNode, table: dict) -> None:
    if n.domain not in ("", "ai.onnx"):
        raise Unsupported(f"op domain '{n.domain}' is not supported")
    if n.op_type in _NONDETERMINISTIC:
        raise Unsupported(f"op type {n.op_type} is random; pocket runs deterministic graphs")
    if n.op_type == "Constant":
        ctx.consts[n.outputs[0]] = _constant(onnx, n)
        return
    if n.op_type == "Shape" and ctx.is_value(n.inputs[0]):
        _shape_of(ctx, n)
        return
    ins = [v for v in n.inputs if v]
    pending = next((ctx.partial[v] for v in ins if v in ctx.partial), None)
    if pending is not None:
        pending.consume(ctx, n)
        return
    if ins and all(ctx.const(v) is not None for v in ins):
        # NOTE: evaluated with every input, in place: an optional input left empty stays empty.
        if n.op_type == "DequantizeLinear":
            qc = ctx.qconsts[n.outputs[0]] = _qconst(ctx, n)
            shape = [1] * qc.q.ndim
            if qc.axis is not None:
                shape[qc.axis] = -1
            # NOTE: as ONNX: (q - zp) * scale in float32, zp and q widened to int32 first.
            ctx.consts[n.outputs[0]] = (
                (qc.q.astype(np.int32) - qc.zero_point.astype(np.int32).reshape(shape))
                .astype(np.float32) * qc.scale.reshape(shape)).astype(np.float32)
            return
        ins = [ctx.const(v) if v else None for v in n.inputs]
        try:
            try:
                res = _evaluate(onnx, n, ins, ctx.opset)
            except RuntimeError as e:
                if "No implementation" not in str(e):
                    raise
                # An op unchanged since an older opset the evaluator knows it by: its newest.
                res = _evaluate(onnx, n, ins, onnx.defs.onnx_opset_version())
        except Exception as e:  # noqa: BLE001 - onnx's evaluator raises what its ops raise
            raise Unsupported(f"folding it on constants failed ({type(e).__name__}: "
                              f"{str(e)[:120]})") from None
        for v, a in zip([v for v in n.outputs if v], res):
            ctx.consts[v] = a
        return
    if _fold_symbolic(ctx, n):
        return
    fn = table.get(n.op_type)
    if fn is None:
        raise Unsupported(f"op type {n.op_type} is not supported")
    fn(ctx, n)


def _constant(onnx, n: OnnxNode) -> np.ndarray:
    from onnx import numpy_helper

    a = n.attrs
    if "value" in a:
        return numpy_helper.to_array(a["value"])
    for key, dt in (("value_float", np.float32), ("value_int", np.int64),
                    ("value_floats", np.float32), ("value_ints", np.int64)):
        if key in a:
            return np.asarray(a[key], dt)
    raise Unsupported(f"Constant with attribute(s) {', '.join(a)} is not supported")


def _qconst(ctx: Context, n: OnnxNode) -> QConst:
    q = ctx.consts[n.inputs[0]]
    scale = np.asarray(ctx.consts[n.inputs[1]], np.float32)
    zp = (np.asarray(ctx.consts[n.inputs[2]]) if len(n.inputs) > 2 and n.inputs[2]
          else np.zeros(scale.shape, q.dtype))
    axis = None if scale.ndim == 0 or scale.size == 1 and q.ndim == 0 else int(n.attr("axis", 1))
    if axis is not None:
        axis %= max(q.ndim, 1)
    return QConst(q, scale.reshape(-1), zp.reshape(-1), axis)


def _output(ctx: Context, v: str) -> str:
    """The IR value of graph output v, renamed to v so the interface keeps its names."""
    if v not in ctx.alias:
        if v in ctx.partial:
            raise Unsupported(f"output '{v}': {ctx.partial[v].reason}")
        if v in ctx.consts:
            raise Unsupported(f"output '{v}' is a constant; pocket runs graphs whose outputs "
                              "depend on the input")
        raise Unsupported(f"output '{v}' is not computed")
    ir = ctx.alias[v]
    if ir in ctx.shifted:
        raise Unsupported(f"output '{v}' is uint8; pocket's outputs are float32 or int8")
    if ir == v:
        return v
    want = v if v not in ctx._names else ctx.fresh(v)
    made = next((n for n in ctx.nodes if ir in n.outputs), None)
    if made is None or ir in ctx.params:
        # The output is a graph input itself: an explicit identity keeps both names.
        node = Node(ctx.fresh(f"{want}/identity"), "dropout", [ir], [want], {"p": 0.0})
        ctx.nodes.append(node)
        ctx._names.add(want)
        ctx.infos[want] = ctx.infos[ir]
        return want
    ctx._names.add(want)
    for node in ctx.nodes:
        node.inputs = [want if x == ir else x for x in node.inputs]
        node.outputs = [want if x == ir else x for x in node.outputs]
    ctx.infos[want] = ctx.infos.pop(ir)
    for k, a in ctx.alias.items():
        if a == ir:
            ctx.alias[k] = want
    return want


_KNOWN_META = ("labels", "task", "preprocessing", "name", "dataset", "metrics")


def _metadata(model) -> dict:
    """The model's metadata: pocket's own fields (JSON, as the exporter writes them) lifted to
    the top where they check out, everything else kept under "onnx"."""
    import json

    from pocket.formats.ir import _check_metadata

    props = {p.key: p.value for p in model.metadata_props}
    meta: dict[str, Any] = {}
    for k in _KNOWN_META:
        if k not in props:
            continue
        try:
            val = json.loads(props[k])
        except ValueError:
            val = props[k]
        try:
            _check_metadata({k: val})
        except FormatError:
            continue
        meta[k] = val
        props.pop(k)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    onnx_meta = {"producer": model.producer_name, "producer_version": model.producer_version,
                 "opset": opset, "ir_version": model.ir_version}
    if model.doc_string:
        onnx_meta["doc"] = model.doc_string[:1000]
    if props:
        onnx_meta["props"] = props
    meta["onnx"] = onnx_meta
    return meta


def parse_shapes(specs: list[str] | tuple[str, ...]) -> dict[str, list]:
    """--input-shape NAME=1,3,224,224 (or N,3,224,224 for a dynamic batch) -> {name: dims}.
    A spec without NAME= names the model's only input: returned under the key ""."""
    out: dict[str, list] = {}
    for s in specs:
        name, _, dims = s.rpartition("=")
        try:
            shape = [d if re.fullmatch(r"[A-Za-z_]\w*", d) else int(d)
                     for d in dims.split(",")]
        except ValueError:
            raise ImportError_(f"--input-shape {s!r}: expected NAME=D1,D2,... with integer sizes "
                               "(a name such as N for the dynamic batch)") from None
        if not shape or any(isinstance(d, int) and d < 1 for d in shape):
            raise ImportError_(f"--input-shape {s!r}: every size must be at least 1")
        out[name] = shape
    return out
