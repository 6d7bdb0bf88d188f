"""Sequence and attention ops: layernorm, embedding, matmul, transpose, attention.

Values are (N, L, D) sequences or (N, H, L, D) heads; the batch is always axis 0. int8: all
five stay f32 (layernorm and attention's softmax lose too much at 8 bits with one scale per
tensor; embedding is a lookup; matmul/transpose only appear between attention's parts). A
sequence model's int8 export quantizes its linears, over (N, L, in) too (export/quantize.py).
"""

from __future__ import annotations

from pocket.formats.opschema import (
    Attr,
    Onnx,
    Op,
    Out,
    broadcast,
    need,
    norm_axis,
)


def _infer_layernorm(node, ins, where: str) -> Out:
    x, w, b = ins
    need(x.dtype == "f32", where, f"layernorm runs on f32, got {x.dtype}")
    ax = norm_axis(node.attrs["axis"], len(x.shape), where)
    need(ax >= 1, where, "layernorm cannot normalise over the batch axis")
    norm = tuple(x.shape[ax:])
    for name, p in zip(node.inputs[1:], (w, b)):
        need(p.dtype == "f32" and tuple(p.shape) == norm, where,
             f"'{name}' must be f32 of shape {list(norm)} (the normalised dims), got "
             f"{p.dtype} {list(p.shape)}")
    need(node.attrs["eps"] > 0, where, "eps must be positive")
    return [("f32", x.shape)]


def _infer_embedding(node, ins, where: str) -> Out:
    ids, w = ins
    need(ids.dtype in ("i64", "i32"), where,
         f"embedding ids '{node.inputs[0]}' must be i64 or i32, got {ids.dtype}")
    need(w.dtype == "f32" and len(w.shape) == 2, where,
         f"embedding weight '{node.inputs[1]}' must be f32 (V, D), got {w.dtype} {list(w.shape)}")
    return [("f32", (*ids.shape, w.shape[1]))]


def _infer_matmul(node, ins, where: str) -> Out:
    a, b = ins
    need(a.dtype == b.dtype == "f32", where, f"matmul runs on f32, got {a.dtype} and {b.dtype}")
    need(len(a.shape) >= 2 and len(b.shape) >= 2, where,
         f"matmul needs inputs of rank >= 2, got {list(a.shape)} and {list(b.shape)}")
    need(a.shape[-1] == b.shape[-2], where,
         f"matmul: {list(a.shape)} @ {list(b.shape)}: inner dims {a.shape[-1]} and "
         f"{b.shape[-2]} differ")
    lead = broadcast(a.shape[:-2], b.shape[:-2], where)
    return [("f32", (*lead, a.shape[-2], b.shape[-1]))]


def _infer_transpose(node, ins, where: str) -> Out:
    x = ins[0]
    perm = list(node.attrs["perm"])
    need(sorted(perm) == list(range(len(x.shape))), where,
         f"perm {perm} must be a permutation of 0..{len(x.shape) - 1}")
    need(perm[0] == 0, where, f"perm {perm} must keep the batch axis first")
    need(x.dtype == "f32", where, f"transpose runs on f32, got {x.dtype}")
    return [("f32", tuple(x.shape[p] for p in perm))]


def _infer_attention(node, ins, where: str) -> Out:
    q, k, v = ins
    need(q.dtype == k.dtype == v.dtype == "f32", where, "attention runs on f32")
    need(len(q.shape) == len(k.shape) == len(v.shape) == 4, where,
         f"q, k, v must be 4-D (N, H, L, D), got {list(q.shape)}, {list(k.shape)}, "
         f"{list(v.shape)}")
    need(tuple(q.shape[1:2]) == tuple(k.shape[1:2]) == tuple(v.shape[1:2]), where,
         "q, k and v must have the same number of heads")
    need(q.shape[3] == k.shape[3], where, f"q and k must share D, got {q.shape[3]} and {k.shape[3]}")
    need(k.shape[2] == v.shape[2], where,
         f"k and v must share the length, got {k.shape[2]} and {v.shape[2]}")
    s = node.attrs.get("scale")
    need(s is None or s > 0, where, "scale must be positive")
    return [("f32", (q.shape[0], q.shape[1], q.shape[2], v.shape[3]))]


ENTRIES = [
    Op("layernorm", 3, 3, {"axis": Attr("int", -1), "eps": Attr("float", 1e-5)}, _infer_layernorm,
       "inputs x, weight, bias; normalises over dims axis..end (Ba et al., 2016)",
       onnx=Onnx("LayerNormalization", from_attrs={"axis": "axis", "epsilon": "eps"})),
    Op("embedding", 2, 2, {}, _infer_embedding,
       "inputs ids (integer, any shape) and weight (V, D) -> ids.shape + (D,); an id outside "
       "[0, V) is an error"),
    Op("matmul", 2, 2, {}, _infer_matmul, "a @ b, NumPy broadcasting over the leading dims",
       onnx=Onnx("MatMul"), traceable=False),
    Op("transpose", 1, 1, {"perm": Attr("ints")}, _infer_transpose,
       "permute the axes (perm names every axis; the batch stays 0)",
       onnx=Onnx("Transpose", from_attrs={"perm": "perm"}), traceable=False),
    # attention comes out of MultiheadAttention's tracer, not a layer of its own
    Op("attention", 3, 3, {"causal": Attr("bool", False), "scale": Attr("float", None)},
       _infer_attention,
       "q, k, v (N, H, L, D) -> softmax(q k^T * scale [+ causal mask]) v; scale defaults to "
       "1/sqrt(D); causal masks key j > query i", traceable=False),
]
