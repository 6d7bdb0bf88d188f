"""At batch 1 (max_batch 1) the engine lets a concat's inputs be written straight into their
slices of its output, and a channel slice be a view of its input (engine._concat_slices,
engine._slice_view): results against the reference interpreter and bit for bit against the
same graph planned for batch 2 (which copies), and which values became views."""

from __future__ import annotations

import numpy as np
from models import FakeContainer

from pocket.formats import reference as ref
from pocket.formats.ir import Graph, Node, ValueInfo
from pocket.infer.engine import Engine

RNG = np.random.default_rng(23)
CONV = {"stride": [1, 1], "dilation": [1, 1], "groups": 1}


def _conv(name, x, c, o, k, params, act="relu"):
    params[f"{name}.w"] = (RNG.standard_normal((o, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
    params[f"{name}.b"] = RNG.standard_normal(o).astype(np.float32)
    return Node(name, "conv2d", [x, f"{name}.w", f"{name}.b"], [name],
                {**CONV, "padding": [k // 2, k // 2], "activation": act})


def _info(a):
    return ValueInfo("f32", tuple(a.shape))


def _run(nodes, params, x, outputs):
    g = Graph({"x": ValueInfo("f32", ("N", *x.shape[1:]))}, outputs, nodes,
              {k: _info(v) for k, v in params.items()})
    want = ref.run(g, params, x)
    got = {}
    for mb in (1, 2):
        with Engine(FakeContainer(g, params), max_batch=mb) as eng:
            for _ in range(2):  # a second call: nothing left over from the first matters
                out = eng.run_all(x, copy=True)
            got[mb] = out
            if mb == 1:
                ctx = eng._ctx
                views = {v for v in ctx.root if ctx.root[v] != v}
    for o in outputs:
        np.testing.assert_allclose(got[1][o], want[o], rtol=1e-5, atol=1e-5)
        assert np.array_equal(got[1][o], got[2][o])
    return views


def test_fire_module_writes_its_branches_in_place():
    """SqueezeNet's fire: squeeze, then 1x1 and 3x3 expands concatenated along channels."""
    params = {}
    nodes = [_conv("sq", "x", 8, 4, 1, params), _conv("e1", "sq", 4, 16, 1, params),
             _conv("e3", "sq", 4, 16, 3, params),
             Node("cat", "concat", ["e1", "e3"], ["cat"], {"axis": 1}),
             Node("y", "relu", ["cat"], ["y"])]
    x = RNG.standard_normal((1, 8, 6, 6)).astype(np.float32)
    # (here the output's buffer must live from e1 on: planned from the concat, it shared
    # bytes with e3's scratch, which then overwrote e1's slice)
    assert _run(nodes, params, x, ["y"]) == {"e1", "e3"}


def test_shuffle_unit_slices_are_views():
    """ShuffleNetV2's unit: split the channels, convolve one half, concat, shuffle, twice."""
    params = {}
    nodes = [_conv("stem", "x", 3, 16, 3, params),
             Node("s1", "slice", ["stem"], ["s1"], {"axis": 1, "start": 0, "end": 8}),
             Node("s2", "slice", ["stem"], ["s2"], {"axis": 1, "start": 8, "end": 16}),
             _conv("b", "s2", 8, 8, 3, params),
             Node("cat", "concat", ["s1", "b"], ["cat"], {"axis": 1}),
             Node("shuf", "channel_shuffle", ["cat"], ["shuf"], {"groups": 2}),
             Node("t1", "slice", ["shuf"], ["t1"], {"axis": 1, "start": 0, "end": 8}),
             Node("t2", "slice", ["shuf"], ["t2"], {"axis": 1, "start": 8, "end": 16}),
             _conv("b2", "t2", 8, 8, 1, params),
             Node("cat2", "concat", ["t1", "b2"], ["y"], {"axis": 1})]
    x = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
    # s1 and t1 are views, so the concats copy them; b and b2 are written in place
    assert _run(nodes, params, x, ["y"]) == {"s1", "s2", "t1", "t2", "b", "b2"}


def test_what_must_stay_a_copy():
    """Not in place: a graph input, a value another node reads too, one input given twice,
    a graph output, a concat along the spatial axes, and a slice at an unaligned offset."""
    params = {}
    nodes = [_conv("a", "x", 3, 4, 1, params), _conv("b", "x", 3, 4, 3, params),
             Node("cat", "concat", ["x", "a", "b", "b"], ["cat"], {"axis": 1}),
             Node("r", "relu", ["a"], ["r"]),
             Node("sp", "concat", ["r", "a"], ["sp"], {"axis": 2}),
             Node("un", "slice", ["cat"], ["un"], {"axis": 1, "start": 3, "end": 9}),
             _conv("c", "x", 3, 4, 1, params),
             Node("out", "concat", ["c", "un"], ["out"], {"axis": 1})]
    x = RNG.standard_normal((1, 3, 5, 5)).astype(np.float32)
    # only c: its sole reader is the last concat (un is a copy: 3 * 25 floats is not aligned)
    assert _run(nodes, params, x, ["cat", "sp", "out", "c"][:3]) == {"c"}
