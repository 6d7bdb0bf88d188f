"""Engine lowering of the spiking ops: spike_encode and lif (kernels_spiking).

A lif node's scratch holds, per sample, its membranes v and currents (float32) and its
synaptic sums (float64). The synapse runs event-driven when its input is spikes (the output of
a firing lif, or of a rate/latency encoder) and dense otherwise; behind a direct-current encoder
its currents are computed once, at step 0 (the input is the same at every step);
`POCKET_LIF=dense` or `POCKET_LIF=event` forces one for every lif node (benchmarks, tests).
An int8 weight stays int8 (its per-channel scales apply to each float64 sum); the linear
synapse's event-driven route keeps one transposed copy of its weight, made at load.
"""

from __future__ import annotations

import math
import os
from functools import partial

import numpy as np

from pocket.formats.ir import Node
from pocket.infer import kernels_spiking as ks
from pocket.infer.plan import EngineError, PlanContext, aligned

_MODES = {"spikes": ks.MODE_SPIKES, "count": ks.MODE_COUNT, "membrane": ks.MODE_MEMBRANE}
_ENCODE = {"direct": 0, "rate": 1, "latency": 2}


def _producer(ctx: PlanContext, node: Node) -> Node | None:
    return next((o for o in ctx.graph.nodes if node.inputs[0] in o.outputs), None)


def _spiking_input(ctx: PlanContext, node: Node) -> bool:
    p = _producer(ctx, node)
    if p is not None and p.op == "lif":
        return p.attrs["output"] == "spikes"
    return p is not None and p.op == "spike_encode" and p.attrs["mode"] != "direct"


def _constant_in_time(ctx: PlanContext, node: Node) -> bool:
    p = _producer(ctx, node)
    return p is not None and p.op == "spike_encode" and p.attrs["mode"] == "direct"


def event_driven(ctx: PlanContext, node: Node) -> bool:
    forced = os.environ.get("POCKET_LIF", "")
    if forced not in ("", "dense", "event"):
        raise EngineError(f"POCKET_LIF={forced!r}: use dense or event")
    return forced == "event" if forced else _spiking_input(ctx, node)


def _prep_lif(ctx: PlanContext, node: Node) -> dict:
    a = node.attrs
    out_sample = ctx.sample[node.outputs[0]]
    feat = math.prod(out_sample[1:] if a["output"] == "spikes" else out_sample)
    d = {"feat": feat, "sparse": event_driven(ctx, node), "const_t": _constant_in_time(ctx, node)}
    if a["synapse"] != "none":
        wname = node.inputs[1]
        w = ctx.params[wname]
        o = w.shape[0]
        qp = ctx.quant(wname) if w.dtype == np.int8 else None
        if w.dtype == np.int8 and qp is None:
            raise EngineError(f"node '{node.name}': int8 weight '{wname}' has no scales")
        d["scale"] = (np.asarray(qp["scale"], np.float64).reshape(o) if qp is not None
                      else np.ones(o, np.float64))
        d["bias"] = (np.asarray(ctx.params[node.inputs[2]], np.float64) if len(node.inputs) > 2
                     else np.zeros(o, np.float64))
        if a["synapse"] == "linear":
            d["w"] = w.reshape(o, -1)
            d["wt"] = np.ascontiguousarray(d["w"].T) if d["sparse"] else d["w"][:1]
    f32 = aligned(ctx.max_batch * feat * 4)
    d["at"] = (0, f32, 2 * f32)
    d["scratch_bytes"] = 2 * f32 + aligned(ctx.max_batch * feat * 8)
    return d


def _b_lif(ctx: PlanContext, step: int, node: Node, n: int) -> list:
    a, d = node.attrs, ctx.prep[step]
    x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
    steps, feat = x.shape[1], d["feat"]
    out = y.reshape(n, steps if a["output"] == "spikes" else 1, feat)
    v = ctx.scratch(step, np.float32, (n, feat), d["at"][0])
    cur = ctx.scratch(step, np.float32, (n, feat), d["at"][1])
    neuron = (np.float32(a["decay"]), np.float32(a["threshold"]), a["reset"] == "subtract",
              _MODES[a["output"]])
    if a["synapse"] == "none":
        return [partial(ks.lif_none, out, x.reshape(n, steps, feat), v, cur, *neuron)]
    acc_shape = (n, feat) if a["synapse"] == "linear" else (n, *ctx.sample[node.outputs[0]][-3:])
    acc = ctx.scratch(step, np.float64, acc_shape, d["at"][2])
    if a["synapse"] == "linear":
        return [partial(ks.lif_linear, out, x.reshape(n, steps, -1), d["w"], d["wt"], d["scale"],
                        d["bias"], v, cur, acc, *neuron, d["sparse"], d["const_t"])]
    w = ctx.params[node.inputs[1]]
    (sh, sw), (ph, pw) = a["stride"], a["padding"]
    return [partial(ks.lif_conv, out, x, w, d["scale"], d["bias"], v, cur, acc, sh, sw, ph, pw,
                    *neuron, d["sparse"], d["const_t"])]


def _prep_encode(ctx: PlanContext, node: Node) -> dict:
    noise = (ctx.params[node.inputs[1]] if len(node.inputs) > 1
             else np.zeros((1, 1), np.float32))
    return {"noise": noise.reshape(noise.shape[0], -1)}


def _b_encode(ctx: PlanContext, step: int, node: Node, n: int) -> list:
    a = node.attrs
    x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
    return [partial(ks.encode, y.reshape(n, a["T"], -1), x.reshape(n, -1), ctx.prep[step]["noise"],
                    _ENCODE[a["mode"]], np.float32(a["gain"]), np.float32(a["offset"]))]


PREPARE = {"lif": _prep_lif, "spike_encode": _prep_encode}
BUILDERS = {"lif": _b_lif, "spike_encode": _b_encode}
