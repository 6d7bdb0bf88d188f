"""The IR as ONNX (opset 17), fp32 and int8 (QDQ).

Names carry over: graph inputs and outputs, node outputs and initializers keep their IR names,
so `pocket compare` can line up values across engines. Helper values an IR node expands into
are named "<node>/<part>" and helper constants "<node>.<part>".

int8 follows the QDQ convention onnxruntime fuses into integer kernels:

    quantize            -> QuantizeLinear (int8 zero point)
    dequantize          -> DequantizeLinear
    int8 conv2d/linear  -> DequantizeLinear(x_q), DequantizeLinear(w_q, per-axis scale, axis 0),
                           DequantizeLinear(b_q int32, scale x_scale * w_scale, axis 0)
                           -> Conv/Gemm -> [Relu] -> [QuantizeLinear(y) when the node has y_scale]
                           (a linear over (N, ..., in): Reshape to rows (N * ..., in) before the
                           group and back after it)
    int8 maxpool2d, flatten, reshape, dropout (the ops that pass int8 through)
                        -> DequantizeLinear -> MaxPool/Flatten/Reshape/Identity -> QuantizeLinear, with the
                           qparams of the int8 input on both sides: exact (max commutes with a
                           monotone quantizer), and the form onnxruntime recognizes. An int8
                           MaxPool/Flatten straight on the Q output runs too, but then onnxruntime
                           no longer fuses the Conv before it into QLinearConv (checked, 1.32).

Relu followed by QuantizeLinear equals the engine's clamp at y_zero_point exactly, since
quantize(0) = y_zero_point. `onnx` is imported inside the functions: the edge install has none.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from pocket.export.errors import ExportError
from pocket.formats import ops
from pocket.formats.ir import Graph, Node

OPSET = 17
IR_VERSION = 8  # the ONNX IR that opset 17 shipped with; older runtimes on a Pi can load it


def _onnx():
    try:
        import onnx
    except ImportError:
        raise ExportError(
            "ONNX export needs the onnx package; install it with: pip install 'pocketnn[onnx]'"
        ) from None
    return onnx


class _Builder:
    """Collects ONNX nodes and initializers for one graph."""

    def __init__(self, graph: Graph, params: Mapping[str, np.ndarray], quant):
        onnx = _onnx()
        self.helper, self.numpy_helper = onnx.helper, onnx.numpy_helper
        self.graph, self.params, self.quant = graph, params, quant or {}
        self.nodes: list = []
        self.inits: dict[str, object] = {}
        self.qparams: dict[str, tuple[float, int]] = {}  # int8 value -> its scale, zero point
        self.infos: dict = {}  # value -> ValueInfo (to_onnx fills it from graph.validate())

    def const(self, name: str, value) -> str:
        if name in self.inits or name in self.params:
            raise AssertionError(f"constant name clash: {name}")
        self.inits[name] = self.numpy_helper.from_array(np.asarray(value), name)
        return name

    def param(self, name: str) -> str:
        if name not in self.inits:
            self.inits[name] = self.numpy_helper.from_array(np.ascontiguousarray(self.params[name]),
                                                            name)
        return name

    def node(self, op: str, inputs: list[str], output: str, name: str, **attrs) -> str:
        self.nodes.append(self.helper.make_node(op, inputs, [output], name=name, **attrs))
        return output


# --------------------------------------------------------------------------- one-node ops


def _single(b: _Builder, n: Node) -> None:
    """An op whose registry entry maps it to one ONNX node (`ops.Onnx`)."""
    m = ops.OPS[n.op].onnx
    attrs = {**m.attrs, **{k: n.attrs[v] for k, v in m.from_attrs.items()}}
    attrs = {k: float(v) if isinstance(v, float) else v for k, v in attrs.items()}
    b.node(m.op_type, [b.param(x) if x in b.params else x for x in n.inputs], n.outputs[0],
           n.name, **attrs)


def _activation(b: _Builder, x: str, out: str, name: str, a: dict) -> str:
    """out = the activation a conv2d/linear with attrs `a` fuses, as that op's own export."""
    act = a["activation"]
    node = Node(name, act, [x], [out], {k: a[k] for k in ops.OPS[act].fusion.attrs})
    ops.impl("onnx_export", act)(b, node)
    return out


