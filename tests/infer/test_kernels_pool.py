"""kernels_pool.maxpool_sep and kernels_fma_pool.maxpool_fma (AVX-512) against a naive NumPy twin
and formats/reference.py."""

from __future__ import annotations

import numpy as np
import pytest

from pocket.formats import reference as ref
from pocket.infer import kernels_pool as kp

RNG = np.random.default_rng(7)

# (kh, kw, sh, sw, ph, pw): the 3x3/2 and 2x2/2 fast paths, padded and not, and general ones
GEOMS = [(3, 3, 2, 2, 1, 1), (3, 3, 2, 2, 0, 0), (2, 2, 2, 2, 0, 0), (3, 2, 1, 2, 1, 1),
         (1, 1, 2, 2, 0, 0), (2, 3, 2, 1, 0, 1), (5, 5, 3, 3, 2, 2), (3, 1, 1, 1, 1, 0)]


def naive_maxpool(x, kh, kw, sh, sw, ph, pw):
    """Each window's max, the padding at the dtype's lowest value, NaN propagating."""
    low = np.iinfo(x.dtype).min if x.dtype.kind == "i" else -np.inf
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=low)
    ho = (x.shape[2] + 2 * ph - kh) // sh + 1
    wo = (x.shape[3] + 2 * pw - kw) // sw + 1
    out = np.empty(x.shape[:2] + (ho, wo), x.dtype)
    for i in range(ho):
        for j in range(wo):
            win = xp[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw].reshape(*x.shape[:2], -1)
            out[:, :, i, j] = np.maximum.reduce(win, axis=2)
    return out


def _input(dtype, shape):
    if dtype == np.int8:
        x = RNG.integers(-128, 128, shape).astype(np.int8)
        x.reshape(-1)[:2] = (-128, 127)
        return x
    x = RNG.standard_normal(shape).astype(np.float32)
    flat = x.reshape(-1)
    flat[RNG.choice(flat.size, 3, replace=False)] = (np.nan, np.inf, -np.inf)
    return x


@pytest.mark.parametrize("geom", GEOMS, ids=lambda g: "k{}x{}s{}{}p{}{}".format(*g))
@pytest.mark.parametrize("dtype", [np.float32, np.int8], ids=["f32", "i8"])
@pytest.mark.parametrize("shape", [(2, 3, 7, 9), (1, 2, 5, 4), (1, 2, 6, 41), (1, 1, 5, 70)])
def test_maxpool_sep_matches_naive(geom, dtype, shape):
    """Rows narrower than a vector (scalar loops only) and wider (vectors, then the last
    elements scalar; 41 and 70 columns: 8-float and 16-code vectors with tails)."""
    kh, kw, sh, sw, ph, pw = geom
    if shape[2] + 2 * ph < kh or shape[3] + 2 * pw < kw:
        pytest.skip("window larger than the padded map")
    x = _input(dtype, shape)
    want = naive_maxpool(x, *geom)
    attrs = {"kernel": [kh, kw], "stride": [sh, sw], "padding": [ph, pw]}
    np.testing.assert_array_equal(want, ref.maxpool2d(attrs, x))
    lowest = dtype(-128) if dtype == np.int8 else np.float32(-np.inf)
    width = kp.row_width(shape[3], want.shape[3], kw, sw, pw)
    planes = shape[0] * shape[1]
    for parts, kernel in ((1, kp.maxpool_sep.serial), (2, kp.maxpool_sep), (planes, kp.maxpool_sep.serial)):
        rows = np.full((parts, width), 5, dtype)  # junk: the kernel writes what it reads
        out = np.full(want.shape, 3, dtype)
        kernel(out, x, rows, *geom, lowest)
        np.testing.assert_array_equal(out, want, err_msg=f"{parts} parts")


# maxpool_fma's geometries (kw, sw in kernels_fma_pool.FAST), rows of several 16-lane chunks,
# odd sizes (a stride-2 window's last column reaching the buffer's end) and padding
FMA_GEOMS = [(3, 3, 2, 2, 1, 1), (3, 3, 2, 2, 0, 0), (2, 2, 2, 2, 0, 0), (3, 3, 1, 1, 1, 1),
             (2, 3, 1, 2, 0, 1), (1, 2, 1, 2, 0, 0), (3, 3, 2, 1, 1, 1)]


@pytest.mark.parametrize("geom", FMA_GEOMS, ids=lambda g: "k{}x{}s{}{}p{}{}".format(*g))
@pytest.mark.parametrize("shape", [(2, 3, 7, 9), (1, 2, 5, 4), (1, 3, 27, 27), (2, 2, 13, 70),
                                   (1, 1, 9, 33)])
