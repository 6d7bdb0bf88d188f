"""Shared test setup: GPU tests skip cleanly where CuPy or a CUDA device is missing."""

import functools

import pytest


@functools.cache
def cuda_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - any failure to reach CUDA means "no GPU here"
        return False


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs CuPy and a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not cuda_available():
            item.add_marker(skip)
