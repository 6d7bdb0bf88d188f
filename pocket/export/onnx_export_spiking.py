"""The spiking ops in ONNX (opset 17): an unrolled graph, one group of nodes per time step.

lif: the synapse runs once over all steps (Reshape (N, T, ...) -> (N*T, ...), Conv or Gemm,
Reshape back); an int8 weight is a DequantizeLinear per output channel. Then, for t = 0..T-1,
Gather step t and apply the neuron: u = decay * v + I_t (Mul, Add), s = u >= threshold
(GreaterOrEqual, Cast), v = u - s * threshold or Where(s, 0, u); the outputs are the steps'
spikes (Unsqueeze + Concat on axis 1), their Sum (count), or the running sum of u divided by T
(membrane). Each of these is one IEEE float32 operation, in the order the reference takes, so
given the same currents onnxruntime emits the same spikes.

spike_encode: Expand (direct); Clip(x * gain + offset, 0, 1) then Less against the stored noise
(rate) or Equal against floor((1 - p) * (T - 1) + 0.5) (latency).
"""

from __future__ import annotations

import numpy as np

from pocket.formats import ops
from pocket.formats.ir import Node

f32 = np.float32


def _axes(b, name: str, axes) -> str:
    return b.const(name, np.asarray(axes, np.int64))


def _synapse(b, n: Node, x: str, x_shape, out_sample) -> str:
    """The currents (N, T, *F) of lif node n, by name."""
    a, name = n.attrs, n.name
    steps = x_shape[1]
    if a["synapse"] == "none":
        return x
    w_name = n.inputs[1]
    w = b.param(w_name)
    if b.params[w_name].dtype == np.int8:
        scale = np.asarray(b.quant[w_name]["scale"], np.float32)
        w = b.node("DequantizeLinear", [w, b.const(f"{name}.w_scale", scale),
                                        b.const(f"{name}.w_zero_point",
                                                np.zeros(scale.shape[0], np.int8))],
                   f"{name}/w", f"{name}/w_dq", axis=0)
    ins = [w] + ([b.param(n.inputs[2])] if len(n.inputs) > 2 else [])
    if a["synapse"] == "linear":
        flat = b.node("Reshape", [x, b.const(f"{name}.fold", np.asarray(
            [-1, int(np.prod(x_shape[2:]))], np.int64))], f"{name}/folded", f"{name}/fold")
        y = b.node("Gemm", [flat, *ins], f"{name}/syn", f"{name}/gemm", transB=1)
    else:
        flat = b.node("Reshape", [x, b.const(f"{name}.fold", np.asarray(
            [-1, *x_shape[2:]], np.int64))], f"{name}/folded", f"{name}/fold")
        kshape = list(b.params[w_name].shape[2:])
        y = b.node("Conv", [flat, *ins], f"{name}/syn", f"{name}/conv", kernel_shape=kshape,
                   strides=a["stride"], pads=[*a["padding"], *a["padding"]])
    return b.node("Reshape", [y, b.const(f"{name}.unfold", np.asarray(
        [-1, steps, *out_sample], np.int64))], f"{name}/current", f"{name}/unfold")


