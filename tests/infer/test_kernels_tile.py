"""The portable register-tiled GEMM (kernels_tile) against float64 NumPy and formats/reference.py:
every tiling edge (channels past a multiple of ROWS, pixels past whole tiles: an 8-pixel tile,
1-7 left over, several blocks), K in one block and in several (sums carried through the output),
the panel and the in-place inputs, batches, parts, activations in the tile and after it."""

from __future__ import annotations

import numpy as np
import pytest

# the float64 activations and the int8 case of the pointwise kernels' tests (this directory is
# on pytest's path: rootdir-relative imports, as test_route_fuzz's)
from models import readonly
from test_kernels_pw import _int8_case, _naive_act

from pocket.formats import reference as ref
from pocket.infer import kernels_fp32 as kf
from pocket.infer import kernels_tile as kt

RNG = np.random.default_rng(7)
PB, BK = kt.PB, kt.BLOCK_K

# name: (N, O, K, P)
SHAPES = {
    "one-tile": (1, 6, 4, 16),
    "rows-left": (1, 13, 9, 32),  # groups of 6, 6 and 1
    "one-row": (1, 1, 5, 40),
    "tile8": (1, 7, 3, 24),  # 16 + an 8-pixel tile
    "left-1": (1, 12, 20, 49),  # 3 tiles + 1 pixel through the panel
    "left-7": (2, 5, 11, 7),  # only a tail
    "one-pixel": (3, 10, 6, 1),
    "blocks": (1, 9, 8, 2 * PB + 29),  # blocks of PB, the last with a tile8 and 5 left
    "packed": (1, 8 * kt.ROWS + 3, 17, 3 * 16 + 13),  # PACK_GROUPS groups: the panel
    "k-blocks": (1, 7, 2 * BK + 37, 45),  # three blocks along K, sums carried
    "k-blocks-packed": (2, 9 * kt.ROWS, BK + 1, PB + 3),
    "k-long": (1, 13, 1000, 45),  # gemm_q's whole K up to EXACT_K (x86's narrow maps)
}
ACTS = {"none": 0.0, "relu": 0.0, "clip": 6.0, "silu": 0.0, "hardswish": 0.0, "hardsigmoid": 0.0,
        "leaky_relu": 0.1}


def _scratch(parts, k):
    return np.full((parts, kt.scratch_floats(k)), np.nan, np.float32)


def _packed(w, **kw):
    return readonly(kt.pack_weights(w, **kw))


def _case(name):
    n, o, k, p = SHAPES[name]
    x = RNG.standard_normal((n, k, p)).astype(np.float32)
    w = RNG.standard_normal((o, k)).astype(np.float32)
    b = readonly(RNG.standard_normal(o).astype(np.float32))
    return x, w, b


@pytest.mark.parametrize("name", SHAPES)
@pytest.mark.parametrize("act", ACTS)
def test_gemm_act_matches_naive_and_reference(name, act):
    x, w, b = _case(name)
    n, k, p = x.shape
    o = w.shape[0]
    alpha = ACTS[act]
    out = np.full((n, o, p), np.nan, np.float32)
    kt.gemm_act.serial(out, _packed(w), x, b, _scratch(1, k), kf.ACT[act], alpha)
    w64, x64 = w.astype(np.float64), x.astype(np.float64)
    pre = np.einsum("ok,nkp->nop", w64, x64) + b.reshape(1, o, 1)
    bound = 1e-5 * (np.einsum("ok,nkp->nop", np.abs(w64), np.abs(x64)) + np.abs(b).reshape(1, o, 1))
    # every activation here has a slope of at most ~1.1: it does not grow the sum's error
    assert np.all(np.abs(out - _naive_act(pre, act, alpha)) <= 1.2 * bound + 1e-6), name
    attrs = {"stride": [1, 1], "padding": [0, 0], "dilation": [1, 1], "groups": 1, "activation": act}
    if act == "clip":
        attrs.update(min=0.0, max=alpha)
    if act == "leaky_relu":
        attrs["alpha"] = alpha
    want = ref.conv2d(attrs, x.reshape(n, k, 1, p), w.reshape(o, k, 1, 1), b).reshape(out.shape)
    assert np.all(np.abs(out - want) <= 1.2 * bound + 1e-6 + 1e-6 * np.abs(want))