def _gelu(b: _Builder, n: Node) -> None:
    """0.5 x (1 + erf(x / sqrt(2))) or its tanh form, expanded: opset 17 has no Gelu."""
    x, out, name = n.inputs[0], n.outputs[0], n.name
    f = np.float32
    if n.attrs.get("approximate", "none") == "tanh":
        # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        x3 = b.node("Mul", [b.node("Mul", [x, x], f"{name}/x2", f"{name}/x2"), x],
                    f"{name}/x3", f"{name}/x3")
        inner = b.node("Add", [x, b.node("Mul", [x3, b.const(f"{name}.c", f(0.044715))],
                                         f"{name}/cx3", f"{name}/cx3")],
                       f"{name}/inner", f"{name}/inner")
        t = b.node("Tanh", [b.node("Mul", [inner, b.const(f"{name}.k",
                                                           f(math.sqrt(2 / math.pi)))],
                                   f"{name}/kin", f"{name}/kin")], f"{name}/t", f"{name}/t")
    else:
        t = b.node("Erf", [b.node("Div", [x, b.const(f"{name}.sqrt2", f(math.sqrt(2)))],
                                  f"{name}/xs", f"{name}/xs")], f"{name}/t", f"{name}/t")
    one = b.node("Add", [t, b.const(f"{name}.one", f(1))], f"{name}/1t", f"{name}/1t")
    half_x = b.node("Mul", [x, b.const(f"{name}.half", f(0.5))], f"{name}/hx", f"{name}/hx")
    b.node("Mul", [half_x, one], out, name)


# --------------------------------------------------------------------------- conv and linear


def _qparams(b: _Builder, prefix: str, scale: float, zp: int, zp_dtype=np.int8) -> list[str]:
    return [b.const(f"{prefix}.scale", np.float32(scale)),
            b.const(f"{prefix}.zero_point", zp_dtype(zp))]


def _weights(b: _Builder, n: Node) -> list[str]:
    """The float weight (and bias) inputs of Conv/Gemm: the params, or their dequantized form."""
    a = n.attrs
    if "x_scale" not in a:
        return [b.param(x) for x in n.inputs[1:]]
    w_name = n.inputs[1]
    w_scale = np.asarray(b.quant[w_name]["scale"], np.float32)
    o = w_scale.shape[0]
    out = [b.node("DequantizeLinear",
                  [b.param(w_name), b.const(f"{n.name}.w_scale", w_scale),
                   b.const(f"{n.name}.w_zero_point", np.zeros(o, np.int8))],
                  f"{n.name}/w", f"{n.name}/w_dq", axis=0)]
    if len(n.inputs) > 2:
        # NOTE: QDQ wants the bias scale to be x_scale * w_scale, the scale of the int32 sum.
        bq = b.quant.get(n.inputs[2])
        b_scale = (np.asarray(bq["scale"], np.float32) if bq is not None
                   else (np.float64(a["x_scale"]) * w_scale.astype(np.float64)).astype(np.float32))
        out.append(b.node("DequantizeLinear",
                          [b.param(n.inputs[2]), b.const(f"{n.name}.b_scale", b_scale),
                           b.const(f"{n.name}.b_zero_point", np.zeros(o, np.int32))],
                          f"{n.name}/b", f"{n.name}/b_dq", axis=0))
    return out


def _layer(onnx_op: str, attrs_of: Callable[[_Builder, Node], dict]) -> Callable:
    def emit(b: _Builder, n: Node) -> None:
        a = n.attrs
        int8 = "x_scale" in a
        x = n.inputs[0]
        if int8:
            x = b.node("DequantizeLinear",
                       [x, *_qparams(b, f"{n.name}.x", a["x_scale"], a["x_zero_point"])],
                       f"{n.name}/x", f"{n.name}/x_dq")
        act = a.get("activation", "none")
        requant = int8 and "y_scale" in a
        y = f"{n.name}/y" if act != "none" or requant else n.outputs[0]
        b.node(onnx_op, [x, *_weights(b, n)], y, n.name, **attrs_of(b, n))
        if act != "none":
            y = _activation(b, y, f"{n.name}/act" if requant else n.outputs[0], f"{n.name}/act",
                            a)
        if requant:
            b.node("QuantizeLinear",
                   [y, *_qparams(b, f"{n.name}.y", a["y_scale"], a["y_zero_point"])],
                   n.outputs[0], f"{n.name}/y_q")
    return emit


