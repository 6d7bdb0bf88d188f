"""The importer of `l2norm` (formats/ops_embed.py): an L2 normalisation as exporters write it.

    pocket's exporter      ReduceL2(keepdims) -> Max(norm, eps) -> Div(x, norm)
    torch F.normalize      ReduceL2(keepdims) -> Clip(min=eps) -> Expand(Shape(x)) -> Div(x, norm)
    by hand                ReduceL2(keepdims) -> Div(x, norm)

The IR has no standalone reduction to an L2 norm (no sqrt op to compose one from), so ReduceL2
imports only as the norm of such a chain. Its node becomes a pending norm (`ctx.partial`): the
walk hands every node that reads it to `_Norm.consume`, which follows the chain to the Div and
emits one l2norm there; any other reader is refused with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pocket.importer.ops_core import _x, importer
from pocket.importer.reader import Context, OnnxNode, Unsupported

# A Div by the bare norm: x / ||x||. The IR's eps must be positive; the smallest normal float32
# changes nothing but an all-zero row, which gives 0 where ONNX gives NaN (0 / 0).
_NO_EPS = float(np.finfo(np.float32).tiny)


@dataclass
class _Norm:
    x: str  # the ONNX value normalised
    axis: int
    eps: float | None = None
    reason: str = ("ReduceL2 is supported only as the norm of an L2 normalisation "
                   "(ReduceL2 -> Max/Clip eps -> [Expand] -> Div)")

    def consume(self, ctx: Context, n: OnnxNode) -> None:
        norm = next(v for v in n.inputs if v in ctx.partial)
        if n.op_type in ("Max", "Clip") and self.eps is None and n.inputs[0] == norm:
            eps = self._eps(ctx, n)
            ctx.partial[n.outputs[0]] = _Norm(self.x, self.axis, eps)
            return
        if n.op_type == "Expand" and n.inputs[0] == norm and self._whole(ctx, n.inputs[1]):
            ctx.partial[n.outputs[0]] = self
            return
        if n.op_type == "Div" and n.inputs[1] == norm and self._same_x(ctx, n.inputs[0]):
            eps = _NO_EPS if self.eps is None else self.eps
            ctx.emit("l2norm", [ctx.value(n.inputs[0])], {"axis": self.axis, "eps": eps})
            return
        raise Unsupported(f"reads the ReduceL2 norm '{norm}': {self.reason}")

    def _eps(self, ctx: Context, n: OnnxNode) -> float:
        if n.op_type == "Max":
            if len(n.inputs) != 2:
                raise Unsupported(f"Max of {len(n.inputs)} inputs: {self.reason}")
            c = ctx.need_const(n.inputs[1], "eps")
            if c.size != 1:
                raise Unsupported(f"Max with a non-scalar eps of shape {list(c.shape)}")
            eps = float(np.ravel(c)[0])
        else:
            lo = ctx.const(n.inputs[1]) if len(n.inputs) > 1 and n.inputs[1] else None
            hi = n.inputs[2] if len(n.inputs) > 2 else ""
            if lo is None or lo.size != 1 or hi:
                raise Unsupported(f"Clip of a ReduceL2 norm needs a constant min (the eps) and "
                                  f"no max: {self.reason}")
            eps = float(np.ravel(lo)[0])
        if not eps > 0:
            raise Unsupported(f"eps {eps:g} must be positive")
        return eps

    def _whole(self, ctx: Context, v: str) -> bool:
        """Whether shape value v is the shape of x (an Expand back to x's shape)."""
        shape = ctx.symvals.get(v, ctx.const(v))
        return shape is not None and list(np.ravel(shape)) == list(ctx.shape(self.x))

    def _same_x(self, ctx: Context, v: str) -> bool:
        return v == self.x or ctx.is_value(v) and ctx.value(v) == ctx.value(self.x)


@importer("l2norm", "ReduceL2")
def reduce_l2(ctx: Context, n: OnnxNode) -> None:
    x = _x(ctx, n)
    ndim = len(ctx.infos[x].shape)
    axes = n.attr("axes")
    if ctx.opset >= 18 and len(n.inputs) > 1 and n.inputs[1]:
        axes = ctx.need_const(n.inputs[1], "axes").tolist()
    if axes is None or len(axes) != 1:
        raise Unsupported(f"axes {axes}: only the norm over one axis is supported (an L2 "
                          "normalisation)")
    axis = int(axes[0])
    if not -ndim <= axis < ndim or axis % ndim == 0:
        raise Unsupported(f"axis {axis} on {ndim} dims: the norm over the batch axis (or out of "
                          "range) is not supported")
    if not n.attr("keepdims", 1):
        raise Unsupported("keepdims=0: only the norm kept for the Div of an L2 normalisation "
                          "is supported")
    ctx.partial[n.outputs[0]] = _Norm(n.inputs[0], axis % ndim)
