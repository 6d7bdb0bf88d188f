"""kernels_sdot and routes/conv_sdot, conv_sdot_taps (ARM dotprod int8 convs): the CPU gate, the
packing and the weight layouts against NumPy twins (plain Numba: they run anywhere), the
routes' limits, conv_sdot_taps end to end on any CPU with a NumPy twin of the sdot GEMM in its
place, and where the CPU has dotprod (`PI=pi5 ../shared/tools/arm64-env python -m pytest -p
no:cacheprovider` this file, with pytest in the root: PY_PKGS="numpy numba onnxruntime pytest"
at setup) the sdot GEMM against NumPy and the route against formats/reference.py and its portable twin
conv_int8_blas, bit for bit. Under PI=pi4 (Cortex-A72, no dotprod) the route must not be
chosen: an sdot there is SIGILL."""

from __future__ import annotations

import platform

import numpy as np
import pytest

from pocket.formats import quant as qm
from pocket.formats import reference as ref
from pocket.formats.ir import Graph, Node, ValueInfo
from pocket.infer import kernels_sdot as ks
from pocket.infer import routes
from pocket.infer.plan import Cpu
from pocket.infer.routes.base import ConvGeometry

RNG = np.random.default_rng(23)
needs_sdot = pytest.mark.skipif(not ks.AVAILABLE, reason="this CPU has no ARM dotprod")


def _packed_twin(x, sh, sw, k4, mp):
    """NumPy: x (M, C, H, W) i8 -> the bytes of (K4, Mp) words, 4 channels of a pixel a word."""
    xs = x[:, :, ::sh, ::sw]
    m, c = xs.shape[:2]
    cols = np.zeros((4 * k4, mp), np.int8)
    cols[:c, :xs[0, 0].size * m] = xs.transpose(1, 0, 2, 3).reshape(c, -1)
    return cols.reshape(k4, 4, mp).transpose(0, 2, 1).reshape(k4, 4 * mp)


def test_the_gate():
    """Off on anything but 64-bit ARM, and off by the switch everywhere."""
    if platform.machine().lower() not in ("aarch64", "arm64"):
        assert not ks.has_dotprod() and not ks.AVAILABLE
    assert Cpu.host().sdot == ks.AVAILABLE


def test_the_switch(monkeypatch):
    monkeypatch.setenv("POCKET_INT8_SDOT", "0")
    assert not ks.has_dotprod()


@pytest.mark.parametrize("m,c,h,w,s", [(1, 8, 5, 7, 1), (2, 6, 4, 3, 1), (3, 5, 7, 6, 2),
                                       (1, 3, 1, 1, 1), (2, 9, 6, 5, 3)])
