"""Spiking layers: the input encoder, LIF neurons, and spiking linear / conv2d blocks.

Values carry time on axis 1, (N, T, ...), in training as in the IR (pocket/formats/ops_spiking):
`SpikeEncoder` makes the axis, each LIF layer reads and writes it, and the head decodes it away
(spike count or mean membrane). A spiking block folds the time steps into the batch for its
synapse (one conv2d/linear over N*T images: a free reshape of (N, T, ...)), then runs the
neurons over time. Each block traces to one `lif` node.

Spiking layers keep `keep_fp32`: under --precision fp16 their parameters stay fp32 and they
compute in fp32 (a membrane's small surrogate gradients underflow fp16; Zenke & Vogels, 2021).
Each neuron layer counts the spikes it emits (on the device, no sync) for `firing_rates`.
"""

from __future__ import annotations

import numpy as np

from pocket.formats import ops
from pocket.train import backend, nn
from pocket.train import functional as F
from pocket.train import functional_spiking as FS
from pocket.train.tensor import Parameter, Tensor


class SpikeEncoder(nn.Module):
    """(N, ...) -> (N, T, ...): direct current (x at every step), rate (Poisson: a spike where a
    uniform draw is under p = clip(gain*x + offset, 0, 1); fresh seeded draws in training, the
    stored table `noise` in eval and in the IR) or latency (one spike, earlier for larger p)."""

    op = "spike_encode"
    keep_fp32 = True

    def __init__(self, steps: int, mode: str = "direct", shape=None, gain: float = 0.25,
                 offset: float = 0.5, seed: int = 0):
        super().__init__()
        if mode not in ("direct", "rate", "latency"):
            raise ValueError(f"encoding must be direct, rate or latency, got {mode!r}")
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise ValueError(f"time steps must be a positive integer, got {steps!r}")
        self.steps, self.mode, self.gain, self.offset = steps, mode, float(gain), float(offset)
        if mode == "rate":
            if shape is None:
                raise ValueError("rate encoding needs the input shape (for its noise table)")
            self.register_buffer("noise", np.random.default_rng(seed).random(
                (steps, *shape), dtype=np.float32))
            self.rng = np.random.default_rng(seed + 1)

    def forward(self, x):
        x = F.astype(x, np.float32) if x.dtype != np.float32 else x
        noise = None
        if self.mode == "rate":
            noise = (FS.poisson_noise(self.rng, self.noise.shape, x.data) if self.training
                     else self.noise)
        return FS.spike_encode(x, self.steps, self.mode, self.gain, self.offset, noise)


class LIF(nn.Module):
    """Leaky integrate-and-fire neurons over axis 1 (see functional_spiking.lif).

    decay (beta) and threshold are scalars of the layer, learnable on request; `output` is
    "spikes" (N, T, ...), "count" (spikes summed over T) or "membrane" (mean over T of the
    membrane of non-firing neurons: a readout). surrogate "sigmoid" uses `alpha`,
    "rectangular" uses `width`."""

    op = "lif"
    keep_fp32 = True
    synapse = "none"

    def __init__(self, decay: float = 0.9, threshold: float = 1.0, reset: str = "subtract",
                 surrogate: str = "sigmoid", alpha: float = 4.0, width: float = 1.0,
                 learn_decay: bool = False, learn_threshold: bool = False,
                 output: str = "spikes"):
        super().__init__()
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"decay must be in [0, 1], got {decay}")
        if reset not in ("subtract", "zero"):
            raise ValueError(f"reset must be subtract or zero, got {reset!r}")
        if surrogate not in FS.SURROGATES:
            raise ValueError(f"surrogate must be sigmoid or rectangular, got {surrogate!r}")
        if output not in ("spikes", "count", "membrane"):
            raise ValueError(f"output must be spikes, count or membrane, got {output!r}")
        for name, value, learn in (("decay", decay, learn_decay),
                                   ("threshold", threshold, learn_threshold)):
            arr = np.array([value], np.float32)
            if learn:
                setattr(self, name, Parameter(arr))
            else:
                self.register_buffer(name, arr)
        self.reset, self.surrogate, self.output = reset, surrogate, output
        self.param = float(alpha if surrogate == "sigmoid" else width)
        self.fired = 0.0  # spikes emitted since firing_rates last read them (a device scalar)
        self.slots = 0  # neuron-steps they were out of

    def _as_tensor(self, v) -> Tensor:
        return v if isinstance(v, Tensor) else Tensor(v)

    def current(self, x: Tensor) -> Tensor:
        return x

    def forward(self, x):
        x = F.astype(x, np.float32) if x.dtype != np.float32 else x
        i = self.current(x)
        decay, threshold = self._as_tensor(self.decay), self._as_tensor(self.threshold)
        if self.output == "membrane":
            u = FS.lif(i, decay, threshold, membrane=True)
            return F.mean(u, axis=1)
        s = FS.lif(i, decay, threshold, self.reset, self.surrogate, self.param)
        self.fired = self.fired + s.data.sum()
        self.slots += s.data.size
        return F.sum(s, axis=1) if self.output == "count" else s

    def ir_attrs(self) -> dict:
        def scalar(v):
            return float(np.float32(backend.to_numpy(v.data if isinstance(v, Tensor) else v)[0]))

        return {"decay": min(1.0, max(0.0, scalar(self.decay))),
                "threshold": scalar(self.threshold), "reset": self.reset, "output": self.output}


def _fold(x: Tensor) -> Tensor:
    return F.reshape(x, (x.shape[0] * x.shape[1], *x.shape[2:]))


