"""The CPU Numba kernels against naive NumPy twins, on odd shapes."""

import numpy as np
import pytest

from pocket.train import functional as F
from pocket.train import gpu_kernels, kernels_cpu
from pocket.train.gradcheck import gradcheck
from pocket.train.tensor import Tensor

# (x shape, kernel, stride, padding, dilation): 1x1, non-square, stride 2, padding, dilation 2,
# batch 1, "same" convs (the one-run path), windows that overhang the far edge
GEOMETRY = [
    ((2, 3, 5, 7), (1, 1), (1, 1), (0, 0), (1, 1)),
    ((1, 2, 6, 5), (3, 3), (1, 1), (1, 1), (1, 1)),
    ((3, 2, 7, 6), (3, 2), (2, 2), (1, 0), (1, 1)),
    ((2, 3, 8, 7), (3, 3), (1, 2), (2, 1), (2, 2)),
    ((1, 1, 4, 4), (5, 5), (1, 1), (2, 2), (1, 1)),
    ((2, 2, 5, 9), (1, 3), (1, 1), (0, 1), (1, 1)),
    ((2, 2, 6, 6), (2, 2), (3, 3), (1, 1), (1, 1)),
    ((1, 3, 9, 4), (3, 3), (2, 1), (0, 2), (1, 2)),
]


def _out(size, k, s, p, d):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def naive_im2col(x, k, s, p, d):
    # x (N, C, H, W) -> col (C, kh, kw, N, Ho, Wo), one element at a time
    n, c, h, w = x.shape
    ho, wo = _out(h, k[0], s[0], p[0], d[0]), _out(w, k[1], s[1], p[1], d[1])
    col = np.zeros((c, k[0], k[1], n, ho, wo), x.dtype)
    for ci in range(c):
        for i in range(k[0]):
            for j in range(k[1]):
                for ni in range(n):
                    for oh in range(ho):
                        for ow in range(wo):
                            hh, ww = oh * s[0] - p[0] + i * d[0], ow * s[1] - p[1] + j * d[1]
                            if 0 <= hh < h and 0 <= ww < w:
                                col[ci, i, j, ni, oh, ow] = x[ni, ci, hh, ww]
    return col


def naive_col2im(col, shape, s, p, d):
    # col (C, kh, kw, N, Ho, Wo) -> gx (N, C, H, W), the adjoint of naive_im2col
    c, kh, kw, n, ho, wo = col.shape
    h, w = shape[2:]
    gx = np.zeros(shape, col.dtype)
    for ci in range(c):
        for i in range(kh):
            for j in range(kw):
                for ni in range(n):
                    for oh in range(ho):
                        for ow in range(wo):
                            hh, ww = oh * s[0] - p[0] + i * d[0], ow * s[1] - p[1] + j * d[1]
                            if 0 <= hh < h and 0 <= ww < w:
                                gx[ni, ci, hh, ww] += col[ci, i, j, ni, oh, ow]
    return gx


@pytest.mark.parametrize("geom", GEOMETRY, ids=[str(i) for i in range(len(GEOMETRY))])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_im2col_col2im_match_naive(rng, geom, dtype):
    shape, k, s, p, d = geom
    x = rng.standard_normal(shape).astype(dtype)
    ref = naive_im2col(x, k, s, p, d)
    col = np.full(ref.shape, np.nan, dtype)  # every element must be written
    kernels_cpu.im2col(x, *k, *s, *p, *d, col)
    np.testing.assert_array_equal(col, ref)

    g = rng.standard_normal(ref.shape).astype(dtype)
    want = naive_col2im(g, shape, s, p, d)
    gx = np.full(shape, np.nan, dtype)
    kernels_cpu.col2im(g.copy(), *k, *s, *p, *d, gx)
    np.testing.assert_allclose(gx, want, rtol=1e-6 if dtype == np.float32 else 1e-12,
                               atol=1e-5 if dtype == np.float32 else 1e-12)


@pytest.mark.parametrize("geom", GEOMETRY, ids=[str(i) for i in range(len(GEOMETRY))])
def test_gpu_kernel_twins_match_naive(rng, geom):
    # the NumPy twins of the GPU im2col/col2im kernels (what the CuPy stand-in runs) against
    # the naive loops
    shape, k, s, p, d = geom
    x = rng.standard_normal(shape)
    ref = naive_im2col(x, k, s, p, d)
    ho, wo = ref.shape[4:]
    col = np.empty_like(ref)
    geo = (*shape, *k, *s, *p, *d, ho, wo)
    gpu_kernels.im2col((1,), (1,), x, col, *geo)
    np.testing.assert_array_equal(col, ref)
    gx = np.full(shape, np.nan)
    gpu_kernels.col2im((1,), (1,), ref, gx, *geo)
    np.testing.assert_allclose(gx, naive_col2im(ref, shape, s, p, d), atol=1e-12)


