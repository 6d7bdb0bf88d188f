import numpy as np
import pytest

from pocket.train import backend


def _cupy_or_skip():
    if not backend.cupy_available():
        pytest.skip("needs CuPy and a CUDA GPU")
    return backend.get_device("cuda").xp


@pytest.fixture(params=[pytest.param("numpy"), pytest.param("cupy", marks=pytest.mark.gpu)])
def xp(request):
    """The array module under test: NumPy always, CuPy when a GPU is there."""
    return np if request.param == "numpy" else _cupy_or_skip()


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
