"""The strict CuPy stand-in (see fake_cupy.py) and how the test suite selects it.

gpu-marked tests run on real CuPy where a CUDA device is visible, and under the stand-in
everywhere else (CI); POCKET_GPU_SIM=1 forces the stand-in, POCKET_GPU_SIM=0 forbids it (then
gpu tests without CUDA skip). Tests marked `cuda` need real CUDA numerics or timing and skip
under the stand-in. The stand-in never ships: it lives in the test suite only.
"""

from __future__ import annotations

import contextlib

from tests.gpu_sim import fake_cupy


def install(monkeypatch) -> object:
    """Make pocket.train.backend see the stand-in as its CuPy for this test."""
    from pocket.train import backend

    fake_cupy.reset()
    monkeypatch.setattr(backend, "_cupy_cache", [fake_cupy.module(), ""])
    monkeypatch.setattr(backend, "_kernels", {}, raising=False)
    monkeypatch.setattr(backend, "_gpu_state", {}, raising=False)
    return fake_cupy.module()


def is_sim(xp) -> bool:
    return getattr(xp, "is_gpu_sim", False)


counting = fake_cupy.counting
COUNTERS = fake_cupy.COUNTERS


@contextlib.contextmanager
def no_syncs_allowed():
    """Fail the block if it makes any host sync."""
    with counting() as c:
        yield c
    assert c.syncs == 0, f"{c.syncs} host syncs"
