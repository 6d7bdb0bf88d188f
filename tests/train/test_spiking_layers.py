"""Spiking layers in train: surrogate gradients and the unrolled LIF layer against float64 finite
differences, the layer against an independent float64 NumPy loop, the encoders, checkpointing
and fp16."""

from __future__ import annotations

import numpy as np
import pytest

from pocket.train import functional_spiking as FS
from pocket.train import nn
from pocket.train import nn_spiking as S
from pocket.train.amp import MixedPrecision
from pocket.train.gradcheck import gradcheck
from pocket.train.recompute import checkpoint_sequential
from pocket.train.tensor import Tensor


def _rng(seed=0):
    return np.random.default_rng(seed)


# ---------------------------------------------------------------- surrogates


@pytest.mark.parametrize("name,param", [("sigmoid", 3.0), ("sigmoid", 10.0), ("rectangular", 0.8)])
def test_surrogate_backward_is_the_surrogates_derivative(name, param):
    x = _rng().uniform(-1.5, 1.5, (4, 7))
    if name == "rectangular":  # away from the ramp's two kinks, where it has no derivative
        x = x[np.abs(np.abs(x) - param / 2) > 1e-3].reshape(-1)
    gradcheck(lambda t: FS.spike(t, name, param, smooth=True), [x])


@pytest.mark.parametrize("name,param", [("sigmoid", 5.0), ("rectangular", 0.5)])
def test_the_step_forward_carries_the_surrogate_gradient(name, param):
    x = Tensor(np.array([-2.0, -0.2, -0.1, 0.0, 0.1, 0.2, 2.0]), requires_grad=True)
    y = FS.spike(x, name, param)
    np.testing.assert_array_equal(y.data, [0, 0, 0, 1, 1, 1, 1])
    y.sum().backward()
    if name == "sigmoid":  # written out: alpha * e^{-ax} / (1 + e^{-ax})^2
        e = np.exp(-param * x.data)
        want = param * e / (1 + e) ** 2
    else:
        want = np.where(np.abs(x.data) < param / 2, 1 / param, 0.0)
    np.testing.assert_allclose(x.grad, want, rtol=1e-8)


# ---------------------------------------------------------------- the unrolled layer


@pytest.mark.parametrize("reset", ["subtract", "zero"])
@pytest.mark.parametrize("name,param", [("sigmoid", 4.0), ("rectangular", 1.5)])
def test_unrolled_lif_gradcheck(reset, name, param):
    """Every input of the layer (currents, decay, threshold) through all T steps: with the
    surrogate in the forward, BPTT is the exact derivative of a smooth function."""
    r = _rng(1)
    x = r.uniform(-0.5, 1.5, (2, 6, 3))
    decay, thr = np.array([0.8]), np.array([0.7])
    gradcheck(lambda a, b, c: FS.lif(a, b, c, reset, name, param, smooth=True), [x, decay, thr],
              atol=1e-6, rtol=1e-4)


def test_unrolled_membrane_readout_gradcheck():
    x = _rng(2).standard_normal((3, 5, 4))
    gradcheck(lambda a, b: FS.lif(a, b, np.array([1.0]), membrane=True), [x, np.array([0.6])])


def _lif_loop(current, beta, theta, reset):
    """An independent float64 LIF: per sample, per neuron, per step."""
    n, t_steps = current.shape[:2]
    flat = current.reshape(n, t_steps, -1)
    spikes = np.zeros_like(flat)
    for i in range(n):
        for j in range(flat.shape[2]):
            v = 0.0
            for t in range(t_steps):
                u = beta * v + flat[i, t, j]
                fire = 1.0 if u >= theta else 0.0
                spikes[i, t, j] = fire
                v = u - fire * theta if reset == "subtract" else (0.0 if fire else u)
    return spikes.reshape(current.shape)


@pytest.mark.parametrize("reset", ["subtract", "zero"])
def test_lif_matches_an_independent_numpy_loop(reset):
    x = _rng(3).uniform(-0.3, 0.9, (3, 9, 2, 5))
    got = FS.lif(Tensor(x), np.array([0.85]), np.array([1.0]), reset).data
    np.testing.assert_array_equal(got, _lif_loop(x, 0.85, 1.0, reset))
    assert 0.05 < got.mean() < 0.95  # the case fires and rests


