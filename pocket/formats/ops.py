"""The op registry: one entry per IR op, and the one place that lists them.

An entry (`Op`) holds what the format itself says about an op: its schema (input count, attrs
with types, defaults and choices, shape inference and validation), whether and how it fuses as
an activation into conv2d/linear (`Fusion`: its code in the engine's `kernels_fp32.activate`,
whether it is non-decreasing so that a maxpool after it commutes), its int8 policy, its ONNX
mapping where that is one ONNX op, and whether it is trainable and traceable.

The stages hang their implementations on the entries by name, in slots (`SLOTS`):

    reference    formats/reference.py   fn(attrs, *inputs, w_scale=None) -> array
    train        train/functional.py    the differentiable forward (its backward beside it)
    trace        train/trace.py         fn(builder, module, prefix, x) -> output value name
    onnx_export  export/onnx_export.py  fn(builder, node) emitting ONNX nodes
    onnx_import  (none yet)
    engine       infer/lowering.py      the builder of the node's bound kernel calls

The core entries are below; an op family lives in a module of its own (`ops_<family>.py`,
written against `opschema`, listing `ENTRIES`) that this module imports into OPS.

`register(slot, name)` raises for a name the registry does not know, so a typo fails at import;
`missing(name)` says which slots an op still lacks (tests/formats/test_registry.py walks every
op with it). Everything else that needs a list of ops (the engine's supported ops, the
exporter's, the fusable activations, the activation codes) derives it from here.

Shape rules take (node, input infos, where) and return [(dtype, shape)] per output; `ir.Graph`
wraps those in ValueInfo. Dims may be symbols; arithmetic on a symbol yields the symbol only
where the dim passes through unchanged. This module imports nothing from `ir`, which imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pocket.formats import ops_embed, ops_seqattn, ops_seqconv, ops_spiking, ops_ssm, ops_vision
from pocket.formats.errors import FormatError
from pocket.formats.opschema import (  # noqa: F401  (re-exported: the stages use ops.X)
    INT8_ATTRS,
    INT8_F32,
    INT8_FUSE,
    INT8_LAYER,
    INT8_PASS,
    INT8_QDQ,
    POOL_ATTRS,
    QDQ_ATTRS,
    SLOTS,
    Attr,
    Dim,
    Fusion,
    Onnx,
    Op,
    Out,
    Shape,
    broadcast,
    check_attr,
    check_groups,
    check_qparams,
    check_weights,
    check_x_dtype,
    conv_out,
    infer_passthrough,
    infer_unary_f32,
    need,
    norm_axis,
    out_dtype,
    prod_dims,
)

# --------------------------------------------------------------------------- shape inference

def _infer_linear(node, ins, where: str) -> Out:
    # (N, ..., in) -> (N, ..., out), over the last axis; int8 too, the leading dims as rows
    x, w = ins[0], ins[1]
    check_x_dtype(node, x, where)
    need(len(x.shape) >= 2, where, f"input must be (N, ..., features), got {list(x.shape)}")
    need(len(w.shape) == 2, where, f"weight must be 2-D [out, in], got {list(w.shape)}")
    need(x.shape[-1] == w.shape[1], where,
         f"input has {x.shape[-1]} features but weight expects {w.shape[1]}")
    check_weights(node, ins, where, w.shape[0])
    return [(out_dtype(node), (*x.shape[:-1], w.shape[0]))]


def _infer_conv2d(node, ins, where: str) -> Out:
    x, w = ins[0], ins[1]
    a = node.attrs
    check_x_dtype(node, x, where)
    need(len(x.shape) == 4, where, f"input must be 4-D (N, C, H, W), got {list(x.shape)}")
    need(len(w.shape) == 4, where, f"weight must be 4-D [O, C/groups, kh, kw], got {list(w.shape)}")
    o = check_groups(node, x, w, where)
    check_weights(node, ins, where, o)
    s, p, d = a["stride"], a["padding"], a["dilation"]
    need(min(s) >= 1 and min(d) >= 1 and min(p) >= 0, where,
         "stride and dilation must be >= 1, padding >= 0")
    ho = conv_out(x.shape[2], w.shape[2], s[0], p[0], d[0], where, "height")
    wo = conv_out(x.shape[3], w.shape[3], s[1], p[1], d[1], where, "width")
    return [(out_dtype(node), (x.shape[0], o, ho, wo))]


def _infer_batchnorm(node, ins, where: str) -> Out:
    x = ins[0]
    need(x.dtype == "f32", where, "batchnorm runs on f32")
    need(len(x.shape) in (2, 4), where, f"input must be (N, C) or (N, C, H, W), got {list(x.shape)}")
    for name, p in zip(node.inputs[1:], ins[1:]):
        need(tuple(p.shape) == (x.shape[1],), where,
             f"'{name}' must have shape [{x.shape[1]}], got {list(p.shape)}")
    return [("f32", x.shape)]


def _infer_pool(node, ins, where: str) -> Out:
    x = ins[0]
    a = node.attrs
    ok = ("f32", "i8") if OPS[node.op].int8 == INT8_PASS else ("f32",)
    need(x.dtype in ok, where, f"{node.op} runs on {' or '.join(ok)}, got {x.dtype}")
    need(len(x.shape) == 4, where, f"input must be 4-D (N, C, H, W), got {list(x.shape)}")
    k = a["kernel"]
    s = a.get("stride") or k
    p = a["padding"]
    need(min(k) >= 1 and min(s) >= 1 and min(p) >= 0, where,
         "kernel and stride must be >= 1, padding >= 0")
    need(p[0] * 2 <= k[0] and p[1] * 2 <= k[1], where, "padding must be at most half the kernel")
    ho = conv_out(x.shape[2], k[0], s[0], p[0], 1, where, "height")
    wo = conv_out(x.shape[3], k[1], s[1], p[1], 1, where, "width")
    return [(x.dtype, (x.shape[0], x.shape[1], ho, wo))]


def _infer_global_avgpool(node, ins, where: str) -> Out:
    x = ins[0]
    need(x.dtype == "f32", where, f"global_avgpool runs on f32, got {x.dtype}")
    need(len(x.shape) == 4, where, f"input must be 4-D (N, C, H, W), got {list(x.shape)}")
    return [("f32", (x.shape[0], x.shape[1], 1, 1))]


def _infer_flatten(node, ins, where: str) -> Out:
    x = ins[0]
    need(len(x.shape) >= 2, where, f"input must have at least 2 dims, got {list(x.shape)}")
    rest = prod_dims(x.shape[1:])
    need(isinstance(rest, int), where, "dims after the batch must be fixed integers")
    return [(x.dtype, (x.shape[0], rest))]


def _infer_reshape(node, ins, where: str) -> Out:
    # `shape` excludes the batch dim, which always passes through; one entry may be -1.
    x = ins[0]
    shape = list(node.attrs["shape"])
    have = prod_dims(x.shape[1:])
    need(isinstance(have, int), where, "dims after the batch must be fixed integers")
    need(shape.count(-1) <= 1 and all(d == -1 or d >= 1 for d in shape), where,
         f"shape {shape} may hold positive sizes and at most one -1")
    known = prod_dims([d for d in shape if d != -1])
    if -1 in shape:
        need(known > 0 and have % known == 0, where, f"cannot reshape {have} values to {shape}")
        shape[shape.index(-1)] = have // known
    need(prod_dims(shape) == have, where, f"cannot reshape {list(x.shape[1:])} to {shape}")
    return [(x.dtype, (x.shape[0], *shape))]


def _infer_add(node, ins, where: str) -> Out:
    a, b = ins
    need(a.dtype == b.dtype == "f32", where, f"add runs on f32, got {a.dtype} and {b.dtype}")
    return [("f32", broadcast(a.shape, b.shape, where))]


def _infer_concat(node, ins, where: str) -> Out:
    first = ins[0]
    ax = norm_axis(node.attrs["axis"], len(first.shape), where)
    need(ax != 0, where, "concat along the batch axis is not supported")
    total = 0
    for name, v in zip(node.inputs, ins):
        need(v.dtype == first.dtype, where, f"'{name}' has dtype {v.dtype}, expected {first.dtype}")
        need(len(v.shape) == len(first.shape) and all(
            i == ax or v.shape[i] == first.shape[i] for i in range(len(v.shape))
        ), where, f"'{name}' shape {list(v.shape)} does not match {list(first.shape)} off axis {ax}")
        need(isinstance(v.shape[ax], int), where, "concat axis must be a fixed size")
        total += v.shape[ax]
    shape = list(first.shape)
    shape[ax] = total
    return [(first.dtype, tuple(shape))]


def _infer_softmax(node, ins, where: str) -> Out:
    norm_axis(node.attrs["axis"], len(ins[0].shape), where)
    return infer_unary_f32(node, ins, where)


def _infer_clip(node, ins, where: str) -> Out:
    a = node.attrs
    need(a["min"] <= a["max"], where, f"min ({a['min']}) must be at most max ({a['max']})")
    return infer_unary_f32(node, ins, where)


def _infer_quantize(node, ins, where: str) -> Out:
    need(ins[0].dtype == "f32", where, f"quantize reads f32, got {ins[0].dtype}")
    check_qparams(node.attrs, "", where)
    return [("i8", ins[0].shape)]


def _infer_dequantize(node, ins, where: str) -> Out:
    need(ins[0].dtype == "i8", where, f"dequantize reads i8, got {ins[0].dtype}")
    check_qparams(node.attrs, "", where)
    return [("f32", ins[0].shape)]


def _infer_lut(node, ins, where: str) -> Out:
    need(ins[0].dtype == "i8", where, f"lut reads i8 codes, got {ins[0].dtype}")
    need(ins[1].dtype == "i8" and tuple(ins[1].shape) == (256,), where,
         f"the table must be 256 int8 codes, got {ins[1].dtype} {list(ins[1].shape)}")
    return [("i8", ins[0].shape)]


# --------------------------------------------------------------------------- the entries


_ACTIVATIONS = [
    Op("relu", 1, 1, {}, infer_unary_f32, "max(x, 0); NaN stays NaN",
       Fusion(1, True), INT8_FUSE, Onnx("Relu")),
    Op("leaky_relu", 1, 1, {"alpha": Attr("float", 0.01)}, infer_unary_f32,
       "x if x >= 0 else alpha * x", Fusion(2, True, ("alpha",)), INT8_F32,
       Onnx("LeakyRelu", from_attrs={"alpha": "alpha"})),
    Op("sigmoid", 1, 1, {}, infer_unary_f32, "1 / (1 + exp(-x))", Fusion(3, True), INT8_F32,
       Onnx("Sigmoid")),
    Op("tanh", 1, 1, {}, infer_unary_f32, "", Fusion(4, True), INT8_F32, Onnx("Tanh")),
    Op("gelu", 1, 1, {"approximate": Attr("str", "none", ("none", "tanh"))}, infer_unary_f32,
       "x * Phi(x) (erf), or its tanh approximation; only the erf form fuses",
       Fusion(5, False, variant_codes={"gelu_tanh": 6}), INT8_F32),
    Op("hardswish", 1, 1, {}, infer_unary_f32, "x * relu6(x + 3) / 6 (PyTorch's hardswish)",
       Fusion(7, False), INT8_F32, Onnx("HardSwish")),
    Op("hardsigmoid", 1, 1, {}, infer_unary_f32, "relu6(x + 3) / 6 (PyTorch's hardsigmoid)",
       Fusion(8, True), INT8_F32, Onnx("HardSigmoid", {"alpha": 1.0 / 6.0, "beta": 0.5})),
    # relu6 is clip(0, 6). It fuses (relu6, ReLU-N) only with min at its default 0: the engine's
    # epilogues carry one activation parameter, here max; an int8 layer clamps its codes to
    # [y_zero_point, quantize(max)]. Any other min stays a node of its own.
    Op("clip", 1, 1, {"min": Attr("float", 0.0), "max": Attr("float", 6.0)}, _infer_clip,
       "min(max(x, min), max); NaN stays NaN", Fusion(9, True, ("max",)), INT8_FUSE),
    Op("silu", 1, 1, {}, infer_unary_f32, "x * sigmoid(x) (swish; Ramachandran et al., 2017)",
       Fusion(10, False), INT8_F32),
]
# What conv2d/linear's `activation` attr may hold.
FUSED = ("none", *(op.name for op in _ACTIVATIONS))
# alpha: leaky_relu's slope; max: a fused clip's upper bound (set where clip fuses; 6 if absent)
_LAYER = {"activation": Attr("str", "none", FUSED), "alpha": Attr("float", 0.01),
          "max": Attr("float", None), **INT8_ATTRS}

OPS: dict[str, Op] = {
    op.name: op
    for op in [
        Op("linear", 2, 3, dict(_LAYER), _infer_linear,
           "y = x @ weight.T + bias, then the fused activation", int8=INT8_LAYER),
        Op("conv2d", 2, 3, {"stride": Attr("ints2", [1, 1]), "padding": Attr("ints2", [0, 0]),
                            "dilation": Attr("ints2", [1, 1]), "groups": Attr("int", 1),
                            **_LAYER}, _infer_conv2d,
           "grouped 2-D cross-correlation with zero padding, then the fused activation",
           int8=INT8_LAYER),
        Op("batchnorm", 5, 5, {"eps": Attr("float", 1e-5)}, _infer_batchnorm,
           "inputs x, gamma, beta, running_mean, running_var; normalizes over axis 1"),
        *_ACTIVATIONS,
        Op("maxpool2d", 1, 1, dict(POOL_ATTRS), _infer_pool,
           "padding counts as -inf; stride defaults to the kernel", int8=INT8_PASS),
        Op("avgpool2d", 1, 1, {**POOL_ATTRS, "count_include_pad": Attr("bool", True)}, _infer_pool),
        Op("global_avgpool", 1, 1, {}, _infer_global_avgpool, "(N, C, H, W) -> (N, C, 1, 1)",
           onnx=Onnx("GlobalAveragePool")),
        Op("flatten", 1, 1, {}, _infer_flatten, "(N, ...) -> (N, prod(...))", int8=INT8_PASS,
           onnx=Onnx("Flatten", {"axis": 1})),
        Op("reshape", 1, 1, {"shape": Attr("ints")}, _infer_reshape,
           "shape excludes the batch dim, which passes through", int8=INT8_PASS,
           traceable=False),
        # add comes out of ResidualBlock's tracer, not a layer of its own
        Op("add", 2, 2, {}, _infer_add, "elementwise with NumPy broadcasting", onnx=Onnx("Add"),
           traceable=False),
        Op("concat", 1, 64, {"axis": Attr("int", 1)}, _infer_concat,
           onnx=Onnx("Concat", from_attrs={"axis": "axis"}), traceable=False),
        Op("dropout", 1, 1, {"p": Attr("float", 0.5)}, infer_passthrough,
           "identity at inference", int8=INT8_PASS, onnx=Onnx("Identity")),
        Op("softmax", 1, 1, {"axis": Attr("int", -1)}, _infer_softmax,
           onnx=Onnx("Softmax", from_attrs={"axis": "axis"})),
        Op("quantize", 1, 1, dict(QDQ_ATTRS), _infer_quantize,
           "q = clip(round_half_even(x / scale) + zero_point, -128, 127)", int8=INT8_QDQ,
           trainable=False, traceable=False),
        Op("dequantize", 1, 1, dict(QDQ_ATTRS), _infer_dequantize, "x = (q - zero_point) * scale",
           int8=INT8_QDQ, trainable=False, traceable=False),
        # The importer's quantize(f(dequantize(q))) for an elementwise f of one int8 value (a
        # QDQ SiLU, sigmoid, hardswish...): f over all 256 codes, as onnxruntime's QLinear
        # lookup tables do
        Op("lut", 2, 2, {}, _infer_lut, "y = table[x + 128] (int8 codes in and out)",
           int8=INT8_QDQ, trainable=False, traceable=False),
    ]
}


# Op families live in modules of their own (`ops_<family>.py`, written against opschema alone),
# each listing its entries in ENTRIES: import the module here and name it in _FAMILIES.
_FAMILIES: tuple = (ops_vision, ops_seqconv, ops_seqattn, ops_ssm, ops_spiking, ops_embed)
for _family in _FAMILIES:
    for _op in _family.ENTRIES:
        if _op.name in OPS:
            raise ValueError(f"op {_op.name!r} of {_family.__name__} is already in the registry")
        OPS[_op.name] = _op
    # a family layer that fuses activations (FUSES) takes conv2d/linear's attrs for them
    for _name in getattr(_family, "FUSES", ()):
        OPS[_name].attrs.update(_LAYER)


# --------------------------------------------------------------------------- registration


def _entry(name: str) -> Op:
    op = OPS.get(name)
    if op is None:
        raise KeyError(f"unknown op {name!r}; the registry (pocket/formats/ops.py) knows "
                       f"{', '.join(OPS)}")
    return op


def _same(a, b) -> bool:
    # A module imported twice (a test reloading it) registers an equal function again.
    return a is b or (getattr(a, "__module__", None), getattr(a, "__qualname__", None)) == (
        getattr(b, "__module__", 0), getattr(b, "__qualname__", 0))


def register(slot: str, name: str) -> Callable:
    """Decorator: `fn` is op `name`'s implementation in `slot`; an unknown op raises."""
    if slot not in SLOTS:
        raise ValueError(f"unknown slot {slot!r}; slots are {', '.join(SLOTS)}")
    op = _entry(name)

    def deco(fn):
        old = op.impls.get(slot)
        if old is not None and not _same(old, fn):
            raise ValueError(f"op {name!r} already has a {slot} implementation ({old!r})")
        op.impls[slot] = fn
        return fn

    return deco


