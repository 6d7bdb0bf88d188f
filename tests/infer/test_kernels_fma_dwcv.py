"""kernels_fma_dwcv (depthwise convs 16 channels a vector, AVX-512) against naive NumPy in
float64, and its route choice."""

from __future__ import annotations

import numpy as np
import pytest
from route_fuzz import guarded_copy
from test_kernels_fma import TILE_ACTS

from pocket.infer import kernels_fma as kfma
from pocket.infer import kernels_fma_cv as kcv
from pocket.infer import kernels_fma_dwcv as kdc
from pocket.infer import kernels_fp32 as kf

needs_fma = pytest.mark.skipif(not kfma.AVAILABLE, reason="this CPU has no AVX-512")
RNG = np.random.default_rng(41)


def _naive(x, w, b, s, ph, pw):
    n, c, h, wd = x.shape
    k = w.shape[2]
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    ho, wo = (h + 2 * ph - k) // s + 1, (wd + 2 * pw - k) // s + 1
    out = np.zeros((n, c, ho, wo)) + (b[None, :, None, None] if b.size else 0)
    for i in range(k):
        for j in range(k):
            rows, cols = slice(i, i + s * (ho - 1) + 1, s), slice(j, j + s * (wo - 1) + 1, s)
            out += w[None, :, 0, i, j, None, None] * xp[:, :, rows, cols]
    return out


@needs_fma
@pytest.mark.parametrize("serial", [False, True])
@pytest.mark.parametrize("n,c,h,w,k,s,ph,pw", [
    (1, 16, 7, 7, 5, 1, 2, 2), (2, 37, 14, 14, 5, 2, 2, 2), (1, 20, 7, 7, 3, 1, 1, 1),
    (1, 33, 14, 14, 3, 2, 1, 1), (1, 17, 13, 11, 5, 1, 2, 2), (1, 5, 4, 4, 3, 1, 1, 1),
    (1, 48, 20, 19, 5, 2, 2, 2), (1, 3, 9, 6, 3, 2, 0, 1), (1, 18, 17, 21, 5, 1, 1, 2)])
def test_dw_conv_fma_cv(n, c, h, w, k, s, ph, pw, serial):
    """Channel counts off a multiple of 16 (the last group's missing channels neither read
    nor written), stride 1 and 2, paddings 0-2 (unequal too), rows longer than 16 (two
    transposes a row) and of 4-7 outputs (a block of 8 past the row's end); x on a guard page
    (a read past it faults), NaN sentinels after the output and NaN in the scratch. Every
    activation of the tiles in registers, tanh in its own pass, no bias; one part and 2-3."""
    x = guarded_copy(3 * RNG.standard_normal((n, c, h, w)).astype(np.float32))
    wt = RNG.standard_normal((c, 1, k, k)).astype(np.float32)
    b = RNG.standard_normal(c).astype(np.float32)
    ho, wo = (h + 2 * ph - k) // s + 1, (w + 2 * pw - k) // s + 1
    hp, wp = (ho - 1) * s + k, (wo - 1) * s + k
    fn = kdc.dw_conv_fma_cv.serial if serial else kdc.dw_conv_fma_cv
    cases = [(epi - 1, 0, TILE_ACTS[epi], b) for epi in sorted(TILE_ACTS) if epi > 0]
    cases += [(-1, kf.ACT["tanh"], np.tanh, b), (0, 0, TILE_ACTS[0], np.zeros(0, np.float32))]
    for mode, act, ref_act, bias in cases:
        for parts in (1, 3 if c > 16 else 2):
            flat = np.full(n * c * ho * wo + 64, np.nan, np.float32)
            out = flat[:n * c * ho * wo].reshape(n, c, ho, wo)
            scratch = np.full((parts, kdc.scratch_floats(hp, wp, ho, wo)), np.nan, np.float32)
            fn(out, x, kdc.pack(wt), kcv.pad_bias(bias, c), scratch, s, ph, pw, mode, act, 0.0)
            assert np.isnan(flat[n * c * ho * wo:]).all(), "wrote past the output"
            want = ref_act(_naive(x, wt, bias, s, ph, pw))
            np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * k * 3, err_msg=f"mode {mode}")


@needs_fma
def test_pack_holds_16_channels_a_tap():
    w = RNG.standard_normal((21, 1, 3, 3)).astype(np.float32)
    wpk = kdc.pack(w)
    assert wpk.shape == (2, 9, 16)
    np.testing.assert_array_equal(wpk[1, 4, :5], w[16:, 0, 1, 1])
    assert not wpk[1, :, 5:].any()


@needs_fma
@pytest.mark.parametrize("h,k,s,cv", [(7, 5, 1, True), (14, 5, 2, True), (14, 5, 1, True),
                                      (28, 5, 2, True), (15, 5, 1, False), (7, 3, 1, False)])
def test_route_takes_it_on_small_maps(tmp_path, h, k, s, cv):
    """5x5 depthwise convs to maps of at most MAX_OUT pixels (7x7, 14x14; 28x28 at stride 2)
    bind dw_conv_fma_cv, with the weights packed once (prepared bytes); 15x15 and 3x3 keep the
    other kernels. Each matches the reference with its hardswish, on one thread and two."""
    from models import Builder, matches_reference, save_model

    from pocket.infer.engine import Engine

    rng = np.random.default_rng(15)
    b = Builder((40, h, h), rng)
    b.conv(40, 40, k, groups=40, stride=[s, s], padding=[k // 2, k // 2], activation="hardswish")
    path = save_model(tmp_path / "dw.bin", b.graph(), b.params, None)
    x = rng.standard_normal((2, 40, h, h)).astype(np.float32)
    for threads in (1, 2):
        with Engine(path, max_batch=2, threads=threads) as eng:
            eng._arena.fill(255)
            got = eng.run(x, copy=True)
            names = [c.func.__name__ for c in eng._bound[2].calls]
            assert any(nm.startswith("dw_conv_fma_cv") for nm in names) == cv, names
            assert (eng.prepared_bytes > 0) == cv
        matches_reference(path, x, got, False)