def test_pack_1x1(m, c, h, w, s):
    """Every word of the packed operand, the zero channel and column tails included."""
    ho, wo = (h - 1) // s + 1, (w - 1) // s + 1
    k4 = -(-c // 4)
    mp = -(-m * ho * wo // ks.TILE_P) * ks.TILE_P
    x = RNG.integers(-128, 128, (m, c, h, w)).astype(np.int8)
    got = np.full((k4, 4 * mp), 0x55, np.int8)
    ks.pack_1x1.serial(got, x, s, s)
    np.testing.assert_array_equal(got, _packed_twin(x, s, s, k4, mp))


def test_pad_weights():
    w = RNG.integers(-128, 128, (5, 7)).astype(np.int8)
    got = np.full((5, 8), 0x55, np.int8)
    ks.pad_weights(got, w)
    np.testing.assert_array_equal(got, np.pad(w, ((0, 0), (0, 1))))


def test_the_route_limits():
    r = routes.ROUTES["conv_sdot"]
    one = ConvGeometry(8, 5, 5, 4, 1, 1, 2, 2, 0, 0, 1, 1, 1)
    assert r.eligible(one, "i8", Cpu(False, False, True))
    assert "dot product" in r.limits(one, "i8", Cpu(False, False))
    assert r.limits(one, "f32", Cpu(False, False, True)) == "int8 only"
    for geo in (ConvGeometry(8, 5, 5, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1),
                ConvGeometry(8, 5, 5, 4, 1, 1, 1, 1, 1, 1, 1, 1, 1),
                ConvGeometry(8, 5, 5, 8, 1, 1, 1, 1, 0, 0, 1, 1, 2)):
        assert not r.eligible(geo, "i8", Cpu(False, False, True))
    # ahead of its portable twin, so a dotprod CPU takes it
    names = [t.name for t in routes.TABLE["conv2d"]]
    assert names.index("conv_sdot") < names.index("conv_int8_blas")


@needs_sdot
@pytest.mark.parametrize("o,k4,mp", [(5, 3, 16), (17, 300, 48), (4, 1, 32)])
def test_gemm(o, k4, mp):
    """The sdot tiles against an int64 NumPy product: channel tails, K past one block."""
    w = RNG.integers(-128, 128, (o, 4 * k4)).astype(np.int8)
    xb = RNG.integers(-128, 128, (k4, 4 * mp)).astype(np.int8)
    c = np.full((o, mp), 7, np.int32)
    ks.gemm(c, w, xb.view(np.uint32))
    want = w.astype(np.int64) @ xb.reshape(k4, mp, 4).transpose(0, 2, 1).reshape(4 * k4, mp)
    np.testing.assert_array_equal(c, want)


@needs_sdot
@pytest.mark.parametrize("n,o,k4,p", [(1, 5, 3, 16), (2, 17, 20, 64), (3, 4, 1, 32), (1, 6, 5, 13),
                                      (3, 9, 4, 7), (2, 4, 2, 24)])
@pytest.mark.parametrize("codes", [True, False])
def test_gemm_q(n, o, k4, p, codes):
    """The tiles' requantizing epilogue against kernels_int8's in NumPy (gemm_q_twin): channel
    tails, several images, extreme sums, maps whose 16-pixel tiles straddle two images or the
    last image's end (through _edge_tiles' buffer); nothing written past the n images."""
    mp = -(-n * p // 16) * 16
    w = RNG.integers(-128, 128, (o, 4 * k4)).astype(np.int8)
    w[0] = -128
    xb = RNG.integers(-128, 128, (k4, 4 * mp)).astype(np.int8)
    badj = RNG.integers(-300000, 300000, o).astype(np.int32)
    if codes:
        m, zp = (RNG.random(o) * 2e-4).astype(np.float32), np.float32(-5)
        args = (badj, m, p, np.float32(-128) - zp, np.float32(127) - zp, zp)
    else:
        args = (badj, RNG.random(o) * 1e-5, p, np.float32(0), np.float32(6), np.float32(0))
    dt = np.int8 if codes else np.float32
    want = np.zeros((n, o, p), dt)
    got = np.full((n + 1, o, p), 99, dt)
    gemm_q_twin(want, w, xb.view(np.uint32), *args)
    ks.gemm_q(got[:n], w, xb.view(np.uint32), *args)
    np.testing.assert_array_equal(got[:n], want)
    assert (got[n] == 99).all()


def test_fused_where():
    """gemm_q takes K in one pass only, any map."""
    assert ks.fused(ks.BLOCK_K4, 64) and ks.fused(1, 16) and ks.fused(4, 49)
    assert not ks.fused(ks.BLOCK_K4 + 1, 64)


def against_twin(route: str, twin: str, g, params, quant, x, n: int, monkeypatch, out: str = "y"):
    """The forced route's output bit for bit against formats/reference.py and its portable
    twin's (each forced by POCKET_ROUTE in an engine of max_batch n)."""
    from models import FakeContainer

    from pocket.infer.engine import Engine

    want = ref.run(g, params, x, quant)[out]
    got = {}
    for r in (route, twin):
        monkeypatch.setenv("POCKET_ROUTE", r)
        with Engine(FakeContainer(g, params, quant), max_batch=n) as eng:
            got[r] = eng.run(x, copy=True)
            assert eng.routes()[0]["route"] == r
    np.testing.assert_array_equal(got[route], want)
    np.testing.assert_array_equal(got[route], got[twin])


def _conv1x1(n, c, o, hw, stride, float_out=False):
    xs, w_s_in = 0.05, RNG.standard_normal((o, c, 1, 1)).astype(np.float32)
    w_q, w_s = qm.quantize_weights(w_s_in)
    params = {"w": w_q, "b": qm.quantize_bias(RNG.standard_normal(o).astype(np.float32), xs, w_s)}
    quant = {"w": {"scale": w_s.tolist(), "zero_point": [0] * o, "axis": 0}}
    x = RNG.integers(-128, 128, (n, c, *hw)).astype(np.int8)
    attrs = {"stride": [stride, stride], "x_scale": xs, "x_zero_point": 9, "activation": "relu"}
    if not float_out:
        attrs.update(y_scale=0.07, y_zero_point=-5)
    node = Node("conv", "conv2d", ["x", "w", "b"], ["y"], attrs)
    g = Graph({"x": ValueInfo("i8", ("N", c, *hw))}, ["y"], [node],
              {k: ValueInfo({np.int8: "i8", np.int32: "i32"}[v.dtype.type], v.shape)
               for k, v in params.items()})
    return g, params, quant, x


@needs_sdot
@pytest.mark.parametrize("n,c,o,hw,stride,float_out", [
    (1, 16, 24, (7, 5), 1, False), (3, 6, 5, (6, 6), 2, False), (2, 96, 16, (4, 4), 1, False),
    (2, 24, 13, (8, 8), 1, True), (1, 7, 6, (8, 4), 2, True)])
def test_route_against_the_reference_and_its_twin(n, c, o, hw, stride, float_out, monkeypatch):
    """conv_sdot bit for bit with the reference and conv_int8_blas; every map takes gemm_q (the
    epilogue in the tiles; 35- and 9-pixel maps through its edge tiles), int8 codes or float32
    values out."""
    from models import FakeContainer

    from pocket.infer.engine import Engine

    g, params, quant, x = _conv1x1(n, c, o, hw, stride, float_out)
    want = ref.run(g, params, x, quant)["y"]
    got = {}
    for route in ("conv_sdot", "conv_int8_blas"):
        monkeypatch.setenv("POCKET_ROUTE", route)
        with Engine(FakeContainer(g, params, quant), max_batch=n) as eng:
            got[route] = eng.run(x, copy=True)
            assert eng.routes()[0]["route"] == route
            if route == "conv_sdot":
                names = [c.func.__name__.removesuffix("_serial") for c in eng._bound[n].calls]
                assert "gemm_q" in names, names
    np.testing.assert_array_equal(got["conv_sdot"], want)
    np.testing.assert_array_equal(got["conv_sdot"], got["conv_int8_blas"])


# --------------------------------------------------------------------------- conv_sdot_taps


def _taps_twin(x, kh, kw, sh, sw, ph, pw, dh, dw, zp, mp):
    """NumPy: the im2row of x (zp in the padding) as pack_taps' bytes, row tap*C4 + c4."""
    m, c, h, w = x.shape
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    c4 = -(-c // 4)
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=zp)
    words = np.zeros((kh * kw, c4 * 4, mp), np.int8)
    for i in range(kh):
        for j in range(kw):
            win = xp[:, :, i * dh:i * dh + sh * (ho - 1) + 1:sh, j * dw:j * dw + sw * (wo - 1) + 1:sw]
            words[i * kw + j, :c, :m * ho * wo] = win.transpose(1, 0, 2, 3).reshape(c, -1)
    return words.reshape(kh * kw * c4, 4, mp).transpose(0, 2, 1).reshape(kh * kw * c4, 4 * mp)


TAPS_CASES = [  # m, c, h, w, (kh, kw, sh, sw, ph, pw, dh, dw)
    (1, 8, 6, 7, (3, 3, 1, 1, 1, 1, 1, 1)),
    (2, 3, 9, 8, (7, 7, 2, 2, 3, 3, 1, 1)),  # a stem: C % 4 != 0, 7x7 s2
    (3, 6, 7, 5, (3, 3, 2, 2, 1, 1, 1, 1)),
    (1, 4, 5, 6, (3, 2, 1, 3, 0, 2, 2, 1)),  # non-square, dilated, padding past the reach
    (2, 5, 4, 4, (1, 1, 1, 1, 1, 1, 1, 1)),  # a padded 1x1 (conv_sdot refuses it)
    (1, 12, 3, 3, (3, 3, 1, 1, 4, 4, 1, 1)),  # padding wider than the kernel
]


@pytest.mark.parametrize("m,c,h,w,geom", TAPS_CASES)
def test_pack_taps(m, c, h, w, geom):
    """Every byte of the packed operand: padding (zp), channel tails (0), column tails (0)."""
    kh, kw, sh, sw, ph, pw, dh, dw = geom
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    k4 = kh * kw * -(-c // 4)
    mp = -(-m * ho * wo // ks.TILE_P) * ks.TILE_P
    x = RNG.integers(-128, 128, (m, c, h, w)).astype(np.int8)
    got = np.full((k4, 4 * mp), 0x55, np.int8)
    ks.pack_taps.serial(got, x, *geom, -7)
    np.testing.assert_array_equal(got, _taps_twin(x, *geom, -7, mp))


def test_weights_taps():
    """The weights in pack_taps' row order: w . packed == the conv's im2row product."""
    w = RNG.integers(-128, 128, (5, 6, 3, 2)).astype(np.int8)
    got = np.full((5, 4 * 3 * 2 * 2), 0x55, np.int8)
    ks.weights_taps(got, w)
    want = np.zeros((5, 3 * 2, 8), np.int8)
    want[:, :, :6] = w.transpose(0, 2, 3, 1).reshape(5, 6, 6)
    np.testing.assert_array_equal(got, want.reshape(5, -1))


def test_the_taps_route_limits():
    r = routes.ROUTES["conv_sdot_taps"]
    sdot = Cpu(False, False, True)
    for geo in (ConvGeometry(3, 9, 9, 8, 7, 7, 2, 2, 3, 3, 1, 1, 1),
                ConvGeometry(8, 5, 5, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1),
                ConvGeometry(8, 5, 5, 4, 1, 1, 1, 1, 1, 1, 1, 1, 1)):
        assert r.eligible(geo, "i8", sdot)
        assert "dot product" in r.limits(geo, "i8", Cpu(False, False))
        assert r.limits(geo, "f32", sdot) == "int8 only"
    assert r.limits(ConvGeometry(8, 5, 5, 8, 3, 3, 1, 1, 1, 1, 1, 1, 2), "i8", sdot) == "groups 1 only"
    # K counts the channels padded to 4: 32767 channels x 4 taps fit as K, not padded
    assert "MAX_K" in r.limits(ConvGeometry(32767, 4, 4, 4, 2, 2, 1, 1, 0, 0, 1, 1, 1), "i8", sdot)
    names = [t.name for t in routes.TABLE["conv2d"]]
    assert names.index("conv_sdot") < names.index("conv_sdot_taps") < names.index("conv_int8_blas")


def _conv(n, c, o, hw, geom, pool=False, to_f32=False):
    """One int8 conv (relu, per-channel weights) [+ an unpadded 2x2 maxpool]; its graph,
    params, quant and an int8 input."""
    kh, kw, sh, sw, ph, pw, dh, dw = geom
    xs = 0.05
    w_q, w_s = qm.quantize_weights(RNG.standard_normal((o, c, kh, kw)).astype(np.float32))
    params = {"w": w_q, "b": qm.quantize_bias(RNG.standard_normal(o).astype(np.float32), xs, w_s)}
    quant = {"w": {"scale": w_s.tolist(), "zero_point": [0] * o, "axis": 0}}
    x = RNG.integers(-128, 128, (n, c, *hw)).astype(np.int8)
    attrs = {"stride": [sh, sw], "padding": [ph, pw], "dilation": [dh, dw], "groups": 1,
             "x_scale": xs, "x_zero_point": 9, "activation": "relu"}
    if not to_f32:
        attrs.update(y_scale=0.07, y_zero_point=-5)
    nodes = [Node("conv", "conv2d", ["x", "w", "b"], ["y"], attrs)]
    out = "y"
    if pool:
        nodes.append(Node("pool", "maxpool2d", ["y"], ["z"],
                          {"kernel": [2, 2], "stride": [2, 2], "padding": [0, 0]}))
        out = "z"
    g = Graph({"x": ValueInfo("i8", ("N", c, *hw))}, [out], nodes,
              {k: ValueInfo({np.int8: "i8", np.int32: "i32"}[v.dtype.type], v.shape)
               for k, v in params.items()})
    return g, params, quant, x, out


def gemm_q_twin(out, w, xp, badj, m, p, lo, hi, zp, pairs=1):
    """NumPy: kernels_sdot.gemm_q / kernels_smull.gemm_q (kernels_int8's epilogue on the exact
    sums: codes as float32 product, clamp, rint, + zp; values as the float64 product rounded
    to float32, clamped)."""
    o = w.shape[0]
    c = np.empty((o, xp.shape[1]), np.int64)
    _gemm_twin(c, w, xp)
    n = out.shape[0]
    acc = (c[:, :n * p] + badj[:, None]).reshape(o, n, p).transpose(1, 0, 2)
    if out.dtype == np.int8:
        v = np.clip(acc.astype(np.float32) * m[:, None], lo, hi)
        out.reshape(n, o, p)[:] = (np.rint(v) + zp).astype(np.int8)
    else:
        out.reshape(n, o, p)[:] = np.clip((acc * m[:, None]).astype(np.float32), lo, hi)


def _gemm_twin(c, w, xp):
    """NumPy: kernels_sdot.gemm's product, int64 then checked to fit int32 (as the sdot sums)."""
    k4, mp = xp.shape
    b = xp.view(np.int8).reshape(k4, mp, 4).transpose(0, 2, 1).reshape(4 * k4, mp)
    full = w.astype(np.int64) @ b.astype(np.int64)
    assert np.abs(full).max() < 2**31
    c[:] = full


@pytest.mark.parametrize("n,c,o,hw,geom,pool,to_f32", [
    (1, 16, 24, (7, 5), (3, 3, 1, 1, 1, 1, 1, 1), False, False),
    (3, 3, 8, (11, 10), (7, 7, 2, 2, 3, 3, 1, 1), False, False),
    (3, 8, 5, (8, 8), (3, 3, 1, 1, 1, 1, 1, 1), True, False),
    (2, 8, 5, (8, 8), (3, 3, 1, 1, 1, 1, 1, 1), True, False),
    (2, 6, 7, (9, 7), (3, 3, 2, 2, 1, 1, 1, 1), False, True),
    (1, 5, 4, (6, 6), (3, 2, 1, 2, 2, 0, 2, 1), False, False)])
def test_taps_route_with_a_numpy_gemm(n, c, o, hw, geom, pool, to_f32, monkeypatch):
    """conv_sdot_taps end to end on any CPU: the engine told it has dotprod, kernels_sdot.gemm
    replaced by its NumPy twin; the packing, the weight order, the scratch, the (pooling)
    epilogue and the chunks against formats/reference.py, bit for bit."""
    from models import FakeContainer

    from pocket.infer import lowering_common as lc
    from pocket.infer import plan
    from pocket.infer.engine import Engine

    g, params, quant, x, out = _conv(n, c, o, hw, geom, pool, to_f32)
    want = ref.run(g, params, x, quant)[out]
    monkeypatch.setattr(plan.Cpu, "host", staticmethod(lambda: Cpu(False, False, True)))
    monkeypatch.setattr(ks, "gemm", _gemm_twin)
    monkeypatch.setattr(ks, "gemm_q", gemm_q_twin)
    if n > 2:  # one image a chunk: the chunks' scratch and output slices
        monkeypatch.setattr(lc, "VNNI_SCRATCH_BYTES", 1)
    monkeypatch.setenv("POCKET_ROUTE", "conv_sdot_taps")
    with Engine(FakeContainer(g, params, quant), max_batch=n) as eng:
        got = eng.run(x, copy=True)
        assert eng.routes()[0]["route"] == "conv_sdot_taps"
    np.testing.assert_array_equal(got, want)


@needs_sdot
@pytest.mark.parametrize("n,c,o,hw,geom,pool", [
    (1, 16, 24, (7, 5), (3, 3, 1, 1, 1, 1, 1, 1), False),
    (2, 3, 8, (11, 10), (7, 7, 2, 2, 3, 3, 1, 1), False),
    (2, 8, 5, (8, 8), (3, 3, 1, 1, 1, 1, 1, 1), True),
    (2, 8, 13, (8, 8), (3, 3, 1, 1, 1, 1, 1, 1), False),  # 64 pixels: gemm_q's epilogue (sdot too)
    (1, 64, 20, (6, 6), (3, 3, 2, 2, 1, 1, 1, 1), False)])
def test_taps_route_against_the_reference_and_its_twin(n, c, o, hw, geom, pool, monkeypatch):
    g, params, quant, x, out = _conv(n, c, o, hw, geom, pool)
    against_twin("conv_sdot_taps", "conv_int8_blas", g, params, quant, x, n, monkeypatch, out)


# --------------------------------------------------------------------------- linear_sdot


def _linear(n, k, o, to_f32=False, lead=()):
    """An int8 linear over (N, *lead, k): lead () the 2-D one, else its n * prod(lead) rows."""
    xs = 0.05
    w_q, w_s = qm.quantize_weights(RNG.standard_normal((o, k)).astype(np.float32))
    params = {"w": w_q, "b": qm.quantize_bias(RNG.standard_normal(o).astype(np.float32), xs, w_s)}
    quant = {"w": {"scale": w_s.tolist(), "zero_point": [0] * o, "axis": 0}}
    attrs = {"x_scale": xs, "x_zero_point": -3, "activation": "relu"}
    if not to_f32:
        attrs.update(y_scale=0.09, y_zero_point=4)
    g = Graph({"x": ValueInfo("i8", ("N", *lead, k))}, ["y"],
              [Node("fc", "linear", ["x", "w", "b"], ["y"], attrs)],
              {k_: ValueInfo({np.int8: "i8", np.int32: "i32"}[v.dtype.type], v.shape)
               for k_, v in params.items()})
    return g, params, quant, RNG.integers(-128, 128, (n, *lead, k)).astype(np.int8)


LINEAR_CASES = [(1, 64, 10, False, ()), (3, 37, 21, False, ()), (1, 130, 1000, True, ()),
                (17, 16, 5, False, ()), (1, 64, 10, False, (7,)), (3, 37, 21, True, (1,)),
                (3, 16, 5, False, (2, 3))]


def test_the_linear_route_limits():
    r = routes.ROUTES["linear_sdot"]
    geo = routes.base.LinearGeometry(1, 512, 1000)
    assert r.eligible(geo, "i8", Cpu(False, False, True))
    assert "dot product" in r.limits(geo, "i8", Cpu(False, False))
    assert r.limits(geo, "f32", Cpu(False, False, True)) == "int8 only"
    names = [t.name for t in routes.TABLE["linear"]]
    assert names.index("linear_sdot") < names.index("linear_int8")


@pytest.mark.parametrize("n,k,o,to_f32,lead", LINEAR_CASES)
def test_linear_route_with_a_numpy_gemm(n, k, o, to_f32, lead, monkeypatch):
    """linear_sdot end to end on any CPU (kernels_sdot.gemm as its NumPy twin): the packed
    weights, the rows padded to words (K % 4 != 0), the epilogue, against the reference."""
    from models import FakeContainer

    from pocket.infer import plan
    from pocket.infer.engine import Engine

    g, params, quant, x = _linear(n, k, o, to_f32, lead)
    want = ref.run(g, params, x, quant)["y"]
    monkeypatch.setattr(plan.Cpu, "host", staticmethod(lambda: Cpu(False, False, True)))
    monkeypatch.setattr(ks, "gemm", _gemm_twin)
    monkeypatch.setenv("POCKET_ROUTE", "linear_sdot")
    with Engine(FakeContainer(g, params, quant), max_batch=n) as eng:
        got = eng.run(x, copy=True)
        assert eng.routes()[0]["route"] == "linear_sdot"
    np.testing.assert_array_equal(got, want)


@needs_sdot
@pytest.mark.parametrize("n,k,o,to_f32,lead", LINEAR_CASES)
def test_linear_route_against_the_reference_and_its_twin(n, k, o, to_f32, lead, monkeypatch):
    against_twin("linear_sdot", "linear_int8", *_linear(n, k, o, to_f32, lead), n, monkeypatch)
