import sys
from pathlib import Path

# the helpers in models.py are imported by plain name from the tests of this folder
sys.path.insert(0, str(Path(__file__).parent))

import pytest  # noqa: E402

from pocket.infer import kernels_vnni  # noqa: E402


@pytest.fixture(params=["vnni", "portable"])
def int8_route(request, monkeypatch):
    """Run an int8 test through both int8 GEMM routes: the AVX-512 VNNI kernels (skipped on a
    CPU without them) and the portable ones every other CPU uses."""
    if request.param == "vnni" and not kernels_vnni.AVAILABLE:
        pytest.skip("this CPU has no AVX-512 VNNI")
    monkeypatch.setattr(kernels_vnni, "AVAILABLE", request.param == "vnni")
    return request.param


@pytest.fixture(params=["fma", "tile", "blas"])
def fp32_route(request, monkeypatch):
    """Run an fp32 conv test through each family of GEMM routes: our AVX-512 FMA kernels
    (skipped on a CPU without them), the portable path every other CPU takes (kernels_tile's
    GEMM where it applies, BLAS elsewhere), and that path with NumPy's BLAS alone
    (POCKET_FP32_TILE=0)."""
    from pocket.infer import kernels_fma, kernels_tile

    if request.param == "fma" and not kernels_fma.AVAILABLE:
        pytest.skip("this CPU has no AVX-512")
    monkeypatch.setattr(kernels_fma, "AVAILABLE", request.param == "fma")
    monkeypatch.setattr(kernels_tile, "AVAILABLE", kernels_tile.AVAILABLE and request.param == "tile")
    return request.param
