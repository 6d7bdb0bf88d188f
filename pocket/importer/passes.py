"""IR rewrites the importer runs after the walk, around the exporter's own (export/transforms.py).

    fold_bias_add   linear/conv2d without a bias, then Add of a constant -> the bias
                    (MatMul + Add is how many exporters write a Linear)
    (export's optimize: drop_dropout, fold_batchnorm, fuse_activations, remove_dead)
    int8_layers     QDQ -> int8 ops, as onnxruntime fuses them into integer kernels:
                    dequantize -> conv2d/linear (weights from DequantizeLinear of int8) [relu]
                    [-> quantize] becomes one int8 layer with the file's own integers, scales and
                    zero points; quantize(maxpool2d/flatten/reshape(dequantize(q))) with equal
                    qparams on both sides becomes the op on q (max commutes with a monotone
                    quantizer); quantize(dequantize(q)) with equal qparams becomes q.

Each returns (graph, params, count) like the exporter's transforms; int8_layers also returns the
weights' quantization parameters for the container.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import numpy as np

from pocket.export.transforms import Rewrite, _bypass, _finish, _fresh, _sole_reader, consumers, producers
from pocket.formats import ops
from pocket.formats import quant as Q
from pocket.formats.ir import Graph
from pocket.importer.reader import QConst


def fold_bias_add(graph: Graph, params: Mapping[str, np.ndarray]) -> Rewrite:
    g = copy.deepcopy(graph)
    params = dict(params)
    uses, made = consumers(g), producers(g)
    count = 0
    for add in [n for n in g.nodes if n.op == "add"]:
        x, c = add.inputs
        if x in g.params:
            x, c = c, x
        prod = made.get(x)
        if (c not in g.params or prod is None or prod.op not in ("linear", "conv2d")
                or len(prod.inputs) != 2 or prod.attrs.get("activation", "none") != "none"
                or _sole_reader(g, uses, x) is not add):
            continue
        o = params[prod.inputs[1]].shape[0]
        ok = ((o,), (1, o)) if prod.op == "linear" else ((o, 1, 1), (1, o, 1, 1))
        if tuple(params[c].shape) not in ok or params[c].dtype != np.float32:
            continue
        b = _fresh(f"{prod.name}.bias", params)
        params[b] = np.ascontiguousarray(params[c].reshape(o))
        g.params[b] = None
        prod.inputs = [*prod.inputs, b]
        prod.outputs = list(add.outputs)
        g.nodes.remove(add)
        count += 1
    g.params = {n: v for n, v in g.params.items() if any(n in m.inputs for m in g.nodes)}
    return _finish(g, params, count)


def fold_silu(graph: Graph, params: Mapping[str, np.ndarray]) -> Rewrite:
    """mul(x, sigmoid(x)) -> silu(x): how exporters write SiLU (swish) at opset 17."""
    g = copy.deepcopy(graph)
    uses, made = consumers(g), producers(g)
    count = 0
    for m in [n for n in g.nodes if n.op == "mul"]:
        for x, s in (m.inputs, m.inputs[::-1]):
            sig = made.get(s)
            if (sig is not None and sig.op == "sigmoid" and sig.inputs[0] == x
                    and _sole_reader(g, uses, s) is m):
                g.nodes.remove(sig)
                m.op, m.inputs, m.attrs = "silu", [x], {}
                count += 1
                break
    return _finish(g, params, count)


def _same_qp(a: Mapping, b: Mapping) -> bool:
    return np.float32(a["scale"]) == np.float32(b["scale"]) and a["zero_point"] == b["zero_point"]


def _int8_weight(w: np.ndarray, qc: QConst | None) -> tuple[np.ndarray, np.ndarray] | None:
    """(w_q, per-channel scale) if w is exactly the symmetric int8 tensor qc dequantized."""
    if (qc is None or qc.q.dtype != np.int8 or np.any(qc.zero_point != 0)
            or qc.axis not in (None, 0) or qc.q.shape != w.shape):
        return None
    o = w.shape[0]
    scale = np.broadcast_to(np.asarray(qc.scale, np.float32).reshape(-1), (o,)).copy()
    if qc.scale.size not in (1, o) or not np.array_equal(Q.dequantize_weights(qc.q, scale), w):
        return None
    if np.any(qc.q == -128):
        return None  # pocket's weights are symmetric in [-127, 127]
    return qc.q, scale


def int8_layers(graph: Graph, params: Mapping[str, np.ndarray], qconsts: Mapping[str, QConst]):
    g = copy.deepcopy(graph)
    params = dict(params)
    quant: dict[str, dict] = {}
    count = 0
    passes = ops.with_int8(ops.INT8_PASS)
    changed = True
    while changed:
        changed = False
        uses, made = consumers(g), producers(g)
        for qn in [n for n in g.nodes if n.op == "quantize"]:
            mid = made.get(qn.inputs[0])
            if mid is None or _sole_reader(g, uses, qn.inputs[0]) is not qn:
                continue
            if mid.op == "dequantize" and _same_qp(mid.attrs, qn.attrs):
                # quantize(dequantize(q)) == q: the readers of the requantized value read q.
                qn.op, qn.attrs = "dropout", {"p": 0.0}
                qn.inputs = [mid.inputs[0]]
                if _bypass(g, qn):
                    count += 1
                    changed = True
                    break
                continue
            if mid.op not in passes:
                continue
            dq = made.get(mid.inputs[0])
            # NOTE: the dequantize may have other readers (a Split's slices): it stays for them.
            if dq is None or dq.op != "dequantize" or not _same_qp(dq.attrs, qn.attrs):
                continue
            mid.inputs = [dq.inputs[0], *mid.inputs[1:]]
            mid.outputs = list(qn.outputs)
            g.nodes.remove(qn)
            count += 1
            changed = True
            break
    uses, made = consumers(g), producers(g)
    infos = g.validate()
    for layer in [n for n in g.nodes if n.op in ops.with_int8(ops.INT8_LAYER)]:
        a = layer.attrs
        dq = made.get(layer.inputs[0])
        if ("x_scale" in a or dq is None or dq.op != "dequantize"
                or not ops.int8_fuses(a.get("activation", "none"))
                or layer.op == "linear" and len(infos[layer.inputs[0]].shape) != 2):
            continue  # an int8 linear takes (N, features): an N-D one stays float
        w_name = layer.inputs[1]
        wq = _int8_weight(params[w_name], qconsts.get(w_name))
        if wq is None:
            continue
        w_q, w_scale = wq
        x_scale, x_zp = dq.attrs["scale"], dq.attrs["zero_point"]
        inputs = [dq.inputs[0], _fresh(f"{w_name}_q", params)]
        params[inputs[1]] = w_q
        quant[inputs[1]] = {"scale": w_scale.tolist(), "zero_point": [0] * len(w_scale),
                            "axis": 0}
        if len(layer.inputs) > 2:
            b_name = layer.inputs[2]
            b = _int8_bias(params[b_name], qconsts.get(b_name), x_scale, w_scale)
            inputs.append(_fresh(f"{b_name}_q", params))
            params[inputs[2]] = b
        new = dict(a, x_scale=x_scale, x_zero_point=x_zp)
        out = layer.outputs[0]
        qn = _sole_reader(g, uses, out)
        if qn is not None and qn.op == "quantize":
            new.update(y_scale=qn.attrs["scale"], y_zero_point=qn.attrs["zero_point"])
            layer.outputs = list(qn.outputs)
            g.nodes.remove(qn)
        layer.inputs, layer.attrs = inputs, new
        g.params.update({v: None for v in inputs[1:]})
        count += 1
    g.params = {n: v for n, v in g.params.items() if any(n in m.inputs for m in g.nodes)}
    rw = _finish(g, params, count)
    return rw.graph, rw.params, {k: v for k, v in quant.items() if k in rw.params}, rw.count


def _int8_bias(b: np.ndarray, qc: QConst | None, x_scale: float,
               w_scale: np.ndarray) -> np.ndarray:
    """The file's int32 bias when its scale is x_scale * w_scale (as QDQ asks), else pocket's
    own quantization of the float bias."""
    want = np.float64(x_scale) * w_scale.astype(np.float64)
    if (qc is not None and qc.q.dtype == np.int32 and not np.any(qc.zero_point != 0)
            and qc.q.shape == b.shape and qc.scale.size in (1, b.size)):
        s = np.broadcast_to(qc.scale.astype(np.float64), b.shape)
        if np.all(np.abs(s - want) <= 1e-6 * want):
            return np.ascontiguousarray(qc.q)
    return Q.quantize_bias(b, x_scale, w_scale)
