"""`pocket doctor`: the documented --json fields are all there, CPU features are read from
/proc/cpuinfo text as written by x86 and ARM kernels, and problems become advice."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pocket import doctor as dr

REPO = Path(__file__).resolve().parents[1]


def _pocket(args, cwd):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("POCKET_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "pocket.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def _documented_fields() -> list[str]:
    """The dotted field names of the README's `pocket doctor --json` table."""
    text = (REPO / "README.md").read_text()
    table = text[text.index("The `--json` fields:"):]
    table = table[: table.index("\n\n", table.index("| field |"))]
    fields = []
    for row in table.splitlines()[3:]:
        cell = row.split("|")[1]
        fields += re.findall(r"`([a-z0-9_.]+)`", cell)
    return fields


def _get(report: dict, dotted: str):
    node = report
    for part in dotted.split("."):
        assert isinstance(node, dict) and part in node, (dotted, part)
        node = node[part]
    return node


@pytest.fixture(scope="module")
def model_bin(tmp_path_factory):
    from pocket.formats.container import write_container
    from pocket.formats.ir import Graph, Node, ValueInfo

    d = tmp_path_factory.mktemp("doctor")
    g = Graph({"x": ValueInfo("f32", ("N", 4))}, ["y"], [Node("fc", "linear", ["x", "w", "b"], ["y"], {})],
              {"w": ValueInfo("f32", (2, 4)), "b": ValueInfo("f32", (2,))}, {"task": "classification"})
    write_container(d / "m.bin", kind="model", graph=g,
                    tensors={"w": np.ones((2, 4), np.float32), "b": np.zeros(2, np.float32)})
    return d / "m.bin"


def test_json_has_every_documented_field(model_bin, tmp_path):
    r = _pocket(["doctor", "--json", str(model_bin)], tmp_path)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)  # exactly one JSON object
    fields = _documented_fields()
    assert len(fields) >= 30, fields
    for f in fields:
        _get(report, f)
    assert isinstance(report["advice"], list)
    assert report["engine"]["int8_route"] in ("vnni", "sdot", "smull", "portable")
    assert report["engine"]["fp32_route"] in ("avx512-fma", "blas")
    m = report["model"]
    assert m["loads"] and m["runs_here"] and m["ops"] == ["linear"] and m["input_shape"] == [4]
    assert report["numpy"] == np.__version__
    assert set(report["extras"]) >= {"images", "data", "onnx", "gpu"}
    assert list(report["extras"]["images"]["packages"]) == ["pillow"]
    for d in report["gpu"]["devices"]:
        assert set(d) == {"index", "name", "memory_bytes", "compute_capability", "fp16_fast"}
    if report["gpu"]["cupy"] is None:
        assert "CuPy" in report["gpu"]["error"]
    text = _pocket(["doctor"], tmp_path)
    assert text.returncode == 0 and "engine   int8:" in text.stdout and "numba" in text.stdout


def test_a_model_that_cannot_run_exits_1_with_advice(model_bin, tmp_path):
    bad = tmp_path / "bad.bin"
    data = bytearray(model_bin.read_bytes())
    data[-1] ^= 0xFF  # a weight byte: its CRC no longer matches
    bad.write_bytes(bytes(data))
    r = _pocket(["doctor", "--json", str(bad)], tmp_path)
    assert r.returncode == 1, r.stderr
    report = json.loads(r.stdout)
    assert not report["model"]["runs_here"] and "CRC" in report["model"]["error"]
    assert any("will not run here" in a for a in report["advice"])
    r = _pocket(["doctor", str(tmp_path / "missing.bin")], tmp_path)
    assert r.returncode == 3 and r.stderr.startswith("Error: ") and "Traceback" not in r.stderr


X86 = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Core(TM) i5-8250U CPU @ 1.60GHz
flags\t\t: fpu vme sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma bmi2

processor\t: 1
model name\t: Intel(R) Core(TM) i5-8250U CPU @ 1.60GHz
flags\t\t: fpu vme sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma bmi2
"""
PI4 = """processor\t: 0
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm crc32 cpuid
CPU implementer\t: 0x41
CPU part\t: 0xd08