def _conv_attrs(b: _Builder, n: Node) -> dict:
    a = n.attrs
    # ONNX pads are [top, left, bottom, right]; the IR pads symmetrically.
    return {"kernel_shape": list(b.params[n.inputs[1]].shape[2:]), "strides": a["stride"],
            "pads": [*a["padding"], *a["padding"]], "dilations": a["dilation"],
            "group": a["groups"]}


def _pool(onnx_op: str) -> Callable:
    def emit(b: _Builder, n: Node) -> None:
        a = n.attrs
        attrs = {"kernel_shape": a["kernel"], "strides": a.get("stride") or a["kernel"],
                 "pads": [*a["padding"], *a["padding"]]}
        if n.op == "avgpool2d":
            attrs["count_include_pad"] = int(a["count_include_pad"])
        b.node(onnx_op, [n.inputs[0]], n.outputs[0], n.name, **attrs)
    return emit


def _batchnorm(b: _Builder, n: Node) -> None:
    b.node("BatchNormalization", [n.inputs[0], *(b.param(x) for x in n.inputs[1:])],
           n.outputs[0], n.name, epsilon=float(n.attrs["eps"]))


def _reshape(b: _Builder, n: Node) -> None:
    # 0 copies the batch dim, so the model keeps its dynamic batch.
    shape = b.const(f"{n.name}.shape", np.asarray([0, *n.attrs["shape"]], np.int64))
    b.node("Reshape", [n.inputs[0], shape], n.outputs[0], n.name)


def _qdq(onnx_op: str) -> Callable:
    def emit(b: _Builder, n: Node) -> None:
        b.node(onnx_op, [n.inputs[0], *_qparams(b, n.name, n.attrs["scale"], n.attrs["zero_point"])],
               n.outputs[0], n.name)
    return emit


def _lut(b: _Builder, n: Node) -> None:
    # table[x + 128]: ONNX has no int8 lookup op, so Gather over the codes widened to int32
    name = n.name
    wide = b.node("Cast", [n.inputs[0]], f"{name}/i32", f"{name}/i32", to=6)  # INT32
    idx = b.node("Add", [wide, b.const(f"{name}/offset", np.int32(128))], f"{name}/idx",
                 f"{name}/idx")
    b.node("Gather", [b.param(n.inputs[1]), idx], n.outputs[0], name, axis=0)


_gemm = _layer("Gemm", lambda b, n: {"transB": 1})


def _linear(b: _Builder, n: Node) -> None:
    shape = b.infos[n.inputs[0]].shape
    if len(shape) == 2:
        _gemm(b, n)
        return
    a, name = n.attrs, n.name
    if "x_scale" in a:
        # int8 (N, ..., in): the 2-D int8 linear on its rows, as the engine runs it. The codes
        # are reshaped to (N * ..., in) and back around the Gemm's QDQ group (a Reshape of int8
        # is exact), which onnxruntime fuses into QGemm as in the 2-D case.
        o = b.params[n.inputs[1]].shape[0]
        flat = b.const(f"{name}.rows", np.asarray([-1, shape[-1]], np.int64))
        rows = b.node("Reshape", [n.inputs[0], flat], f"{name}/rows", f"{name}/rows")
        _gemm(b, Node(name, n.op, [rows, *n.inputs[1:]], [f"{name}/rows_out"], a))
        if all(isinstance(d, int) for d in shape[1:]):  # -1 recovers N
            back = b.const(f"{name}.shape", np.asarray([-1, *shape[1:-1], o], np.int64))
        else:  # a symbolic inner dim: the input's own leading dims
            lead = b.node("Shape", [n.inputs[0]], f"{name}/lead", f"{name}/lead", end=-1)
            back = b.node("Concat", [lead, b.const(f"{name}.o", np.asarray([o], np.int64))],
                          f"{name}/shape", f"{name}/shape", axis=0)
        b.node("Reshape", [f"{name}/rows_out", back], n.outputs[0], f"{name}/unrows")
        return
    # (N, ..., in) fp32: Gemm is 2-D, so MatMul by a Transpose of the
    # weight (constant-folded by the runtime), then the bias and the fused activation
    act = a.get("activation", "none")
    y = f"{name}/y" if act != "none" else n.outputs[0]
    wt = b.node("Transpose", [b.param(n.inputs[1])], f"{name}/wT", f"{name}/wT", perm=[1, 0])
    if len(n.inputs) > 2:
        mm = b.node("MatMul", [n.inputs[0], wt], f"{name}/mm", f"{name}/mm")
        b.node("Add", [mm, b.param(n.inputs[2])], y, name)
    else:
        b.node("MatMul", [n.inputs[0], wt], y, name)
    if act != "none":
        _activation(b, y, n.outputs[0], f"{name}/act", a)


