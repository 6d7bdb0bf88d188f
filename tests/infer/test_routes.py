"""The route table (pocket/infer/routes): declared limits, POCKET_ROUTE, Engine.routes() and
`pocket inspect --routes`, each route checked against formats/reference.py where it runs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from models import FakeContainer, save_model

from pocket.formats import quant as qm
from pocket.formats import reference as ref
from pocket.formats.ir import Graph, Node, ValueInfo
from pocket.infer import EngineError, routes
from pocket.infer.engine import Engine
from pocket.infer.plan import Cpu
from pocket.infer.routes.base import ConvGeometry, LinearGeometry

RNG = np.random.default_rng(21)
# the routes that read padded images at a pitch (see ConvGeometry.pitch_limit)
PITCH_ROUTES = {"conv_fma_pitch", "conv_gemm_pitch", "conv_vnni", "conv_vnni_quad", "conv_winograd",
                "conv_winograd_fused"}


# (the old pitch routes: [1, 3] read NaN on the portable path and wrong int8 on VNNI, [2, 4]
# read NaN on AVX-512 too, with the arena filled with NaN first)
BEYOND_REACH = [((6, 7), [1, 3]), ((5, 5), [2, 4])]


def _info(a):
    return ValueInfo({np.float32: "f32", np.int8: "i8", np.int32: "i32"}[a.dtype.type], a.shape)


def _graph(x, nodes, params):
    return Graph({"x": ValueInfo("f32" if x.dtype == np.float32 else "i8", ("N", *x.shape[1:]))},
                 [nodes[-1].outputs[0]], nodes, {k: _info(v) for k, v in params.items()})


def _fp32_conv(c, o, h, w, padding, n):
    params = {"w": RNG.standard_normal((o, c, 3, 3)).astype(np.float32),
              "b": RNG.standard_normal(o).astype(np.float32)}
    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    node = Node("conv", "conv2d", ["x", "w", "b"], ["y"], {"padding": padding, "activation": "relu"})
    return x, [node], params, None


def _int8_conv(c, o, h, w, padding, n):
    xs = 0.05
    w_q, w_s = qm.quantize_weights(RNG.standard_normal((o, c, 3, 3)).astype(np.float32))
    b_q = qm.quantize_bias(RNG.standard_normal(o).astype(np.float32), xs, w_s)
    params = {"w": w_q, "b": b_q}
    quant = {"w": {"scale": w_s.tolist(), "zero_point": [0] * o, "axis": 0}}
    x = RNG.integers(-128, 128, (n, c, h, w)).astype(np.int8)
    # a non-zero x_zp: the padding must read as x_zp, wherever it is
    node = Node("conv", "conv2d", ["x", "w", "b"], ["y"],
                {"padding": padding, "x_scale": xs, "x_zero_point": 9, "y_scale": 0.07, "y_zero_point": -5,
                 "activation": "relu"})
    return x, [node], params, quant


def _run(x, nodes, params, quant, threads=1, max_batch=8):
    g = _graph(x, nodes, params)
    want = ref.run(g, params, x, quant)[g.outputs[0]]
    with Engine(FakeContainer(g, params, quant), max_batch=max_batch, threads=threads) as eng:
        eng._arena.fill(255)  # NaN as float32: a read of memory no call wrote shows
        got = [eng.run(x, copy=True) for _ in range(2)]
        table = eng.routes()
    return got, want, table


@pytest.mark.parametrize("c", [3, 32])
@pytest.mark.parametrize("n,threads", [(1, 1), (3, 2)])
@pytest.mark.parametrize("hw,pad", BEYOND_REACH)
def test_padding_beyond_the_kernels_reach_fp32(c, n, threads, hw, pad, fp32_route):
    """Regression (issue 21): a stride-1 3x3 conv with padding [1, 3] (3 > dilation x (k - 1))
    is not eligible for the routes that read padded images at a pitch; it takes an im2col route
    and matches the reference (it read memory the call never wrote on AVX-512, out of bounds
    in kernels_fp32.bias_act_pitch on the portable path)."""
    got, want, table = _run(*_fp32_conv(c, 5, *hw, pad, n), threads=threads)
    assert table[0]["route"] not in PITCH_ROUTES and "batch_1" not in table[0]
    for y in got:
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5 * 9 * c)


@pytest.mark.parametrize("c", [3, 32])
@pytest.mark.parametrize("n,threads", [(1, 1), (3, 2)])
@pytest.mark.parametrize("hw,pad", BEYOND_REACH)
def test_padding_beyond_the_kernels_reach_int8(c, n, threads, hw, pad, int8_route):
    """The same geometry in int8 (the VNNI routes read garbage there): bit for bit."""
    got, want, table = _run(*_int8_conv(c, 8, *hw, pad, n), threads=threads)
    assert table[0]["route"] in ("conv_int8_blas", "conv_int8_im2row", "conv_tile_q_cols")
    for y in got:
        assert np.array_equal(y, want)


def test_the_padding_limit_is_declared():
    """Each pitch route declares the limit (on either axis); the im2col routes take any padding."""
    cpu = Cpu(fma=True, vnni=True)
    within = ConvGeometry(32, 6, 7, 8, 3, 3, 1, 1, 1, 2, 1, 1, 1)
    for geo in (ConvGeometry(32, 6, 7, 8, 3, 3, 1, 1, 1, 3, 1, 1, 1),
                ConvGeometry(32, 6, 7, 8, 3, 3, 1, 1, 3, 1, 1, 1, 1)):
        for name in PITCH_ROUTES:
            dtype = "i8" if "vnni" in name else "f32"
            r = routes.ROUTES[name]
            assert r.eligible(within, dtype, cpu), name
            assert not r.eligible(geo, dtype, cpu) and "padding" in r.limits(geo, dtype, cpu), name
        for name, dtype in (("conv_fma_cols", "f32"), ("conv_gemm", "f32"), ("conv_im2col", "f32"),
                            ("conv_int8_blas", "i8"), ("conv_int8_im2row", "i8"),
                            ("conv_tile_cols", "f32"), ("conv_tile_q_cols", "i8")):
            assert routes.ROUTES[name].eligible(geo, dtype, cpu), name
    # at stride 2 nothing is laid at the padded width's pitch: VNNI may take the padding
    strided = ConvGeometry(32, 6, 7, 8, 3, 3, 2, 2, 1, 3, 1, 1, 1)
    assert routes.ROUTES["conv_vnni_quad"].eligible(strided, "i8", cpu)


def test_the_table():
    """Every route is in its op's table once, under a unique name; nothing else is registered."""
    names = [r.name for table in routes.TABLE.values() for r in table]
    assert len(names) == len(set(names)) == len(routes.ROUTES)
    for op, table in routes.TABLE.items():
        assert all(r.op == op for r in table)
    # the last route of each dtype takes any geometry: no node is left without one
    anything = ConvGeometry(6, 5, 5, 6, 3, 3, 2, 1, 4, 0, 2, 1, 3)
    for dtype in ("f32", "i8"):
        assert any(r.eligible(anything, dtype, Cpu(False, False)) for r in routes.TABLE["conv2d"])
        assert any(r.eligible(LinearGeometry(1, 5, 3), dtype, Cpu(False, False))
                   for r in routes.TABLE["linear"])
    from pocket.infer.routes import linear_chain, linear_fma, linear_vnni

    assert linear_chain.CHAIN_ROWS == max(linear_fma.FMA_LINEAR_ROWS, linear_vnni.VNNI_TILE_ROWS)


