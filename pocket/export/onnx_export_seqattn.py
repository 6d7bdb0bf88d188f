"""ONNX (opset 17) of the sequence ops that are not one ONNX node each: embedding as Gather,
attention decomposed into MatMul/Softmax (opset 17 has no Attention op). layernorm
(LayerNormalization), matmul (MatMul) and transpose (Transpose) map one to one through their
registry entries."""

from __future__ import annotations

import math

import numpy as np

from pocket.formats import ops


def _embedding(b, n) -> None:
    ids, w = n.inputs
    b.node("Gather", [b.param(w), ids], n.outputs[0], n.name, axis=0)


def _attention(b, n) -> None:
    """softmax(q k^T * scale [+ mask]) v; the causal mask is a constant (L, S) of 0 and -inf
    added to the scores, so a query never sees a later key."""
    q, k, v = n.inputs
    name = n.name
    lq, d = b.infos[q].shape[2:]
    ls = b.infos[k].shape[2]
    scale = n.attrs.get("scale") or 1.0 / math.sqrt(d)
    kt = b.node("Transpose", [k], f"{name}/kT", f"{name}/kT", perm=[0, 1, 3, 2])
    s = b.node("MatMul", [q, kt], f"{name}/qk", f"{name}/qk")
    s = b.node("Mul", [s, b.const(f"{name}.scale", np.float32(scale))], f"{name}/s", f"{name}/s")
    if n.attrs.get("causal", False):
        mask = np.where(np.tril(np.ones((lq, ls), bool)), 0.0, -np.inf).astype(np.float32)
        s = b.node("Add", [s, b.const(f"{name}.causal_mask", mask)], f"{name}/masked",
                   f"{name}/masked")
    p = b.node("Softmax", [s], f"{name}/p", f"{name}/softmax", axis=-1)
    b.node("MatMul", [p, v], n.outputs[0], name)


ops.register_table("onnx_export", {"embedding": _embedding, "attention": _attention})