def test_gemm_act_writes_only_its_output():
    """The last pixels go through the scratch: nothing past the output is written."""
    n, o, k, p = 1, 7, 5, 21
    x = RNG.standard_normal((1, k, p)).astype(np.float32)
    w = RNG.standard_normal((o, k)).astype(np.float32)
    out2 = np.full((n, o, p), np.nan, np.float32)
    wt = _packed(w)
    kt.gemm_act.serial(out2, wt, x, readonly(np.zeros(o, np.float32)), _scratch(1, k), kf.ACT["none"], 0.0)
    np.testing.assert_allclose(out2[0], w.astype(np.float64) @ x[0].astype(np.float64),
                               rtol=1e-5, atol=1e-5)
    flat = np.full(o * p + 40, 3.0, np.float32)
    kt.gemm_act.serial(flat[:o * p].reshape(1, o, p), wt, x, readonly(np.zeros(o, np.float32)),
                       _scratch(1, k), kf.ACT["relu"], 0.0)
    assert np.all(flat[o * p:] == 3.0)


def test_gemm_act_nan_input_and_relu():
    """A NaN input poisons its pixel in every channel, through the in-tile ReLU too."""
    n, o, k, p = 1, 9, 6, 37
    x = RNG.standard_normal((n, k, p)).astype(np.float32)
    x[0, 2, 5] = np.nan
    x[0, 3, 36] = np.nan  # in the tail
    w = RNG.standard_normal((o, k)).astype(np.float32)
    out = np.full((n, o, p), 7.0, np.float32)
    kt.gemm_act.serial(out, _packed(w), x, readonly(np.zeros(o, np.float32)), _scratch(1, k),
                       kf.ACT["relu"], 0.0)
    assert np.all(np.isnan(out[0, :, 5])) and np.all(np.isnan(out[0, :, 36]))
    keep = np.delete(np.arange(p), [5, 36])
    twin = np.maximum(w.astype(np.float64) @ x[0][:, keep].astype(np.float64), 0)
    np.testing.assert_allclose(out[0][:, keep], twin, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["rows-left", "blocks", "packed", "k-blocks-packed", "one-pixel"])
def test_gemm_act_same_bytes_for_any_split(name):
    """Any number of parts (more than the tasks too) writes the serial twin's bytes: each
    output is the same chain along K whichever part computes it, panel or not."""
    x, w, b = _case(name)
    n, k, p = x.shape
    one = np.full((n, w.shape[0], p), np.nan, np.float32)
    kt.gemm_act.serial(one, _packed(w), x, b, _scratch(1, k), kf.ACT["silu"], 0.0)
    for parts in (2, 3, 7):
        got = np.full_like(one, np.nan)
        kt.gemm_act(got, _packed(w), x, b, _scratch(parts, k), kf.ACT["silu"], 0.0)
        np.testing.assert_array_equal(got, one, err_msg=f"{name}, {parts} parts")


@pytest.mark.parametrize("name", ["rows-left", "left-7", "one-pixel", "packed", "k-blocks-packed"])
def test_gemm_act_with_each_images_weights(name):
    """gemm_act with 3-D weights (Winograd's 16 GEMMs): image i against its own weights w[i], by float64
    einsum; any number of parts writes the serial twin's bytes."""
    x, w, b = _case(name)
    n, k, p = x.shape
    o = w.shape[0]
    ws = RNG.standard_normal((n, o, k)).astype(np.float32)
    packed = readonly(np.stack([kt.pack_weights(wi) for wi in ws]))
    one = np.full((n, o, p), np.nan, np.float32)
    kt.gemm_act.serial(one, packed, x, b, _scratch(1, k), kf.ACT["relu"], 0.0)
    w64, x64 = ws.astype(np.float64), x.astype(np.float64)
    pre = np.einsum("nok,nkp->nop", w64, x64) + b.reshape(1, o, 1)
    bound = 1e-5 * (np.einsum("nok,nkp->nop", np.abs(w64), np.abs(x64)) + np.abs(b).reshape(1, o, 1))
    assert np.all(np.abs(one - np.maximum(pre, 0)) <= 1.2 * bound + 1e-6)
    for parts in (2, 5):
        got = np.full_like(one, np.nan)
        kt.gemm_act(got, packed, x, b, _scratch(parts, k), kf.ACT["relu"], 0.0)
        np.testing.assert_array_equal(got, one, err_msg=f"{name}, {parts} parts")


