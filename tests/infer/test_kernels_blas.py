"""kernels_blas: GEMMs split across Numba's threads through the loaded OpenBLAS's cblas_sgemm,
against a float64 product, over the layouts the engine's BLAS calls take (weights by rows or
transposed, batches of images, a shared matrix broadcast), split by columns, rows or images."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pocket.infer import blas_libs as bl
from pocket.infer import kernels_blas as kb


@pytest.fixture(scope="module")
def sgemm():
    f = bl.find_sgemm()
    if f is None:
        pytest.skip("NumPy's BLAS here is not an OpenBLAS with cblas_sgemm")
    return f


def _operands(rng, m, k, n, batch, ta, tb, shared_a):
    a = rng.standard_normal((k, m) if ta else (m, k), dtype=np.float32)
    a = a.T if ta else a
    if not shared_a:
        a = np.stack([a * (i + 1) for i in range(batch)])
    b = rng.standard_normal((batch, n, k) if tb else (batch, k, n), dtype=np.float32)
    return a, (b.transpose(0, 2, 1) if tb else b)


@pytest.mark.parametrize("threads", [2, 3])
def test_gemm_parts_matches_a_float64_product(sgemm, threads):
    """Every layout and split through the serial twin (a solo call's, or a small call's: the
    parts one after another); the parallel twin on the row-major layouts, the same bytes.

    NOTE: the parallel twin on the transposed layouts too compiled six more signatures (~10 s
    each on CI's cores); the kernel reads only the operands' addresses, so the layouts change
    plan's geometry (checked through the serial twin), not the parallel loop."""
    rng = np.random.default_rng(0)
    seen, seen_parallel = set(), set()
    for m, k, n, batch, ta, tb, shared_a in itertools.product(
            [1, 5, 40, 129], [1, 7, 33], [3, 130, 300], [1, 2, 4], [0, 1], [0, 1], [True, False]):
        a, b = _operands(rng, m, k, n, batch, ta, tb, shared_a)
        out = np.full((batch, m, n), np.nan, np.float32)
        geo = kb.plan(a, b, out, threads)
        if geo is None:
            assert m == 1 or (batch < threads and n < kb.MIN_COLS * threads
                              and m < kb.MIN_ROWS * threads)
            continue
        seen.add((geo[-2], geo[-1]))
        want = np.matmul(a.astype(np.float64), b.astype(np.float64))
        kb.gemm_parts.serial(sgemm, a, b, out, geo, out.reshape(batch, m, n), *kb.NO_EPILOGUE)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * np.sqrt(k))
        if ta or tb:
            continue
        seen_parallel.add((geo[-2], geo[-1]))
        again = np.full_like(out, np.nan)
        kb.gemm_parts(sgemm, a, b, again, geo, again.reshape(batch, m, n), *kb.NO_EPILOGUE)
        np.testing.assert_array_equal(again, out)
    assert seen == seen_parallel == {(1, 1), (1, threads), (0, threads)}  # images, columns, rows


def test_plan_declines_what_cblas_cannot_read():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((64, 32), dtype=np.float32)
    b = rng.standard_normal((32, 512), dtype=np.float32)
    out = np.empty((64, 512), np.float32)
    assert kb.plan(a, b, out, 2) is not None
    assert kb.plan(a[:, ::2], b[::2], out, 2) is None  # no unit stride along either axis
    assert kb.plan(a.astype(np.float64), b, out, 2) is None
    assert kb.plan(a, b, np.empty((512, 64), np.float32).T, 2) is None  # output not by rows
    assert kb.plan(a[:4, :], b[:, :8], np.empty((4, 8), np.float32), 2) is None  # too small
    assert kb.plan(a[:1], b, out[:1], 2) is None  # a vector times a matrix: BLAS's gemv
    four = np.empty((2, 2, 64, 512), np.float32)
    assert kb.plan(a, np.broadcast_to(b, (2, 2, 32, 512)), four, 2) is None  # two batch axes


