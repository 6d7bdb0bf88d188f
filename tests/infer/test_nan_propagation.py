"""NaN propagates through every fp32 route as in formats/reference.py (issue 21): a NaN reaching
a ReLU (fused or not) or a max pool gives NaN, as NumPy, PyTorch and onnxruntime do.

Each case is a small model with NaN in its input, run on both GEMM families (the AVX-512
kernels and the portable BLAS ones, see conftest.fp32_route), and names a kernel that its plan
must call, so that each route family is the one under test. Expected: NaN exactly where the
reference has NaN (Winograd: at least there; its transforms mix a tile's 4x4 inputs into all
of its outputs, so a NaN reaches a few more), the other values within 1e-5 of the output's
largest magnitude.
"""

from __future__ import annotations

import numpy as np
import pytest
from models import Builder, FakeContainer
from route_fuzz import kernel_names

from pocket.formats import reference as ref
from pocket.infer import Engine, kernels_tile
from pocket.infer import kernels_fp32 as kf


def _conv_relu(b, c, o, k=3, **attrs):
    attrs.setdefault("padding", [k // 2, k // 2])
    return b.conv(c, o, k, activation="relu", **attrs)


# name: (input shape, batch, build(b), {route: a kernel its plan calls}, Winograd)
CASES = {
    # a channel multiplier (C/groups == 1, O == 2C): the direct loops
    "direct": ((4, 7, 6), 2, lambda b: _conv_relu(b, 4, 8, groups=4),
               {"fma": "conv2d_direct", "blas": "conv2d_direct"}, False),
    "depthwise": ((4, 15, 14), 2, lambda b: _conv_relu(b, 4, 4, groups=4),
                  {"fma": "dw_conv_fma", "blas": "dw_conv_padded"}, False),
    # a small plane (at most 196 outputs at 3x3): one flat run of vectors on AVX-512
    "depthwise_small": ((4, 7, 6), 2, lambda b: _conv_relu(b, 4, 4, groups=4),
                        {"fma": "dw_conv_fma_flat", "blas": "dw_conv_padded"}, False),
    "pointwise": ((5, 4, 6), 2, lambda b: _conv_relu(b, 5, 7, k=1), {"fma": "gemm", "blas": "bias_act"},
                  False),
    "grouped": ((4, 6, 6), 2, lambda b: _conv_relu(b, 4, 6, groups=2),
                {"fma": "bias_act", "blas": "im2col_same"}, False),
    "strided": ((3, 9, 8), 2, lambda b: _conv_relu(b, 3, 10, stride=[2, 2]),
                {"fma": "pad_phases", "blas": "bias_act"}, False),
    "pitch": ((8, 10, 9), 2, lambda b: _conv_relu(b, 8, 16),
              {"fma": "bias_act_pitch", "blas": "bias_act_pitch"}, False),
    # one image whose pixels fill whole tiles: the GEMM's register epilogue writes the output
    "one_image": ((3, 8, 8), 1, lambda b: _conv_relu(b, 3, 16), {"fma": "gemm", "blas": "bias_act_pitch"},
                  False),
    "winograd": ((64, 16, 16), 1, lambda b: _conv_relu(b, 64, 16),
                 {"fma": "output_transform", "blas": "output_transform"}, True),
    "winograd_fused": ((32, 8, 10), 4, lambda b: _conv_relu(b, 32, 8), {"fma": "fused_conv"}, True),
    "conv_pool": ((8, 10, 12), 2, lambda b: (_conv_relu(b, 8, 16), b.op("maxpool2d", kernel=[2, 2])),
                  {"fma": "gemm_pool2_pitch", "blas": "bias_act_pool_pitch"}, False),
    "conv_pool_3x3": ((8, 11, 12), 2, lambda b: (_conv_relu(b, 8, 16),
                                                 b.op("maxpool2d", kernel=[3, 3], stride=[2, 2])),
                      {"fma": "bias_act_pool_pitch", "blas": "bias_act_pool_pitch"}, False),
    "strided_pool": ((3, 13, 13), 2, lambda b: (_conv_relu(b, 3, 10, stride=[2, 2]),
                                                b.op("maxpool2d", kernel=[2, 2])),
                     {"fma": "bias_act_pool_pitch", "blas": "bias_act_pool"}, False),
    "winograd_pool": ((64, 16, 16), 1, lambda b: (_conv_relu(b, 64, 16), b.op("maxpool2d", kernel=[2, 2])),
                      {"fma": "output_transform", "blas": "output_transform"}, True),
    "linear_one_row": ((37,), 3, lambda b: b.linear(37, 20, activation="relu"),
                       {"fma": "gemv", "blas": "gemv"}, False),  # (kernels_gemv at 1-4 rows)
    "linear_rows": ((37,), 20, lambda b: b.linear(37, 20, activation="relu"),
                    {"fma": "bias_act_t", "blas": "bias_act_rows"}, False),
    "linear_chained": ((40,), 20, lambda b: (b.linear(40, 24, activation="relu"),
                                             b.linear(24, 12, activation="relu")),
                       {"fma": "gemm_t", "blas": "bias_act_rows"}, False),
    "relu_maxpool": ((3, 7, 8), 2, lambda b: (b.op("relu"), b.op("maxpool2d", kernel=[2, 2]), b.op(
        "maxpool2d", kernel=[3, 3], stride=[1, 1], padding=[1, 1])),
                     {"fma": "unary", "blas": "unary"}, False),
}
# the portable path with kernels_tile: its GEMM (bias and ReLU in the tile) where it takes the
# conv, BLAS's kernels elsewhere
_TILE = {"pointwise": "gemm_act", "strided": "gemm_act", "strided_pool": "gemm_act"}
if not kernels_tile.W_VECTORS:  # x86: conv_tile_cols ahead of conv_gemm_pitch (conv_tile.py)
    _TILE.update(dict.fromkeys(("pitch", "one_image", "conv_pool", "conv_pool_3x3"), "gemm_act"))
    # ... and 3-channel stride-2 convs over their input's phases (conv_tile_phase)
    _TILE.update(dict.fromkeys(("strided", "strided_pool"), "gemm_phase"))
for _name, _case in CASES.items():
    if "blas" in _case[3]:
        _case[3]["tile"] = _TILE.get(_name, _case[3]["blas"])


@pytest.mark.parametrize("name", list(CASES))
def test_nan_propagates_like_the_reference(name, fp32_route):
    shape, n, build, kernels, winograd = CASES[name]
    if fp32_route not in kernels:
        pytest.skip(f"{name} is an AVX-512 route")
    rng = np.random.default_rng(len(name))
    b = Builder(shape, rng)
    build(b)
    g = b.graph()
    x = rng.standard_normal((n, *shape)).astype(np.float32)
    # NaN inside, at a corner of the last image and, for maps, on a right edge
    x.reshape(n, -1)[0, 3] = x.reshape(-1)[-1] = np.nan
    if len(shape) == 3:
        x[0, 0, shape[1] // 2, -1] = np.nan
    want = ref.run(g, b.params, x)[g.outputs[0]]
    assert np.isnan(want).any() and not np.isnan(want).all()
    with Engine(FakeContainer(g, b.params), threads=1, max_batch=n) as eng:
        assert kernels[fp32_route] in kernel_names(eng._bind(n).calls)
        got = eng.run(x, copy=True)
    lost = np.isnan(want) & ~np.isnan(got)
    assert not lost.any(), f"{lost.sum()} NaN of the reference came out as numbers: {np.argwhere(lost)[0]}"
    if not winograd:
        extra = np.isnan(got) & ~np.isnan(want)
        assert not extra.any(), f"{extra.sum()} NaN where the reference has numbers"
    ok = ~np.isnan(got)
    top = np.abs(want[ok]).max()
    np.testing.assert_allclose(got[ok], want[ok], rtol=0, atol=1e-5 * top)


def test_nan_helpers_propagate():
    """kernels_fp32's ReLU, max and max pools against NumPy and the reference, NaN and infinities
    in every position."""
    from numba import njit

    vals = np.array([np.nan, 1.0, -2.0, 0.0, -0.0, np.inf, -np.inf], np.float32)
    relu, nanmax = njit(lambda v: kf.relu(v)), njit(lambda a, b: kf.nanmax(a, b))
    for a in vals:
        np.testing.assert_array_equal(relu(a), np.maximum(a, np.float32(0)))
        for c in vals:
            np.testing.assert_array_equal(nanmax(a, c), np.maximum(a, c))
    rng = np.random.default_rng(0)
    x = rng.choice(vals, (2, 3, 5, 6)).astype(np.float32)
    for attrs in ({"kernel": [2, 2], "padding": [0, 0]},
                  {"kernel": [3, 2], "stride": [1, 2], "padding": [1, 1]}):
        want = ref.maxpool2d(attrs, x)
        got = np.empty_like(want)
        kf.maxpool2d(got, x, *attrs["kernel"], *(attrs.get("stride") or attrs["kernel"]), *attrs["padding"])
        np.testing.assert_array_equal(got, want)