def register_table(slot: str, table: Mapping[str, Any]) -> dict[str, Any]:
    """Register every {op name: implementation} of a dispatch table; returns it as a dict."""
    for name, fn in table.items():
        register(slot, name)(fn)
    return dict(table)


def impl(slot: str, name: str):
    """Op `name`'s implementation in `slot`; a KeyError naming both when there is none."""
    fn = _entry(name).impls.get(slot)
    if fn is None:
        raise KeyError(f"op {name!r} has no {slot} implementation")
    return fn


def implementations(slot: str) -> dict[str, Any]:
    return {name: op.impls[slot] for name, op in OPS.items() if slot in op.impls}


def required_slots(name: str) -> tuple[str, ...]:
    op = _entry(name)
    return tuple(s for s in SLOTS if s in ("reference", "onnx_export", "engine")
                 or (s == "train" and op.trainable) or (s == "trace" and op.traceable))


def missing(name: str) -> list[str]:
    """The slots op `name` needs but nothing has registered (import the stages first)."""
    return [s for s in required_slots(name) if s not in _entry(name).impls]


# --------------------------------------------------------------------------- derived views


def activations() -> tuple[str, ...]:
    """The ops that fuse into conv2d/linear as their `activation`."""
    return tuple(n for n, op in OPS.items() if op.fusion is not None)