def test_find_sgemm_answers(sgemm):
    assert bl._works("sgemm", sgemm) and bl.find_sgemm() is sgemm  # found once, then cached
    sgemv = bl.find_sgemv()
    assert sgemv is not None and bl._works("sgemv", sgemv)


@pytest.mark.parametrize("threads", [2, 4])
def test_gemv_parts_matches_a_float64_product(sgemm, threads):
    """A batch-1 linear (1, K) @ (K, N), the weights by rows or transposed (linear_blas's
    w.T view), split by outputs; the serial twin gives the same bytes."""
    from functools import partial

    sgemv = bl.find_sgemv()
    rng = np.random.default_rng(4)
    for k, n, tb in itertools.product([1, 7, 1280], [256, 1000, 1003], [0, 1]):
        w = rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32)
        b = w.T if tb else w
        a = rng.standard_normal((1, k), dtype=np.float32)
        out = np.full((1, n), np.nan, np.float32)
        geo = kb.plan_gemv(a, b, out, threads)
        if n < kb.MIN_GEMV_COLS * threads:
            assert geo is None
            continue
        call, took = kb.split_call(sgemm, partial(np.matmul, a, b, out=out), threads)
        assert call.func is kb.gemv_parts and not took
        call()
        want = a.astype(np.float64) @ b.astype(np.float64)
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * np.sqrt(k))
        again = np.full_like(out, np.nan)
        kb.gemv_parts.serial(sgemv, a, b, again, geo)
        np.testing.assert_array_equal(again, out)
    assert kb.plan_gemv(np.ones((2, 8), np.float32), np.ones((8, 512), np.float32),
                        np.ones((2, 512), np.float32), 2) is None  # two rows: a GEMM


@pytest.mark.parametrize("act", ["none", "relu", "clip", "silu"])
@pytest.mark.parametrize("shape", [(1, 96, 16, 1024), (1, 1280, 160, 16), (3, 40, 24, 300)])
def test_the_epilogue_is_the_bias_act_pass(sgemm, act, shape):
    """A 1x1 conv's matmul + bias_act bound as one split call: the same bytes as the split GEMM
    followed by the bias_act kernel, and within float32 rounding of a float64 reference."""
    from functools import partial

    from pocket.infer import kernels_fp32 as kf

    batch, o, k, p = shape
    rng = np.random.default_rng(2)
    w = rng.standard_normal((o, k), dtype=np.float32)
    x = rng.standard_normal((batch, k, p), dtype=np.float32)
    bias = rng.standard_normal(o, dtype=np.float32)
    code, alpha = kf.ACT[act], (6.0 if act == "clip" else 0.0)
    y = np.empty((batch, o, p), np.float32)
    matmul = partial(np.matmul, w, x, out=y)
    bias_act = partial(kf.bias_act, y, y.reshape(batch * o, p), o, 0, bias, code, alpha)
    call, took = kb.split_call(sgemm, matmul, 2, bias_act)
    assert took
    call()
    fused = y.copy()
    plain, _ = kb.split_call(sgemm, matmul, 2, None)
    plain()
    bias_act()
    np.testing.assert_array_equal(fused, y)
    z = np.matmul(w.astype(np.float64), x.astype(np.float64)) + bias[:, None]
    want = {"none": z, "relu": np.maximum(z, 0), "clip": np.clip(z, 0, 6),
            "silu": z / (1 + np.exp(-z))}[act]
    np.testing.assert_allclose(fused, want, rtol=1e-4, atol=1e-4 * np.sqrt(k))
    # another layout of the pass (a wide GEMM's (O, N*P)) stays a call of its own
    other = partial(kf.bias_act, y, y.reshape(batch * o, p), 0, p, bias, code, alpha)
    assert kb.split_call(sgemm, matmul, 2, other)[1] is False
