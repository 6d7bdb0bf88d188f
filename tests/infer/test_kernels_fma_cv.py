"""kernels_fma_cv (1x1 convs vectorized along the output channels, AVX-512) against naive
NumPy in float64, and against kernels_fma.gemm bit for bit (the route picks either by shape,
so a plan's outputs must not depend on which)."""

from __future__ import annotations

import numpy as np
import pytest
from route_fuzz import guarded_copy
from test_kernels_fma import TILE_ACTS, _naive

from pocket.infer import kernels_fma as kfma
from pocket.infer import kernels_fma_cv as kcv

needs_fma = pytest.mark.skipif(not kfma.AVAILABLE, reason="this CPU has no AVX-512")
RNG = np.random.default_rng(31)


def _run(fn, x, w, b, epi, groups, splits, parts):
    nb, k, m = x.shape
    o = w.shape[0]
    flat = np.full(nb * o * m + 64, np.nan, np.float32)
    c = flat[:nb * o * m].reshape(nb, o, m)
    scratch = np.full((parts, kcv.scratch_floats(m, groups)), np.nan, np.float32)
    fn(c, kcv.pack(w), x, nb, o, m, kcv.pad_bias(b, o), epi, groups, splits, scratch)
    assert np.isnan(flat[nb * o * m:]).all(), "wrote past C"
    return c


@needs_fma
@pytest.mark.parametrize("serial", [False, True])
@pytest.mark.parametrize("split", [(1, 1, 1), (1, 2, 2), (3, 1, 2), (2, 3, 4)])
@pytest.mark.parametrize("nb,o,k,m", [(1, 64, 16, 49), (1, 1152, 192, 49), (2, 24, 300, 31),
                                      (1, 40, 7, 1), (1, 80, 130, 196), (1, 17, 5, 13),
                                      (2, 100, 257, 169), (1, 96, 70, 49), (1, 112, 129, 5),
                                      (1, 7, 1, 12), (1, 208, 40, 37)])
def test_gemm_cv(nb, o, k, m, split, serial):
    """Channel counts that leave a last vector partly empty (17, 40, 100), blocks of 1-4
    vectors (a split's vectors in even blocks), pixels that end a tile of 6 or 12 early, K
    past one chunk of CV_K rows (the scratch carries the sums), pixel groups and channel
    splits over several parts; X ends on a guard page (a read past it faults), C is followed
    by NaN sentinels and the scratch starts NaN. Every activation of the tiles; a NaN input
    pixel gives NaN outputs in its column."""
    groups, splits, parts = split
    x = 3 * RNG.standard_normal((nb, k, m)).astype(np.float32)
    x[0, 0, m - 1] = np.nan
    x = guarded_copy(x)
    w = RNG.standard_normal((o, k)).astype(np.float32)
    b = RNG.standard_normal(o).astype(np.float32)
    fn = kcv.gemm_cv.serial if serial else kcv.gemm_cv
    gemm = kfma.gemm.serial if serial else kfma.gemm
    for epi in sorted(TILE_ACTS):
        c = _run(fn, x, w, b, epi, groups, splits, parts)
        ref = np.full((nb, o, m), np.nan, np.float32)
        gemm(ref, w, x.reshape(-1), kfma.row_offsets(k, m), nb, o, m, k * m, 0, k, o * m, m, b, epi)
        np.testing.assert_array_equal(c, ref)  # the same bits as kernels_fma.gemm
        for i in range(nb):
            want = TILE_ACTS[epi](_naive(w, x[i]) + (b[:, None] if epi else 0))
            np.testing.assert_array_equal(np.isnan(c[i]), np.isnan(want))
            np.testing.assert_allclose(c[i], want, rtol=1e-5, atol=1e-5 * np.sqrt(k))