@pytest.mark.parametrize("n, p, o", [(1, 169, 1000), (1, 784, 96), (2, 196, 40), (1, 49, 7),
                                     (3, 3025, 16), (1, 5, 1)])
def test_parts_split_the_pixels_evenly(n, p, o):
    """The parts' task runs cover every task once, in order, and each part's pixels (counted
    in whole vectors, block by block) are within one task of an even share: a 13 x 13 map is a block of
    128 pixels and one of 41, and an even count of tasks gave one part 3x the other's."""
    x = np.empty((n, 4, p), np.float32)
    nb, ng, tasks = kt._tasks(x, o)
    # (a block's pixels in whole vectors: the tiles' work)
    widths = [-(-min(kt.PB, p - b * kt.PB) // kt.VL) * kt.VL for b in range(nb)]
    cost = [widths[t // ng % nb] for t in range(tasks)]
    for parts in (1, 2, 3, 4):
        edges = [kt._span(i, parts, x, nb, ng) for i in range(parts + 1)]
        assert edges[0] == 0 and edges[-1] == tasks and edges == sorted(edges)
        share = sum(cost) / parts
        for a, z in zip(edges, edges[1:]):
            assert abs(sum(cost[a:z]) - share) <= kt.PB + kt.VL, (parts, edges)


def test_arm_form_matches_naive(tmp_path):
    """The tiles' ARM form (each row's weights 4 steps at a time as a vector, then the steps
    left one at a time; pack_weights' quads) through the same checks (float32, int8, and the
    indexed tiles over a stride-2 conv's phases),
    compiled on this CPU in a worker with a Numba cache of its own."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "POCKET_TILE_WVECTORS": "1", "NUMBA_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__,
                           "-k", "naive_and_reference and (relu or silu or none) or gemm_q_exact and "
                                 "i8-relu or gemm_phase and hardswish"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout


@pytest.mark.parametrize("name", SHAPES)
@pytest.mark.parametrize("mode", ["i8", "i8-relu", "i8-clip", "f32", "f32-relu"])
def test_gemm_q_exact(name, mode):
    """int8 codes in, int8 codes or float32 out: bit for bit the reference's (and kernels_pw's
    twin), whatever the split into parts."""
    from pocket.formats import quant as qm
    from pocket.infer import kernels_int8 as ki

    n, o, k, p = SHAPES[name]
    if k > ki.EXACT_K:
        pytest.skip("past the exact float32 sums")
    x_zp = 11
    x, w_q, w_s, b_q = _int8_case(n, o, k, p, x_zp)
    to_int8 = mode.startswith("i8")
    act = {"relu": "relu", "clip": "clip"}.get(mode.split("-")[-1], "none")
    relu = act != "none"
    y_zp, y_s = (-5, 0.07) if to_int8 else (0, None)
    m = qm.requant_multiplier(0.05, w_s, y_s)
    hi = float(qm.quantize(np.float32(6.0), y_s, y_zp)) if act == "clip" and to_int8 else 127.0
    lo = (float(y_zp if relu else -128), hi, 6.0 if act == "clip" else np.inf)
    w2 = w_q.reshape(o, k)
    bias_adj = b_q.astype(np.int64) - np.int64(x_zp) * ki.weight_sums(w2).astype(np.int64)
    attrs = {"stride": [1, 1], "padding": [0, 0], "dilation": [1, 1], "groups": 1, "activation": act,
             "x_scale": 0.05, "x_zero_point": x_zp}
    if act == "clip":
        attrs.update(min=0.0, max=6.0)
    if to_int8:
        attrs.update(y_scale=y_s, y_zero_point=y_zp)
    want = ref.conv2d(attrs, x.reshape(n, k, 1, p), w_q, b_q, w_scale=w_s).reshape(n, o, p)
    for parts, fn in ((1, kt.gemm_q.serial), (3, kt.gemm_q)):
        if parts > 1 and mode != "i8-relu":
            continue  # the parallel twin for one mode (each compile takes seconds)
        out = np.full((n, o, p), 99 if to_int8 else np.nan, np.int8 if to_int8 else np.float32)
        scratch = np.full((parts, kt.scratch_floats_q(k)), np.nan, np.float32)
        fn(out, _packed(w2.astype(np.float32), blocked=False), x, bias_adj, m, to_int8,
           float(y_zp), lo, relu, scratch)
        assert np.array_equal(out, want), (name, parts)


@pytest.mark.parametrize("spinning", [False, True])
@pytest.mark.parametrize("int8", [False, True])
def test_parts_follow_the_engines_choice(tmp_path, monkeypatch, spinning, int8):
    """A tile GEMM the engine runs on the pool (its parallel twin) is split into one part a
    thread, one it runs serially into one: the route (conv_tile, conv_tile_q) and
    pools.call_work measure its work alike. An 8 -> 64 channel 1x1 conv on 32x32 maps is
    under the threshold as multiply-adds, over it as 64 per element: gemm_q once ran its
    parallel twin with one part where the threads spin."""
    from models import Builder, two_thread_calls

    from pocket.infer import pools

    monkeypatch.setattr(pools, "spin_policy", lambda graph, sample, threads: (spinning, False))
    monkeypatch.setenv("POCKET_ROUTE", "conv_tile_q" if int8 else "conv_tile")
    rng = np.random.default_rng(4)
    b = Builder((8, 32, 32), rng)
    b.conv(8, 64, 1, activation="relu")
    routes, calls = two_thread_calls(tmp_path / "pw.bin", b, rng, (8, 32, 32), int8,
                                     lambda name: name.startswith("gemm_"))
    assert routes == ["conv_tile_q" if int8 else "conv_tile"]
    assert len(calls) == 1
    serial = calls[0].func.__name__.endswith("_serial")
    scratch = calls[0].args[-1] if int8 else calls[0].args[4]
    assert scratch.shape[0] == (1 if serial else 2)


@pytest.mark.parametrize("k", [20, 2 * BK + 37])
@pytest.mark.parametrize("act", ["relu", "clip", "silu"])
def test_gemm_act_column_bytes_whatever_its_place(k, act):
    """An output column's bytes do not depend on whether a 16-pixel tile, an 8-pixel one or the
    last 1-7 pixels' kernel (x86: kernels_tile._cols, many channel groups a call) computes it:
    each is the same chain along K. P = 49 (3 tiles and one pixel), 53 and 64 hold the same
    first 49 columns; O = 9 groups and 3 rows (two _cols calls, the last group short)."""
    o = 8 * kt.ROWS + 3
    x = RNG.standard_normal((1, k, 64)).astype(np.float32)
    w = RNG.standard_normal((o, k)).astype(np.float32)
    b = RNG.standard_normal(o).astype(np.float32)
    outs = []
    for p in (49, 53, 64):
        out = np.full((1, o, p), np.nan, np.float32)
        kt.gemm_act.serial(out, _packed(w), np.ascontiguousarray(x[:, :, :p]), b,
                           _scratch(1, k), kf.ACT[act], ACTS[act])
        outs.append(out[:, :, :49])
    np.testing.assert_array_equal(outs[0], outs[2])
    np.testing.assert_array_equal(outs[1], outs[2])
    twin = w.astype(np.float64) @ x[0, :, :49].astype(np.float64) + b[:, None]
    np.testing.assert_allclose(outs[2][0], _naive_act(twin, act, ACTS[act]), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["left-1", "left-7", "blocks", "packed", "k-blocks"])
@pytest.mark.parametrize("act", ["hardswish", "hardsigmoid"])
def test_epilogue_hard_activations_equal_the_pass(name, act):
    """hardswish / hardsigmoid in the tiles' epilogue (16- and 8-pixel tiles, x86's _cols for
    the last 1-7 pixels, K in blocks) give the bytes of the pass they replaced: the GEMM with
    no activation, then kernels_fp32.act_inplace over its output. Inputs scaled so that the
    sums cross -3 and 3, plus a NaN, an inf and a -inf column."""
    x, w, b = _case(name)
    x = 3.0 * x
    x[:, 0, :3] = [np.nan, np.inf, -np.inf]
    n, k, p = x.shape
    wp = _packed(w)
    fused = np.full((n, w.shape[0], p), np.nan, np.float32)
    kt.gemm_act.serial(fused, wp, x, b, _scratch(1, k), kf.ACT[act], 0.0)
    plain = np.full_like(fused, np.nan)
    kt.gemm_act.serial(plain, wp, x, b, _scratch(1, k), kf.ACT["none"], 0.0)
    kf.act_inplace(plain.reshape(-1), 0, plain.size, np.float32(0.0), kf.ACT[act], 0.0)
    np.testing.assert_array_equal(fused, plain)
    assert np.isnan(fused).any() and (fused != 0).any()


# --------------------------------------------------------------------------- phases

# (C, O, H, W, kh, kw, ph, pw): Wo = 112 (whole tiles), 7 x 3 (an 8-pixel tile and 3 left over),
# 1 (only a tail), odd sizes and paddings past the kernel's reach, K past BLOCK_K (7x7, 3 ch)
PHASE_CASES = [(3, 16, 224, 224, 3, 3, 1, 1), (3, 7, 11, 13, 3, 3, 1, 1), (2, 13, 9, 20, 5, 5, 2, 2),
               (1, 5, 7, 6, 2, 3, 0, 1), (4, 9, 17, 40, 4, 4, 3, 2), (3, 20, 5, 3, 3, 3, 1, 1),
               (3, 8, 40, 46, 7, 7, 3, 3), (2, 6, 9, 61, 1, 1, 0, 0)]


def _naive_phases(x, ph, pw, hq, wq):
    """The four phases by NumPy: pad to 2 Hq x 2 Wq, then every other row and column."""
    n, c, h, w = x.shape
    padded = np.zeros((n, c, 2 * hq, 2 * wq), np.float32)
    padded[:, :, ph:ph + h, pw:pw + w] = x
    return np.stack([padded[:, :, a::2, b::2] for a in (0, 1) for b in (0, 1)], axis=2).reshape(-1)


@pytest.mark.parametrize("case", PHASE_CASES)
def test_split_phases_matches_numpy(case):
    from pocket.infer import kernels_phase as kq

    c, _, h, w, _, _, ph, pw = case
    x = RNG.standard_normal((2, c, h, w)).astype(np.float32)
    hq, wq = kq.phase_shape(h, w, ph, pw)
    want = _naive_phases(x, ph, pw, hq, wq)
    for fn in (kq.split_phases.serial, kq.split_phases):
        xq = np.full(want.size + kt.phase_slack(wq), np.nan, np.float32)
        fn(xq, x, ph, pw, hq, wq)
        np.testing.assert_array_equal(xq[:want.size], want)
        assert not xq[want.size:].any()  # the slack the last tiles read: zeros


@pytest.mark.parametrize("case", PHASE_CASES)
@pytest.mark.parametrize("act", ["none", "relu", "hardswish", "silu"])
@pytest.mark.parametrize("parts", [1, 3])
def test_gemm_phase_matches_reference(case, act, parts):
    """kernels_tile.gemm_phase (one image's stride-2 conv over its phases) against
    formats/reference.py's conv in float64, every output written (NaN-filled before)."""
    from pocket.infer import kernels_phase as kq

    c, o, h, w, kh, kw, ph, pw = case
    x = RNG.standard_normal((1, c, h, w)).astype(np.float32)
    wt = RNG.standard_normal((o, c, kh, kw)).astype(np.float32)
    b = RNG.standard_normal(o).astype(np.float32)
    hq, wq = kq.phase_shape(h, w, ph, pw)
    ho, wo = (h + 2 * ph - kh) // 2 + 1, (w + 2 * pw - kw) // 2 + 1
    xq = np.full(c * 4 * hq * wq + kt.phase_slack(wq), np.nan, np.float32)
    kq.split_phases.serial(xq, x, ph, pw, hq, wq)
    y = np.full((o, ho, wo), np.nan, np.float32)
    fn = kt.gemm_phase if parts > 1 else kt.gemm_phase.serial
    fn(y, _packed(wt.reshape(o, -1), blocked=False), xq, wq, kq.phase_offsets(c, kh, kw, hq, wq), b,
       np.full((parts, kt.ROWS * kt.VL), np.nan, np.float32), kf.ACT[act], 0.0)
    attrs = {"stride": [2, 2], "padding": [ph, pw], "dilation": [1, 1], "groups": 1, "activation": act}
    x64, w64 = x.astype(np.float64), wt.astype(np.float64)
    want = ref.conv2d(attrs, x64, w64, b.astype(np.float64))[0]
    plain = dict(attrs, activation="none")
    bound = 1e-5 * (ref.conv2d(plain, np.abs(x64), np.abs(w64), np.abs(b).astype(np.float64))[0])
    assert np.all(np.abs(y - want) <= 1.2 * bound + 1e-6), (case, act)