def test_spiking_linear_layer_matches_the_loop():
    """The whole block in float64: the synapse at each step (W x_t + b), then the neurons."""
    r = _rng(4)
    layer = S.SpikingLinear(6, 4, rng=r, decay=0.75, threshold=0.5, reset="zero", output="count")
    layer.syn.weight.data = layer.syn.weight.data.astype(np.float64)
    layer.syn.bias.data = layer.syn.bias.data.astype(np.float64)
    x = (r.random((2, 7, 6)) < 0.5).astype(np.float64)
    w, b = layer.syn.weight.data, layer.syn.bias.data
    current = np.einsum("ntf,of->nto", x, w) + b
    want = _lif_loop(current, 0.75, 0.5, "zero").sum(axis=1)
    got = FS.lif(Tensor(current), np.array([0.75]), np.array([0.5]), "zero").data.sum(axis=1)
    np.testing.assert_array_equal(got, want)
    out = layer(Tensor(x.astype(np.float32)))  # the layer itself, in float32
    np.testing.assert_array_equal(out.data, want)


def test_learnable_decay_and_threshold_get_gradients():
    layer = S.LIF(learn_decay=True, learn_threshold=True)
    x = Tensor(_rng(5).uniform(0, 1.2, (2, 8, 5)).astype(np.float32), requires_grad=True)
    layer(x).sum().backward()
    assert layer.decay.grad is not None and layer.threshold.grad is not None
    assert np.all(np.isfinite(layer.decay.grad)) and layer.threshold.grad[0] < 0
    assert {n for n, _ in layer.named_parameters()} == {"decay", "threshold"}


def test_bad_layer_arguments_are_refused():
    with pytest.raises(ValueError, match="decay must be in"):
        S.LIF(decay=1.5)
    with pytest.raises(ValueError, match="surrogate must be"):
        S.LIF(surrogate="triangle")
    with pytest.raises(ValueError, match="time steps"):
        S.SpikeEncoder(0)


# ---------------------------------------------------------------- encoders


def test_encoders():
    x = np.array([[-4.0, -2.0, 0.0, 1.0, 2.0]], np.float32)  # p = 0, 0, .5, .75, 1
    direct = S.SpikeEncoder(3, "direct")(Tensor(x)).data
    np.testing.assert_array_equal(direct, np.repeat(x[:, None], 3, axis=1))
    lat = S.SpikeEncoder(5, "latency")(Tensor(x)).data[0]
    # one spike at round((1 - p) * 4): p .5 -> t 2, .75 -> t 1, 1 -> t 0; p 0 never fires
    want = np.zeros((5, 5), np.float32)
    want[2, 2] = want[1, 3] = want[0, 4] = 1
    np.testing.assert_array_equal(lat, want)
    enc = S.SpikeEncoder(400, "rate", shape=(5,), seed=3)
    rates = enc(Tensor(x)).data[0].mean(axis=0)
    np.testing.assert_allclose(rates, [0, 0, 0.5, 0.75, 1], atol=0.07)
    enc.eval()
    a, b = enc(Tensor(x)).data, enc(Tensor(x)).data
    np.testing.assert_array_equal(a, b)  # eval: the stored table
    np.testing.assert_array_equal(a[0], (enc.noise < np.clip(x * 0.25 + 0.5, 0, 1)))
    enc.train()
    assert not np.array_equal(enc(Tensor(x)).data, enc(Tensor(x)).data)  # fresh draws


# ---------------------------------------------------------------- memory savers


def _model(rng):
    return nn.Sequential(
        S.SpikeEncoder(6, "rate", shape=(2, 6, 6), seed=1),
        S.SpikingConv2d(2, 4, 3, padding=1, rng=rng, threshold=0.3),
        S.SpikingConv2d(4, 4, 3, stride=2, padding=1, rng=rng, threshold=0.3),
        S.SpikingLinear(36, 8, rng=rng, threshold=0.3),
        S.SpikingLinear(8, 3, rng=rng, output="membrane"))


