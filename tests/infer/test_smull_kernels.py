"""kernels_smull and routes conv_smull, conv_smull_taps, linear_smull (int8 convs and linears
on 64-bit ARM without dotprod: the Pi 4's Cortex-A72): the CPU gate, the routes' limits and
order, the routes end to end on any CPU with NumPy twins of the GEMMs in their place, and
where the CPU runs them (`../shared/tools/arm64-env python -m pytest -p no:cacheprovider` this
file, PI=pi4, with pytest in the root) the smull GEMMs against NumPy, with and without two
products an int16 lane, -128 weights included, and the routes against formats/reference.py
and their portable twins conv_int8_blas and linear_int8, bit for bit. The packing and weight
layouts are kernels_sdot's (tested in test_sdot_kernels)."""

from __future__ import annotations

import platform

import numpy as np
import pytest
from test_sdot_kernels import LINEAR_CASES, _conv, _conv1x1, _gemm_twin, _linear, against_twin, gemm_q_twin

from pocket.formats import reference as ref
from pocket.infer import kernels_sdot as ks
from pocket.infer import kernels_smull as km
from pocket.infer import routes
from pocket.infer.plan import Cpu
from pocket.infer.routes.base import ConvGeometry

RNG = np.random.default_rng(29)
needs_smull = pytest.mark.skipif(not km.AVAILABLE, reason="not 64-bit ARM without dotprod")
A72 = Cpu(False, False, smull=True)


def test_the_gate():
    """Off on anything but 64-bit ARM, never beside sdot, and off by the switch everywhere."""
    if platform.machine().lower() not in ("aarch64", "arm64"):
        assert not km.has_smull() and not km.AVAILABLE
    assert not (km.AVAILABLE and ks.AVAILABLE)
    assert Cpu.host().smull == km.AVAILABLE


def test_the_switch(monkeypatch):
    monkeypatch.setenv("POCKET_INT8_SMULL", "0")
    assert not km.has_smull()


def test_pairs_ok():
    """Two products share an int16 lane only without a -128 weight: 2 * 128 * 127 < 2**15."""
    assert 2 * 128 * 127 < 2**15 <= 2 * 128 * 128
    w = RNG.integers(-127, 128, (4, 8)).astype(np.int8)
    assert km.pairs_ok(w) == 1
    w[2, 5] = -128
    assert km.pairs_ok(w) == 0
    assert km.pairs_ok(np.zeros((0, 4), np.int8)) == 1


def test_the_route_limits():
    one = ConvGeometry(8, 5, 5, 4, 1, 1, 2, 2, 0, 0, 1, 1, 1)
    r, taps = routes.ROUTES["conv_smull"], routes.ROUTES["conv_smull_taps"]
    assert r.eligible(one, "i8", A72) and taps.eligible(one, "i8", A72)
    for route in (r, taps):
        assert "without the dot product" in route.limits(one, "i8", Cpu(False, False))
        assert "without the dot product" in route.limits(one, "i8", Cpu(False, False, True))
        assert route.limits(one, "f32", A72) == "int8 only"
    three = ConvGeometry(8, 5, 5, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1)
    assert not r.eligible(three, "i8", A72) and taps.eligible(three, "i8", A72)
    assert taps.limits(ConvGeometry(8, 5, 5, 8, 3, 3, 1, 1, 1, 1, 1, 1, 2), "i8", A72) == "groups 1 only"
    names = [t.name for t in routes.TABLE["conv2d"]]
    # ahead of the portable twin, so the A72 takes them; behind sdot (never both eligible)
    assert names.index("conv_sdot_taps") < names.index("conv_smull") < names.index("conv_smull_taps")
    assert names.index("conv_smull_taps") < names.index("conv_int8_blas")


def _gemv_twin(c, x, w, pairs):
    """NumPy: kernels_smull.gemv, c = x @ w.T in int64, checked to fit int32."""
    full = x.astype(np.int64) @ w.T.astype(np.int64)
    assert np.abs(full).max(initial=0) < 2**31
    c[:] = full


def _with_twins(monkeypatch):
    """The engine told it runs on an A72, kernels_smull's GEMMs replaced by NumPy twins."""
    from pocket.infer import plan

    monkeypatch.setattr(plan.Cpu, "host", staticmethod(lambda: A72))
    monkeypatch.setattr(km, "gemm", lambda c, w, xp, pairs: _gemm_twin(c, w, xp))
    monkeypatch.setattr(km, "gemm_q", gemm_q_twin)
    monkeypatch.setattr(km, "gemv", _gemv_twin)


@pytest.mark.parametrize("n,c,o,hw,stride,float_out", [
    (1, 16, 24, (7, 5), 1, False), (3, 6, 5, (6, 6), 2, False), (2, 96, 16, (4, 4), 1, False),
    (2, 24, 13, (8, 8), 1, True), (1, 7, 6, (8, 4), 2, True)])
