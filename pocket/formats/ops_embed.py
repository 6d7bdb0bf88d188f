"""Embedding ops: `l2norm`, the L2 normalisation an embedding model ends with.

    y = x / max(||x||_2, eps)      the norm taken over `axis` (PyTorch's F.normalize)

An embedding model is a backbone, a linear projection to D dims and this op, so its output rows
are unit vectors and the similarity of two samples is their dot product (the cosine). The eps
keeps an all-zero row at zero instead of NaN. int8: the op stays float32 (a division by a
per-row norm has no per-tensor scale to speak of, and it is D values per sample).
"""

from __future__ import annotations

from pocket.formats.opschema import INT8_F32, Attr, Op, Out, infer_unary_f32, need, norm_axis


def _infer_l2norm(node, ins, where: str) -> Out:
    ax = norm_axis(node.attrs["axis"], len(ins[0].shape), where)
    need(ax != 0, where, "l2norm over the batch axis is not supported")
    need(node.attrs["eps"] > 0, where, f"eps must be positive, got {node.attrs['eps']}")
    return infer_unary_f32(node, ins, where)


ENTRIES = [
    Op("l2norm", 1, 1, {"axis": Attr("int", -1), "eps": Attr("float", 1e-12)}, _infer_l2norm,
       "x / max(sqrt(sum(x^2 over axis)), eps)", int8=INT8_F32),
]