def test_checkpointing_across_the_time_steps_gives_the_same_gradients():
    x = Tensor(_rng(6).standard_normal((4, 2, 6, 6)).astype(np.float32))
    grads = []
    for segments in (0, 2):
        m = _model(_rng(7))
        out = checkpoint_sequential(m, x, segments)
        (out * Tensor(np.arange(out.data.size, dtype=np.float32).reshape(out.shape))).sum().backward()
        grads.append([p.grad.copy() for p in m.parameters()])
    for a, b in zip(*grads):
        np.testing.assert_array_equal(a, b)
    assert any(np.abs(g).sum() > 0 for g in grads[0])


def test_fp16_keeps_the_spiking_layers_fp32():
    m = _model(_rng(8))
    amp = MixedPrecision(m, "fp16")
    assert all(p.data.dtype == np.float32 for p in m.parameters())
    x = Tensor(amp.cast_input(_rng(9).standard_normal((2, 2, 6, 6)).astype(np.float32)))
    assert x.dtype == np.float16
    out = m(x)
    assert out.dtype == np.float32
    out.sum().backward()
    assert all(p.grad.dtype == np.float32 for p in m.parameters() if p.grad is not None)


def test_firing_rates_are_counted_per_layer():
    m = _model(_rng(10))
    m(Tensor(_rng(11).standard_normal((3, 2, 6, 6)).astype(np.float32)))
    rates = S.firing_rates(m)
    assert set(rates) == {"1", "2", "3"}  # the membrane readout does not fire
    assert all(0 <= r <= 1 for r in rates.values()) and max(rates.values()) > 0
    assert S.firing_rates(m) == {}  # read and reset


def test_snn_options_are_checked_with_a_model_error():
    from pocket.train import models

    with pytest.raises(models.ModelError, match=r"\[model\] snn: readout must be count or membrane"):
        models.ZOO["snn"]((1, 8, 8), 10, readout="spikes")
    with pytest.raises(models.ModelError, match="encoding must be direct, rate or latency"):
        models.ZOO["snn"]((4,), 3, encoding="poisson")
    m = models.ZOO["snn"]((6,), 3, steps=3, hidden=[5], readout="membrane")
    assert m(Tensor(np.ones((2, 6), np.float32))).shape == (2, 3)


@pytest.mark.parametrize("cfg,shape", [
    ({"name": "snn", "steps": 5, "channels": [3, 4], "hidden": [8], "threshold": 0.3,
      "reset": "zero", "learn_decay": True, "learn_threshold": True}, (1, 6, 6)),
    ({"name": "snn", "steps": 4, "encoding": "rate", "hidden": [6], "readout": "membrane",
      "surrogate": "rectangular"}, (7,)),
    ({"layers": [{"type": "spike_encode", "steps": 4, "mode": "latency"},
                 {"type": "spiking_conv2d", "out": 3, "kernel": 3, "padding": 1, "stride": 2,
                  "threshold": 0.2},
                 {"type": "lif", "decay": 0.5, "threshold": 0.5},
                 {"type": "spiking_linear", "out": 5, "threshold": 0.3},
                 {"type": "spiking_linear", "output": "count", "threshold": 0.2}]}, (2, 5, 5)),
], ids=["snn_conv", "snn_rate_membrane", "layer_list"])
def test_spiking_models_trace_to_their_eval_output(cfg, shape):
    from pocket.formats import reference
    from pocket.train.models import build_model
    from pocket.train.trace import trace

    rng = _rng(12)
    model = build_model(cfg, shape, 3, rng).eval()
    x = rng.normal(0, 1, (4, *shape)).astype(np.float32)
    want = model(Tensor(x)).data
    graph, params = trace(model, shape)
    got = reference.run(graph, params, {"input": x})["output"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert {n.op for n in graph.nodes} <= {"spike_encode", "lif"}


@pytest.mark.parametrize("name,shape", [("digits_snn", (1, 8, 8)), ("mnist_snn", (1, 28, 28))])
def test_the_example_configs_build(name, shape):
    import pathlib

    from pocket.train.config import load_config
    from pocket.train.models import build_model

    path = pathlib.Path(__file__).parents[2] / "examples" / f"{name}.toml"
    cfg = load_config(str(path), {})
    model = build_model(cfg["model"], shape, 10, _rng(13))
    assert S.time_steps(model) == cfg["model"]["steps"] <= 16
    assert model[-1].output == "count"