def test_route_with_numpy_gemms(n, c, o, hw, stride, float_out, monkeypatch):
    """conv_smull end to end on any CPU: its operands and gemm_q's epilogue (any map), against
    formats/reference.py bit for bit."""
    from models import FakeContainer

    from pocket.infer.engine import Engine

    g, params, quant, x = _conv1x1(n, c, o, hw, stride, float_out)
    want = ref.run(g, params, x, quant)["y"]
    _with_twins(monkeypatch)
    monkeypatch.setenv("POCKET_ROUTE", "conv_smull")
    with Engine(FakeContainer(g, params, quant), max_batch=n) as eng:
        got = eng.run(x, copy=True)
        assert eng.routes()[0]["route"] == "conv_smull"
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("n,c,o,hw,geom,pool,to_f32", [
    (1, 16, 24, (7, 5), (3, 3, 1, 1, 1, 1, 1, 1), False, False),
    (3, 3, 8, (11, 10), (7, 7, 2, 2, 3, 3, 1, 1), False, False),
    (2, 8, 5, (8, 8), (3, 3, 1, 1, 1, 1, 1, 1), True, False),
    (2, 6, 7, (9, 7), (3, 3, 2, 2, 1, 1, 1, 1), False, True)])
def test_taps_route_with_a_numpy_gemm(n, c, o, hw, geom, pool, to_f32, monkeypatch):
    from models import FakeContainer

    from pocket.infer.engine import Engine

    g, params, quant, x, out = _conv(n, c, o, hw, geom, pool, to_f32)
    want = ref.run(g, params, x, quant)[out]
    _with_twins(monkeypatch)
    monkeypatch.setenv("POCKET_ROUTE", "conv_smull_taps")
    with Engine(FakeContainer(g, params, quant), max_batch=n) as eng:
        got = eng.run(x, copy=True)
        assert eng.routes()[0]["route"] == "conv_smull_taps"
    np.testing.assert_array_equal(got, want)


def test_the_linear_route_limits():
    r = routes.ROUTES["linear_smull"]
    geo = routes.base.LinearGeometry(1, 512, 1000)
    assert r.eligible(geo, "i8", A72)
    assert "without the dot product" in r.limits(geo, "i8", Cpu(False, False, True))
    assert r.limits(geo, "f32", A72) == "int8 only"
    names = [t.name for t in routes.TABLE["linear"]]
    assert names.index("linear_sdot") < names.index("linear_smull") < names.index("linear_int8")


@pytest.mark.parametrize("n,k,o,to_f32,lead", LINEAR_CASES)
def test_linear_route_with_a_numpy_gemv(n, k, o, to_f32, lead, monkeypatch):
    """linear_smull end to end on any CPU (kernels_smull.gemv as its NumPy twin): the weights
    and rows padded to 16-byte runs (K % 16 != 0), the epilogue, against the reference."""
    from models import FakeContainer

    from pocket.infer.engine import Engine

    g, params, quant, x = _linear(n, k, o, to_f32, lead)
    want = ref.run(g, params, x, quant)["y"]
    _with_twins(monkeypatch)
    monkeypatch.setenv("POCKET_ROUTE", "linear_smull")
    with Engine(FakeContainer(g, params, quant), max_batch=n) as eng:
        got = eng.run(x, copy=True)
        assert eng.routes()[0]["route"] == "linear_smull"
    np.testing.assert_array_equal(got, want)


# ----------------------------------------------------------------- on 64-bit ARM without sdot


@needs_smull
@pytest.mark.parametrize("o,k4,mp", [(5, 3, 16), (17, 300, 48), (4, 1, 8), (9, 513, 24)])
@pytest.mark.parametrize("wmin", [-127, -128])
def test_gemm(o, k4, mp, wmin):
    """The tiles against an int64 NumPy product: channel tails, odd K4 (a single step after the
    pairs), K past one block; one word a step (pairs 0) always, pairs where the weights allow;
    extreme operands (x -128 against w -127: the largest pair an int16 lane holds)."""
    w = RNG.integers(wmin, 128, (o, 4 * k4)).astype(np.int8)
    w[0, :] = wmin
    xb = RNG.integers(-128, 128, (k4, 4 * mp)).astype(np.int8)
    xb[:, :8] = -128
    want = w.astype(np.int64) @ xb.reshape(k4, mp, 4).transpose(0, 2, 1).reshape(4 * k4, mp)
    for pairs in {0, km.pairs_ok(w)}:
        c = np.full((o, mp), 7, np.int32)
        km.gemm(c, w, xb.view(np.uint32), pairs)
        np.testing.assert_array_equal(c, want)
    assert km.pairs_ok(w) == (wmin > -128)