def _unfold(y: Tensor, n: int) -> Tensor:
    return F.reshape(y, (n, y.shape[0] // n, *y.shape[1:]))


class SpikingLinear(LIF):
    """A linear synapse applied at each time step (the dims after T flattened), then LIF."""

    synapse = "linear"

    def __init__(self, in_features: int, out_features: int, bias: bool = True, rng=None, **lif):
        super().__init__(**lif)
        self.syn = nn.Linear(in_features, out_features, bias, rng=rng)

    def current(self, x):
        n, t = x.shape[0], x.shape[1]
        return F.reshape(self.syn(F.reshape(x, (n * t, -1))), (n, t, -1))


class SpikingConv2d(LIF):
    """A conv2d synapse applied at each time step, then LIF: (N, T, C, H, W) -> (N, T, O, Ho, Wo)."""

    synapse = "conv2d"

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 bias: bool = True, rng=None, **lif):
        super().__init__(**lif)
        self.syn = nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding, bias=bias,
                             rng=rng)

    def current(self, x):
        return _unfold(self.syn(_fold(x)), x.shape[0])


def spiking_layers(model: nn.Module) -> list[tuple[str, LIF]]:
    return [(name, m) for name, m in model.named_modules() if isinstance(m, LIF)
            and m.output != "membrane"]


def firing_rates(model: nn.Module, reset: bool = True) -> dict[str, float]:
    """{layer name: spikes per neuron per time step} since the last call (one host sync)."""
    out = {}
    for name, m in spiking_layers(model):
        if m.slots:
            out[name or "lif"] = float(m.fired) / m.slots
        if reset:
            m.fired, m.slots = 0.0, 0
    return out


def time_steps(model: nn.Module) -> int | None:
    """T of a spiking model (its encoder's), None for other models."""
    for m in model.modules():
        if isinstance(m, SpikeEncoder):
            return m.steps
    return None


# --------------------------------------------------------------------------- tracing


def _p(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


@ops.register("trace", "lif")
def _trace_lif(b, m: LIF, prefix: str, x: str) -> str:
    ins = [x]
    attrs = {"synapse": m.synapse, **m.ir_attrs()}
    if m.synapse != "none":
        ins.append(b.param(_p(prefix, "syn.weight")))
        if m.syn.bias is not None:
            ins.append(b.param(_p(prefix, "syn.bias")))
    if m.synapse == "conv2d":
        if m.syn.dilation != (1, 1) or m.syn.groups != 1:
            raise ValueError(f"layer '{prefix}': a spiking conv2d has no dilation or groups")
        attrs.update(stride=list(m.syn.stride), padding=list(m.syn.padding))
    return b.node(prefix, "lif", ins, **attrs)


@ops.register("trace", "spike_encode")
def _trace_encode(b, m: SpikeEncoder, prefix: str, x: str) -> str:
    ins = [x] + ([b.param(_p(prefix, "noise"))] if m.mode == "rate" else [])
    return b.node(prefix, "spike_encode", ins, T=m.steps, mode=m.mode, gain=m.gain,
                  offset=m.offset)


# --------------------------------------------------------------------------- reports


def summary(model: nn.Module, input_shape, precision: str = "fp32") -> dict | None:
    """The time axis in the memory report: per spiking layer, its neurons per step and the
    bytes a training step saves per sample for its backward (its synapse's input and its
    membranes u_t, both T steps long: T multiplies them). None for a model without them."""
    steps = time_steps(model)
    layers = spiking_layers(model) + [(n, m) for n, m in model.named_modules()
                                      if isinstance(m, LIF) and m.output == "membrane"]
    if steps is None and not layers:
        return None
    shapes: dict[int, tuple] = {}

    def grab(m):
        fwd = m.forward

        def wrapped(x):
            shapes[id(m)] = (tuple(x.shape[1:]), fwd(x))
            return shapes[id(m)][1]
        return wrapped

    from pocket.train.tensor import no_grad

    was = model.training
    model.eval()
    for _, m in layers:
        object.__setattr__(m, "forward", grab(m))
    try:
        with no_grad():
            params = model.parameters()
            x = np.zeros((1, *input_shape), np.float32)
            if params:
                x = backend.to_device(x, backend.device_of(params[0].data))
            model(Tensor(x))
    finally:
        for _, m in layers:
            object.__delattr__(m, "forward")
        model.train(was)
        firing_rates(model)  # the probe's spikes are not the run's
    rows = []
    for name, m in layers:
        x_shape, y = shapes[id(m)]
        t = x_shape[0]
        neurons = int(np.prod(y.shape[2:] if m.output == "spikes" else y.shape[1:]))
        saved = 4 * t * (int(np.prod(x_shape[1:])) * (m.synapse != "none") + neurons)
        rows.append({"name": name, "synapse": m.synapse, "neurons": neurons,
                     "saved_bytes_per_sample": saved})
    out = {"time_steps": steps, "layers": rows,
           "saved_bytes_per_sample": sum(r["saved_bytes_per_sample"] for r in rows)}
    if precision == "fp16":
        out["fp32_layers"] = [r["name"] for r in rows]
    return out


def render_summary(s: dict) -> list[str]:
    from pocket.train.memory import format_bytes

    lines = [f"spiking: T = {s['time_steps']} time steps; each layer saves its input and its "
             f"membranes for all T steps, {format_bytes(s['saved_bytes_per_sample'])} a sample"]
    lines += [f"  {r['name']:<8} {r['synapse']:<7} {r['neurons']:>6} neurons  "
              f"{format_bytes(r['saved_bytes_per_sample']):>10} a sample" for r in s["layers"]]
    if s.get("fp32_layers"):
        lines.append(f"  under fp16 these layers stay fp32 (weights, membranes, surrogate "
                     f"gradients): {', '.join(s['fp32_layers'])}")
    return lines