ops.register_table("onnx_export", {
    "conv2d": _layer("Conv", _conv_attrs),
    "linear": _linear,
    "batchnorm": _batchnorm,
    "gelu": _gelu,
    "maxpool2d": _pool("MaxPool"),
    "avgpool2d": _pool("AveragePool"),
    "reshape": _reshape,
    "quantize": _qdq("QuantizeLinear"),
    "dequantize": _qdq("DequantizeLinear"),
    "lut": _lut,
})
ops.register_table("onnx_export", {n: _single for n, op in ops.OPS.items() if op.onnx is not None})


ONNX_OPS: dict[str, Callable[[_Builder, Node], None]] = ops.implementations("onnx_export")

_ELEM = {"f32": "FLOAT", "f16": "FLOAT16", "i8": "INT8", "u8": "UINT8", "i32": "INT32",
         "i64": "INT64"}


def to_onnx(graph: Graph, params: Mapping[str, np.ndarray],
            quant: Mapping[str, dict | None] | None = None, *, check: bool = True):
    """Build the ONNX model of a validated IR graph; int8 graphs need the weights' `quant`."""
    onnx = _onnx()
    helper = onnx.helper
    infos = graph.validate()
    emit = ops.implementations("onnx_export")
    for n in graph.nodes:
        if n.op not in emit:
            raise ExportError(f"node '{n.name}' (op '{n.op}'): the ONNX export cannot handle this "
                              f"op yet; supported: {', '.join(sorted(emit))}")
    b = _Builder(graph, params, quant)
    b.infos = infos
    for n in graph.nodes:
        x = n.inputs[0]
        policy = ops.OPS[n.op].int8
        if policy == ops.INT8_PASS and x in b.qparams:
            qp = b.qparams[x]
            inner = Node(n.name, n.op, [f"{n.name}/x"], [f"{n.name}/y"], n.attrs)
            b.node("DequantizeLinear", [x, *_qparams(b, f"{n.name}.x", *qp)], inner.inputs[0],
                   f"{n.name}/x_dq")
            emit[n.op](b, inner)
            b.node("QuantizeLinear", [inner.outputs[0], *_qparams(b, f"{n.name}.y", *qp)],
                   n.outputs[0], f"{n.name}/y_q")
            b.qparams[n.outputs[0]] = qp
            continue
        emit[n.op](b, n)
        if n.op == "quantize":
            b.qparams[n.outputs[0]] = (n.attrs["scale"], n.attrs["zero_point"])
        elif policy == ops.INT8_LAYER and "y_scale" in n.attrs:
            b.qparams[n.outputs[0]] = (n.attrs["y_scale"], n.attrs["y_zero_point"])

    def value_info(name: str):
        v = infos[name]
        return helper.make_tensor_value_info(name, getattr(onnx.TensorProto, _ELEM[v.dtype]),
                                             list(v.shape))

    g = helper.make_graph(b.nodes, graph.metadata.get("name", "pocket"),
                          [value_info(x) for x in graph.inputs],
                          [value_info(x) for x in graph.outputs],
                          initializer=list(b.inits.values()))
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="pocket", producer_version=_version())
    model.ir_version = IR_VERSION
    # Every metadata field as JSON, so a reader gets back lists and objects, not Python reprs.
    helper.set_model_props(model, {k: json.dumps(v) for k, v in graph.metadata.items()})
    if check:
        onnx.checker.check_model(model, full_check=True)
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    return model


def save(model, path: str | os.PathLike) -> int:
    """Write atomically (temp file in the same folder, fsync, rename); return the size."""
    path = Path(path)
    data = model.SerializeToString()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return len(data)


def _version() -> str:
    from pocket import __version__

    return __version__


# Op families' ONNX mappings register themselves on import (they use _layer and _Builder above).
from pocket.export import (  # noqa: E402, F401
    onnx_export_embed,
    onnx_export_seqattn,
    onnx_export_seqconv,
    onnx_export_spiking,
    onnx_export_ssm,
    onnx_export_vision,
)
