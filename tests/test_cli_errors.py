"""Bad input to `pocket train`: exit 3 and one `Error:` line that says what to fix, never a
traceback; POCKET_DEBUG=1 brings the traceback back."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]

GOOD_CSV = "a,b,y\n1,2,0\n4,5,1\n7,8,0\n2,3,1\n5,6,0\n8,9,1\n3,1,0\n6,4,1\n9,7,0\n1,5,1\n"


def _files(folder: Path) -> None:
    (folder / "good.csv").write_text(GOOD_CSV)
    (folder / "text_cell.csv").write_text(GOOD_CSV.replace("4,5,1", "4,five,1"))
    (folder / "nan.csv").write_text(GOOD_CSV.replace("4,5,1", "4,nan,1"))
    x = np.ones((20, 3), np.float32)
    np.savez(folder / "good.npz", x=x, y=np.arange(20) % 2)
    data = (folder / "good.npz").read_bytes()
    (folder / "truncated.npz").write_bytes(data[:len(data) // 2])
    x[3, 1] = np.nan
    np.savez(folder / "nan.npz", x=x, y=np.arange(20) % 2)
    (folder / "ok.toml").write_text(
        '[run]\ndevice = "cpu"\n[data]\ntarget = "y"\n[model]\nname = "mlp"\nhidden = [4]\n'
        '[train]\nepochs = 1\nbatch_size = 2\n')
    (folder / "typo.toml").write_text('[train]\nepocs = 2\n')
    (folder / "model.toml").write_text('[run]\ndevice = "cpu"\n[data]\nsource = "csv:good.csv"\n'
                                       'target = "y"\n[model]\nname = "resnt"\n')
    (folder / "malformed.toml").write_text('[train\nepochs = 2\n')
    (folder / "wrong_type.toml").write_text('[train]\nepochs = "ten"\n')


def _pocket(args: list[str], cwd: Path, debug: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("POCKET_DEBUG", None)
    env.pop("POCKET_DEVICE", None)
    if debug:
        env["POCKET_DEBUG"] = "1"
    return subprocess.run([sys.executable, "-m", "pocket.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


# (args after `pocket train`, words the one Error: line must hold)
CASES = {
    "missing data file": (["ok.toml", "--data", "csv:/no/such.csv"],
                          ["/no/such.csv", "not found"]),
    "csv text cell": (["ok.toml", "--data", "csv:text_cell.csv"],
                      ["text_cell.csv", "'b'", "not numeric", "'five'", "line 3"]),
    "truncated npz": (["ok.toml", "--data", "npz:truncated.npz"], ["truncated.npz", "NPZ"]),
    "unknown config key": (["typo.toml"], ["epocs", "[train]", "did you mean 'epochs'"]),
    "wrong type": (["wrong_type.toml"], ["epochs", "int", "'ten'"]),
    "csv NaN": (["ok.toml", "--data", "csv:nan.csv"], ["nan.csv", "NaN", "line 3", "'b'"]),
    "npz NaN": (["ok.toml", "--data", "npz:nan.npz"], ["nan.npz", "NaN", "(3, 1)"]),
    "unknown model": (["model.toml"], ["'resnt'", "did you mean 'resnet'"]),
    "bad budget": (["ok.toml", "--memory-budget", "4 lightyears"],
                   ["'4 lightyears'", "4GiB"]),
    "cuda without gpu": (["ok.toml", "--device", "cuda"], ["CUDA", "--device cpu"]),
    "missing config": (["nope.toml"], ["nope.toml", "not found"]),
    "malformed toml": (["malformed.toml"], ["malformed.toml", "not valid TOML", "line 1"]),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli_errors")
    _files(d)
    return d


def _cuda_present() -> bool:
    from pocket.train import backend

    return backend.cupy_available()


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_error_line_and_exit_3(folder, case):
    args, words = CASES[case]
    if case == "cuda without gpu" and _cuda_present():
        pytest.skip("this machine has a GPU")
    r = _pocket(["train", *args, "--out", str(folder / "run")], folder)
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("Error: ")
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert r.stdout == ""


def test_csv_without_target_column_lists_the_columns(folder):
    (folder / "no_target.toml").write_text(
        (folder / "ok.toml").read_text().replace('target = "y"', 'target = "label"'))
    r = _pocket(["train", "no_target.toml", "--data", "csv:good.csv"], folder)
    assert r.returncode == 3, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("Error: ") and "'label'" in line
    assert "a, b, y" in line


def test_debug_shows_the_traceback(folder):
    r = _pocket(["train", "typo.toml"], folder, debug=True)
    assert r.returncode != 0
    assert "Traceback (most recent call last)" in r.stderr
    assert "ConfigError" in r.stderr and "epocs" in r.stderr


# --------------------------------------------------------------------------- the device commands
# Bad input to infer / export / inspect / compare: the same rule (exit 3, one Error: line,
# nothing on stdout), each file written here as a hostile user would hand it over.

def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose IHDR announces width x height pixels (Pillow checks its pixel limit on open,
    before decoding any data)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (len(data).to_bytes(4, "big") + kind + data
                + zlib.crc32(kind + data).to_bytes(4, "big"))

    ihdr = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 0, 0, 0, 0])
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) \
        + chunk(b"IEND", b"")


def _device_files(d: Path) -> None:
    from pocket.formats.container import write_container
    from pocket.formats.ir import Graph, Node, ValueInfo

    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((3, 64)).astype(np.float32), np.zeros(3, np.float32)
    g = Graph({"x": ValueInfo("f32", ("N", 1, 8, 8))}, ["y"],
              [Node("flat", "flatten", ["x"], ["f"], {}), Node("fc", "linear", ["f", "w", "b"], ["y"], {})],
              {"w": ValueInfo("f32", (3, 64)), "b": ValueInfo("f32", (3,))},
              {"task": "classification", "labels": ["a", "b", "c"],
               "preprocessing": {"image_size": [8, 8], "pixel_max": 16.0, "scale": 1 / 16}})
    write_container(d / "model.bin", kind="model", tensors={"w": w, "b": b}, graph=g)
    t = Graph({"x": ValueInfo("f32", ("N", 2))}, ["y"], [Node("fc", "linear", ["x", "w", "b"], ["y"], {})],
              {"w": ValueInfo("f32", (1, 2)), "b": ValueInfo("f32", (1,))},
              {"task": "regression", "preprocessing": {"columns": ["a", "b"]}})
    write_container(d / "table.bin", kind="model", tensors={"w": w[:1, :2].copy(), "b": b[:1].copy()},
                    graph=t)
    (d / "empty.npy").write_bytes(b"")
    np.save(d / "no_rows.npy", np.zeros((0, 1, 8, 8), np.float32))
    with open(d / "huge.npy", "wb") as f:  # a header claiming 10^12 samples, then 64 bytes
        np.lib.format.write_array_header_1_0(
            f, {"descr": "<f4", "fortran_order": False, "shape": (10**12, 1, 8, 8)})
        f.write(b"\0" * 64)
    np.savez(d / "objects.npz", x=np.array([{"a": 1}, None], dtype=object))
    with zipfile.ZipFile(d / "pickle.npz", "w") as z:  # a raw pickle (protocol 4 of the int 1)
        z.writestr("x.npy", b"\x80\x04K\x01.")
    np.savez(d / "good.npz", x=np.zeros((2, 1, 8, 8), np.float32))
    data = (d / "good.npz").read_bytes()
    (d / "corrupt.npz").write_bytes(data[: len(data) // 2])
    (d / "bomb.png").write_bytes(_png_header_only(20000, 20000))
    (d / "warn_bomb.png").write_bytes(_png_header_only(10000, 10000))
    np.savez(d / "strings.npz", x=np.array(["one", "two"]))
    (d / "notzip.npz").write_text("x = 1, 2, 3\n")
    os.mkfifo(d / "fifo.npy")
    os.mkfifo(d / "fifo.bin")


@pytest.fixture(scope="module")
def device(tmp_path_factory):
    d = tmp_path_factory.mktemp("device_errors")
    _files(d)
    _device_files(d)
    return d


@pytest.fixture(scope="module")
def tiny_ckpt(device):
    """A 1-epoch MLP checkpoint on a 10-row CSV, trained with no test split."""
    from pocket.train.run import train_from_config

    cfg = device / "no_test.toml"
    cfg.write_text((device / "ok.toml").read_text().replace(
        '[data]\n', f'[data]\nsource = "csv:{device / "good.csv"}"\ntest_fraction = 0\n'))
    r = train_from_config(str(cfg), {"out": str(device / "tiny_run")}, quiet=True)
    return r["best_checkpoint"]


@pytest.fixture(scope="module")
def onnx_file(device):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    path = device / "model.onnx"
    onnx.save(model, str(path))
    return path


DEVICE_CASES = {
    "empty npy": (["infer", "model.bin", "empty.npy"], ["empty.npy", "empty"]),
    "npy without rows": (["infer", "model.bin", "no_rows.npy"], ["no_rows.npy", "no samples"]),
    "npy header 10^12 rows": (["infer", "model.bin", "huge.npy"],
                              ["huge.npy", "1000000000000", "truncated"]),
    "npz object member": (["infer", "model.bin", "objects.npz"], ["objects.npz", "Python objects"]),
    "npz raw pickle member": (["infer", "model.bin", "pickle.npz"], ["pickle.npz", "not a NumPy"]),
    "corrupt npz": (["infer", "model.bin", "corrupt.npz"], ["corrupt.npz", ".npz"]),
    "image over the pixel limit": (["infer", "model.bin", "bomb.png"], ["bomb.png", "pixel limit"]),
    "image over the warning limit": (["infer", "model.bin", "warn_bomb.png"],
                                     ["warn_bomb.png", "pixel limit"]),
    "fifo input": (["infer", "model.bin", "fifo.npy"], ["fifo.npy", "not a regular file"]),
    "fifo model": (["infer", "fifo.bin", "good.npz"], ["fifo.bin", "not a regular file"]),
    "csv field over 131072 characters": (["infer", "table.bin", "long_field.csv"],
                                         ["long_field.csv", "131072"]),
}


@pytest.mark.parametrize("case", list(DEVICE_CASES))
def test_device_bad_input_is_one_error_line_and_exit_3(device, case):
    args, words = DEVICE_CASES[case]
    if case.startswith("csv field"):
        (device / "long_field.csv").write_text('a,b\n1,"' + "9" * 140000 + '"\n')
    _assert_clean_error(_pocket(args, device), words)


def _assert_clean_error(r: subprocess.CompletedProcess, words: list[str]) -> None:
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("Error: ")
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert r.stdout == ""


def test_training_csv_field_over_the_limit(device):
    (device / "long_train.csv").write_text(GOOD_CSV + '1,"' + "9" * 140000 + '",0\n')
    r = _pocket(["train", "ok.toml", "--data", "csv:long_train.csv", "--out", str(device / "r")], device)
    _assert_clean_error(r, ["long_train.csv", "131072"])


@pytest.mark.parametrize("calib,words", [("strings.npz", ["strings.npz", "<U3"]),
                                         ("notzip.npz", ["notzip.npz", "not an .npz"])])
def test_export_bad_calibration_file(device, tiny_ckpt, calib, words):
    r = _pocket(["export", tiny_ckpt, "--int8", "--calib", calib, "-o", "m.bin"], device)
    _assert_clean_error(r, words)


def test_compare_without_a_test_split_says_what_to_pass(device, tiny_ckpt):
    r = _pocket(["compare", tiny_ckpt, "--bin", "model.bin"], device)
    _assert_clean_error(r, ["test_fraction = 0", "--inputs", "--random", "--data"])


# infer, inspect, compare MODEL.onnx and doctor import ONNX files (tests/importer); the commands
# that need pocket's own files say so and name `pocket import`.
@pytest.mark.parametrize("command", [["export", "{onnx}"], ["compare", "{ckpt}", "--bin", "{onnx}"]])
def test_onnx_files_are_recognized(device, onnx_file, tiny_ckpt, command):
    args = [a.format(onnx=onnx_file, ckpt=tiny_ckpt) for a in command]
    _assert_clean_error(_pocket(args, device), [str(onnx_file), "this is an ONNX file",
                                                "pocket import"])
