"""kernels_tile_pool.gemm_phase_pool (a stride-2 stem conv with its max pool fused) against
formats/reference.py's conv and maxpool in float64, and bit for bit against the two calls it
replaces (kernels_tile.gemm_phase, then kernels_pool.maxpool_sep)."""

from __future__ import annotations

import numpy as np
import pytest
from models import readonly

from pocket.formats import reference as ref
from pocket.infer import kernels_fp32 as kf
from pocket.infer import kernels_phase as kq
from pocket.infer import kernels_pool as kp
from pocket.infer import kernels_tile as kt
from pocket.infer import kernels_tile_pool as ktp

RNG = np.random.default_rng(11)

# (C, O, H, W, conv k, conv padding, pool k, pool padding): SqueezeNet's stem (3x3 conv, 3x3
# pool unpadded, odd Wo), ResNet-18's (7x7, pool padded), ShuffleNetV2's (3x3, pool padded),
# 2x2 pools (padded: a first window of one row), channels past a multiple of ROWS, rows of a
# vector and a little more, odd and even conv sizes
CASES = [(3, 16, 63, 63, 3, 0, 3, 0), (3, 8, 56, 60, 7, 3, 3, 1), (3, 13, 40, 36, 3, 1, 3, 1),
         (2, 7, 35, 37, 3, 1, 2, 0), (1, 6, 34, 34, 3, 1, 2, 1), (4, 20, 33, 34, 5, 2, 3, 1),
         (3, 9, 36, 38, 3, 1, 3, 0)]


def _conv_then_pool(case):
    c, o, h, w, k, p, pk, pp = case
    x = RNG.standard_normal((1, c, h, w)).astype(np.float32)
    wt = RNG.standard_normal((o, c, k, k)).astype(np.float32)
    b = readonly(RNG.standard_normal(o).astype(np.float32))
    hq, wq = kq.phase_shape(h, w, p, p)
    ho, wo = (h + 2 * p - k) // 2 + 1, (w + 2 * p - k) // 2 + 1
    hp, wp = (ho + 2 * pp - pk) // 2 + 1, (wo + 2 * pp - pk) // 2 + 1
    xq = np.full(c * 4 * hq * wq + kt.phase_slack(wq), np.nan, np.float32)
    kq.split_phases.serial(xq, x, p, p, hq, wq)
    args = (readonly(kt.pack_weights(wt.reshape(o, -1), blocked=False)), xq, wq,
            readonly(kq.phase_offsets(c, k, k, hq, wq)), b)
    return x, wt, b, args, (ho, wo, hp, wp)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("act", ["none", "relu", "clip"])
@pytest.mark.parametrize("parts", [1, 3])
def test_gemm_phase_pool_matches_reference_and_the_two_calls(case, act, parts):
    c, o, h, w, k, p, pk, pp = case
    alpha = 6.0 if act == "clip" else 0.0
    x, wt, b, args, (ho, wo, hp, wp) = _conv_then_pool(case)
    assert ktp.fusable(pk, pk, 2, 2, pp, pp, wo, False)
    code = kf.ACT[act]

    ring = np.full((parts, ktp.ring_floats(o, wo, wp, pk, pk, pp)), np.nan, np.float32)
    got = np.full((o, hp, wp), np.nan, np.float32)
    fn = ktp.gemm_phase_pool if parts > 1 else ktp.gemm_phase_pool.serial
    fn(got, *args, ring, ho, wo, pk, pp, code, alpha)

    # the two calls it replaces: the same bytes
    y = np.full((1, o, ho, wo), np.nan, np.float32)
    kt.gemm_phase.serial(y[0], *args, np.full((1, kt.ROWS * kt.VL), np.nan, np.float32), code, alpha)
    plain = np.full((1, o, hp, wp), np.nan, np.float32)
    rows = np.full((1, kp.row_width(wo, wp, pk, 2, pp)), np.nan, np.float32)
    kp.maxpool_sep.serial(plain, y, rows, pk, pk, 2, 2, pp, pp, np.float32(-np.inf))
    np.testing.assert_array_equal(got, plain[0])

    # float64 reference: conv (with its activation), then the pool
    conv = {"stride": [2, 2], "padding": [p, p], "dilation": [1, 1], "groups": 1,
            "activation": act, "alpha": alpha}
    x64, w64 = x.astype(np.float64), wt.astype(np.float64)
    pool = {"kernel": [pk, pk], "stride": [2, 2], "padding": [pp, pp]}
    want = ref.maxpool2d(pool, ref.conv2d(conv, x64, w64, b.astype(np.float64)))[0]
    mag = ref.conv2d(dict(conv, activation="none"), np.abs(x64), np.abs(w64),
                     np.abs(b).astype(np.float64))
    bound = 1e-5 * ref.maxpool2d(pool, mag)[0].max()
    assert np.abs(got - want).max() <= bound + 1e-6, (case, act)


def test_fusable_declines_what_the_kernel_does_not_take():
    assert ktp.fusable(3, 3, 2, 2, 1, 1, 112, False)
    assert not ktp.fusable(3, 3, 2, 2, 1, 1, 112, True)  # SiLU and the like: after the tiles
    assert not ktp.fusable(3, 3, 1, 1, 1, 1, 112, False)  # stride 1
    assert not ktp.fusable(5, 5, 2, 2, 2, 2, 112, False)  # 5x5 windows
    assert not ktp.fusable(3, 2, 2, 2, 0, 0, 112, False)  # not square
    assert not ktp.fusable(3, 3, 2, 2, 1, 1, 7, False)  # rows under a vector
    assert not ktp.fusable(3, 3, 2, 2, 0, 0, 16, False)  # pooled rows under a vector (8)