@ops.register("onnx_export", "lif")
def _lif(b, n: Node) -> None:
    a, name = n.attrs, n.name
    infos = b.graph.infer_shapes()
    x_shape = infos[n.inputs[0]].shape
    steps = x_shape[1]
    y_shape = infos[n.outputs[0]].shape
    feat = list(y_shape[2:] if a["output"] == "spikes" else y_shape[1:])
    cur = _synapse(b, n, n.inputs[0], x_shape, feat)
    decay = b.const(f"{name}.decay", f32(a["decay"]))
    thr = b.const(f"{name}.threshold", f32(a["threshold"]))
    membrane = a["output"] == "membrane"
    v, total, steps_out = None, None, []
    for t in range(steps):
        p = f"{name}/t{t}"
        i_t = b.node("Gather", [cur, b.const(f"{name}.t{t}", np.int64(t))], f"{p}/i", f"{p}/gather",
                     axis=1)
        # NOTE: v starts at 0, and decay * 0 + I is I exactly: step 0 skips the Mul and Add
        u = i_t if v is None else b.node(
            "Add", [b.node("Mul", [decay, v], f"{p}/dv", f"{p}/mul"), i_t], f"{p}/u", f"{p}/add")
        if membrane:
            total = u if total is None else b.node("Add", [total, u], f"{p}/sum", f"{p}/sum")
            v = u
            continue
        fire = b.node("GreaterOrEqual", [u, thr], f"{p}/fire", f"{p}/ge")
        s = b.node("Cast", [fire], f"{p}/s", f"{p}/cast", to=1)
        if a["reset"] == "subtract":
            v = b.node("Sub", [u, b.node("Mul", [s, thr], f"{p}/st", f"{p}/st")], f"{p}/v",
                       f"{p}/reset")
        else:
            v = b.node("Where", [fire, b.const(f"{p}.zero", f32(0)), u], f"{p}/v", f"{p}/reset")
        steps_out.append(s)
    out = n.outputs[0]
    if membrane:
        b.node("Div", [total, b.const(f"{name}.T", f32(steps))], out, f"{name}/mean")
    elif a["output"] == "count":
        if len(steps_out) == 1:
            b.node("Identity", steps_out, out, f"{name}/count")
        else:
            b.node("Sum", steps_out, out, f"{name}/count")
    else:
        ax = _axes(b, f"{name}.axis1", [1])
        cols = [b.node("Unsqueeze", [s, ax], f"{s}1", f"{s}/unsqueeze") for s in steps_out]
        b.node("Concat", cols, out, f"{name}/concat", axis=1)


@ops.register("onnx_export", "spike_encode")
def _encode(b, n: Node) -> None:
    a, name, x, out = n.attrs, n.name, n.inputs[0], n.outputs[0]
    infos = b.graph.infer_shapes()
    rank = len(infos[x].shape)
    steps = a["T"]
    ax = _axes(b, f"{name}.axis1", [1])
    if a["mode"] == "direct":
        xs = b.node("Unsqueeze", [x, ax], f"{name}/x1", f"{name}/unsqueeze")
        shape = b.const(f"{name}.shape", np.asarray([1, steps] + [1] * (rank - 1), np.int64))
        b.node("Expand", [xs, shape], out, name)
        return
    gx = b.node("Mul", [x, b.const(f"{name}.gain", f32(a["gain"]))], f"{name}/gx", f"{name}/gain")
    lin = b.node("Add", [gx, b.const(f"{name}.offset", f32(a["offset"]))], f"{name}/lin",
                 f"{name}/offset")
    p = b.node("Clip", [lin, b.const(f"{name}.lo", f32(0)), b.const(f"{name}.hi", f32(1))],
               f"{name}/p", f"{name}/clip")
    p1 = b.node("Unsqueeze", [p, ax], f"{name}/p1", f"{name}/p_unsqueeze")
    if a["mode"] == "rate":
        noise = b.node("Unsqueeze", [b.param(n.inputs[1]), _axes(b, f"{name}.axis0", [0])],
                       f"{name}/noise", f"{name}/noise_unsqueeze")
        fire = b.node("Less", [noise, p1], f"{name}/fire", f"{name}/less")
    else:
        late = b.node("Sub", [b.const(f"{name}.one", f32(1)), p], f"{name}/late", f"{name}/late")
        when = b.node("Floor", [b.node("Add", [
            b.node("Mul", [late, b.const(f"{name}.span", f32(steps - 1))], f"{name}/lt",
                   f"{name}/span"), b.const(f"{name}.half", f32(0.5))], f"{name}/lth",
            f"{name}/half")], f"{name}/when", f"{name}/floor")
        grid = b.const(f"{name}.t", np.arange(steps, dtype=np.float32).reshape(
            [1, steps] + [1] * (rank - 1)))
        at = b.node("Equal", [b.node("Unsqueeze", [when, ax], f"{name}/when1",
                                     f"{name}/when_unsqueeze"), grid], f"{name}/at", f"{name}/eq")
        pos = b.node("Greater", [p1, b.const(f"{name}.zero", f32(0))], f"{name}/pos",
                     f"{name}/pos")
        fire = b.node("And", [at, pos], f"{name}/fire", f"{name}/and")
    b.node("Cast", [fire], out, f"{name}/cast", to=1)
