"""Spiking zoo model `snn` and the spiking layer-list kinds.

    [model]
    name = "snn"          # encoder, spiking conv blocks (stride 2 after the first), spiking
    steps = 12            # linear blocks, a readout decoding time away
    encoding = "direct"   # direct | rate | latency
    readout = "count"     # count (spikes of the head) | membrane (its mean membrane)

Layer lists take `spike_encode` ({steps, mode, gain, offset}), `spiking_conv2d` ({out,
kernel, stride, padding, bias} and the neuron keys), `spiking_linear` ({out, bias} and the
neuron keys; `out` defaults to the number of outputs, for the head) and `lif` (the neuron keys alone).
"""

from __future__ import annotations

import math

from pocket.train import models, nn
from pocket.train import nn_spiking as S

_NEURON_KEYS = {"decay", "threshold", "reset", "surrogate", "alpha", "width", "learn_decay",
                "learn_threshold", "output"}


def _neuron(spec: dict) -> dict:
    return {k: spec[k] for k in _NEURON_KEYS if k in spec}


@models.register_model("snn")
def snn(input_shape, num_outputs, *, channels=None, hidden=None, steps: int = 12,
        encoding: str = "direct", readout: str = "count", decay: float = 0.9,
        threshold: float = 1.0, reset: str = "subtract", surrogate: str = "sigmoid",
        alpha: float = 4.0, width: float = 1.0, learn_decay: bool = False,
        learn_threshold: bool = False, rng=None, **_) -> nn.Sequential:
    """A spiking network: images (C, H, W) go through spiking conv blocks (default channels
    16, 32; the second and later downsample by stride 2), any input through spiking linear
    blocks (default hidden 128), then a spiking linear head with `readout`."""
    neuron = dict(decay=decay, threshold=threshold, reset=reset, surrogate=surrogate,
                  alpha=alpha, width=width, learn_decay=learn_decay,
                  learn_threshold=learn_threshold)
    try:
        return _snn(input_shape, num_outputs, channels, hidden, steps, encoding, readout, neuron,
                    rng)
    except (TypeError, ValueError) as e:
        raise models.ModelError(f"[model] snn: {e}") from None


def _snn(input_shape, num_outputs, channels, hidden, steps, encoding, readout, neuron, rng):
    if readout not in ("count", "membrane"):
        raise ValueError(f"readout must be count or membrane, got {readout!r}")
    shape = tuple(input_shape)
    layers: list[nn.Module] = [S.SpikeEncoder(steps, encoding, shape=shape)]
    if len(shape) == 3:
        c, h, w = shape
        for i, out in enumerate(channels or [16, 32]):
            s = 1 if i == 0 else 2
            layers.append(S.SpikingConv2d(c, out, 3, s, 1, rng=rng, **neuron))
            c, h, w = out, (h + 2 - 3) // s + 1, (w + 2 - 3) // s + 1
        width_in = c * h * w
    else:
        width_in = math.prod(shape)
    for out in hidden or [128]:
        layers.append(S.SpikingLinear(width_in, out, rng=rng, **neuron))
        width_in = out
    layers.append(S.SpikingLinear(width_in, num_outputs, rng=rng, **{**neuron, "output": readout}))
    return nn.Sequential(*layers)


@models.register_layer("spike_encode", {"steps", "mode", "gain", "offset"})
def _encode_layer(spec, shape, num_outputs, last, rng):
    m = S.SpikeEncoder(spec.get("steps", 12), spec.get("mode", "direct"), shape=shape,
                       gain=spec.get("gain", 0.25), offset=spec.get("offset", 0.5))
    return m, (m.steps, *shape)


@models.register_layer("spiking_conv2d", {"out", "kernel", "stride", "padding", "bias",
                                          *_NEURON_KEYS})
def _conv_layer(spec, shape, num_outputs, last, rng):
    if len(shape) != 4:
        raise ValueError("spiking_conv2d reads (T, C, H, W): put spike_encode before it")
    t, c, h, w = shape
    k, s, p = spec.get("kernel", 3), spec.get("stride", 1), spec.get("padding", 0)
    m = S.SpikingConv2d(c, spec["out"], k, s, p, spec.get("bias", True), rng=rng, **_neuron(spec))
    ho = (h + 2 * m.syn.padding[0] - m.syn.kernel_size[0]) // m.syn.stride[0] + 1
    wo = (w + 2 * m.syn.padding[1] - m.syn.kernel_size[1]) // m.syn.stride[1] + 1
    if ho < 1 or wo < 1:
        raise ValueError("the output would be empty")
    return m, ((t, spec["out"], ho, wo) if m.output == "spikes" else (spec["out"], ho, wo))


@models.register_layer("spiking_linear", {"out", "bias", *_NEURON_KEYS})
def _linear_layer(spec, shape, num_outputs, last, rng):
    if len(shape) < 2:
        raise ValueError("spiking_linear reads (T, ...): put spike_encode before it")
    out = spec.get("out", num_outputs)  # the head: set output = "count" or "membrane" on it
    neuron = _neuron(spec)
    m = S.SpikingLinear(math.prod(shape[1:]), out, spec.get("bias", True), rng=rng, **neuron)
    return m, ((shape[0], out) if m.output == "spikes" else (out,))


@models.register_layer("lif", _NEURON_KEYS)
def _lif_layer(spec, shape, num_outputs, last, rng):
    m = S.LIF(**_neuron(spec))
    return m, (shape if m.output == "spikes" else shape[1:])
