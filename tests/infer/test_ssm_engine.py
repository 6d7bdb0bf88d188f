"""The engine's state-space kernels against the reference, and streaming == whole sequence."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from models import FakeContainer

from pocket.formats import reference as ref
from pocket.formats.ir import Graph, Node, ValueInfo
from pocket.formats.ops_ssm import SSM_PARAMS
from pocket.infer import Engine, EngineError

sys.path.insert(0, str(Path(__file__).parents[1]))
from ssm_params import ssm_params  # noqa: E402


def ssm_graph(rng, length, h, s, *, bidirectional=False, glu=False, tail=None):
    p = {f"ssm.{k}": v for k, v in ssm_params(rng, h, s, bidirectional, np.float32).items()}
    nodes = [Node("ssm", "ssm", ["x", *p], ["y0"], {"bidirectional": bidirectional})]
    if glu:
        nodes.append(Node("glu", "glu", ["y0"], ["y1"], {"axis": -1}))
    if tail == "flatten":
        nodes.append(Node("flat", "flatten", [nodes[-1].outputs[0]], ["y2"], {}))
    infos = {k: ValueInfo("f32", v.shape) for k, v in p.items()}
    g = Graph({"x": ValueInfo("f32", ("N", length, h))}, [nodes[-1].outputs[0]], nodes, infos, {})
    g.validate()
    return g, p


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("n,length,h,s", [(1, 1, 1, 1), (3, 7, 5, 3), (2, 12, 4, 6)])
def test_engine_matches_reference(n, length, h, s, bidirectional):
    rng = np.random.default_rng(n * 100 + length)
    g, p = ssm_graph(rng, length, h, s, bidirectional=bidirectional, glu=h % 2 == 0)
    x = rng.normal(size=(n, length, h)).astype(np.float32)
    want = ref.run(g, p, x)[g.outputs[0]]
    with Engine(FakeContainer(g, p), max_batch=4) as eng:
        got = eng.run(x, copy=True)
        again = eng.run(x, copy=True)  # the state starts from zero at every run
        one = eng.run(x[:1], copy=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(again, got)
    np.testing.assert_allclose(one, want[:1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("axis", [1, 2])
def test_glu_kernel_matches_reference(axis):
    rng = np.random.default_rng(7)
    node = Node("glu", "glu", ["x"], ["y"], {"axis": axis})
    g = Graph({"x": ValueInfo("f32", ("N", 6, 3 + 3 * (axis == 2)))}, ["y"], [node], {}, {})
    x = (3 * rng.normal(size=(2, *g.inputs["x"].shape[1:]))).astype(np.float32)
    with Engine(FakeContainer(g, {})) as eng:
        np.testing.assert_allclose(eng.run(x), ref.run(g, {}, x)["y"], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("chunk", [1, 3])
def test_streaming_equals_whole_sequence(chunk):
    rng = np.random.default_rng(8)
    g, p = ssm_graph(rng, 9, 4, 5, glu=True)
    x = rng.normal(size=(2, 9, 4)).astype(np.float32)
    with Engine(FakeContainer(g, p)) as eng:
        whole = eng.run(x, copy=True)
        with eng.stream(chunk) as s:
            parts = [s(x[:, t:t + chunk]) for t in range(0, 9, chunk)]
            assert s.steps == 9
            np.testing.assert_allclose(np.concatenate(parts, axis=1), whole, rtol=1e-6, atol=1e-6)
            with pytest.raises(EngineError, match="state of 2 sequences"):
                s(x[:1, :chunk])
            s.reset()  # a new sequence starts from a zero state
            np.testing.assert_allclose(s(x[:1, :chunk]), whole[:1, :chunk], rtol=1e-6, atol=1e-6)
    # and streaming goes on past the window the model was exported with
    long = rng.normal(size=(1, 30, 4)).astype(np.float32)
    with Engine(FakeContainer(g, p)) as eng, eng.stream(1) as s:
        streamed = np.concatenate([s(long[:, t:t + 1]) for t in range(30)], axis=1)
    np.testing.assert_allclose(streamed, ref.run(_retimed(g, 30), p, long)[g.outputs[0]],
                               rtol=1e-5, atol=1e-5)


def _retimed(g, length):
    (name, info), = g.inputs.items()
    return Graph({name: ValueInfo("f32", ("N", length, info.shape[2]))}, g.outputs, g.nodes,
                 g.params, {})


def test_unstreamable_models_are_named():
    rng = np.random.default_rng(9)
    g, p = ssm_graph(rng, 6, 2, 2, bidirectional=True)
    with Engine(FakeContainer(g, p)) as eng, pytest.raises(EngineError, match="bidirectional"):
        eng.stream()
    g, p = ssm_graph(rng, 6, 2, 2, tail="flatten")
    with Engine(FakeContainer(g, p)) as eng:
        with pytest.raises(EngineError, match="node 'flat' .flatten. mixes time steps"):
            eng.stream()
        with pytest.raises(EngineError, match="positive number"):
            eng.stream(0)
    assert set(SSM_PARAMS) <= {k.split(".")[1] for k in p}
