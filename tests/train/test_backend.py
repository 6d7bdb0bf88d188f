import subprocess
import sys

import numpy as np
import pytest

from pocket.errors import PocketError
from pocket.train import backend


def test_cpu_and_transfers():
    d = backend.get_device("cpu")
    assert str(d) == "cpu" and d.xp is np
    a = np.arange(3.0)
    assert backend.to_numpy(backend.to_device(a, d)) is not None
    assert backend.get_array_module(a) is np


def test_auto_falls_back_with_a_reason(monkeypatch):
    monkeypatch.setattr(backend, "_cupy_cache", [None, "CuPy is not installed"])
    monkeypatch.delenv("POCKET_DEVICE", raising=False)
    d = backend.get_device("auto")
    assert d.kind == "cpu" and "CuPy is not installed" in d.reason


def test_cuda_without_gpu_says_what_to_do(monkeypatch):
    monkeypatch.setattr(backend, "_cupy_cache", [None, "CuPy is not installed"])
    with pytest.raises(PocketError, match="--device cpu"):
        backend.get_device("cuda")
    with pytest.raises(PocketError, match="bad device"):
        backend.get_device("tpu")


def test_env_overrides_auto(monkeypatch):
    monkeypatch.setenv("POCKET_DEVICE", "cpu")
    assert backend.get_device("auto").kind == "cpu"
    assert backend.get_device(None).reason == ""


def test_importing_train_never_imports_cupy():
    code = "import sys, pocket.train; print('cupy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.gpu
def test_cuda_device_when_present():
    if not backend.cupy_available():
        pytest.skip("needs CuPy and a CUDA GPU")
    d = backend.get_device("cuda")
    x = backend.to_device(np.ones(3), d)
    assert backend.get_array_module(x) is d.xp
    np.testing.assert_array_equal(backend.to_numpy(x), np.ones(3))
