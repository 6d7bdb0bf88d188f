"""Spiking ops: `spike_encode` (an input spread over T time steps) and `lif` (leaky
integrate-and-fire neurons, optionally behind their linear or conv2d synapse).

Where T lives: axis 1. The IR's first dim is the batch symbol "N" and every engine sizes a value
as N x its per-sample shape, so a spiking value is (N, T, ...) with T a fixed int, and the time
steps of one sample stay contiguous. `spike_encode` makes the axis from an (N, ...) input; a
`lif` reads (N, T, ...) and writes spikes (N, T, ...), or decodes its neurons over time into
(N, ...): their spike count, or their mean membrane potential (a non-firing readout). The
synapse is inside the op, applied to each time step alone (the time steps fold into the batch
for the linear/conv2d), because core conv2d/linear/flatten read (N, C, H, W) / (N, F): keeping
the synapse in the op is what lets the time axis stay a per-sample dim everywhere.

The neuron, per time step t (all float32, no fused multiply-add; v starts at 0):

    u_t = decay * v_{t-1} + I_t          I_t: the synapse's output (or the input) at step t
    s_t = 1 if u_t >= threshold else 0
    v_t = u_t - s_t * threshold          reset "subtract"
    v_t = u_t * (1 - s_t)                reset "zero"

State lives inside the op (v, one float32 per neuron, for one sample's T steps). int8: a `lif`
may carry an int8 weight (symmetric per output channel, its scales in the tensor table) while
its input, bias, membrane and threshold stay float32: spikes are exactly 0 or 1, so there is no
activation to quantize; the synaptic sum is sum(x * w_q) * w_scale.
"""

from __future__ import annotations

from pocket.formats.opschema import INT8_F32, Attr, Op, Out, conv_out, need, prod_dims

ENCODE_MODES = ("direct", "rate", "latency")
RESETS = ("subtract", "zero")
OUTPUTS = ("spikes", "count", "membrane")
SYNAPSES = ("none", "linear", "conv2d")


def _infer_spike_encode(node, ins, where: str) -> Out:
    x = ins[0]
    a = node.attrs
    need(x.dtype == "f32", where, f"spike_encode reads f32, got {x.dtype}")
    need(len(x.shape) >= 2, where, f"input must be (N, ...), got {list(x.shape)}")
    t = a["T"]
    need(t >= 1, where, f"T must be >= 1, got {t}")
    rate = a["mode"] == "rate"
    need((len(ins) == 2) == rate, where,
         "mode rate takes its noise table as a second input; direct and latency take none")
    if rate:
        need(ins[1].dtype == "f32" and tuple(ins[1].shape) == (t, *x.shape[1:]), where,
             f"noise must be f32 [{t}, {', '.join(map(str, x.shape[1:]))}], "
             f"got {ins[1].dtype} {list(ins[1].shape)}")
    return [("f32", (x.shape[0], t, *x.shape[1:]))]


def _infer_lif(node, ins, where: str) -> Out:
    x = ins[0]
    a = node.attrs
    need(x.dtype == "f32", where, f"lif reads f32 (spikes or currents), got {x.dtype}")
    need(len(x.shape) >= 3, where, f"input must be (N, T, ...), got {list(x.shape)}")
    need(isinstance(x.shape[1], int), where, "the time axis (dim 1) must be a fixed size")
    need(0.0 <= a["decay"] <= 1.0, where, f"decay must be in [0, 1], got {a['decay']}")
    syn = a["synapse"]
    need((len(ins) == 1) == (syn == "none"), where,
         "synapse none takes no weight; linear and conv2d take a weight and an optional bias")
    feat = tuple(x.shape[2:])
    if syn != "none":
        w = ins[1]
        need(w.dtype in ("f32", "i8"), where, f"weight must be f32 or i8, got {w.dtype}")
        o = w.shape[0]
        if len(ins) > 2:
            need(ins[2].dtype == "f32" and tuple(ins[2].shape) == (o,), where,
                 f"bias must be f32 [{o}], got {ins[2].dtype} {list(ins[2].shape)}")
        if syn == "linear":
            f_in = prod_dims(feat)
            need(isinstance(f_in, int), where, "dims after the time axis must be fixed")
            need(len(w.shape) == 2 and w.shape[1] == f_in, where,
                 f"weight must be [out, {f_in}], got {list(w.shape)}")
            feat = (o,)
        else:
            need(len(feat) == 3, where, f"conv2d synapse reads (N, T, C, H, W), got {list(x.shape)}")
            need(len(w.shape) == 4 and w.shape[1] == feat[0], where,
                 f"weight must be [O, {feat[0]}, kh, kw], got {list(w.shape)}")
            s, p = a["stride"], a["padding"]
            need(min(s) >= 1 and min(p) >= 0, where, "stride must be >= 1, padding >= 0")
            ho = conv_out(feat[1], w.shape[2], s[0], p[0], 1, where, "height")
            wo = conv_out(feat[2], w.shape[3], s[1], p[1], 1, where, "width")
            feat = (o, ho, wo)
    if a["output"] == "spikes":
        return [("f32", (x.shape[0], x.shape[1], *feat))]
    return [("f32", (x.shape[0], *feat))]


ENTRIES = [
    Op("spike_encode", 1, 2, {"T": Attr("int"), "mode": Attr("str", "direct", ENCODE_MODES),
                              "gain": Attr("float", 0.25), "offset": Attr("float", 0.5)},
       _infer_spike_encode,
       "(N, ...) -> (N, T, ...). direct: x at every step; rate: p = clip(gain*x + offset, 0, 1), "
       "spike where noise[t] < p (noise: a stored uniform table, so every engine draws the same); "
       "latency: one spike at t = floor((1 - p) * (T - 1) + 0.5) where p > 0",
       int8=INT8_F32),
    Op("lif", 1, 3, {"synapse": Attr("str", "none", SYNAPSES), "stride": Attr("ints2", [1, 1]),
                     "padding": Attr("ints2", [0, 0]), "decay": Attr("float"),
                     "threshold": Attr("float", 1.0), "reset": Attr("str", "subtract", RESETS),
                     "output": Attr("str", "spikes", OUTPUTS)},
       _infer_lif,
       "leaky integrate-and-fire over axis 1 (see ops_spiking); output spikes (N, T, ...), "
       "count: sum over T of the spikes, membrane: mean over T of u_t without firing",
       int8=INT8_F32),
]
