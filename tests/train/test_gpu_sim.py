"""The CuPy stand-in refuses what CuPy refuses and counts what it should (else the gpu-marked
suite that runs under it in CI would prove nothing)."""

import numpy as np
import pytest

from tests.gpu_sim import fake_cupy


@pytest.fixture
def cp():
    fake_cupy.reset()
    yield fake_cupy.module()
    fake_cupy.reset()


def test_mixing_host_and_device_arrays_is_refused(cp):
    d, h = cp.ones(3), np.ones(3)
    for bad in (lambda: d + h, lambda: h + d, lambda: cp.add(d, h), lambda: np.add(d, h),
                lambda: cp.where(d > 0, h, d), lambda: cp.concatenate([d, h])):
        with pytest.raises(TypeError):
            bad()
    assert float((d + 1.5).sum()) == 7.5  # Python and NumPy scalars are fine
    assert float((d * np.float32(2)).sum()) == 6.0


def test_writing_a_host_array_into_a_device_array_is_refused(cp):
    d = cp.zeros((2, 3))
    with pytest.raises(TypeError, match="host"):
        d[...] = np.ones((2, 3))
    d[...] = cp.ones((2, 3))
    d[0] = 2.0
    assert d.get().tolist() == [[2.0] * 3, [1.0] * 3]


def test_implicit_conversion_and_numpy_functions_are_refused(cp):
    d = cp.arange(4.0)
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(d)
    with pytest.raises(TypeError):
        np.testing.assert_allclose(d, np.arange(4.0))
    with pytest.raises(TypeError, match="NumPy function"):
        np.concatenate([d, d])
    with pytest.raises(TypeError, match="NumPy function"):
        np.sum(d)
    assert isinstance(cp.asnumpy(d), np.ndarray)
    assert not isinstance(d, np.ndarray)


def test_host_syncs_are_counted(cp):
    d = cp.arange(6.0).reshape(2, 3)
    with fake_cupy.counting() as c:
        s = d.sum()
        e = d * 2 + 1
    assert c.syncs == 0 and c.launches == 3 and c.allocs == 3
    with fake_cupy.counting() as c:
        float(s), bool(s > 0), int(d[0, 1]), d.get(), e.item(0), d.tolist()
    assert c.syncs == 6


def test_views_are_not_allocations_and_the_pool_counts_live_bytes(cp):
    pool = cp.get_default_memory_pool()
    base = pool.used_bytes()
    d = cp.zeros((4, 8), np.float32)
    assert pool.used_bytes() == base + 512  # rounded to the pool block
    with fake_cupy.counting() as c:
        v = d.reshape(8, 4).T[1:]
    assert c.allocs == 0 and v.shape == (3, 8)
    del d, v
    assert pool.used_bytes() == base
    pool.set_limit(size=base + 64)
    with pytest.raises(cp.cuda.memory.OutOfMemoryError):
        cp.empty(100, np.float32)
    pool.set_limit(size=0)


def test_arrays_of_another_device_are_refused(cp):
    with cp.cuda.Device(1):
        d1 = cp.ones(3)
        assert d1.device.id == 1
    with pytest.raises(ValueError, match="different from the current device"):
        d1 + 1
    with cp.cuda.Device(1):
        assert float((d1 + 1).sum()) == 6.0
    moved = cp.asarray(d1)  # a copy onto the current device
    assert moved.device.id == 0


def test_custom_kernels_run_their_twins_and_check_arguments(cp):
    from pocket.train import gpu_kernels

    mod = cp.RawModule(code=gpu_kernels.SOURCE, options=gpu_kernels.OPTIONS,
                       name_expressions=gpu_kernels.INSTANCES)
    fn = mod.get_function("relu_backward<float>")
    gy = cp.asarray(np.array([1.0, 2.0, 3.0], np.float32))
    y = cp.asarray(np.array([0.0, 1.0, -1.0], np.float32))
    gx = cp.empty(3, np.float32)
    with fake_cupy.counting() as c:
        fn((1,), (256,), (gy, y, gx, np.int64(3)))
    assert c.launches == 1 and gx.get().tolist() == [0.0, 2.0, 0.0]
    with pytest.raises(ValueError, match="C-contiguous"):
        fn((1,), (256,), (cp.ones((3, 2), np.float32).T[0], y, gx, np.int64(3)))
    with pytest.raises(TypeError, match="host"):
        fn((1,), (256,), (np.ones(3, np.float32), y, gx, np.int64(3)))
    with pytest.raises(RuntimeError, match="name_expressions"):
        mod.get_function("relu_backward<int>")
    with pytest.raises(RuntimeError, match="no NumPy twin"):
        cp.RawKernel("extern \"C\" __global__ void nope() {}", "nope")


def test_elementwise_kernel_types_are_checked(cp):
    from pocket.train import backend

    backend.KERNEL_TWINS["sim_axpy"] = lambda a, x, y, out: np.add(a * x, y, out=out)
    try:
        k = cp.ElementwiseKernel("T a, T x, T y", "T out", "out = a * x + y", "sim_axpy")
        x32 = cp.ones(3, np.float32)
        out = k(2.0, x32, x32)
        assert out.dtype == np.float32 and out.get().tolist() == [3.0] * 3
        with pytest.raises(TypeError, match="both"):
            k(2.0, x32, cp.ones(3, np.float64))
    finally:
        del backend.KERNEL_TWINS["sim_axpy"]
