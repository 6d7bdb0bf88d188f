"""The engine's spiking kernels against formats/reference.py: spikes, counts and membranes equal
(both sum each synapse in float64 and step the neurons in float32), dense and event-driven,
fp32 and int8 weights, odd shapes (stride 2, non-square kernels, batch 1 and 3)."""

from __future__ import annotations

import numpy as np
import pytest

from pocket.formats import reference as ref
from pocket.infer import Engine, EngineError
from tests.formats import spiking_graphs as sg
from tests.infer.models import save_model

# NOTE: fixed seeds, not hash(kind): str hashes change with each process's PYTHONHASHSEED, and
# two seeds in a thousand make the latency case spike nowhere (CI drew one)
SEEDS = {"conv": 0, "rate": 1, "latency": 2}


@pytest.mark.parametrize("route", ["dense", "event"])
@pytest.mark.parametrize("int8", [False, True], ids=["fp32", "int8"])
@pytest.mark.parametrize("kind", ["conv", "rate", "latency"])
def test_engine_matches_the_reference(kind, int8, route, tmp_path, monkeypatch):
    monkeypatch.setenv("POCKET_LIF", route)
    rng = np.random.default_rng(SEEDS[kind])
    g, p, shape = sg.build(kind, rng)
    quant = None
    if int8:
        g, p, quant = sg.int8_weights(g, p)
    path = save_model(tmp_path / "m.bin", g, p, quant)
    x = sg.inputs(shape, 3, rng)
    want = ref.run(g, p, x, quant)[g.outputs[0]]
    with Engine(path, max_batch=3) as eng:
        np.testing.assert_array_equal(eng.run(x, copy=True), want)
        np.testing.assert_array_equal(eng.run(x[1:2], copy=True), want[1:2])
    if g.nodes[-1].attrs["output"] == "count":
        assert 0 < want.mean() < g.nodes[0].attrs["T"]  # the case fires, and not everywhere


def test_a_bad_route_name_is_refused(tmp_path, monkeypatch):
    g, p, shape = sg.build("rate", np.random.default_rng(0))
    path = save_model(tmp_path / "m.bin", g, p)
    monkeypatch.setenv("POCKET_LIF", "sparse")
    with pytest.raises(EngineError, match="POCKET_LIF='sparse': use dense or event"):
        with Engine(path, max_batch=2) as eng:
            eng.run(sg.inputs(shape, 2, np.random.default_rng(1)))
