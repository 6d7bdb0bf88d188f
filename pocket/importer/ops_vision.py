"""The importers of the vision ops (formats/ops_vision.py and the clip/silu activations):
MobileNetV2's Clip (relu6), squeeze-and-excitation's Mul, ShuffleNetV2's channel shuffle
(Reshape -> Transpose -> Reshape) and channel split (Slice or Split). SiLU arrives as
Sigmoid + Mul and becomes one op in passes.fold_silu.
"""

from __future__ import annotations

import numpy as np

from pocket.importer.ops_core import _fparam, _x, importer
from pocket.importer.reader import Context, OnnxNode, Unsupported

_F32 = np.finfo(np.float32)


@importer("clip", "Clip")
def clip(ctx: Context, n: OnnxNode) -> None:
    x = _x(ctx, n)
    if ctx.opset < 11:
        lo, hi = n.attr("min", float(_F32.min)), n.attr("max", float(_F32.max))
    else:
        bound = [ctx.const(v) if v else None for v in (n.inputs[1:3] + ["", ""])[:2]]
        for v, b in zip(n.inputs[1:3], bound):
            if v and b is None:
                raise Unsupported(f"bound '{v}' must be a constant")
        lo = float(bound[0]) if bound[0] is not None else float(_F32.min)
        hi = float(bound[1]) if bound[1] is not None else float(_F32.max)
    if not lo <= hi:
        raise Unsupported(f"min {lo:g} > max {hi:g} is not supported")
    ctx.emit("clip", [x], {"min": max(lo, float(_F32.min)), "max": min(hi, float(_F32.max))})


@importer("mul", "Mul")
def mul(ctx: Context, n: OnnxNode) -> None:
    a, b = n.inputs[:2]
    if not ctx.is_value(a):
        a, b = b, a
    x = _x(ctx, OnnxNode(n.op_type, n.name, [a], n.outputs, {}))
    y = ctx.value(b) if ctx.is_value(b) else _fparam(ctx, b, "factor")
    ctx.emit("mul", [x, y])


@importer("channel_shuffle", "Transpose")
def transpose(ctx: Context, n: OnnxNode) -> None:
    """Only the transpose of a channel shuffle: (N, C, H, W) -> Reshape (N, g, C/g, H, W) ->
    Transpose(0, 2, 1, 3, 4); the Reshape back to (N, C, H, W) then changes nothing."""
    x = _x(ctx, n)
    shape = ctx.infos[x].shape
    perm = list(n.attr("perm", reversed(range(len(shape)))))
    if perm == list(range(len(shape))):
        ctx.same(n.outputs[0], n.inputs[0])
        return
    made = _producer(ctx, x)
    # A QDQ model (quantize_static) has a Q/DQ pair on every edge: Reshape -> Q -> DQ -> Transpose.
    chain = []
    while made is not None and made.op in ("quantize", "dequantize"):
        chain.append(made)
        made = _producer(ctx, made.inputs[0])
    src = made.inputs[0] if made is not None and made.op == "reshape" else None
    if (perm != [0, 2, 1, 3, 4] or src is None or len(ctx.infos[src].shape) != 4
            or ctx.infos[src].shape[1] != shape[1] * shape[2]
            or tuple(ctx.infos[src].shape[2:]) != tuple(shape[3:])):
        raise Unsupported(f"perm {perm} on shape {list(shape)}: only the transpose of a channel "
                          "shuffle ((N, g, C/g, H, W), perm 0 2 1 3 4) is supported")
    for q in reversed(chain):
        # The same Q/DQ on the 4-D source: they are elementwise, so the reshape changes nothing.
        v = ctx.emit(q.op, [src], q.attrs, out=f"{n.outputs[0]}/{q.op}", name=f"{n.name}/{q.op}")
        if q.outputs[0] in ctx.shifted:
            ctx.shifted.add(v)
        src = v
    ctx.emit("channel_shuffle", [src], {"groups": int(shape[1])})
    # The ONNX value is 5-D, (N, C/g, g, H, W): what a following Reshape or Shape reads.
    ctx.onnx_shapes[n.outputs[0]] = (shape[0], shape[2], shape[1], *shape[3:])


def _producer(ctx: Context, v: str):
    return next((m for m in reversed(ctx.nodes) if v in m.outputs), None)


def _slice_bounds(size: int, start: int, end: int) -> tuple[int, int]:
    start = start + size if start < 0 else start
    end = end + size if end < 0 else end
    return max(0, min(start, size)), max(0, min(end, size))


@importer("slice", "Slice", "Split")
def slice_(ctx: Context, n: OnnxNode) -> None:
    x = _x(ctx, n)
    shape = ctx.infos[x].shape
    ndim = len(shape)
    if n.op_type == "Split":
        axis = int(n.attr("axis", 0)) % ndim
        size = shape[axis]
        if not isinstance(size, int):
            raise Unsupported("the split axis must have a fixed size")
        outs = [v for v in n.outputs]
        if len(n.inputs) > 1 and n.inputs[1]:
            sizes = [int(s) for s in ctx.need_const(n.inputs[1], "split")]
        elif n.attr("split") is not None:
            sizes = [int(s) for s in n.attr("split")]
        else:
            k = len(outs)
            step = -(-size // k)
            sizes = [min(step, size - i * step) for i in range(k)]
        if sum(sizes) != size or len(sizes) != len(outs):
            raise Unsupported(f"split sizes {sizes} do not cover axis {axis} of size {size}")
        start = 0
        for out, s in zip(outs, sizes):
            ctx.emit("slice", [x], {"axis": axis, "start": start, "end": start + s}, out=out,
                     name=f"{n.name}/{out}")
            start += s
        return
    if len(n.inputs) < 3:
        raise Unsupported("Slice with starts/ends as attributes (opset < 10) is not supported")
    starts = ctx.need_const(n.inputs[1], "starts").reshape(-1)
    ends = ctx.need_const(n.inputs[2], "ends").reshape(-1)
    axes = (ctx.need_const(n.inputs[3], "axes").reshape(-1) if len(n.inputs) > 3 and n.inputs[3]
            else np.arange(len(starts)))
    steps = (ctx.need_const(n.inputs[4], "steps").reshape(-1) if len(n.inputs) > 4 and n.inputs[4]
             else np.ones(len(starts), np.int64))
    cuts = []
    for ax, s, e, st in zip(axes, starts, ends, steps):
        ax = int(ax) % ndim
        size = shape[ax]
        if not isinstance(size, int):
            raise Unsupported(f"axis {ax} must have a fixed size")
        lo, hi = _slice_bounds(size, int(max(min(s, 2**62), -2**62)), int(max(min(e, 2**62), -2**62)))
        if int(st) != 1:
            raise Unsupported(f"step {int(st)} on axis {ax} is not supported (step 1 only)")
        if (lo, hi) != (0, size):
            cuts.append((ax, lo, hi))
    if not cuts:
        ctx.same(n.outputs[0], n.inputs[0])
        return
    if len(cuts) > 1:
        raise Unsupported(f"slicing {len(cuts)} axes at once is not supported (one axis)")
    (ax, lo, hi), = cuts
    if ax == 0:
        raise Unsupported("slicing the batch axis is not supported")
    ctx.emit("slice", [x], {"axis": ax, "start": lo, "end": hi})
