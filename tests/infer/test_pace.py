"""pools.Pace (team or solo, call by call) and the engine's two ways of running a plan: the
choice follows the times it is given, and both ways (and a team call that finishes solo) write
the same bytes."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from models import cnn_mnist, quantize_sequential, save_model

from pocket.formats import reference as ref
from pocket.formats.container import read_container
from pocket.infer import Engine, kernels_fma, kernels_tile, pools
from pocket.infer import bound as bound_mod
from pocket.infer import engine as engine_mod
from pocket.infer import kernels_blas as kb


def drive(pace: pools.Pace, team: float, solo: float, calls: int) -> list[bool]:
    """Make `calls` calls whose team and solo ways take these times; the ways they took."""
    ways = []
    for _ in range(calls):
        way = pace.next_solo()
        ways.append(way)
        took = team if not way else solo
        if not way and took > pace.deadline():  # a team call past its deadline finishes solo
            took = float("inf")
        pace.took(way, took)
    return ways


def test_pace_keeps_the_team_while_it_is_faster():
    pace = pools.Pace()
    ways = drive(pace, 1.0, 1.8, 1000)
    assert not pace.solo
    probes = [i for i, w in enumerate(ways) if w]
    # the first probe at the second call, then gaps doubling to the cap
    assert probes[0] == 1 and len(probes) <= 9, probes
    assert np.diff(probes).max() == pools._PROBE_MAX


def test_pace_goes_solo_under_load_and_back_when_it_ends():
    pace = pools.Pace()
    drive(pace, 1.0, 1.8, 2000)  # the gap at its cap
    drive(pace, 3.0, 1.8, pools._SLOWER_RUN + 2)  # a neighbour starts: probed at once
    assert pace.solo
    ways = drive(pace, 3.0, 1.8, 1000)
    assert sum(not w for w in ways) <= 9  # team probes only, their gap doubling
    assert pace.deadline() == pools._DEADLINE * 1.8
    ways = drive(pace, 1.0, 1.8, 200)  # the neighbour stops: probes that win look again soon
    assert not pace.solo
    first = ways.index(False)  # the first team probe; three that win switch back
    switched = next(i for i in range(len(ways)) if not any(ways[i:i + pools._PROBE_MIN]))
    assert switched <= first + 2 * pools._PROBE_MIN + 1, (first, switched)


def test_pace_needs_a_clear_win_to_switch():
    """Within _SWITCH of each other, the ways do not flip back and forth."""
    pace = pools.Pace()
    drive(pace, 1.0, 0.95, 500)
    assert not pace.solo
    pace = pools.Pace()
    drive(pace, 1.0, 0.85, 50)
    assert pace.solo


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    rng = np.random.default_rng(11)
    g, p = cnn_mnist(rng)
    x = rng.random((6, 1, 28, 28), dtype=np.float32)
    d = tmp_path_factory.mktemp("pace")
    gq, pq, qq = quantize_sequential(g, p, x)
    return {"fp32": save_model(d / "cnn.bin", g, p), "int8": save_model(d / "cnn8.bin", gq, pq, qq),
            "x": x}


def _two_threads():
    import numba

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs 2 Numba threads")
    return numba


def _force(bound, solo: bool) -> None:
    bound.pace.solo, bound.pace._left = solo, 1 << 30


@pytest.mark.parametrize("split", ["0", "1"])
@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_team_solo_and_finishing_solo_write_the_same_bytes(cnn, precision, split, monkeypatch):
    """Team calls, solo calls and team calls that finish solo after any of their calls: the
    same bytes, with and without GEMMs split across the threads (kernels_blas)."""
    numba = _two_threads()
    # every kernel splits on a team call
    monkeypatch.setattr(engine_mod, "_PARALLEL_WORK", 0)
    monkeypatch.setattr(engine_mod, "_PARALLEL_WORK_PINNED", 0)
    monkeypatch.setenv("POCKET_SPLIT_GEMM", split)
    # BLAS GEMMs to split: the portable tile routes (kernels_tile) would take the int8 convs
    monkeypatch.setattr(kernels_tile, "AVAILABLE", False)
    x = cnn["x"]
    with Engine(cnn[precision], threads=2, max_batch=8) as eng, read_container(cnn[precision]) as c:
        want = ref.run_container(c, x)[c.graph.outputs[0]]
        eng.bind(len(x))
        bound = eng._bound[len(x)]
        split_calls = any(c.func is kb.gemm_parts for c in bound.calls)
        assert split_calls == (split == "1" and eng._pinned)
        eng.run(x)
        assert bound.pace is not None and eng.mode(len(x)) == "team"
        # no parallel kernel in a solo call (Engine._solo leaves Numba's pool as it is)
        assert not any(getattr(c.func, "serial", None) is not None for c in bound.solo.calls)
        same = np.testing.assert_array_equal

        _force(bound, False)
        team = eng.run(x, copy=True)
        _force(bound, True)
        solo = eng.run(x, copy=True)
        assert eng.mode(len(x)) == "solo" and numba.get_num_threads() == 2
        same(solo, team)
        for stop in range(len(bound.calls) - 1):
            _force(bound, False)
            monkeypatch.setattr(bound_mod, "call_until", partial(_stop_at, stop))
            late = eng.run(x, copy=True)
            same(late, team, f"finished solo after call {stop}")
            assert numba.get_num_threads() == 2
        monkeypatch.undo()
        # the input read in place, copied into the arena (not C-ordered), and through run_all
        fortran = np.asfortranarray(x)
        for way in (False, True):
            _force(bound, way)
            same(eng.run(fortran), team)
            _force(bound, way)
            same(eng.run_all(x)[eng.graph.outputs[0]], team)
        tol = 0 if precision == "int8" else 1e-5
        np.testing.assert_allclose(team, want, rtol=tol, atol=tol)


def _stop_at(stop, calls, fed, deadline):
    """bound.call_until with a deadline that passes right after call `stop`."""
    at = -1 if fed is None else fed[0]
    for i, call in enumerate(calls[:stop + 1]):
        if i == at:
            call.func(*call.args[:fed[1]], fed[2], *call.args[fed[1] + 1:], **call.keywords)
        else:
            call()
    return stop


@pytest.mark.parametrize("blas", [True, False])
def test_an_error_in_a_solo_call_restores_the_threads(cnn, blas, monkeypatch):
    """A solo call shrinks BLAS's pool to one thread where a call reaches it (the portable
    kernels: convs as BLAS GEMMs) and the pool is the engine's to size (not pinned), and
    restores it on an error; Numba's pool it never touches."""
    numba = _two_threads()
    monkeypatch.setattr(engine_mod, "_PARALLEL_WORK", 0)
    if blas:
        monkeypatch.setattr(kernels_fma, "AVAILABLE", False)
        monkeypatch.setattr(kernels_tile, "AVAILABLE", False)
        monkeypatch.setattr(pools, "spin_policy", lambda *_: (False, False))  # BLAS keeps its pool
    with Engine(cnn["fp32"], threads=2, max_batch=8) as eng:
        eng.run(cnn["x"])
        bound = eng._bound[len(cnn["x"])]
        reaches = any(c.func is np.matmul or c.func is kb.gemm_parts for c in bound.calls)
        switches = bound.solo.serial_steps
        assert switches == (reaches and bool(eng._blas))
        assert switches or not blas
        before = [c.num_threads for c in pools.blas_controllers()]

        def boom():
            assert [c.num_threads for c in pools.blas_controllers()] == ([1] * len(before) if switches
                                                                          else before)
            assert numba.get_num_threads() == 2
            raise RuntimeError("boom")

        bound.solo.calls.insert(len(bound.solo.calls) - 1, partial(boom))
        _force(bound, True)
        with pytest.raises(RuntimeError, match="boom"):
            eng.run(cnn["x"])
        assert [c.num_threads for c in pools.blas_controllers()] == before
        _force(bound, False)  # a team call that finishes solo meets it too
        monkeypatch.setattr(bound_mod, "call_until", partial(_stop_at, 0))
        with pytest.raises(RuntimeError, match="boom"):
            eng.run(cnn["x"])
        assert [c.num_threads for c in pools.blas_controllers()] == before