def _conv_routes(dtype, geo):
    cpu = Cpu.host()
    return [r.name for r in routes.TABLE["conv2d"] if r.eligible(geo, dtype, cpu)]


@pytest.mark.parametrize("dtype", ["f32", "i8"])
def test_each_eligible_conv_route_forced(dtype, monkeypatch):
    """POCKET_ROUTE=<name> runs each route eligible here for one geometry (C = 4: VNNI's quad
    too), at batches 1 and 3 (the routes' small-batch siblings), against the reference."""
    make = _fp32_conv if dtype == "f32" else _int8_conv
    geo = ConvGeometry(4, 6, 7, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1)
    names = _conv_routes(dtype, geo)
    assert len(names) >= 2
    for name in names:
        monkeypatch.setenv("POCKET_ROUTE", name)
        x, nodes, params, quant = make(4, 4, 6, 7, [1, 1], 3)
        g = _graph(x, nodes, params)
        with Engine(FakeContainer(g, params, quant), max_batch=3) as eng:
            assert eng.routes()[0]["route"] == name
            for n in (1, 3):
                got, want = eng.run(x[:n]), ref.run(g, params, x[:n], quant)["y"]
                if dtype == "i8":
                    assert np.array_equal(got, want), name
                else:
                    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4, err_msg=name)


