"""Inverted residual blocks on small maps as one parallel call (lowering_block,
kernels_fma_block): the engine against formats/reference.py, which chains fuse, and the
kernels against the three calls they replace."""

from __future__ import annotations

import numpy as np
import pytest
from models import Builder, matches_reference, save_model

from pocket.infer import kernels_fma as kfma
from pocket.infer import kernels_fma_block as kb
from pocket.infer import kernels_fma_dw as kfd
from pocket.infer import kernels_fma_im2col as kfi
from pocket.infer import kernels_fp32 as kf
from pocket.infer.engine import Engine

needs_fma = pytest.mark.skipif(not kfma.AVAILABLE, reason="this CPU has no AVX-512")
S1 = {"stride": [1, 1], "dilation": [1, 1]}


def _block(rng, c, hw, t, o, *, residual=True, act="clip", dw_act="clip", project_act="none", k=3, stride=1):
    """A 1x1 conv c -> t, a k x k depthwise conv, a 1x1 conv t -> o (+ the block's input)."""
    b = Builder((c, hw, hw), rng)
    b.conv(c, c, 1, padding=[0, 0], activation="relu", **S1)  # the block's input: computed
    inp = b.last
    extra = {"max": 6.0} if act == "clip" else {}
    b.conv(c, t, 1, padding=[0, 0], activation=act, **extra, **S1)
    extra = {"max": 6.0} if dw_act == "clip" else {}
    b.conv(t, t, k, groups=t, padding=[k // 2, k // 2], activation=dw_act, stride=[stride, stride],
           dilation=[1, 1], **extra)
    b.conv(t, o, 1, padding=[0, 0], activation=project_act, **S1)
    if residual:
        b.op("add", inp)
    b.conv(o, 8, 1, padding=[0, 0], activation="none", **S1)
    return b


def _names(eng, n):
    return [getattr(c.func, "__name__", "") for c in eng._bound[n].calls]


@needs_fma
@pytest.mark.parametrize("case", [(16, 8, 96, 16, True, "clip", "clip", 3, 1),
                                  (24, 4, 144, 24, True, "relu", "none", 3, 1),
                                  (32, 7, 192, 24, False, "clip", "hardswish", 3, 1),
                                  (8, 20, 48, 8, True, "clip", "clip", 3, 1),  # the row kernels
                                  (8, 17, 48, 16, False, "relu", "relu", 3, 2),  # stride 2
                                  (8, 20, 40, 8, True, "relu", "relu", 5, 1)])
def test_the_block_runs_as_one_call(tmp_path, case):
    """At batch 1 the block binds block_parts + block_sum (no add, no depthwise call of its
    own), on one and two threads; batch 3 runs the nodes one by one. Each matches the
    reference, the arena starting as NaN."""
    c, hw, t, o, residual, act, dw_act, k, stride = case
    rng = np.random.default_rng(11)
    b = _block(rng, c, hw, t, o, residual=residual, act=act, dw_act=dw_act, k=k, stride=stride)
    path = tmp_path / "blk.bin"
    save_model(path, b.graph(), b.params, None)
    for threads in (1, 2):
        with Engine(path, max_batch=3, threads=threads) as eng:
            for n in (1, 3):
                x = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
                eng._arena.fill(255)
                got = eng.run(x, copy=True)
                names = _names(eng, n)
                fused = n == 1
                assert any(s.startswith("block_parts") for s in names) == fused, names
                assert any(s.startswith("dw_conv_fma") for s in names) != fused, names
                matches_reference(path, x, got, False)


@needs_fma
@pytest.mark.parametrize("why", ["project_act", "dwcv", "second_reader"])
def test_chains_that_do_not_fuse(tmp_path, why):
    """A project conv with an activation, a depthwise conv on kernels_fma_dwcv (5x5 on a small
    map), or the expanded map read twice: the nodes run one by one."""
    rng = np.random.default_rng(12)
    if why == "project_act":
        b = _block(rng, 16, 8, 64, 16, project_act="relu")
    elif why == "dwcv":
        b = _block(rng, 16, 8, 64, 16, k=5)
    else:
        b = Builder((16, 8, 8), rng)
        b.conv(16, 64, 1, padding=[0, 0], activation="relu", **S1)
        e = b.last
        b.conv(64, 64, 3, groups=64, padding=[1, 1], activation="relu", **S1)
        b.conv(64, 64, 1, padding=[0, 0], activation="none", **S1)
        b.op("add", e)  # the expanded map read again
    path = tmp_path / "nf.bin"
    save_model(path, b.graph(), b.params, None)
    x = rng.standard_normal((1, 16, 8, 8)).astype(np.float32)
    with Engine(path, max_batch=1, threads=1) as eng:
        got = eng.run(x, copy=True)
        assert not any(s.startswith("block_parts") for s in _names(eng, 1))
    matches_reference(path, x, got, False)


@needs_fma
@pytest.mark.parametrize("parts", [1, 2, 3])
def test_block_kernels_against_the_three_calls(parts):
    """block_parts + block_sum against kernels_fma.gemm, dw_conv_fma_flat, gemm and add: the
    same bits on one part, float32 rounding of the split sum on more; an odd channel count
    (the parts split whole tiles of the expand's rows)."""
    rng = np.random.default_rng(13)
    k, c1, c3, h = 20, 100, 24, 7
    m = h * h
    x = rng.standard_normal((k, m)).astype(np.float32)
    w1 = (rng.standard_normal((c1, k)) / np.sqrt(k)).astype(np.float32)
    b1 = rng.standard_normal(c1).astype(np.float32)
    w2 = rng.standard_normal((c1, 1, 3, 3)).astype(np.float32)
    b2 = rng.standard_normal(c1).astype(np.float32)
    w3 = (rng.standard_normal((c3, c1)) / np.sqrt(c1)).astype(np.float32)
    b3 = rng.standard_normal(c3).astype(np.float32)
    res = rng.standard_normal((c3, m)).astype(np.float32)
    masks = kfi.same_masks(kf.same_valid(h, h, 3, 3, 1, 1, 1, 1))
    offs1, offs3 = kfma.row_offsets(k, m), kfma.row_offsets(c1, m)
    relu6 = 1 + kfma.MODE_RELU6
    e_ref = np.zeros((1, c1, m), np.float32)
    kfma.gemm.serial(e_ref, w1, x.reshape(-1), offs1, 1, c1, m, k * m, 0, k, c1 * m, m, b1, relu6)
    d_ref = np.zeros((1, c1, h, h), np.float32)
    kfd.dw_conv_fma_flat.serial(d_ref, e_ref.reshape(1, c1, h, h), w2, b2, masks, 1, 1, 1, relu6 - 1, 0, 0.0)
    p_ref = np.zeros((1, c3, m), np.float32)
    kfma.gemm.serial(p_ref, w3, d_ref.reshape(-1), offs3, 1, c3, m, c1 * m, 0, c1, c3 * m, m, b3, 1)
    want = p_ref[0] + res
    psum = np.full((parts, c3, m), np.nan, np.float32)
    e = np.full((c1, m), np.nan, np.float32)
    d = np.full((1, c1, h, h), np.nan, np.float32)
    out = np.full((c3, m), np.nan, np.float32)
    kb.block_parts(psum, e.reshape(1, c1, h, h), d, x, w1, b1, relu6, offs1, w2, b2, masks,
                   np.zeros((0, 1), np.float32), 1, 1, 1, relu6 - 1, 0, 0.0, w3, offs3)
    kb.block_sum(out, psum, b3, res)
    np.testing.assert_array_equal(e, e_ref[0])
    np.testing.assert_array_equal(d, d_ref)
    if parts == 1:
        np.testing.assert_array_equal(out, want)
    else:
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