def test_layout_copies_match_numpy(rng):
    y, b = rng.standard_normal((5, 3, 7)), rng.standard_normal(5)
    out = np.empty((3, 5, 7))
    kernels_cpu.rows_to_nchw(y, b, out)
    np.testing.assert_array_equal(out, y.transpose(1, 0, 2) + b[:, None])
    rows = np.empty((5, 3, 7))
    kernels_cpu.nchw_to_rows(out, rows)
    np.testing.assert_array_equal(rows, out.transpose(1, 0, 2))


# (x shape, w shape, stride, padding, dilation, groups): the paths the reference CNNs take
# (3x3 "same"), plus groups 2, depthwise, 1x1 and batch 1 through the whole conv
CONV_CASES = [
    ((2, 3, 6, 5), (4, 3, 3, 3), 1, 1, 1, 1),
    ((1, 4, 5, 6), (6, 2, 3, 1), 1, (1, 0), 1, 2),
    ((2, 3, 5, 5), (3, 1, 3, 3), 1, 1, 1, 3),
    ((1, 2, 7, 6), (3, 2, 3, 3), 2, 2, 2, 1),
    ((2, 3, 4, 5), (2, 3, 1, 1), 1, 0, 1, 1),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=[str(i) for i in range(len(CONV_CASES))])
def test_conv2d_gradients_through_kernels(rng, case):
    xs, ws, s, p, d, g = case
    x, w, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0])
    gradcheck(lambda x, w, b: F.conv2d(x, w, b, s, p, d, g), [x, w, b])


@pytest.fixture
def small_arrays_use_kernels(monkeypatch):
    monkeypatch.setattr(F, "_CPU_KERNEL_MIN_SIZE", 0)


@pytest.mark.parametrize("shape", [(4, 3, 5, 2), (1, 2, 3, 3), (3, 5, 7)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batchnorm_kernels_match_numpy(rng, monkeypatch, shape, dtype):
    x = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
    g, b = rng.standard_normal(shape[1]).astype(dtype), rng.standard_normal(shape[1]).astype(dtype)
    gy = rng.standard_normal(shape).astype(dtype)
    results = []
    for min_size in (1 << 62, 0):  # NumPy path, then the Numba kernels
        monkeypatch.setattr(F, "_CPU_KERNEL_MIN_SIZE", min_size)
        rm, rv = np.zeros(shape[1], dtype), np.ones(shape[1], dtype)
        xt, gt, bt = (Tensor(a.copy(), requires_grad=True) for a in (x, g, b))
        y = F.batchnorm(xt, gt, bt, rm, rv, training=True, momentum=0.1, eps=1e-5)
        y.backward(gy)
        results.append([y.data, rm, rv, xt.grad, gt.grad, bt.grad])
    tol = 1e-4 if dtype == np.float32 else 1e-10
    for got, want in zip(results[1], results[0]):
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.usefixtures("small_arrays_use_kernels")
@pytest.mark.parametrize("shape", [(5, 3, 4), (2, 3, 4, 5), (1, 2, 3, 3)])
def test_batchnorm_kernel_gradients(rng, shape):
    c = shape[1]
    rm, rv = np.zeros(c), np.ones(c)
    gradcheck(lambda x, g, b: F.batchnorm(x, g, b, rm, rv, training=True),
              [rng.standard_normal(shape), rng.standard_normal(c), rng.standard_normal(c)])


@pytest.mark.usefixtures("small_arrays_use_kernels")
def test_relu_backward_kernel(rng):
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    x[0, 0, :2] = 0.0  # the gradient at 0 is 0, as in PyTorch
    xt = Tensor(x, requires_grad=True)
    gy = rng.standard_normal(x.shape).astype(np.float32)
    F.relu(xt).backward(gy)
    np.testing.assert_array_equal(xt.grad, gy * (x > 0))
    gradcheck(lambda a: F.relu(a), [rng.standard_normal((4, 5)) + 0.05])
