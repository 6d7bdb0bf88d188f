"""Every CUDA source pocket builds compiles with NVRTC, for every architecture it supports.

No GPU needed: NVRTC from NVIDIA's pip wheel (`nvidia-cuda-nvrtc-cu12`, in the dev extra) via
ctypes. Each architecture is compiled to a CUBIN (so ptxas runs too), every name expression the
trainer launches must resolve, and the compile log must carry no warning beyond NVRTC's notice
that pre-Turing architectures are deprecated.
"""

import ctypes
import ctypes.util
import importlib.util
from pathlib import Path

import pytest

from pocket.train import gpu_kernels

# GTX 750 Ti (5.2), GTX 1060 (6.1), RTX 20xx/T4 (7.5), RTX 30xx (8.6), RTX 40xx (8.9), H100 (9.0)
ARCHS = ("52", "61", "75", "86", "89", "90")


def _nvrtc():
    spec = importlib.util.find_spec("nvidia.cuda_nvrtc") if importlib.util.find_spec(
        "nvidia") else None
    candidates = []
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            candidates += sorted(Path(loc, "lib").glob("libnvrtc.so*"))
    found = ctypes.util.find_library("nvrtc")
    if found:
        candidates.append(found)
    for c in candidates:
        if "builtins" in str(c) or ".alt." in str(c):
            continue
        try:
            return ctypes.CDLL(str(c))
        except OSError:
            continue
    pytest.skip("NVRTC not installed (pip install nvidia-cuda-nvrtc-cu12, in pocketnn[dev])")


def _check(lib, rc, what):
    if rc != 0:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise AssertionError(f"{what}: {lib.nvrtcGetErrorString(rc).decode()}")


def _compile(lib, source: str, names: list[str], options: list[str]):
    prog = ctypes.c_void_p()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"pocket.cu", 0,
                                       None, None), "nvrtcCreateProgram")
    try:
        for n in names:
            _check(lib, lib.nvrtcAddNameExpression(prog, n.encode()), n)
        opts = [o.encode() for o in options]
        rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        log = log.value.decode(errors="replace")
        assert rc == 0, f"compile failed ({' '.join(options)}):\n{log}"
        lowered = {}
        for n in names:
            out = ctypes.c_char_p()
            _check(lib, lib.nvrtcGetLoweredName(prog, n.encode(), ctypes.byref(out)), n)
            lowered[n] = out.value.decode()
        cubin = ctypes.c_size_t()
        _check(lib, lib.nvrtcGetCUBINSize(prog, ctypes.byref(cubin)), "nvrtcGetCUBINSize")
        return log, lowered, cubin.value
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


@pytest.mark.parametrize("arch", ARCHS)
def test_every_kernel_compiles_for(arch):
    lib = _nvrtc()
    log, lowered, cubin = _compile(lib, gpu_kernels.SOURCE, gpu_kernels.INSTANCES,
                                   [*gpu_kernels.OPTIONS, f"--gpu-architecture=sm_{arch}"])
    noise = [ln for ln in log.splitlines()
             if ln.strip() and "Architectures prior to" not in ln]
    assert not noise, "\n".join(noise)
    assert cubin > 0 and set(lowered) == set(gpu_kernels.INSTANCES)
    # fp16, fp32 and fp64 where the trainer launches them
    for name in ("relu_backward", "erf_forward", "dropout_mask", "im2col", "col2im"):
        assert {f"{name}<{t}>" for t in ("half_t", "float", "double")} <= set(lowered)


def test_a_broken_source_fails_the_compile():
    lib = _nvrtc()
    with pytest.raises(AssertionError, match="compile failed"):
        _compile(lib, gpu_kernels.SOURCE + "\n__global__ void broken() { undefined_call(); }\n",
                 [], ["--gpu-architecture=sm_75"])


def test_every_kernel_has_a_twin():
    kernels = {n.split("<", 1)[0] for n in gpu_kernels.INSTANCES}
    assert kernels == set(gpu_kernels.TWINS)
