"""Shared test setup: gpu-marked tests run on real CuPy where a CUDA device is visible and
under the strict CuPy stand-in (tests/gpu_sim) everywhere else, so every GPU branch runs in CI.
POCKET_GPU_SIM=1 forces the stand-in even on a GPU machine; POCKET_GPU_SIM=0 forbids it (gpu
tests then skip without CUDA). Tests marked `cuda` need real CUDA numerics or timing and skip
under the stand-in."""

import functools
import os
from pathlib import Path

import pytest


@functools.cache
def cuda_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - any failure to reach CUDA means "no GPU here"
        return False


def gpu_sim_selected() -> bool:
    mode = os.environ.get("POCKET_GPU_SIM", "")
    if mode == "1":
        return True
    if mode == "0":
        return False
    return not cuda_available()


def pytest_collection_modifyitems(config, items):
    sim = gpu_sim_selected()
    for item in items:
        if item.get_closest_marker("cuda") is not None and (sim or not cuda_available()):
            item.add_marker(pytest.mark.skip(reason="needs real CUDA numerics (a GPU)"))
        elif item.get_closest_marker("gpu") is not None and not sim and not cuda_available():
            item.add_marker(pytest.mark.skip(reason="needs CuPy and a CUDA GPU "
                                             "(POCKET_GPU_SIM=0 forbids the stand-in)"))


@pytest.fixture(autouse=True)
def _gpu_backend(request, monkeypatch):
    """A gpu-marked test sees the stand-in as CuPy unless real CUDA is in use."""
    if request.node.get_closest_marker("gpu") is not None and gpu_sim_selected():
        from tests import gpu_sim

        gpu_sim.install(monkeypatch)
    yield


# --------------------------------------------------------------------------- a trained model
# One real digits checkpoint for the whole run, shared by the export, compare and e2e tests.
# Under pytest-xdist every worker asks for it; a file lock makes the first one train it and
# the others wait and reuse it.

# The main job's own config (examples/digits_cnn.toml) with fewer epochs: the same
# architecture, so the checks on it (int8 file size, accuracy kept) are the real ones.
DIGITS_TEST_EPOCHS = 6


@pytest.fixture(scope="session")
def digits_ckpt(tmp_path_factory) -> str:
    import fcntl
    import os

    pytest.importorskip("sklearn")
    root = tmp_path_factory.getbasetemp()
    shared = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root
    folder = shared / "digits_ckpt"
    folder.mkdir(exist_ok=True)
    ckpt = folder / "run" / "best.ckpt"
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "done").exists():
            from pocket.train.run import train_from_config

            config = Path(__file__).parent.parent / "examples" / "digits_cnn.toml"
            # force: a run that a killed worker left unfinished (no "done") is redone.
            train_from_config(str(config), {"out": str(folder / "run"), "force": True,
                                            "epochs": DIGITS_TEST_EPOCHS}, quiet=True)
            (folder / "done").write_text("ok")
    return str(ckpt)


@pytest.fixture(scope="session")
def digits_test_data():
    """The digits test split, preprocessed as the digits checkpoint was trained."""
    pytest.importorskip("sklearn")
    from pocket.train.data import load_dataset

    ds = load_dataset("digits", seed=0)
    return ds.test.x, ds.test.y