def with_int8(policy: str) -> tuple[str, ...]:
    return tuple(n for n, op in OPS.items() if op.int8 == policy)


def activation_codes() -> dict[str, int]:
    """kernels_fp32.ACT: activation name (or variant) -> its code in kernels_fp32.activate."""
    out = {"none": 0}
    for n, op in OPS.items():
        if op.fusion is not None:
            out[n] = op.fusion.code
            out.update(op.fusion.variant_codes)
    return out


def monotone_codes() -> tuple[int, ...]:
    """The activation codes that are non-decreasing (none included): a maxpool commutes."""
    return (0, *(op.fusion.code for op in OPS.values() if op.fusion and op.fusion.monotone))


def fusable(node) -> bool:
    """Whether this activation node can move into the conv2d/linear before it."""
    op = OPS.get(node.op)
    if op is None or op.fusion is None:
        return False
    return all(node.attrs.get(k, spec.default) == spec.default
               for k, spec in op.attrs.items() if k not in op.fusion.attrs)


def fused_attrs(node) -> dict[str, Any]:
    """The attrs an activation node leaves on the layer it fuses into."""
    return {"activation": node.op, **{k: node.attrs[k] for k in OPS[node.op].fusion.attrs}}


def int8_fuses(activation: str) -> bool:
    """Whether an int8 conv2d/linear can carry this fused activation."""
    return activation == "none" or OPS[activation].int8 == INT8_FUSE


