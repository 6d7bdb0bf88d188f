"""fp32 graph -> int8 graph (DESIGN §6), with the arithmetic of `pocket.formats.quant`.

1. Calibrate: run the fp32 graph once through the reference interpreter on the calibration
   samples, in chunks, and take each value's range from that pass (`pocket.export.calibrate`:
   min/max, a percentile, or the MSE- or entropy-optimal clip).
2. Plan: every int8 layer op (conv2d/linear, by their int8 policy in `pocket.formats.ops`)
   whose fused activation is none or one that fuses into int8 (relu) is a candidate. A value is
   kept in int8 when every reader consumes int8 (an int8 layer, or an op that passes int8
   through, such as maxpool2d / flatten / reshape / dropout, whose own output is kept in int8)
   and it is not a graph output; an int8 layer then writes int8 (`y_scale`) and everything
   else reads f32 (an int8 layer without `y_scale` writes f32 itself, so no separate
   dequantize is needed on those edges).
3. Guard: quantize each candidate alone (its input quantized, its output requantized when the
   plan says so) and compare with the fp32 layer on the calibration samples. A layer whose error
   exceeds `max_layer_error` stays fp32; the plan is then made again without it.
4. Build: `quantize` nodes where an f32 value feeds int8, int8 weights (symmetric per output
   channel), int32 biases, and the qparams in the node attrs.

The layer error is the relative RMS error per output channel, averaged in quadrature over the
channels: sqrt(mean_c(sum_c (y_q - y)^2 / sum_c y^2)). Per channel, because activations are
quantized per tensor: one channel with a huge range flattens every other channel to a few
levels while barely moving a whole-tensor SQNR. A channel whose signal is under 1% of the median
channel power is measured against that 1% floor, so a dead ReLU channel cannot dominate (the
median, not the mean, so that the outlier channel does not lift the floor over the others).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from pocket.export.calibrate import (
    DEFAULT_PERCENTILE,
    RUN_BATCH,
    Pass,
    batches,
    check_method,
    run_pass,
)
from pocket.export.transforms import DTYPE_NAMES, consumers
from pocket.formats import ops, reference
from pocket.formats import quant as Q
from pocket.formats.ir import Graph, Node, ValueInfo

LAYERS = ops.with_int8(ops.INT8_LAYER)
# Ops whose weight (input 1) goes int8, symmetric per output channel, while they read and write
# f32: lif (ops_spiking), whose inputs are 0/1 spikes and whose membrane stays f32.
WEIGHT_ONLY = ("lif",)
PASSTHROUGH = ops.with_int8(ops.INT8_PASS)
DEFAULT_CALIB_SAMPLES = 256
DEFAULT_MAX_LAYER_ERROR = 0.2  # relative RMS error per channel (about 14 dB)
CHANNEL_FLOOR = 0.01


@dataclass
class Quantized:
    graph: Graph
    params: dict[str, np.ndarray]
    quant: dict[str, dict]
    layers: list[dict] = field(default_factory=list)   # one per conv2d/linear, in graph order
    weights: list[dict] = field(default_factory=list)  # error of each int8 weight tensor
    calib: Pass | None = None                          # the fp32 pass it was calibrated on
    ranges: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    errors: dict[str, dict] = field(default_factory=dict)  # each candidate layer alone

    @property
    def layers_fp32(self) -> list[str]:
        return [r["name"] for r in self.layers if not r["int8"]]


# --------------------------------------------------------------------------- calibration


def calibrate(graph: Graph, params: Mapping[str, np.ndarray], x: np.ndarray, *,
              method: str = "minmax", percentile: float = DEFAULT_PERCENTILE
              ) -> dict[str, tuple[float, float]]:
    """value name -> (lo, hi) over the calibration samples, for every f32 value of the graph."""
    check_method(method)
    return run_pass(graph, params, x, subsample=method != "minmax").ranges(method, percentile)


class _Ranges(dict):
    """Clipping ranges computed on first use: the histogram methods cost ~10 ms a value, and
    only the values that get quantized need one."""

    def __init__(self, p: Pass, method: str, percentile: float):
        super().__init__()
        self.p, self.method, self.percentile = p, method, percentile

    def __missing__(self, v: str) -> tuple[float, float]:
        self[v] = r = self.p.range(v, self.method, self.percentile)
        return r


def layer_values(graph: Graph) -> set[str]:
    """The inputs and outputs of the int8 layer ops: what the guard reads from the pass."""
    return {v for n in graph.nodes if n.op in LAYERS for v in (n.inputs[0], n.outputs[0])}


# --------------------------------------------------------------------------- planning


@dataclass
class _Plan:
    int8: set[str]                        # names of the int8 layer nodes
    native_i8: dict[str, tuple[float, int]]  # value -> the qparams it is stored with


def _plan(graph: Graph, int8: set[str], ranges) -> _Plan:
    uses = consumers(graph)
    wants: dict[str, bool] = {}
    for node in reversed(graph.nodes):
        for v in node.outputs:
            readers = uses.get(v, [])
            wants[v] = v not in graph.outputs and bool(readers) and all(
                (r.name in int8 and r.inputs[0] == v and v not in r.inputs[1:])
                or (r.op in PASSTHROUGH and wants[r.outputs[0]])
                for r in readers)

    native: dict[str, tuple[float, int]] = {}
    for node in graph.nodes:
        y = node.outputs[0]
        if node.name in int8 and wants[y]:
            native[y] = Q.choose_activation_qparams(*ranges[y])
        elif node.op in PASSTHROUGH and node.inputs[0] in native:
            native[y] = native[node.inputs[0]]
    return _Plan(int8, native)


def _candidates(graph: Graph) -> tuple[set[str], dict[str, str]]:
    """Layers that can be int8, and the reason for each that cannot."""
    ok, why = set(), {}
    for n in graph.nodes:
        if n.op not in LAYERS:
            continue
        act = n.attrs.get("activation", "none")
        if not ops.int8_fuses(act):
            fuse = ops.with_int8(ops.INT8_FUSE)
            why[n.name] = (f"fused activation '{act}' has no int8 form (only "
                           f"{' and '.join(fuse)} fuse{'s' if len(fuse) == 1 else ''} into int8)")
        else:
            ok.add(n.name)
    return ok, why


# --------------------------------------------------------------------------- int8 layers


def _layer_int8(node: Node, params, x_qp: tuple[float, int], y_qp: tuple[float, int] | None,
                shared: set[str], taken: set[str]) -> tuple[Node, dict[str, np.ndarray], dict]:
    """One conv2d/linear as an int8 node with its int8 weight and int32 bias.

    They keep their names, except a tensor another node also reads (`shared`): that one gets an
    int8 copy under a fresh name, since the other reader may be fp32 or use another x_scale.
    """
    x_scale, x_zp = x_qp
    w_name = node.inputs[1]
    w_q, w_scale = Q.quantize_weights(params[w_name])
    o = w_q.shape[0]
    new_params = {w_name: w_q}
    quant = {w_name: {"scale": w_scale.tolist(), "zero_point": [0] * o, "axis": 0}}
    inputs = [node.inputs[0], w_name]
    if len(node.inputs) > 2:
        b_name = node.inputs[2]
        new_params[b_name] = Q.quantize_bias(params[b_name], x_scale, w_scale)
        inputs.append(b_name)
    for old in list(new_params):
        if old in shared:
            new = _fresh(f"{node.name}.{old.rsplit('.', 1)[-1]}_q", taken)
            new_params[new] = new_params.pop(old)
            quant[new] = quant.pop(old)
            inputs = [new if i == old else i for i in inputs]
    taken.update(new_params)
    attrs = dict(node.attrs, x_scale=x_scale, x_zero_point=x_zp)
    if y_qp is not None:
        attrs.update(y_scale=y_qp[0], y_zero_point=y_qp[1])
    return Node(node.name, node.op, inputs, list(node.outputs), attrs), new_params, quant


def _fresh(name: str, taken) -> str:
    i = 0
    while f"{name}{i or ''}" in taken:
        i += 1
    return f"{name}{i or ''}"


def _layer_errors(graph: Graph, params, x: np.ndarray, plan: _Plan, ranges,
                  kept: list[dict[str, np.ndarray]] | None = None) -> dict[str, dict]:
    """Each planned int8 layer alone vs its fp32 self on the calibration samples.

    kept: the layers' fp32 inputs and outputs per chunk of the calibration pass; without it the
    fp32 graph runs again, chunk by chunk (the same chunks, so the same sums).
    """
    infos = graph.validate()
    minis = {}
    for node in graph.nodes:
        if node.name not in plan.int8:
            continue
        xv, yv = node.inputs[0], node.outputs[0]
        x_qp = plan.native_i8.get(xv) or Q.choose_activation_qparams(*ranges[xv])
        y_qp = plan.native_i8.get(yv)
        qnode, p, quant = _layer_int8(node, params, x_qp, y_qp, set(), set())
        nodes = [Node("q", "quantize", ["x"], ["xq"], {"scale": x_qp[0], "zero_point": x_qp[1]}),
                 Node(node.name, node.op, ["xq", *qnode.inputs[1:]], ["y"], qnode.attrs)]
        if y_qp is not None:
            nodes.append(Node("dq", "dequantize", ["y"], ["yf"],
                              {"scale": y_qp[0], "zero_point": y_qp[1]}))
        g = Graph({"x": ValueInfo("f32", infos[xv].shape)}, [nodes[-1].outputs[0]], nodes,
                  {n: ValueInfo(DTYPE_NAMES[a.dtype], a.shape) for n, a in p.items()})
        minis[node.name] = (g, p, quant, xv, yv)

    node_ops = {n.name: n.op for n in graph.nodes}
    sums = {name: [0.0, 0.0, 0.0, 0.0] for name in minis}  # noise/signal per channel, total
    envs = kept if kept is not None else (reference.run(graph, params, xb, keep_all=True)
                                          for xb in batches(x))
    for env in envs:
        for name, (g, p, quant, xv, yv) in minis.items():
            # per output channel: axis 1 of a conv's (N, C, H, W), the last of a linear's (N, ..., O)
            axes = tuple(range(env[yv].ndim - 1)) if node_ops[name] == "linear" else (
                0, *range(2, env[yv].ndim))
            s = sums[name]
            for xb, yb in zip(batches(env[xv], RUN_BATCH), batches(env[yv], RUN_BATCH), strict=True):
                y = yb.astype(np.float64)
                yq = reference.run(g, p, xb, quant)[g.outputs[0]].astype(np.float64)
                d2, y2 = (yq - y) ** 2, y**2
                s[0] = s[0] + d2.sum(axis=axes)
                s[1] = s[1] + y2.sum(axis=axes)
                s[2] += float(d2.sum())
                s[3] += float(y2.sum())
    out = {}
    for name, (noise_c, signal_c, noise, signal) in sums.items():
        live = signal_c[signal_c > 0]
        floor = CHANNEL_FLOOR * (float(np.median(live)) if live.size else 1.0)
        err = float(np.sqrt(np.mean(noise_c / np.maximum(signal_c, floor))))
        sqnr = float("inf") if noise == 0 else 10 * np.log10(max(signal, 1e-30) / noise)
        out[name] = {"error": err, "sqnr_db": sqnr}
    return out


# --------------------------------------------------------------------------- the pass


def quantize_graph(graph: Graph, params: Mapping[str, np.ndarray], calib_x: np.ndarray, *,
                   max_layer_error: float | None = None, method: str = "minmax",
                   percentile: float = DEFAULT_PERCENTILE, calib: Pass | None = None,
                   errors: dict[str, dict] | None = None,
                   keep_fp32: Mapping[str, str] | None = None) -> Quantized:
    """The int8 version of a (folded, fused) fp32 graph; see the module docstring.

    calib: the calibration pass over calib_x, if the caller ran it already (`run_pass` with
    subsample for the clipping methods and keep=layer_values(graph)); errors: the guard's layer
    errors of an earlier call with the same pass; keep_fp32: layers to leave fp32 anyway, with
    the reason the report gives (--int8-target's fallback).
    """
    limit = DEFAULT_MAX_LAYER_ERROR if max_layer_error is None else float(max_layer_error)
    check_method(method)
    graph.validate()
    if calib is None:
        calib = run_pass(graph, params, calib_x, subsample=method != "minmax",
                         keep=layer_values(graph))
    ranges = _Ranges(calib, method, percentile)
    int8, why = _candidates(graph)
    plan = _plan(graph, int8, ranges)
    if errors is None:
        errors = _layer_errors(graph, params, calib_x, plan, ranges, calib.kept)
    bad = {n for n, e in errors.items() if not e["error"] <= limit}
    for n in bad:
        why[n] = (f"int8 error {errors[n]['error']:.3g} exceeds max_layer_error {limit:g} "
                  f"(SQNR {errors[n]['sqnr_db']:.1f} dB)")
    for n, reason in (keep_fp32 or {}).items():
        if n in int8 and n not in bad:
            bad.add(n)
            why[n] = reason
    plan = _plan(graph, int8 - bad, ranges)
    qgraph, qparams, qinfo, weights = _build(graph, params, plan, ranges)
    layers = [{"name": n.name, "op": n.op, "int8": n.name in plan.int8,
               "error": errors.get(n.name, {}).get("error"),
               "sqnr_db": errors.get(n.name, {}).get("sqnr_db"),
               "reason": why.get(n.name)}
              for n in graph.nodes if n.op in LAYERS]
    layers += [{"name": n.name, "op": n.op, "int8": True, "error": None, "sqnr_db": None,
                "reason": "weight-only int8: f32 inputs and state"}
               for n in graph.nodes if n.op in WEIGHT_ONLY and len(n.inputs) > 1]
    return Quantized(qgraph, qparams, qinfo, layers, weights, calib, ranges, errors)


def _build(graph: Graph, params, plan: _Plan, ranges):
    nodes: list[Node] = []
    out_params: dict[str, np.ndarray] = {}
    quant: dict[str, dict] = {}
    weights = []
    reads: dict[str, int] = {}
    for n in graph.nodes:
        for v in n.inputs:
            reads[v] = reads.get(v, 0) + 1
    shared = {v for v, c in reads.items() if c > 1 and v in graph.params}
    taken = set(graph.params)
    as_i8: dict[str, tuple[str, tuple[float, int]]] = {}  # f32 value -> its quantized twin

    def int8_input(v: str) -> tuple[str, tuple[float, int]]:
        if v in plan.native_i8:
            return v, plan.native_i8[v]
        if v not in as_i8:
            qp = Q.choose_activation_qparams(*ranges[v])
            nodes.append(Node(f"{v}/quantize", "quantize", [v], [f"{v}/q"],
                              {"scale": qp[0], "zero_point": qp[1]}))
            as_i8[v] = (f"{v}/q", qp)
        return as_i8[v]

    for node in graph.nodes:
        if node.name in plan.int8:
            xq, x_qp = int8_input(node.inputs[0])
            qnode, p, qi = _layer_int8(node, params, x_qp, plan.native_i8.get(node.outputs[0]),
                                       shared, taken)
            qnode.inputs[0] = xq
            nodes.append(qnode)
            out_params.update(p)
            quant.update(qi)
            w = qnode.inputs[1]
            weights.append(_weight_error(w, params[node.inputs[1]], p[w], quant[w]["scale"]))
        else:
            inputs = list(node.inputs)
            out_params.update({v: np.asarray(params[v]) for v in inputs if v in graph.params})
            if node.op in WEIGHT_ONLY and len(inputs) > 1:
                w_name = inputs[1]
                w_q, w_scale = Q.quantize_weights(params[w_name])
                if w_name in shared:
                    inputs[1] = _fresh(f"{node.name}.weight_q", taken)
                    taken.add(inputs[1])
                out_params[inputs[1]] = w_q
                quant[inputs[1]] = {"scale": w_scale.tolist(), "zero_point": [0] * len(w_scale),
                                    "axis": 0}
                weights.append(_weight_error(inputs[1], params[w_name], w_q, w_scale))
            nodes.append(Node(node.name, node.op, inputs, list(node.outputs), dict(node.attrs)))
    g = Graph(dict(graph.inputs), list(graph.outputs), nodes,
              {n: ValueInfo(DTYPE_NAMES[a.dtype], tuple(a.shape)) for n, a in out_params.items()},
              dict(graph.metadata))
    g.validate()
    return g, out_params, quant, weights


def _weight_error(name: str, w: np.ndarray, w_q: np.ndarray, scale) -> dict:
    w = np.asarray(w, np.float32)
    d = Q.dequantize_weights(w_q, np.asarray(scale, np.float32))
    err = np.abs(d.astype(np.float64) - w)
    norm = float(np.linalg.norm(w.astype(np.float64)))
    return {"name": name, "shape": list(w.shape), "max_abs_error": float(err.max(initial=0)),
            "rel_error": float(np.linalg.norm(err) / norm) if norm else 0.0,
            "sqnr_db": Q.sqnr_db(w, d)}
