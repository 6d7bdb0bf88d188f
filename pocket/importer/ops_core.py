"""The importers of the core IR ops: each maps the ONNX op types in its `onnx_types` to that op.

An importer is `fn(ctx, node)` (reader.Context, reader.OnnxNode); it reads its inputs through
ctx (constants, IR values and their shapes), adds IR nodes with `ctx.emit`, and raises
`Unsupported` naming the attribute or shape it cannot map. BatchNorm, Identity and Dropout
import as IR ops that the exporter's transforms then fold away (passes.py).
"""

from __future__ import annotations

import math

import numpy as np

from pocket.formats import ops
from pocket.importer.reader import Context, OnnxNode, QConst, Unsupported


def importer(ir_op: str, *onnx_types: str):
    """Register fn as IR op `ir_op`'s importer, for ONNX nodes of these types."""

    def deco(fn):
        fn.onnx_types = onnx_types
        return ops.register("onnx_import", ir_op)(fn)

    return deco


# --------------------------------------------------------------------------- helpers


def _fparam(ctx: Context, v: str, what: str) -> str:
    c = ctx.need_const(v, what)
    if c.dtype.kind != "f":
        raise Unsupported(f"{what} ('{v}') has dtype {c.dtype}; expected a float tensor")
    return ctx.param(c if c.dtype == np.float32 else c.astype(np.float32), v)


def _x(ctx: Context, n: OnnxNode, ndim: int | tuple | None = None, what: str = "input") -> str:
    if not ctx.is_value(n.inputs[0]):
        raise Unsupported(f"{what} '{n.inputs[0]}' must be computed from the graph input")
    x = ctx.value(n.inputs[0])
    shape = ctx.infos[x].shape
    want = (ndim,) if isinstance(ndim, int) else ndim
    if want is not None and len(shape) not in want:
        raise Unsupported(f"{what} must be {' or '.join(f'{d}-D' for d in want)}, got shape "
                          f"{list(shape)}")
    return x


def _no_extra_outputs(n: OnnxNode, keep: int = 1) -> None:
    extra = [v for v in n.outputs[keep:] if v]
    if extra:
        raise Unsupported(f"output(s) {', '.join(extra)} are not supported (only the first)")


