"""The reference of spike_encode and lif against loops written here, and their shape rules."""

from __future__ import annotations

import numpy as np
import pytest

from pocket.formats import reference as ref
from pocket.formats.errors import FormatError
from pocket.formats.ir import Graph, Node, ValueInfo
from tests.formats import spiking_graphs as sg


def _loop(current, decay, thr, reset, output):
    """float32 LIF, one neuron at a time."""
    n, steps = current.shape[:2]
    flat = current.reshape(n, steps, -1)
    spikes = np.zeros(flat.shape, np.float32)
    mem = np.zeros((n, flat.shape[2]), np.float32)
    d, th = np.float32(decay), np.float32(thr)
    for i in range(n):
        for j in range(flat.shape[2]):
            v = np.float32(0)
            for t in range(steps):
                u = np.float32(d * v) + flat[i, t, j]
                if output == "membrane":
                    v = u
                    mem[i, j] = mem[i, j] + u
                    continue
                fire = u >= th
                spikes[i, t, j] = fire
                v = (u - th if reset == "subtract" else np.float32(0)) if fire else u
    if output == "membrane":
        return (mem / np.float32(steps)).reshape((n,) + current.shape[2:])
    if output == "count":
        return spikes.sum(axis=1).reshape((n,) + current.shape[2:])
    return spikes.reshape(current.shape)


@pytest.mark.parametrize("reset", ["subtract", "zero"])
@pytest.mark.parametrize("output", ["spikes", "count", "membrane"])
def test_lif_neurons_follow_the_float32_recurrence(reset, output):
    x = np.random.default_rng(0).uniform(-0.2, 0.8, (3, 9, 2, 3)).astype(np.float32)
    a = {"synapse": "none", "decay": 0.7, "threshold": 0.6, "reset": reset, "output": output}
    got = ref.ops.impl("reference", "lif")(a, x)
    np.testing.assert_array_equal(got, _loop(x, 0.7, 0.6, reset, output))


def test_lif_synapses_apply_at_each_step():
    rng = np.random.default_rng(1)
    x = (rng.random((2, 4, 3, 5, 4)) < 0.4).astype(np.float32)
    w = rng.standard_normal((2, 3, 3, 2)).astype(np.float32)
    b = rng.standard_normal(2).astype(np.float32)
    a = {"synapse": "conv2d", "stride": [2, 1], "padding": [1, 0], "decay": 0.9,
         "threshold": 0.5, "reset": "subtract", "output": "spikes"}
    # the conv written out: output (oy, ox) reads rows oy*2-1.., cols ox..
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (0, 0), (1, 1), (0, 0)))
    ho, wo = (5 + 2 - 3) // 2 + 1, 4 - 2 + 1
    cur = np.zeros((2, 4, 2, ho, wo))
    for oy in range(ho):
        for ox in range(wo):
            win = xp[:, :, :, oy * 2:oy * 2 + 3, ox:ox + 2]
            cur[:, :, :, oy, ox] = np.einsum("ntcij,ocij->nto", win, w) + b
    got = ref.ops.impl("reference", "lif")(a, x, w, b)
    np.testing.assert_array_equal(got, _loop(cur.astype(np.float32), 0.9, 0.5, "subtract",
                                             "spikes"))
    assert 0 < got.mean() < 1


def test_encoders_by_hand():
    enc = ref.ops.impl("reference", "spike_encode")
    x = np.array([[-3.0, 0.0, 1.0, 2.0]], np.float32)  # p 0, .5, .75, 1
    lat = enc({"T": 3, "mode": "latency", "gain": 0.25, "offset": 0.5}, x)[0]
    np.testing.assert_array_equal(lat, [[0, 0, 0, 1], [0, 1, 1, 0], [0, 0, 0, 0]])
    noise = np.array([[0.1, 0.4, 0.8, 0.99]] * 2, np.float32)
    rate = enc({"T": 2, "mode": "rate", "gain": 0.25, "offset": 0.5}, x, noise)[0]
    np.testing.assert_array_equal(rate, [[0, 1, 0, 1]] * 2)


def _graph(nodes, shape=(4,), params=None):
    return Graph({"x": ValueInfo("f32", ("N", *shape))}, [nodes[-1].outputs[0]], nodes,
                 params or {}, {})


def test_shape_rules_and_their_errors():
    g, _, _ = sg.build("conv", np.random.default_rng(2))
    infos = g.infer_shapes()
    assert infos["e"].shape == ("N", 5, 1, 6, 7)
    assert infos["s2"].shape == ("N", 5, 4, 3, 4) and infos["y"].shape == ("N", 6)
    bad = [
        ([Node("e", "spike_encode", ["x"], ["e"], {"T": 0})], "T must be >= 1"),
        ([Node("e", "spike_encode", ["x"], ["e"], {"T": 2, "mode": "rate"})], "noise table"),
        ([Node("l", "lif", ["x"], ["y"], {"decay": 0.5})], "must be \\(N, T, ...\\)"),
        ([Node("e", "spike_encode", ["x"], ["e"], {"T": 2}),
          Node("l", "lif", ["e"], ["y"], {"decay": 1.5})], "decay must be in"),
        ([Node("e", "spike_encode", ["x"], ["e"], {"T": 2}),
          Node("l", "lif", ["e", "w"], ["y"], {"decay": 0.5, "synapse": "linear"})],
         "weight must be \\[out, 4\\]"),
    ]
    for nodes, msg in bad:
        with pytest.raises(FormatError, match=msg):
            _graph(nodes, params={"w": ValueInfo("f32", (3, 5))}).validate()