def test_adaptive_threads_off(cnn, monkeypatch):
    _two_threads()
    monkeypatch.setattr(engine_mod, "_PARALLEL_WORK", 0)
    with Engine(cnn["fp32"], threads=2, max_batch=8, adaptive_threads=False) as eng:
        eng.run(cnn["x"])
        assert eng._bound[len(cnn["x"])].pace is None and eng.mode(len(cnn["x"])) == "team"
    monkeypatch.setenv("POCKET_ADAPTIVE_THREADS", "0")
    with Engine(cnn["fp32"], threads=2, max_batch=8) as eng:
        eng.run(cnn["x"])
        assert eng._bound[len(cnn["x"])].pace is None
    with Engine(cnn["fp32"], threads=1, max_batch=8) as eng:
        eng.run(cnn["x"])
        assert eng.mode(len(cnn["x"])) == "serial" and eng.mode(3) == "serial"


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_solo_calls_run_the_tiles_and_depthwise_planes_as_one_part(tmp_path, precision, monkeypatch):
    """A solo call runs the kernels that name `one_part` (kernels_tile's GEMMs, kernels_dw's
    padded planes) on the first row of their scratch: one part, as a 1-thread plan does, where
    the team's call splits them in two; the bytes are the team's and the 1-thread engine's."""
    from models import Builder

    _two_threads()
    monkeypatch.setattr(engine_mod, "_PARALLEL_WORK", 0)
    monkeypatch.setattr(engine_mod, "_PARALLEL_WORK_PINNED", 0)
    rng = np.random.default_rng(12)
    b = Builder((8, 30, 27), rng)
    b.conv(8, 32, 1, activation="relu")
    b.conv(32, 32, 3, groups=32, stride=[2, 2], padding=[1, 1], activation="relu")
    b.conv(32, 16, 1)
    g, p = b.graph(), b.params
    x = rng.standard_normal((2, 8, 30, 27)).astype(np.float32)
    quant = None
    if precision == "int8":
        g, p, quant = quantize_sequential(g, p, x)
    path = save_model(tmp_path / "block.bin", g, p, quant)
    with Engine(path, threads=1, max_batch=2) as one:
        want = one.run(x, copy=True)
    with Engine(path, threads=2, max_batch=2) as eng:
        eng.run(x)
        bound = eng._bound[len(x)]
        # (the bound calls are compiled entry points by now: the scratch shows by its shape)
        cut = [(a.shape[0], c.shape[0]) for t, s in zip(bound.calls, bound.solo.calls)
               for a, c in zip(t.args, s.args) if isinstance(a, np.ndarray) and a.shape != c.shape]
        assert set(cut) <= {(2, 1)}, cut
        # at least the two 1x1 GEMMs (int8's depthwise conv takes kernels_dwcl here; AVX-512
        # routes of its own)
        assert len(cut) >= (0 if kernels_fma.AVAILABLE else 2), cut
        _force(bound, False)
        team = eng.run(x, copy=True)
        _force(bound, True)
        solo = eng.run(x, copy=True)
    np.testing.assert_array_equal(team, want)
    np.testing.assert_array_equal(solo, want)