Hardware\t: BCM2835
Model\t\t: Raspberry Pi 4 Model B Rev 1.4
"""
PI5 = PI4.replace("crc32 cpuid", "aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm "
                  "lrcpc dcpop asimddp").replace("0xd08", "0xd0b").replace("Pi 4", "Pi 5")


def test_cpu_features_from_cpuinfo():
    x = dr.cpu_report(X86, "x86_64")
    assert x["model"].startswith("Intel(R) Core(TM) i5-8250U") and x["known"]
    assert x["features"]["avx2"] and x["features"]["fma"]
    assert not x["features"]["avx512f"] and not x["features"]["avx512_vnni"]
    pi4, pi5 = dr.cpu_report(PI4, "aarch64"), dr.cpu_report(PI5, "aarch64")
    assert pi4["model"] == "Raspberry Pi 4 Model B Rev 1.4"
    assert pi4["features"]["asimd"] and not pi4["features"]["asimddp"]
    assert pi5["features"]["asimddp"] and pi5["features"]["asimdhp"]
    assert set(pi4["features"]) == set(dr.ARM_FEATURES)
    assert not dr.cpu_report("", "x86_64")["known"]


def _report(**over) -> dict:
    r = {"cpu": dr.cpu_report(X86, "x86_64"), "engine": {"int8_route": "portable"},
         "numba": {"disable_jit": False, "cache_dir": "/c", "cache_writable": True, "cached_kernels": 5},
         "extras": {"images": {"installed": True}, "onnx": {"installed": True}},
         "gpu": {"cupy": None, "driver": None, "error": "CuPy is not installed", "devices": []},
         "model": None}
    r.update(over)
    return r


def test_one_line_of_advice_per_problem():
    assert dr._advice(_report()) == []
    assert any("asimddp" in a for a in dr._advice(_report(cpu=dr.cpu_report(PI4, "aarch64"))))
    assert dr._advice(_report(cpu=dr.cpu_report(PI5, "aarch64"))) == []
    tips = dr._advice(_report(numba={"disable_jit": False, "cache_dir": "/ro", "cache_writable": False,
                                     "cached_kernels": 0}))
    assert len(tips) == 1 and "NUMBA_CACHE_DIR" in tips[0]
    tips = dr._advice(_report(numba={"disable_jit": False, "cache_dir": "/c", "cache_writable": True,
                                     "cached_kernels": 0}))
    assert len(tips) == 1 and "--warmup" in tips[0]
    tips = dr._advice(_report(extras={"images": {"installed": False}, "onnx": {"installed": True}}))
    assert tips == ["Pillow is missing: image inputs need pip install 'pocketnn[images]'"]
    gpus = [{"index": 0, "name": "GTX 1060", "compute_capability": "6.1", "fp16_fast": False}]
    tips = dr._advice(_report(gpu={"cupy": "13.0", "driver": "550", "error": None, "devices": gpus}))
    assert len(tips) == 1 and "GTX 1060" in tips[0] and "fp32" in tips[0]
    tips = dr._advice(_report(gpu={"cupy": None, "driver": "550.54", "error": "CuPy is not installed",
                                   "devices": []}))
    assert len(tips) == 1 and "pocketnn[gpu]" in tips[0]


@pytest.mark.parametrize("cc,fast", [((5, 2), False), ((5, 3), True), ((6, 0), True), ((6, 1), False),
                                     ((7, 5), True), ((8, 6), True), ((9, 0), True)])
def test_fp16_speed_by_compute_capability(cc, fast):
    assert dr._fp16_fast(*cc) is fast


def test_gpu_report_reads_cupy_through_the_backend(monkeypatch):
    """The CuPy facts come from train/backend.py (the one module that imports CuPy): a stand-in
    cupy with one sm_61 card is reported with its memory, capability and slow fp16."""
    import importlib.machinery
    import types

    fake = types.ModuleType("cupy")
    fake.__spec__ = importlib.machinery.ModuleSpec("cupy", None)
    fake.__version__ = "14.2.0"
    props = {"name": b"GeForce GTX 1060", "totalGlobalMem": 6 << 30, "major": 6, "minor": 1}
    runtime = types.SimpleNamespace(runtimeGetVersion=lambda: 12040, driverGetVersion=lambda: 12060,
                                    getDeviceCount=lambda: 1, getDeviceProperties=lambda i: props)
    fake.cuda = types.SimpleNamespace(runtime=runtime)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    g = dr.gpu_report()
    assert g["error"] is None and g["cupy"] == "14.2.0" and g["cuda_runtime"] == "12.4"
    assert g["devices"] == [{"index": 0, "name": "GeForce GTX 1060", "memory_bytes": 6 << 30,
                             "compute_capability": "6.1", "fp16_fast": dr._fp16_fast(6, 1)}]
