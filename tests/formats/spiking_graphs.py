"""Small spiking graphs (spike_encode and lif in every synapse, encoding and output form) with
random weights, fp32 or with int8 lif weights, for the reference, engine and ONNX tests."""

from __future__ import annotations

import numpy as np

from pocket.formats import quant as Q
from pocket.formats.ir import Graph, Node, ValueInfo


def _lif(name, x, out, *params, **attrs):
    a = {"decay": 0.8, "threshold": 0.5, "reset": "subtract", "output": "spikes"}
    a.update(attrs)
    return Node(name, "lif", [x, *params], [out], a)


def build(kind: str, rng: np.random.Generator):
    """(graph, params, input per-sample shape) of one case."""
    p: dict[str, np.ndarray] = {}

    def w(name, *shape, scale=1.0):
        fan = int(np.prod(shape[1:]))
        p[name] = (scale * rng.standard_normal(shape) / np.sqrt(fan) * 2).astype(np.float32)
        return name

    if kind == "conv":
        shape = (1, 6, 7)
        nodes = [
            Node("enc", "spike_encode", ["x"], ["e"], {"T": 5, "mode": "direct"}),
            _lif("l1", "e", "s1", w("w1", 3, 1, 3, 3), w("b1", 3, 1), synapse="conv2d",
                 padding=[1, 1]),
            _lif("l2", "s1", "s2", w("w2", 4, 3, 3, 3), w("b2", 4, 1), synapse="conv2d",
                 stride=[2, 2], padding=[1, 1], reset="zero"),
            _lif("l3", "s2", "y", w("w3", 6, 48), w("b3", 6, 1), synapse="linear",
                 output="count"),
        ]
        p["b1"], p["b2"], p["b3"] = p["b1"][:, 0], p["b2"][:, 0], p["b3"][:, 0]
    elif kind == "rate":
        shape = (10,)
        p["noise"] = rng.random((6, 10), dtype=np.float32)
        nodes = [
            Node("enc", "spike_encode", ["x", "noise"], ["e"], {"T": 6, "mode": "rate",
                                                              "gain": 0.3, "offset": 0.5}),
            _lif("l1", "e", "s1", w("w1", 7, 10), synapse="linear", reset="zero"),
            _lif("l2", "s1", "s2", threshold=0.3),
            _lif("l3", "s2", "y", w("w3", 3, 7), w("b3", 3, 1), synapse="linear",
                 output="membrane", decay=0.9),
        ]
        p["b3"] = p["b3"][:, 0]
    elif kind == "latency":
        shape = (2, 5, 5)
        nodes = [
            Node("enc", "spike_encode", ["x"], ["e"], {"T": 7, "mode": "latency"}),
            _lif("l1", "e", "s1", w("w1", 3, 2, 2, 3), synapse="conv2d", threshold=0.3),
            _lif("l2", "s1", "y", w("w2", 4, 36), synapse="linear", output="count",
                 threshold=0.4),
        ]
    else:
        raise ValueError(kind)
    g = Graph({"x": ValueInfo("f32", ("N", *shape))}, [nodes[-1].outputs[0]], nodes,
              {k: ValueInfo("f32", v.shape) for k, v in p.items()}, {})
    g.validate()
    return g, p, shape


def int8_weights(graph: Graph, params: dict):
    """The graph with every lif weight int8 per output channel: (graph, params, quant)."""
    params, quant = dict(params), {}
    for n in graph.nodes:
        if n.op == "lif" and len(n.inputs) > 1:
            w_q, scale = Q.quantize_weights(params[n.inputs[1]])
            params[n.inputs[1]] = w_q
            quant[n.inputs[1]] = {"scale": scale.tolist(), "zero_point": [0] * len(scale),
                                  "axis": 0}
    g = Graph(dict(graph.inputs), list(graph.outputs), list(graph.nodes),
              {k: ValueInfo("i8" if v.dtype == np.int8 else "f32", v.shape)
               for k, v in params.items()}, {})
    g.validate()
    return g, params, quant


def inputs(shape, n: int, rng) -> np.ndarray:
    return rng.standard_normal((n, *shape)).astype(np.float32)