def test_five_tiles_cover_the_pixels_exactly():
    """Tiles of 6 then _five_tiles(mp) tiles of 5 cover mp pixels with none to spare wherever
    some such cover exists (by brute force); else it is 0 (the last tile of 6 runs short)."""
    for mp in range(1, 400):
        five = kcv._five_tiles(mp)
        covers = [b for b in range(mp // 5 + 1) if (mp - 5 * b) % 6 == 0]
        if covers:
            assert five == min(covers), mp
        else:
            assert five == 0, mp


@needs_fma
def test_pack_is_vector_major():
    """pack: vector v's row k holds channels 16v..16v+15 at input k, zeros past o, on a line."""
    w = RNG.standard_normal((37, 5)).astype(np.float32)
    wp = kcv.pack(w)
    assert wp.shape == (3, 5, 16) and wp.ctypes.data % 64 == 0
    full = np.zeros((48, 5), np.float32)
    full[:37] = w
    np.testing.assert_array_equal(wp.transpose(0, 2, 1).reshape(48, 5), full)


@pytest.mark.parametrize("o,m,threads,want", [(1152, 49, 1, (1, 1)), (1152, 49, 2, (1, 2)),
                                               (112, 196, 2, (2, 1)), (64, 3, 2, (1, 1))])
def test_cv_split(o, m, threads, want):
    """Many channel vectors split between the threads; few split the pixels, never into more
    groups than there are tiles of CV_P pixels."""
    assert kcv.cv_split(o, m, threads) == want


@pytest.mark.parametrize("o,k,m,threads,want", [
    (1152, 192, 49, 1, True), (1000, 512, 169, 1, True),  # 77% / 96% of the pixel lanes
    (576, 96, 49, 1, False), (192, 48, 169, 1, False),  # few multiply-adds an output
    (32, 256, 729, 1, False), (64, 64, 3136, 1, False),  # large maps fill the pixel lanes
    (24, 300, 49, 1, False),  # 24 channels fill the channel lanes worse than 49 pixels
    (96, 288, 49, 2, False), (112, 672, 196, 2, True), (192, 1152, 49, 2, True)])
def test_pays(o, k, m, threads, want):
    assert kcv.pays(o, k, m, threads) == want


@needs_fma
@pytest.mark.parametrize("hw,cv", [(7, True), (16, False)])
def test_small_maps_take_gemm_cv(tmp_path, hw, cv):
    """A 1x1 conv on a 7x7 map binds gemm_cv (weights packed once, counted as prepared
    bytes) and matches the reference with its SiLU; on 16x16 it keeps kernels_fma.gemm."""
    from models import Builder, matches_reference, save_model

    from pocket.infer.engine import Engine

    rng = np.random.default_rng(14)
    b = Builder((160, hw, hw), rng)
    b.conv(160, 200, 1, activation="silu")
    path = tmp_path / "pw.bin"
    save_model(path, b.graph(), b.params, None)
    x = rng.standard_normal((2, 160, hw, hw)).astype(np.float32)
    for threads in (1, 2):
        with Engine(path, max_batch=2, threads=threads) as eng:
            eng._arena.fill(255)
            got = eng.run(x, copy=True)
            names = [c.func.__name__ for c in eng._bound[2].calls]
            assert any(n.startswith("gemm_cv") for n in names) == cv, names
            assert (eng.prepared_bytes > 0) == cv
        matches_reference(path, x, got, False)


@needs_fma
def test_small_map_3x3_takes_gemm_cv_on_one_thread(tmp_path):
    """A 3x3 conv on a 7x7 map (conv_fma_cols: im2col, then the GEMM) runs gemm_cv over
    columns of exactly 49 pixels at batch 1 on one thread, kernels_fma.gemm on two threads
    and at batch 2 (two images a chunk); each matches the reference."""
    from models import Builder, matches_reference, save_model

    from pocket.infer.engine import Engine

    rng = np.random.default_rng(15)
    b = Builder((96, 7, 7), rng)
    b.conv(96, 160, 3, padding=[1, 1], activation="relu")
    path = tmp_path / "c3.bin"
    save_model(path, b.graph(), b.params, None)
    for threads, n, cv in ((1, 1, True), (2, 1, False), (1, 2, False)):
        x = rng.standard_normal((n, 96, 7, 7)).astype(np.float32)
        with Engine(path, max_batch=2, threads=threads) as eng:
            eng._arena.fill(255)
            got = eng.run(x, copy=True)
            names = [c.func.__name__ for c in eng._bound[n].calls]
            assert any(s.startswith("gemm_cv") for s in names) == cv, (threads, n, names)
        matches_reference(path, x, got, False)


@needs_fma
@pytest.mark.parametrize("c,cv2", [(96, False), (288, True)])
def test_small_map_3x3_streamed_weights_take_gemm_cv_on_two_threads(tmp_path, c, cv2):
    """On two threads a 3x3 conv on a 7x7 map takes gemm_cv (its channels split between the
    threads) where its weights pass kernels_fma.STREAM_W_BYTES (288 -> 160: 1.66 MB), and its
    solo twin (a busy machine's calls) the same kernel serially, as one thread's plan does;
    with fewer weights (96 -> 160: 0.55 MB) the two GEMMs over K's halves stay. Each matches
    the reference, team and solo."""
    from models import Builder, matches_reference, save_model

    from pocket.infer.engine import Engine

    assert (c * 9 * 160 * 4 > kfma.STREAM_W_BYTES) == cv2
    rng = np.random.default_rng(16)
    b = Builder((c, 7, 7), rng)
    b.conv(c, 160, 3, padding=[1, 1], activation="relu")
    path = tmp_path / "c3.bin"
    save_model(path, b.graph(), b.params, None)
    x = rng.standard_normal((1, c, 7, 7)).astype(np.float32)
    with Engine(path, max_batch=1, threads=2) as eng:
        eng._arena.fill(255)
        got = eng.run(x, copy=True)
        bound = eng._bound[1]
        names = [getattr(f.func, "__name__", "") for f in bound.calls]
        assert any(s.startswith("gemm_cv") for s in names) == cv2, names
        assert any(s.startswith("bias_act_sum") for s in names) == (not cv2), names
        assert bound.solo is not None  # (2 threads, work to split: the adaptive plan's twin)
        solo = [getattr(f.func, "__name__", "") for f in bound.solo.calls]
        assert ("gemm_cv_serial" in solo) == cv2, solo
        eng._arena.fill(255)
        eng._run_calls(bound.solo, None if bound.solo.feed is None else
                       (bound.solo.feed[0], bound.solo.feed[1], x.reshape(bound.solo.feed[2])))
        np.testing.assert_array_equal(bound.outputs[0], got)
    matches_reference(path, x, got, False)


def test_call_work_counts_the_multiply_adds():
    """The engine's serial/parallel choice (pools.call_work) measures gemm_cv as it measures
    kernels_fma.gemm over the same conv (counted as an element-wise kernel, MobileNetV3's 96 x
    288 @ 288 x 49 ran on one thread)."""
    from functools import partial

    from pocket.infer import pools

    nb, o, k, m = 2, 96, 288, 49
    x, w = np.zeros((nb, k, m), np.float32), np.zeros((o, k), np.float32)
    c, b = np.zeros((nb, o, m), np.float32), np.zeros(o, np.float32)
    cv = partial(kcv.gemm_cv, c, kcv.pack(w), x, nb, o, m, kcv.pad_bias(b, o), 1, 1, 2,
                 np.zeros((2, kcv.scratch_floats(m, 1)), np.float32))
    gemm = partial(kfma.gemm, c, w, x, kfma.row_offsets(k, m), nb, o, m, k * m, 0, k, o * m, m, b, 1)
    assert pools.call_work(cv, True) == pools.call_work(gemm, True) == 4 * nb * o * k * m