# --------------------------------------------------------------------------- attrs of a node


def normalize_attrs(node, where: str) -> dict[str, Any]:
    """Check a node's attrs against its schema and fill in defaults."""
    schema = OPS[node.op]
    unknown = sorted(set(node.attrs) - set(schema.attrs))
    if unknown:
        raise FormatError(f"{where}: unknown attribute(s) {', '.join(unknown)}; "
                          f"{node.op} takes {', '.join(schema.attrs) or 'none'}")
    out = {}
    for name, spec in schema.attrs.items():
        if name in node.attrs and node.attrs[name] is not None:
            out[name] = check_attr(where, name, spec, node.attrs[name])
        elif spec.required:
            raise FormatError(f"{where}: missing required attribute '{name}'")
        elif spec.default is not None:
            out[name] = list(spec.default) if isinstance(spec.default, list) else spec.default
    if "x_scale" in out:
        check_qparams(out, "x_", where)
        if "y_scale" in out or "y_zero_point" in out:
            check_qparams(out, "y_", where)
        if not int8_fuses(out.get("activation", "none")):
            raise FormatError(f"{where}: an int8 node can fuse only "
                              f"{', '.join(with_int8(INT8_FUSE))}, not {out['activation']}")
    elif any(k in out for k in ("x_zero_point", "y_scale", "y_zero_point")):
        raise FormatError(f"{where}: int8 attributes need 'x_scale' and 'x_zero_point'")
    return out