def test_forced_routes_that_cannot_run(monkeypatch):
    x, nodes, params, quant = _fp32_conv(3, 4, 6, 7, [1, 3], 1)
    g = _graph(x, nodes, params)
    monkeypatch.setenv("POCKET_ROUTE", "conv_gemm_pitch")
    with pytest.raises(EngineError, match=r"node 'conv'.*conv_gemm_pitch: padding \[1, 3\] exceeds"):
        Engine(FakeContainer(g, params))
    monkeypatch.setenv("POCKET_ROUTE", "conv_int8_im2row")
    with pytest.raises(EngineError, match=r"node 'conv'.*conv_int8_im2row: int8 only"):
        Engine(FakeContainer(g, params))
    monkeypatch.setenv("POCKET_ROUTE", "conv_gemm,conv_nope")
    with pytest.raises(EngineError, match=r"unknown route\(s\) conv_nope; the routes are conv_fma_depthwise"):
        Engine(FakeContainer(g, params))
    # a name for another op leaves this one to the table; the first eligible name wins
    for env, want in (("linear_blas", "conv_"), ("conv_gemm_pitch,conv_im2col", "conv_im2col")):
        monkeypatch.setenv("POCKET_ROUTE", env)
        with Engine(FakeContainer(g, params)) as eng:
            assert eng.routes()[0]["route"].startswith(want)


def _mlp_int8_model(tmp_path):
    from pocket.formats.ir import Graph as G

    w = RNG.integers(-127, 128, (6, 8)).astype(np.int8)
    params = {"w": w, "b": np.zeros(6, np.int32)}
    quant = {"w": {"scale": [0.01] * 6, "zero_point": [0] * 6, "axis": 0}}
    nodes = [Node("q", "quantize", ["x"], ["xq"], {"scale": 0.05, "zero_point": 0}),
             Node("fc", "linear", ["xq", "w", "b"], ["y"],
                  {"x_scale": 0.05, "x_zero_point": 0, "activation": "none"})]
    g = G({"x": ValueInfo("f32", ("N", 8))}, ["y"], nodes, {k: _info(v) for k, v in params.items()})
    return save_model(tmp_path / "m.bin", g, params, quant)


