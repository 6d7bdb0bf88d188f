"""IR rewrites the importer runs after the walk, around the exporter's own (export/transforms.py).

    fold_bias_add   linear/conv2d without a bias, then Add of a constant -> the bias
                    (MatMul + Add is how many exporters write a Linear)
    (export's optimize: drop_dropout, fold_batchnorm, fuse_activations, remove_dead)
    int8_luts       quantize(f(dequantize(q))), f elementwise over the one int8 value q (a QDQ
                    sigmoid, SiLU, hardswish...) -> lut(q, f over all 256 codes)
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
from pocket.formats import (
    ops,
    reference,  # noqa: F401  (fills the reference slot int8_luts evaluates)
)
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


# The float ops a lookup table may absorb: the activations, and add/mul whose other input is
# a scalar constant or a function of the same int8 value (x * sigmoid(x))
_LUT_BINARY = ("add", "mul")
_CODES = np.arange(-128, 128, dtype=np.int8)


def int8_luts(graph: Graph, params: Mapping[str, np.ndarray]) -> Rewrite:
    """Each quantize whose float input is an elementwise function of one int8 value q becomes
    lut(q, table): the function on all 256 codes through the reference ops, quantized as the
    graph quantizes it. The float nodes in between go once nothing else reads them. Run after
    int8_layers, so the layers' int8 outputs are the sources."""
    g = copy.deepcopy(graph)
    params = dict(params)
    made = producers(g)
    unary = set(ops.activations()) | {"dropout"}
    impl = ops.implementations("reference")

    def codes(v: str):
        """(source, codes): int8 value v as a function of the codes of an int8 source."""
        p = made.get(v)
        if p is not None and p.op == "lut":
            src, c = codes(p.inputs[0])
            return src, params[p.inputs[1]][c.astype(np.int16) + 128]
        if p is not None and p.op == "quantize":
            r = floats(p.inputs[0])
            if r is not None:
                return r[0], impl["quantize"](p.attrs, r[1])
        return v, _CODES

    def floats(v: str):
        """(source, values) of float value v over the source's 256 codes, or None."""
        p = made.get(v)
        if p is None:
            return None
        if p.op == "dequantize":
            src, c = codes(p.inputs[0])
            return src, impl["dequantize"](p.attrs, c)
        if p.op in unary and len(p.inputs) == 1:
            r = floats(p.inputs[0])
            return None if r is None else (r[0], impl[p.op](p.attrs, r[1]))
        if p.op in _LUT_BINARY:
            srcs, args = set(), []
            for x in p.inputs:
                if x in g.params:
                    if params[x].size != 1 or params[x].dtype != np.float32:
                        return None
                    args.append(params[x].reshape(()))
                    continue
                r = floats(x)
                if r is None:
                    return None
                srcs.add(r[0])
                args.append(r[1])
            if len(srcs) != 1:
                return None
            return srcs.pop(), impl[p.op](p.attrs, *args).astype(np.float32)
        return None

    count = 0
    for qn in [n for n in g.nodes if n.op == "quantize"]:
        p = made.get(qn.inputs[0])
        if p is None or p.op == "dequantize":
            continue  # a requantization alone: int8_layers' business, or a float input
        r = floats(qn.inputs[0])
        if r is None:
            continue
        src, table = r[0], impl["quantize"](qn.attrs, r[1])
        t = _fresh(f"{qn.name}.table", params)
        params[t] = np.ascontiguousarray(table, np.int8)
        g.params[t] = None
        qn.op, qn.inputs, qn.attrs = "lut", [src, t], {}
        made = producers(g)
        count += 1
    return _finish(g, params, count)
