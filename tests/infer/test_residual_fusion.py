"""A residual block's add (and its ReLU) written by the conv before it: lowering.residual_convs
and kernels_fma_winograd.output_transform_res."""

from __future__ import annotations

import numpy as np
import pytest
from models import BindRecorder, Builder, arena_hazards, matches_reference, save_model

from pocket.infer import engine as engine_mod
from pocket.infer import kernels_fma as kfma
from pocket.infer import kernels_fma_winograd as kfw
from pocket.infer import kernels_winograd as kwg
from pocket.infer.engine import Engine

needs_fma = pytest.mark.skipif(not kfma.AVAILABLE, reason="this CPU has no AVX-512")
S1 = {"stride": [1, 1], "dilation": [1, 1]}


@needs_fma
@pytest.mark.parametrize("shape", [(1, 8, 14, 14), (2, 5, 7, 9), (1, 3, 56, 56), (1, 4, 13, 31)])
@pytest.mark.parametrize("relu", [0, 1])
def test_output_transform_res_is_the_transform_then_the_add(shape, relu):
    """Bit for bit: the portable output transform (no activation), then NumPy's float32 add
    and a ReLU (0 where negative, NaN kept), on 1-4 images, odd sizes, planes past 16 tiles."""
    n, o, ho, wo = shape
    th, tw = -(-ho // 2), -(-wo // 2)
    cols = -(-n * th * tw // 16) * 16
    rng = np.random.default_rng(sum(shape) + relu)
    m = rng.standard_normal((16, o, cols)).astype(np.float32)
    m[0, 0, 0] = np.nan  # (propagates to one output through the add and the ReLU)
    b = rng.standard_normal(o).astype(np.float32)
    res = rng.standard_normal((n, o, ho, wo)).astype(np.float32)
    conv = np.empty((n, o, ho, wo), np.float32)
    kwg.output_transform(conv, m.reshape(-1)[:16 * o * cols].reshape(16, o, cols),
                         np.empty((n * o, 8, th * tw), np.float32), th, tw, b, 0, 0.0, False)
    want = conv + res
    if relu:
        want = np.where(want < 0, np.float32(0), want)
    for kernel in (kfw.output_transform_res, kfw.output_transform_res.serial):
        got = np.full_like(want, 7.0)
        kernel(got, m, th, tw, b, res, relu)
        np.testing.assert_array_equal(got, want)


def _block(rng, c, hw, *, relu_after=True, conv_act="none"):
    """A basic residual block: a computed input, 3x3 conv + ReLU, 3x3 conv (conv_act), + the
    input (then a ReLU), then a reader."""
    b = Builder((c, hw, hw), rng)
    inp = b.conv(c, c, 1, padding=[0, 0], activation="relu", **S1)
    b.conv(c, c, 3, padding=[1, 1], activation="relu", **S1)
    b.conv(c, c, 3, padding=[1, 1], activation=conv_act, **S1)
    b.op("add", inp)
    if relu_after:
        b.op("relu")
    b.conv(c, 8, 1, padding=[0, 0], activation="none", **S1)
    return b


def _names(eng, n):
    return [getattr(c.func, "__name__", "") for c in eng._bound[n].calls]


@needs_fma
@pytest.mark.parametrize("relu_after", [True, False])
def test_the_winograd_conv_writes_the_add(tmp_path, monkeypatch, relu_after):
    """The block's second conv (Winograd, 64 channels, 16x16) writes the add's output: no add
    call at batch 1, on 1 and 2 threads; at batch 3 too where the conv takes the plain route,
    else the add runs. Every run matches the reference, the arena starting as NaN."""
    monkeypatch.setattr(engine_mod, "_PARALLEL_WORK", 0)
    rng = np.random.default_rng(5)
    b = _block(rng, 64, 16, relu_after=relu_after)
    path = tmp_path / "res.bin"
    save_model(path, b.graph(), b.params, None)
    rec = BindRecorder(monkeypatch)
    for threads in (1, 2):
        with Engine(path, max_batch=3, threads=threads) as eng:
            assert eng._ctx.residual == {2: 3}
            for n in (1, 3):
                x = rng.standard_normal((n, 64, 16, 16)).astype(np.float32)
                eng._arena.fill(255)
                got = eng.run(x, copy=True)
                names = _names(eng, n)
                fused = any(s.startswith("output_transform_res") for s in names)
                assert fused == (not any(s.startswith("add") for s in names)), names
                assert fused or n == 3, names
                matches_reference(path, x, got, False)
                assert arena_hazards(eng, n, rec) == []
            _the_add_output_lives_from_the_conv(eng)


def _the_add_output_lives_from_the_conv(eng):
    """The arena keeps the add's output apart from everything the conv reads (its input,
    scratch, the residual): it starts at the conv's step, not the add's."""
    ctx, g = eng._ctx, eng.graph
    for conv_step, add in ctx.residual.items():
        assert ctx.buffers[ctx.root[g.nodes[add].outputs[0]]].first <= conv_step


@needs_fma
def test_no_fusion_where_the_conv_has_an_activation_or_the_value_comes_later(tmp_path):
    """A ReLU on the conv itself keeps the add; of two convs added, only the later one can
    write the sum (the earlier one's partner is not made yet)."""
    rng = np.random.default_rng(6)
    b = _block(rng, 32, 16, conv_act="relu")
    path = tmp_path / "act.bin"
    save_model(path, b.graph(), b.params, None)
    with Engine(path, max_batch=1, threads=1) as eng:
        assert eng._ctx.residual == {}
    b = Builder((64, 16, 16), rng)
    inp = b.conv(64, 64, 1, padding=[0, 0], activation="relu", **S1)
    first = b.conv(64, 64, 3, padding=[1, 1], activation="none", **S1)
    b.last = inp
    b.conv(64, 64, 3, padding=[1, 1], activation="none", **S1)
    b.op("add", first)
    path = tmp_path / "two.bin"
    save_model(path, b.graph(), b.params, None)
    with Engine(path, max_batch=1, threads=1) as eng:
        assert eng._ctx.residual == {2: 3}
        x = rng.standard_normal((1, 64, 16, 16)).astype(np.float32)
        eng._arena.fill(255)
        matches_reference(path, x, eng.run(x, copy=True), False)
        assert sum(s.startswith("output_transform_res") for s in _names(eng, 1)) == 1