@needs_smull
@pytest.mark.parametrize("n,o,k4,p", [(1, 5, 3, 8), (2, 17, 20, 64), (3, 4, 1, 16), (1, 6, 5, 13),
                                      (3, 9, 4, 7), (2, 4, 2, 12)])
@pytest.mark.parametrize("codes", [True, False])
def test_gemm_q(n, o, k4, p, codes):
    """The tiles' epilogue against kernels_int8's in NumPy: channel tails, several images, maps
    whose 8-pixel tiles straddle two images or the last image's end (stored through a buffer),
    the packed operand's columns past the real pixels (rounded up to 16) never stored."""
    mp = -(-n * p // 16) * 16
    w = RNG.integers(-127, 128, (o, 4 * k4)).astype(np.int8)
    xb = RNG.integers(-128, 128, (k4, 4 * mp)).astype(np.int8)
    badj = RNG.integers(-300000, 300000, o).astype(np.int32)
    if codes:
        m, zp = (RNG.random(o) * 2e-4).astype(np.float32), np.float32(-5)
        args = (badj, m, p, np.float32(-128) - zp, np.float32(127) - zp, zp)
    else:
        args = (badj, RNG.random(o) * 1e-5, p, np.float32(0), np.float32(6), np.float32(0))
    dt = np.int8 if codes else np.float32
    want = np.zeros((n, o, p), dt)
    got = np.full((n + 1, o, p), 99, dt)  # one image more: nothing may be written there
    gemm_q_twin(want, w, xb.view(np.uint32), *args, 1)
    km.gemm_q(got[:n], w, xb.view(np.uint32), *args, 1)
    np.testing.assert_array_equal(got[:n], want)
    assert (got[n] == 99).all()


@needs_smull
@pytest.mark.parametrize("n,c,o,hw,stride,float_out", [
    (1, 16, 24, (7, 5), 1, False), (3, 6, 5, (6, 6), 2, False), (2, 96, 16, (4, 4), 1, False),
    (2, 24, 13, (8, 8), 1, True)])
def test_route_against_the_reference_and_its_twin(n, c, o, hw, stride, float_out, monkeypatch):
    g, params, quant, x = _conv1x1(n, c, o, hw, stride, float_out)
    against_twin("conv_smull", "conv_int8_blas", g, params, quant, x, n, monkeypatch)


@needs_smull
@pytest.mark.parametrize("n,c,o,hw,geom,pool", [
    (1, 16, 24, (7, 5), (3, 3, 1, 1, 1, 1, 1, 1), False),
    (2, 3, 8, (11, 10), (7, 7, 2, 2, 3, 3, 1, 1), False),
    (2, 8, 5, (8, 8), (3, 3, 1, 1, 1, 1, 1, 1), True),
    (2, 8, 13, (8, 8), (3, 3, 1, 1, 1, 1, 1, 1), False),  # 64 pixels: gemm_q's epilogue (sdot too)
    (1, 64, 20, (6, 6), (3, 3, 2, 2, 1, 1, 1, 1), False)])
def test_taps_route_against_the_reference_and_its_twin(n, c, o, hw, geom, pool, monkeypatch):
    g, params, quant, x, out = _conv(n, c, o, hw, geom, pool)
    against_twin("conv_smull_taps", "conv_int8_blas", g, params, quant, x, n, monkeypatch, out)


@needs_smull
@pytest.mark.parametrize("n,o,k16", [(1, 1000, 80), (3, 5, 16), (2, 9, 48), (1, 3, 2048)])
@pytest.mark.parametrize("wmin", [-127, -128])
def test_gemv(n, o, k16, wmin):
    """4 outputs a pass against an int64 NumPy product: output tails, several rows, long K;
    pairs where the weights allow, one product an int16 lane always; extreme operands."""
    w = RNG.integers(wmin, 128, (o, k16)).astype(np.int8)
    w[0] = wmin
    x = RNG.integers(-128, 128, (n, k16)).astype(np.int8)
    x[0] = -128
    want = x.astype(np.int64) @ w.T.astype(np.int64)
    for pairs in {0, km.pairs_ok(w)}:
        c = np.full((n, o), 7, np.int32)
        km.gemv(c, x, w, pairs)
        np.testing.assert_array_equal(c, want)


@needs_smull
@pytest.mark.parametrize("n,k,o,to_f32,lead", LINEAR_CASES)
def test_linear_route_against_the_reference_and_its_twin(n, k, o, to_f32, lead, monkeypatch):
    against_twin("linear_smull", "linear_int8", *_linear(n, k, o, to_f32, lead), n, monkeypatch)