def test_maxpool_fma_matches_naive(geom, shape):
    from pocket.infer import kernels_fma as kfma

    if not kfma.AVAILABLE:
        pytest.skip("this CPU has no AVX-512")
    from pocket.infer import kernels_fma_pool as kfp

    kh, kw, sh, sw, ph, pw = geom
    assert kfp.fast(kw, sw)
    if shape[2] + 2 * ph < kh or shape[3] + 2 * pw < kw:
        pytest.skip("window larger than the padded map")
    x = _input(np.float32, shape)
    want = naive_maxpool(x, *geom)
    np.testing.assert_array_equal(want, ref.maxpool2d({"kernel": [kh, kw], "stride": [sh, sw],
                                                       "padding": [ph, pw]}, x))
    planes = shape[0] * shape[1]
    for parts, kernel in ((1, kfp.maxpool_fma.serial), (2, kfp.maxpool_fma),
                          (planes, kfp.maxpool_fma.serial)):
        flat = np.full(want.size + 32, 3, np.float32)  # a write past the output shows
        out = flat[:want.size].reshape(want.shape)
        kernel(out, x, parts, *geom)
        np.testing.assert_array_equal(out, want, err_msg=f"{parts} parts")
        assert (flat[want.size:] == 3).all()


def test_row_width_covers_every_window():
    for w, kw, sw, pw in ((9, 3, 2, 1), (8, 3, 2, 0), (5, 5, 3, 2), (1, 1, 2, 0)):
        wo = (w + 2 * pw - kw) // sw + 1
        assert kp.row_width(w, wo, kw, sw, pw) >= max((wo - 1) * sw + kw, w + 2 * pw)


@pytest.mark.parametrize("p", [1, 7, 1000])
def test_global_avgpool_sums_in_float64(p):
    """The reassociated (vector-lane) float64 sum: within a float32 rounding of the float64
    mean, also where a float32 sum would lose digits (a large offset); NaN and inf pass."""
    from pocket.infer import kernels_fp32 as kf

    x = (1e4 + RNG.standard_normal((2, 5, p))).astype(np.float32)
    x[0, 1, p // 2] = np.nan
    x[1, 2, 0] = np.inf
    want = x.astype(np.float64).mean(axis=2)
    for kernel in (kf.global_avgpool, kf.global_avgpool.serial):
        out = np.empty((2, 5), np.float32)
        kernel(out, x)
        assert np.isnan(out[0, 1]) and out[1, 2] == np.inf
        ok = np.isfinite(want)
        assert np.all(np.abs(out[ok] - want[ok]) <= np.spacing(np.float32(want[ok])))


def test_without_the_jit(tmp_path):
    """NUMBA_DISABLE_JIT=1 (every kernel as Python): the LLVM-vector passes of maxpool_sep and
    of the padded depthwise convs cannot run there; their scalar loops give the naive results."""
    import os
    import subprocess
    import sys

    code = """
import numpy as np
from pocket.infer import kernels_dw as kd, kernels_pool as kp
assert not kp.VECTORS and not kd.VECTORS
x = np.random.default_rng(1).standard_normal((1, 2, 9, 33)).astype(np.float32)
out = np.empty((1, 2, 4, 16), np.float32)
rows = np.empty((1, kp.row_width(33, 16, 3, 2, 0)), np.float32)
kp.maxpool_sep.serial(out, x, rows, 3, 3, 2, 2, 0, 0, np.float32(-np.inf))
want = np.max([x[:, :, i:i + 7:2, j:j + 31:2] for i in range(3) for j in range(3)], axis=0)
assert np.array_equal(out, want)
w = np.random.default_rng(2).standard_normal((2, 1, 3, 3)).astype(np.float32)
b = np.zeros(2, np.float32)
y = np.empty((1, 2, 5, 17), np.float32)
a, t = kd.padded_sizes(9, 33, 5, 17, 2, 1, 1)
kd.dw_conv_padded.serial(y, x, w, b, np.zeros((1, a), np.float32), np.zeros((1, t), np.float32),
                         2, 1, 1, 0, 0.0)
xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
want = sum(w[None, :, 0, i, j, None, None] * xp[:, :, i:i + 9:2, j:j + 33:2]
           for i in range(3) for j in range(3))
assert np.allclose(y, want, atol=1e-5)
"""
    env = {**os.environ, "NUMBA_DISABLE_JIT": "1", "NUMBA_CACHE_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=600)
