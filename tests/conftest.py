"""Shared test setup: GPU tests skip cleanly where CuPy or a CUDA device is missing."""

import functools
from pathlib import Path

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