def test_routes_listing_and_inspect(tmp_path, monkeypatch):
    """Engine.routes() and `pocket inspect --routes [--json]` name each layer's route."""
    from click.testing import CliRunner

    from pocket.cli import main

    x, nodes, params, _ = _fp32_conv(3, 4, 6, 7, [1, 1], 1)
    fp32 = save_model(tmp_path / "f.bin", _graph(x, nodes, params), params)
    with Engine(fp32) as eng:
        (row,) = eng.routes()
    assert row["node"] == "conv" and row["op"] == "conv2d" and row["dtype"] == "f32"
    assert row["geometry"]["padding"] == [1, 1] and row["geometry"]["output"] == [4, 6, 7]
    assert row["route"] in routes.ROUTES and row["scratch_bytes"] > 0
    int8 = _mlp_int8_model(tmp_path)
    res = CliRunner().invoke(main, ["inspect", "--routes", str(int8), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    (fc,) = out["routes"]
    want = "linear_vnni" if Cpu.host().vnni else "linear_int8"
    assert fc["node"] == "fc" and fc["route"] == want and fc["geometry"] == {"rows": 64, "k": 8, "o": 6}
    res = CliRunner().invoke(main, ["inspect", "--routes", str(fp32)])
    assert res.exit_code == 0 and "conv2d  f32  3x6x7 -> 4x6x7 k3x3 s1x1 p1x1" in res.output
    assert row["route"] in res.output
    monkeypatch.setenv("POCKET_ROUTE", "conv_int8_blas")
    res = CliRunner().invoke(main, ["inspect", "--routes", str(fp32)])
    assert res.exit_code == 3 and res.output.startswith("Error: node 'conv'")


@pytest.mark.parametrize("dtype", ["f32", "i8"])
def test_each_eligible_linear_route_forced(dtype, monkeypatch):
    """POCKET_ROUTE=<name> for each linear route eligible here, two chained linears (the tile
    routes' packed hand-over) at batches 1 and 20, against the reference."""
    k, h, o = 24, 16, 12
    if dtype == "f32":
        params = {"w1": RNG.standard_normal((h, k)).astype(np.float32),
                  "b1": RNG.standard_normal(h).astype(np.float32),
                  "w2": RNG.standard_normal((o, h)).astype(np.float32)}
        nodes = [Node("fc1", "linear", ["x", "w1", "b1"], ["h"], {"activation": "relu"}),
                 Node("fc2", "linear", ["h", "w2"], ["y"], {})]
        quant, x = None, RNG.standard_normal((20, k)).astype(np.float32)
    else:
        params, quant = {}, {}
        for i, (a, b) in enumerate(((h, k), (o, h)), 1):
            w_q, w_s = qm.quantize_weights(RNG.standard_normal((a, b)).astype(np.float32))
            params[f"w{i}"] = w_q
            params[f"b{i}"] = qm.quantize_bias(RNG.standard_normal(a).astype(np.float32), 0.05, w_s)
            quant[f"w{i}"] = {"scale": w_s.tolist(), "zero_point": [0] * a, "axis": 0}
        i8 = {"x_scale": 0.05, "x_zero_point": 3, "y_scale": 0.05, "y_zero_point": 3}
        nodes = [Node("fc1", "linear", ["x", "w1", "b1"], ["h"], {**i8, "activation": "relu"}),
                 Node("fc2", "linear", ["h", "w2", "b2"], ["y"], {**i8, "activation": "none"})]
        x = RNG.integers(-128, 128, (20, k)).astype(np.int8)
    g = _graph(x, nodes, params)
    cpu = Cpu.host()
    names = [r.name for r in routes.TABLE["linear"] if r.eligible(LinearGeometry(20, k, h), dtype, cpu)]
    assert names
    for name in names:
        monkeypatch.setenv("POCKET_ROUTE", name)
        with Engine(FakeContainer(g, params, quant), max_batch=20) as eng:
            assert [r["route"] for r in eng.routes()] == [name, name]
            for n in (1, 20):
                got, want = eng.run(x[:n]), ref.run(g, params, x[:n], quant)["y"]
                if dtype == "i8":
                    assert np.array_equal(got, want), name
                else:
                    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4, err_msg=name)


@pytest.mark.parametrize("h,w,k,s,want", [(40, 8, 5, 1, "conv_depthwise"), (56, 56, 5, 2, "conv_depthwise"),
                                           (10, 7, 5, 1, "conv_fma_depthwise"),
                                           (14, 14, 5, 2, "conv_fma_depthwise"),
                                           (28, 28, 5, 2, "conv_fma_depthwise"),
                                           (14, 14, 5, 1, "conv_fma_depthwise"),
                                           (7, 7, 5, 1, "conv_fma_depthwise"),
                                           (7, 7, 3, 1, "conv_fma_depthwise"),
                                           (28, 28, 3, 2, "conv_fma_depthwise")])
def test_depthwise_5x5_on_small_maps_and_stride_2_takes_the_padded_plane(h, w, k, s, want):
    """Where kernels_fma_dw runs, a 5x5 depthwise conv to more than kernels_fma_dwcv.MAX_OUT
    pixels on maps of 8 columns or fewer, or at stride 2, takes conv_depthwise's padded plane
    (measured faster: routes.conv_fma_depthwise); to at most MAX_OUT pixels it stays on
    conv_fma_depthwise (16 channels a vector: kernels_fma_dwcv), and so do 3x3 and 5x5 on
    wider maps. Forced, the fma route still runs it."""
    cpu = Cpu.host()
    geo = ConvGeometry(24, h, w, 24, k, k, s, s, k // 2, k // 2, 1, 1, 24)
    if not cpu.fma:
        pytest.skip("kernels_fma_dw needs AVX-512")
    table = [r for r in routes.TABLE["conv2d"] if r.eligible(geo, "f32", cpu)]
    first = next(r for r in table if r.declines(geo, "f32", cpu) is None)
    assert first.name == want
    assert routes.ROUTES["conv_fma_depthwise"].eligible(geo, "f32", cpu)


@pytest.mark.parametrize("x86", [True, False])
@pytest.mark.parametrize("o", [8, 15, 16, 24, 40])
def test_int8_pointwise_takes_the_tiles_on_x86_from_16_channels(monkeypatch, o, x86):
    """An int8 1x1 conv of 256+ pixels on the portable path: on x86 conv_tile_q from
    conv_pw_int8.TILE_Q_FROM_O output channels on (measured faster there), conv_pw_int8 below;
    on ARM conv_pw_int8 at every width. Either way the engine matches the reference."""
    from pocket.infer.routes import conv_pw_int8

    monkeypatch.setattr(conv_pw_int8, "TILE_Q_FROM_O", 16 if x86 else None)
    cpu = Cpu(fma=False, vnni=False)
    geo = ConvGeometry(24, 16, 16, o, 1, 1, 1, 1, 0, 0, 1, 1, 1)
    table = [r for r in routes.TABLE["conv2d"] if r.eligible(geo, "i8", cpu)]
    first = next(r for r in table if r.declines(geo, "i8", cpu) is None)
    assert first.name == ("conv_tile_q" if x86 and o >= 16 else "conv_pw_int8")
    if Cpu.host().vnni or Cpu.host().sdot:
        return  # (the engine would take its VNNI / sdot route)
    w_q, w_s = qm.quantize_weights(RNG.standard_normal((o, 24, 1, 1)).astype(np.float32))
    params = {"w": w_q, "b": qm.quantize_bias(RNG.standard_normal(o).astype(np.float32), 0.05, w_s)}
    quant = {"w": {"scale": w_s.tolist(), "zero_point": [0] * o, "axis": 0}}
    x = RNG.integers(-128, 128, (2, 24, 16, 16)).astype(np.int8)
    node = Node("conv", "conv2d", ["x", "w", "b"], ["y"],
                {"padding": 0, "x_scale": 0.05, "x_zero_point": 3, "y_scale": 0.07, "y_zero_point": -5,
                 "activation": "relu"})
    got, want, table = _run(x, [node], params, quant)
    assert table[0]["route"] == first.name
    for g in got:
        assert np.array_equal(g, want)


@pytest.mark.parametrize("hw,fused", [(32, True), (30, False)])
def test_stem_conv_fuses_a_padded_maxpool(tmp_path, hw, fused):
    """A stride-2 conv on conv_fma_phase followed by a 3x3/2 maxpool of padding 1 (ResNet's and
    ShuffleNet's stems): at batch 1 the AVX-512 pool reads the conv's output at its pitch (no
    copy-out pass; the pool's -inf padding is its own); where the pool's last window would
    reach the junk columns past Wo (15 columns: window 13..15) and at batch 2 the pool runs on
    its own. Every way matches the reference."""
    from models import Builder, matches_reference, save_model

    from pocket.infer import kernels_fma
    from pocket.infer.engine import Engine

    if not kernels_fma.AVAILABLE:
        pytest.skip("conv_fma_phase needs AVX-512")
    rng = np.random.default_rng(21)
    b = Builder((3, hw, hw), rng)
    b.conv(3, 16, 3, stride=[2, 2], padding=[1, 1], activation="relu")
    b.op("maxpool2d", kernel=[3, 3], stride=[2, 2], padding=[1, 1])
    path = save_model(tmp_path / "stem.bin", b.graph(), b.params, None)
    for n in (1, 2):
        x = rng.standard_normal((n, 3, hw, hw)).astype(np.float32)
        with Engine(path, max_batch=n, threads=1) as eng:
            eng._arena.fill(255)  # NaN as float32: a read of memory no call wrote shows
            got = eng.run(x, copy=True)
            assert eng.routes()[0]["route"] == "conv_fma_phase"
            calls = eng._bound[n].calls
            names = [c.func.__name__ for c in calls]
        # fused: one GEMM over the image's pitch (nb 1) whose scratch the pool reads; not
        # fused, at batch 1 the GEMM writes the output's rows (nb = Ho), the pool after it
        gemm = next(c for c in calls if c.func.__name__.startswith("gemm"))
        pooled = "bias_act_pitch_serial" not in names and gemm.args[4] == 1
        assert pooled == (fused and n == 1), names
        assert "maxpool_fma_serial" in names
        matches_reference(path, x, got, False)


@pytest.mark.parametrize("hw,act,direct", [(128, "silu", True), (193, "hardswish", True),
                                           (224, "sigmoid", True), (128, "leaky_relu", False),
                                           (56, "silu", False), (150, "silu", False)])
def test_stem_conv_writes_its_rows(tmp_path, hw, act, direct):
    """A stride-2 conv on conv_fma_phase with an activation the GEMM's registers do, at batch
    1, its rows of whole vectors or of 96 or more pixels (Wo = 64, 97, 112: whole and masked
    tails): one GEMM a row of the output, straight into the NCHW rows (no copy-out pass past
    the junk columns); with another activation and where the rows fill vectors badly (Wo =
    28, 75) the copy-out pass stays. Every way matches the reference, at batch 2 too."""
    from models import Builder, matches_reference, save_model

    from pocket.infer import kernels_fma
    from pocket.infer.engine import Engine

    if not kernels_fma.AVAILABLE:
        pytest.skip("conv_fma_phase needs AVX-512")
    rng = np.random.default_rng(22)
    b = Builder((3, hw, hw), rng)
    b.conv(3, 12, 3, stride=[2, 2], padding=[1, 1], activation=act)
    path = save_model(tmp_path / "stem.bin", b.graph(), b.params, None)
    for n in (1, 2):
        x = rng.standard_normal((n, 3, hw, hw)).astype(np.float32)
        with Engine(path, max_batch=n, threads=2) as eng:
            eng._arena.fill(255)  # NaN as float32: a read of memory no call wrote shows
            got = eng.run(x, copy=True)
            assert eng.routes()[0]["route"] == "conv_fma_phase"
            names = [c.func.__name__ for c in eng._bound[n].calls]
        if n == 1:
            assert (not any(nm.startswith("bias_act_pitch") for nm in names)) == direct, names
        matches_reference(path, x, got, False)


@pytest.mark.parametrize("small_l1", [True, False])
def test_int8_long_k_on_the_tiles_only_where_the_weights_keep_sums_exact(small_l1):
    """An int8 1x1 conv with K = 1152 (past kernels_int8.EXACT_K) on a 7x7 map: x86's portable
    path runs it on kernels_tile's float32 sums only when 128 x each channel's sum of |w_q|
    stays within 2**24 (every partial sum exact); the codes at their extremes (x_q = -128,
    w_q = +-127) would pass it and keep conv_int8_blas, whose pieces of EXACT_K rows (sums up to
    1024 x 128 x 127, just within 2**24) run on kernels_tile.gemm_act there too. Either way the
    output is the reference's, bit for bit."""
    from pocket.infer import kernels_fma, kernels_tile

    if kernels_fma.AVAILABLE or kernels_tile.W_VECTORS or not kernels_tile.AVAILABLE:
        pytest.skip("x86's portable path only")
    c, o, hw = 1152, 8, 7
    w_q = (RNG.integers(-20, 21, (o, c, 1, 1)) if small_l1 else
           RNG.choice([-127, 127], (o, c, 1, 1))).astype(np.int8)
    assert (128 * np.abs(w_q.astype(np.int64)).reshape(o, -1).sum(1).max() <= 2**24) == small_l1
    w_s = np.full(o, 0.01, np.float32)
    x = RNG.integers(-128, 128, (2, c, hw, hw)).astype(np.int8)
    x[0] = -128  # the largest sums the weights allow
    node = Node("conv", "conv2d", ["x", "w"], ["y"],
                {"x_scale": 0.05, "x_zero_point": 3, "y_scale": 40.0, "y_zero_point": 0})
    quant = {"w": {"scale": w_s.tolist(), "zero_point": [0] * o, "axis": 0}}
    got, want, table = _run(x, [node], {"w": w_q}, quant, max_batch=2)
    assert (table[0]["route"] == "conv_tile_q") == small_l1, table
    for g in got:
        np.testing.assert_array_equal(g, want)