def _pads(n: OnnxNode, spatial: tuple, kernel: list, strides: list, dilations: list) -> list[int]:
    """ONNX pads/auto_pad -> the IR's symmetric [pad_h, pad_w]."""
    auto = n.attr("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        pads = list(n.attr("pads", [0] * 4))
    elif auto == "VALID":
        pads = [0] * 4
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for size, k, s, d in zip(spatial, kernel, strides, dilations):
            if not isinstance(size, int):
                raise Unsupported(f"auto_pad {auto} needs fixed spatial sizes")
            total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
            lo = total // 2 if auto == "SAME_UPPER" else total - total // 2
            begin.append(lo)
            end.append(total - lo)
        pads = begin + end
    else:
        raise Unsupported(f"auto_pad {auto!r} is not supported")
    if len(pads) != 4:
        raise Unsupported(f"pads {pads} must have 4 entries (2-D)")
    if pads[:2] != pads[2:]:
        raise Unsupported(f"pads {pads} are asymmetric; pocket pads both sides alike")
    return pads[:2]


def _pair(n: OnnxNode, key: str, default: list) -> list[int]:
    v = list(n.attr(key, default))
    if len(v) != 2:
        raise Unsupported(f"{key} {v} must have 2 entries (2-D)")
    return [int(x) for x in v]


# --------------------------------------------------------------------------- conv and linear


@importer("conv2d", "Conv")
def conv(ctx: Context, n: OnnxNode) -> None:
    x = _x(ctx, n, 4, "input (N, C, H, W)")
    w = ctx.need_const(n.inputs[1], "weight")
    if w.ndim != 4:
        raise Unsupported(f"weight shape {list(w.shape)}: only 2-D convolutions are supported")
    kernel = _pair(n, "kernel_shape", list(w.shape[2:]))
    if kernel != list(w.shape[2:]):
        raise Unsupported(f"kernel_shape {kernel} does not match the weight {list(w.shape)}")
    stride, dil = _pair(n, "strides", [1, 1]), _pair(n, "dilations", [1, 1])
    pad = _pads(n, ctx.infos[x].shape[2:], kernel, stride, dil)
    ins = [x, _fparam(ctx, n.inputs[1], "weight")]
    if len(n.inputs) > 2 and n.inputs[2]:
        ins.append(_fparam(ctx, n.inputs[2], "bias"))
    ctx.emit("conv2d", ins, {"stride": stride, "padding": pad, "dilation": dil,
                             "groups": int(n.attr("group", 1))})


def _linear_weight(ctx: Context, v: str, transpose: bool, alpha: float, what: str) -> str:
    """The [out, in] weight param from ONNX's B (keeping the integers of a DequantizeLinear'd B
    for the int8 pass)."""
    b = ctx.need_const(v, what)
    if b.ndim != 2 or b.dtype.kind != "f":
        raise Unsupported(f"{what} must be a 2-D float tensor, got {b.dtype} {list(b.shape)}")
    if not transpose and alpha == 1.0 and b.dtype == np.float32:
        return ctx.param(b, v)
    w = np.ascontiguousarray((b.T if transpose else b) * np.float32(alpha), np.float32)
    p = ctx.param(w, f"{v}.T" if transpose else f"{v}.scaled")
    qc = ctx.qconsts.get(v)
    if qc is not None and alpha == 1.0:
        axis = None if qc.axis is None else (1 - qc.axis if transpose else qc.axis)
        ctx.qconsts[p] = QConst(qc.q.T if transpose else qc.q, qc.scale, qc.zero_point, axis)
    return p


@importer("linear", "Gemm", "MatMul")
def linear(ctx: Context, n: OnnxNode) -> None:
    if n.op_type == "MatMul":
        # (N, ..., K) @ B (K, O): the IR's linear over the last axis (pocket's own export of an
        # N-D linear is Transpose(W) -> MatMul)
        x = _x(ctx, n, None, "input A")
        if len(ctx.infos[x].shape) < 2:
            raise Unsupported(f"input A of shape {list(ctx.infos[x].shape)} must be (N, ..., "
                              "features)")
        ctx.emit("linear", [x, _linear_weight(ctx, n.inputs[1], True, 1.0, "B")])
        return
    x = _x(ctx, n, 2, "input A (N, features)")
    if n.attr("transA", 0):
        raise Unsupported("transA=1 is not supported (the input must be (N, features))")
    alpha, beta = float(n.attr("alpha", 1.0)), float(n.attr("beta", 1.0))
    w = _linear_weight(ctx, n.inputs[1], not n.attr("transB", 0), alpha, "B")
    ins = [x, w]
    if len(n.inputs) > 2 and n.inputs[2]:
        c = ctx.need_const(n.inputs[2], "C")
        o = ctx.params[w].shape[0]
        if c.size not in (1, o) or c.ndim > 2 or c.ndim == 2 and c.shape[0] != 1:
            raise Unsupported(f"C of shape {list(c.shape)} must broadcast as a bias of {o}")
        bias = np.broadcast_to(np.asarray(c, np.float32).reshape(-1), (o,)) * np.float32(beta)
        if c.dtype == np.float32 and beta == 1.0 and c.shape == (o,):
            ins.append(ctx.param(c, n.inputs[2]))
        else:
            ins.append(ctx.param(np.ascontiguousarray(bias, np.float32), f"{n.name}.bias"))
    ctx.emit("linear", ins)


@importer("batchnorm", "BatchNormalization")
def batchnorm(ctx: Context, n: OnnxNode) -> None:
    if n.attr("training_mode", 0):
        raise Unsupported("training_mode=1 is not supported (inference only)")
    _no_extra_outputs(n)
    x = _x(ctx, n, (2, 4), "input")
    ins = [x, *(_fparam(ctx, v, what) for v, what in zip(
        n.inputs[1:5], ("scale", "bias", "mean", "var")))]
    ctx.emit("batchnorm", ins, {"eps": float(n.attr("epsilon", 1e-5))})


# --------------------------------------------------------------------------- activations


def _unary(ir_op: str, onnx_type: str, attrs=lambda n: {}):
    @importer(ir_op, onnx_type)
    def fn(ctx: Context, n: OnnxNode) -> None:
        ctx.emit(ir_op, [_x(ctx, n)], attrs(n))

    fn.__name__ = fn.__qualname__ = ir_op
    return fn


def _hardsigmoid_attrs(n: OnnxNode) -> dict:
    alpha, beta = float(n.attr("alpha", 0.2)), float(n.attr("beta", 0.5))
    if abs(alpha - 1 / 6) > 1e-6 or abs(beta - 0.5) > 1e-6:
        raise Unsupported(f"alpha={alpha:g}, beta={beta:g}: only PyTorch's hardsigmoid "
                          "(alpha=1/6, beta=0.5) is supported")
    return {}


def _gelu_attrs(n: OnnxNode) -> dict:
    return {"approximate": n.attr("approximate", "none")}


relu = _unary("relu", "Relu")
leaky_relu = _unary("leaky_relu", "LeakyRelu", lambda n: {"alpha": float(n.attr("alpha", 0.01))})
sigmoid = _unary("sigmoid", "Sigmoid")
tanh = _unary("tanh", "Tanh")
gelu = _unary("gelu", "Gelu", _gelu_attrs)
hardswish = _unary("hardswish", "HardSwish")
hardsigmoid = _unary("hardsigmoid", "HardSigmoid", _hardsigmoid_attrs)


@importer("softmax", "Softmax")
def softmax(ctx: Context, n: OnnxNode) -> None:
    x = _x(ctx, n)
    ndim = len(ctx.infos[x].shape)
    axis = int(n.attr("axis", -1 if ctx.opset >= 13 else 1))
    if not -ndim <= axis < ndim:
        raise Unsupported(f"axis {axis} is out of range for {ndim} dims")
    axis %= ndim
    if ctx.opset < 13 and axis != ndim - 1:
        # NOTE: before opset 13 Softmax flattens the dims from `axis` on into one.
        raise Unsupported(f"opset {ctx.opset} Softmax over the flattened dims {axis}.. is "
                          "supported only on the last axis")
    if axis == 0:
        raise Unsupported("softmax over the batch axis is not supported")
    ctx.emit("softmax", [x], {"axis": axis})


# --------------------------------------------------------------------------- pooling


def _pool_attrs(ctx: Context, n: OnnxNode, x: str) -> dict:
    _no_extra_outputs(n)
    kernel = _pair(n, "kernel_shape", [])
    stride = _pair(n, "strides", [1, 1])
    if _pair(n, "dilations", [1, 1]) != [1, 1]:
        raise Unsupported(f"dilations {n.attr('dilations')} are not supported")
    spatial = ctx.infos[x].shape[2:]
    pad = _pads(n, spatial, kernel, stride, [1, 1])
    if n.attr("ceil_mode", 0):
        # Ceil mode only matters when the last window starts inside the padded input.
        for size, k, s, p in zip(spatial, kernel, stride, pad):
            if (size + 2 * p - k) % s and math.ceil((size + 2 * p - k) / s) * s < size + p:
                raise Unsupported("ceil_mode=1 with a partial last window is not supported")
    return {"kernel": kernel, "stride": stride, "padding": pad}


@importer("maxpool2d", "MaxPool")
def maxpool(ctx: Context, n: OnnxNode) -> None:
    x = _x(ctx, n, 4, "input (N, C, H, W)")
    if n.attr("storage_order", 0):
        raise Unsupported("storage_order=1 is not supported")
    ctx.emit("maxpool2d", [x], _pool_attrs(ctx, n, x))


@importer("avgpool2d", "AveragePool")
def avgpool(ctx: Context, n: OnnxNode) -> None:
    x = _x(ctx, n, 4, "input (N, C, H, W)")
    a = _pool_attrs(ctx, n, x)
    ctx.emit("avgpool2d", [x], {**a, "count_include_pad": bool(n.attr("count_include_pad", 0))})


@importer("global_avgpool", "GlobalAveragePool", "ReduceMean")
def global_avgpool(ctx: Context, n: OnnxNode) -> None:
    x = _x(ctx, n, 4, "input (N, C, H, W)")
    if n.op_type == "ReduceMean":
        axes = n.attr("axes")
        if axes is None and len(n.inputs) > 1 and n.inputs[1]:
            axes = ctx.need_const(n.inputs[1], "axes").tolist()
        if sorted(a % 4 for a in (axes or [])) != [2, 3]:
            raise Unsupported(f"ReduceMean over axes {axes}: only the mean over H and W "
                              "(axes 2, 3) is supported")
        if not n.attr("keepdims", 1):
            # x.mean([2, 3]) in PyTorch: the pool, then (N, C, 1, 1) -> (N, C).
            g = ctx.emit("global_avgpool", [x], out=f"{n.outputs[0]}/pool",
                         name=f"{n.name}/pool")
            ctx.emit("flatten", [g])
            return
    ctx.emit("global_avgpool", [x])


# --------------------------------------------------------------------------- shapes


@importer("flatten", "Flatten")
def flatten(ctx: Context, n: OnnxNode) -> None:
    x = _x(ctx, n)
    shape = ctx.infos[x].shape
    axis = int(n.attr("axis", 1))
    axis = axis + len(shape) if axis < 0 else axis
    if axis != 1:
        # ONNX Flatten makes (prod(dims[:axis]), prod(dims[axis:])): the batch changes.
        raise Unsupported(f"axis={n.attr('axis', 1)} folds dims into the batch; only axis=1 "
                          "keeps it")
    ctx.emit("flatten", [x])


@importer("reshape", "Reshape")
def reshape(ctx: Context, n: OnnxNode) -> None:
    x = _x(ctx, n)
    src = ctx.onnx_shapes.get(n.inputs[0]) or ctx.infos[x].shape
    v = n.inputs[1]
    if ctx.const(v) is not None:
        target = [int(d) for d in ctx.consts[v].reshape(-1)]
    elif v in ctx.symvals:
        target = list(ctx.symvals[v].reshape(-1))
    else:
        raise Unsupported(f"shape '{v}' must be a constant or shape arithmetic on the input")
    allowzero = n.attr("allowzero", 0)
    target = [src[i] if d == 0 and not allowzero and i < len(src) else d
              for i, d in enumerate(target)]
    rest = target[1:]
    if any(not isinstance(d, int) for d in rest):
        raise Unsupported(f"target shape {target}: only the batch dim may be dynamic")
    if target[0] != src[0]:
        known = math.prod(d for d in rest if d != -1)
        have = math.prod(src[1:]) if all(isinstance(d, int) for d in src[1:]) else None
        if not (target[0] == -1 and -1 not in rest and have == known):
            raise Unsupported(f"reshape {list(src)} -> {target} changes the batch dim")
    have = list(ctx.infos[x].shape[1:])
    if rest.count(-1) == 1 and all(isinstance(d, int) for d in have):
        known = math.prod(d for d in rest if d != -1)
        if known and math.prod(have) % known == 0:
            rest = [math.prod(have) // known if d == -1 else d for d in rest]
    if rest == have:
        # The reshape back of a channel shuffle (or any no-op one): no copy in the engine.
        ctx.same(n.outputs[0], n.inputs[0])
        return
    ctx.emit("reshape", [x], {"shape": rest})


@importer("add", "Add", "Sub")
def add(ctx: Context, n: OnnxNode) -> None:
    a, b = n.inputs[:2]
    if not ctx.is_value(a):
        if n.op_type == "Sub":
            raise Unsupported("constant - tensor is not supported")
        a, b = b, a
    ins = [_x(ctx, OnnxNode(n.op_type, n.name, [a], n.outputs, {}))]
    if ctx.is_value(b):
        if n.op_type == "Sub":
            raise Unsupported("tensor - tensor is not supported (only minus a constant)")
        ins.append(ctx.value(b))
    else:
        c = ctx.need_const(b, "addend")
        if c.dtype.kind != "f":
            raise Unsupported(f"addend '{b}' has dtype {c.dtype}; expected float")
        if n.op_type == "Sub":
            ins.append(ctx.param(np.negative(c, dtype=np.float32), f"{b}.neg"))
        else:
            ins.append(_fparam(ctx, b, "addend"))
    ctx.emit("add", ins)


@importer("concat", "Concat")
def concat(ctx: Context, n: OnnxNode) -> None:
    ins = [ctx.value(v) for v in n.inputs if v]
    ndim = len(ctx.infos[ins[0]].shape)
    axis = int(n.attr("axis"))
    if not -ndim <= axis < ndim:
        raise Unsupported(f"axis {axis} is out of range for {ndim} dims")
    ctx.emit("concat", ins, {"axis": axis % ndim})


@importer("dropout", "Dropout", "Identity")
def dropout(ctx: Context, n: OnnxNode) -> None:
    if n.op_type == "Dropout" and len(n.inputs) > 2 and n.inputs[2]:
        mode = ctx.const(n.inputs[2])
        if mode is None or bool(mode):
            raise Unsupported("training_mode must be a constant false")
    ctx.same(n.outputs[0], n.inputs[0])


# --------------------------------------------------------------------------- QDQ


def _qparams(ctx: Context, n: OnnxNode) -> tuple[float, int, bool]:
    """(scale, zero point as int8, shifted): a uint8 tensor becomes int8 with zp - 128."""
    if n.attr("block_size", 0):
        raise Unsupported("blocked quantization (block_size) is not supported")
    scale = ctx.need_const(n.inputs[1], "scale")
    if scale.size != 1:
        raise Unsupported(f"per-axis scale of shape {list(scale.shape)} on an activation is "
                          "not supported (per tensor only)")
    zp = ctx.const(n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] else None
    if zp is not None and zp.size != 1:
        raise Unsupported(f"per-axis zero point of shape {list(zp.shape)} is not supported")
    dtype = np.dtype(np.uint8) if zp is None else zp.dtype
    out_dtype = n.attr("output_dtype", 0)
    if zp is None and out_dtype:
        dtype = {2: np.dtype(np.uint8), 3: np.dtype(np.int8)}.get(out_dtype, np.dtype(object))
    if dtype not in (np.dtype(np.int8), np.dtype(np.uint8)):
        raise Unsupported(f"zero point type {dtype} is not supported (int8 or uint8)")
    z = 0 if zp is None else int(zp.reshape(-1)[0])
    shifted = dtype == np.uint8
    return float(np.float32(scale.reshape(-1)[0])), z - 128 if shifted else z, shifted


@importer("quantize", "QuantizeLinear")
def quantize(ctx: Context, n: OnnxNode) -> None:
    x = _x(ctx, n)
    scale, zp, shifted = _qparams(ctx, n)
    if ctx.infos[x].dtype != "f32":
        raise Unsupported(f"input has dtype {ctx.infos[x].dtype}; expected f32")
    y = ctx.emit("quantize", [x], {"scale": scale, "zero_point": zp})
    if shifted:
        ctx.shifted.add(y)
    _keep_onnx_shape(ctx, n)


@importer("dequantize", "DequantizeLinear")
def dequantize(ctx: Context, n: OnnxNode) -> None:
    x = _x(ctx, n)
    scale, zp, shifted = _qparams(ctx, n)
    if ctx.infos[x].dtype != "i8" or shifted != (x in ctx.shifted):
        raise Unsupported(f"input '{n.inputs[0]}' must come from a QuantizeLinear of the same "
                          "element type")
    ctx.emit("dequantize", [x], {"scale": scale, "zero_point": zp})
    _keep_onnx_shape(ctx, n)


def _keep_onnx_shape(ctx: Context, n: OnnxNode) -> None:
    # Q and DQ are elementwise: a value whose ONNX shape is not its IR one (the 5-D transpose of
    # a channel shuffle) keeps it across them.
    if n.inputs[0] in ctx.onnx_shapes:
        ctx.onnx_shapes[n.outputs[0]] = ctx.onnx_shapes[n.inputs[0]]
