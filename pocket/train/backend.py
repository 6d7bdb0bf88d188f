"""The one place that knows about CuPy: array module, devices, transfers, RNG, GPU kernels.

Everything else in `pocket.train` writes array code once against `xp = get_array_module(x)`.
CuPy is imported lazily, so importing `pocket.train` never pulls it in.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from pocket.errors import PocketError

_NO_GPU_HINT = (
    "use --device cpu, or install pocketnn[gpu] on a machine with an NVIDIA GPU"
)

_cupy_cache: list = []  # [module or None, reason]


def _import_cupy():
    """Return (cupy module or None, reason it is unavailable)."""
    if not _cupy_cache:
        pin_tf32()
        try:
            import cupy

            n = cupy.cuda.runtime.getDeviceCount()
            if n < 1:
                _cupy_cache[:] = [None, "CuPy is installed but no CUDA device is visible"]
            else:
                _cupy_cache[:] = [cupy, ""]
        except ImportError:
            _cupy_cache[:] = [None, "CuPy is not installed"]
        except Exception as e:  # noqa: BLE001 - any CUDA runtime failure means "no GPU"
            _cupy_cache[:] = [None, f"CUDA is not usable ({type(e).__name__}: {e})"]
    return _cupy_cache[0], _cupy_cache[1]


def cuda_inventory() -> dict:
    """What `pocket doctor` reports of CUDA: CuPy's version, the CUDA runtime and driver
    versions, and each visible device (index, name, memory, compute capability). Raises what
    CuPy raises when CUDA is not usable; ImportError without CuPy."""
    import cupy

    rt = cupy.cuda.runtime
    v, d = rt.runtimeGetVersion(), rt.driverGetVersion()
    devices = []
    for i in range(rt.getDeviceCount()):
        p = rt.getDeviceProperties(i)
        name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
        devices.append({"index": i, "name": name, "memory_bytes": int(p["totalGlobalMem"]),
                        "major": int(p["major"]), "minor": int(p["minor"])})
    return {"cupy": cupy.__version__, "cuda_runtime": f"{v // 1000}.{v % 1000 // 10}",
            "driver_cuda": f"{d // 1000}.{d % 1000 // 10}", "devices": devices}


def tf32_enabled() -> bool:
    """TF32 (a 10-bit mantissa inside fp32 GEMMs and convolutions on Ampere and newer) is off
    unless POCKET_TF32=1: fp32 training then means fp32 on every card."""
    return os.environ.get("POCKET_TF32", "0") == "1"


def pin_tf32() -> None:
    """Pin TF32 for CuPy's cuBLAS and for cuDNN before either library starts: NVIDIA's
    NVIDIA_TF32_OVERRIDE=0 turns it off in both, CUPY_TF32 is CuPy's own switch."""
    on = tf32_enabled()
    os.environ["CUPY_TF32"] = "1" if on else "0"
    if on:
        if os.environ.get("NVIDIA_TF32_OVERRIDE") == "0":
            del os.environ["NVIDIA_TF32_OVERRIDE"]
    else:
        os.environ["NVIDIA_TF32_OVERRIDE"] = "0"


def cupy_available() -> bool:
    return _import_cupy()[0] is not None


@dataclass(frozen=True)
class Device:
    """Where arrays live. `reason` says why `auto` chose it (e.g. the CPU fallback)."""

    kind: str  # "cpu" | "cuda"
    index: int = 0
    reason: str = ""

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index}"

    @property
    def xp(self):
        return np if self.kind == "cpu" else _import_cupy()[0]

    def __eq__(self, other) -> bool:
        return isinstance(other, Device) and (self.kind, self.index) == (other.kind, other.index)

    def __hash__(self) -> int:
        return hash((self.kind, self.index))


CPU = Device("cpu")


def get_device(spec: str | Device | None = "auto") -> Device:
    """Resolve "auto" | "cpu" | "cuda" | "cuda:N"; POCKET_DEVICE overrides "auto"/None."""
    if isinstance(spec, Device):
        return spec
    if spec in (None, "auto"):
        spec = os.environ.get("POCKET_DEVICE", "auto") or "auto"
    spec = str(spec).strip().lower()
    if spec == "cpu":
        return CPU
    cp, why = _import_cupy()
    if spec == "auto":
        if cp is None:
            return Device("cpu", 0, f"{why}; training on the CPU")
        best = max(range(cp.cuda.runtime.getDeviceCount()), key=_device_total_memory)
        hint = cupy_build_mismatch(best)
        if hint:
            return Device("cpu", 0, f"{hint}; training on the CPU")
        return Device("cuda", best, "the CUDA device with the most memory")
    if spec == "cuda" or spec.startswith("cuda:"):
        if cp is None:
            raise PocketError(f"no CUDA GPU found ({why}); {_NO_GPU_HINT}")
        index = 0
        if ":" in spec:
            try:
                index = int(spec.split(":", 1)[1])
            except ValueError:
                raise PocketError(f"bad device {spec!r}; use cpu, cuda or cuda:N") from None
        n = cp.cuda.runtime.getDeviceCount()
        if not 0 <= index < n:
            raise PocketError(f"no CUDA device {index} (found {n}); use cuda:0..cuda:{n - 1}")
        hint = cupy_build_mismatch(index)
        if hint:
            raise PocketError(hint)
        return Device("cuda", index)
    raise PocketError(f"bad device {spec!r}; use auto, cpu, cuda or cuda:N")


# The oldest compute capability each CUDA major version's CuPy wheel runs on.
_MIN_CC = {12: 50, 13: 75}
_EXTRA = {12: "pocketnn[gpu] (cupy-cuda12x)", 13: "pocketnn[gpu-cuda13] (cupy-cuda13x)"}


def cupy_build_mismatch(index: int = 0) -> str:
    """Why the installed CuPy cannot drive CUDA device `index`, naming the extra that can; ""
    when it can. Two ways it cannot: the card is older than the wheel's CUDA supports (CUDA 13
    dropped Maxwell, Pascal and Volta), or the driver is older than the wheel's CUDA."""
    cp = _import_cupy()[0]
    if cp is None:
        return ""
    try:
        rt = cp.cuda.runtime
        cuda_major = rt.runtimeGetVersion() // 1000
        driver = rt.driverGetVersion()
        cc = int(cp.cuda.Device(index).compute_capability)
    except Exception:  # noqa: BLE001 - no answer is no evidence of a mismatch
        return ""
    installed = _EXTRA.get(cuda_major, f"CuPy for CUDA {cuda_major}")
    if cc < _MIN_CC.get(cuda_major, 0):
        return (f"CUDA device {index} (compute capability {cc // 10}.{cc % 10}) is too old for the "
                f"installed {installed}; pip uninstall cupy-cuda{cuda_major}x and "
                f"pip install '{_EXTRA[12].split(' ')[0]}'")
    if driver // 1000 < cuda_major:
        other = [m for m in sorted(_EXTRA) if m <= driver // 1000 and cc >= _MIN_CC[m]]
        fix = (f"pip uninstall cupy-cuda{cuda_major}x and pip install "
               f"'{_EXTRA[other[-1]].split(' ')[0]}', or update the NVIDIA driver") if other else (
               "update the NVIDIA driver")
        return (f"the NVIDIA driver supports CUDA {driver // 1000}.{driver % 1000 // 10} but the "
                f"installed {installed} needs CUDA {cuda_major}; {fix}")
    return ""


def _device_total_memory(index: int) -> int:
    cp = _import_cupy()[0]
    with cp.cuda.Device(index):
        return cp.cuda.runtime.memGetInfo()[1]


def get_array_module(arr):
    """numpy for NumPy arrays and scalars, cupy for CuPy arrays."""
    if isinstance(arr, np.ndarray) or type(arr).__module__ == "numpy":
        return np
    cp = _import_cupy()[0]
    if cp is not None and isinstance(arr, cp.ndarray):
        return cp
    return np


def device_of(arr) -> Device:
    if get_array_module(arr) is np:
        return CPU
    return Device("cuda", arr.device.id)


def to_device(arr, device: str | Device):
    """Copy (only if needed) an array onto `device`."""
    device = get_device(device)
    if device.kind == "cpu":
        return to_numpy(arr)
    cp = _import_cupy()[0]
    if isinstance(arr, cp.ndarray):
        if arr.device.id == device.index:
            return arr
        with cp.cuda.Device(device.index):
            return cp.array(arr, copy=True)  # a copy that lives on `device`
    with cp.cuda.Device(device.index):
        return cp.asarray(arr)


def to_numpy(arr) -> np.ndarray:
    if get_array_module(arr) is np:
        return np.asarray(arr)
    return arr.get()


def erf(x):
    """Elementwise erf in x's own dtype; NumPy has none, so the CPU path is a Numba kernel.

    NOTE: cupyx.scipy.special.erf has no half loop and returns float64 for fp16 input, which
    would turn every layer after a GELU into float64; the GPU path is our own kernel."""
    if get_array_module(x) is np:
        from pocket.train.kernels_cpu import erf as erf_cpu

        return erf_cpu(x)
    x = contiguous(x)
    y = _import_cupy()[0].empty_like(x)
    gpu_launch("erf_forward", x.dtype, x.size, x, y, np.int64(x.size))
    return y


def scatter_add(a, index, values) -> None:
    """a[index] += values with repeated indices accumulated."""
    if get_array_module(a) is np:
        np.add.at(a, index, values)
    else:
        # NOTE: cupyx.scatter_add is deprecated (a DeprecationWarning, an error in the tests);
        # cupy.add.at is its replacement.
        _import_cupy()[0].add.at(a, index, values)


# RNG: one explicit numpy Generator drives initializers and dropout, so a run is reproducible
# and its state can go into a checkpoint (the state is a JSON-able dict).
_rng = [np.random.default_rng(0)]


def manual_seed(seed: int) -> np.random.Generator:
    _rng[0] = np.random.default_rng(seed)
    return _rng[0]


def default_rng() -> np.random.Generator:
    return _rng[0]


def get_rng_state() -> dict:
    return _rng[0].bit_generator.state


def set_rng_state(state: dict) -> None:
    rng = np.random.default_rng()
    rng.bit_generator.state = state
    _rng[0] = rng


def uniform(shape, like, rng: np.random.Generator | None = None):
    """U[0, 1) of `like`'s dtype on `like`'s device, drawn from the pocket RNG (CPU only)."""
    rng = rng or _rng[0]
    return rng.random(shape, dtype=np.float32 if like.dtype == np.float32 else np.float64)


def dropout_mask(shape, like, p: float, rng: np.random.Generator | None = None):
    """keep / (1 - p) as `like`'s dtype on its device: 1/(1-p) where U[0,1) >= p, else 0.

    On the GPU one counter-based kernel makes the mask from a 64-bit seed drawn from the pocket
    RNG (host side, no sync): no generator object or curand state per call, and a resumed run
    draws the same seeds, so GPU dropout is as reproducible as the CPU's.
    """
    rng = rng or _rng[0]
    scale = 1.0 / (1.0 - p)
    if get_array_module(like) is np:
        keep = uniform(shape, like, rng) >= p
        return keep.astype(like.dtype) * like.dtype.type(scale)
    seed = np.uint64(rng.integers(0, 2**63 - 1))
    mask = _import_cupy()[0].empty(shape, like.dtype)
    gpu_launch("dropout_mask", like.dtype, mask.size, seed, np.float32(p), np.float32(scale),
               mask, np.int64(mask.size))
    return mask


# GPU kernels: one RawModule of templates (pocket.train.gpu_kernels), compiled on first use per
# device; every kernel has its NumPy twin there, which the test suite's CuPy stand-in runs.
from pocket.train import gpu_kernels  # noqa: E402

KERNEL_TWINS = gpu_kernels.TWINS
GPU_FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
_kernels: dict = {}
_gpu_state: dict = {}


def contiguous(a):
    """a, or a C-contiguous copy (what a RawKernel's pointer arguments need)."""
    return a if a.flags.c_contiguous else get_array_module(a).ascontiguousarray(a)


def gpu_function(name: str, dtype):
    """The compiled kernel `name` for `dtype` on the current device."""
    cp = _import_cupy()[0]
    dev = cp.cuda.runtime.getDevice()
    expr = gpu_kernels.instance(name, dtype)
    fn = _kernels.get((dev, expr))
    if fn is None:
        mod = _kernels.get((dev, "module"))
        if mod is None:
            mod = cp.RawModule(code=gpu_kernels.SOURCE, options=gpu_kernels.OPTIONS,
                               name_expressions=gpu_kernels.INSTANCES)
            _kernels[(dev, "module")] = mod
        fn = _kernels[(dev, expr)] = mod.get_function(expr)
    return fn


def gpu_launch(name: str, dtype, n: int, *args) -> None:
    """Launch kernel `name` (for `dtype`) over n elements; args as the kernel takes them
    (device arrays, C-contiguous; NumPy scalars of the kernel's parameter types)."""
    grid, block = gpu_kernels.launch_shape(n)
    gpu_function(name, dtype)(grid, block, args)


# cuDNN convolutions through NVIDIA's cuDNN Python frontend (nvidia-cudnn-frontend, in the gpu
# extras), on CuPy arrays via DLPack, one built plan per (device, kind, shapes, dtype,
# geometry). Thin on purpose: it cannot run without a GPU, so every failure (no frontend, no
# engine for the shape, a build error) returns False once and the caller's im2col + cuBLAS
# path (tested under the CuPy stand-in) runs instead, for that shape from then on.
_cudnn: dict = {}
_CUDNN_KINDS = ("fprop", "dgrad", "wgrad")


def cudnn_available() -> bool:
    if os.environ.get("POCKET_CUDNN", "1") == "0":
        return False
    if "module" not in _cudnn:
        cp = _import_cupy()[0]
        mod = None
        if cp is not None and not getattr(cp, "is_gpu_sim", False):
            try:
                import cudnn as mod
            except Exception:  # noqa: BLE001 - missing wheel or library: the fallback runs
                mod = None
        _cudnn["module"] = mod
    return _cudnn["module"] is not None


def _cudnn_plan(kind: str, a, b, out, stride, padding, dilation):
    cudnn, cp = _cudnn["module"], _import_cupy()[0]
    dev = cp.cuda.runtime.getDevice()
    key = (dev, kind, a.shape, b.shape, out.shape, a.dtype.str, stride, padding, dilation)
    if key in _cudnn:
        return _cudnn[key]
    plan = None
    try:
        handle = _cudnn.get(("handle", dev))
        if handle is None:
            handle = _cudnn[("handle", dev)] = cudnn.create_handle()
        cudnn.set_stream(handle=handle, stream=cp.cuda.get_current_stream().ptr)
        dt = {"float16": cudnn.data_type.HALF, "float32": cudnn.data_type.FLOAT,
              "float64": cudnn.data_type.DOUBLE}[a.dtype.name]
        acc = cudnn.data_type.DOUBLE if a.dtype.name == "float64" else cudnn.data_type.FLOAT
        g = cudnn.pygraph(handle=handle, io_data_type=dt, intermediate_data_type=acc,
                          compute_data_type=acc)

        def t(arr, name):
            return g.tensor(name=name, dim=list(arr.shape),
                            stride=[st // arr.itemsize for st in arr.strides], data_type=dt)

        ta, tb = t(a, "a"), t(b, "b")
        geo = dict(padding=list(padding), stride=list(stride), dilation=list(dilation),
                   compute_data_type=acc)
        if kind == "fprop":
            to = g.conv_fprop(image=ta, weight=tb, **geo)
        elif kind == "dgrad":
            to = g.conv_dgrad(loss=ta, filter=tb, **geo)
        else:
            to = g.conv_wgrad(image=ta, loss=tb, **geo)
        to.set_output(True).set_dim(list(out.shape)).set_stride(
            [st // out.itemsize for st in out.strides]).set_data_type(dt)
        g.build([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        plan = (g, handle, ta, tb, to, int(g.get_workspace_size()))
    except Exception as e:  # noqa: BLE001 - no engine for this shape: im2col + cuBLAS instead
        _cudnn.setdefault("failures", []).append(f"{kind} {a.shape} {b.shape}: {e}")
    _cudnn[key] = plan
    return plan


def cudnn_conv(kind: str, a, b, out, stride, padding, dilation) -> bool:
    """out[...] = the convolution `kind` of a and b with cuDNN; False where it cannot (the
    caller then runs its own path). fprop: a=x, b=w, out=y; dgrad: a=gy, b=w, out=gx;
    wgrad: a=x, b=gy, out=gw. Groups follow from the channel counts of x and w."""
    if kind not in _CUDNN_KINDS or not cudnn_available():
        return False
    cp = _import_cupy()[0]
    a, b = contiguous(a), contiguous(b)
    plan = _cudnn_plan(kind, a, b, out, tuple(stride), tuple(padding), tuple(dilation))
    if plan is None:
        return False
    g, handle, ta, tb, to, ws = plan
    workspace = cp.empty(max(ws, 1), dtype=cp.uint8)
    g.execute({ta: a, tb: b, to: out}, workspace, handle=handle)
    return True


def use_device(device: Device) -> None:
    """Make `device` the current CUDA device of this thread: CuPy allocates, launches and caps
    the pool on the current device, so `cuda:N` is honoured only if it is current."""
    if device.kind == "cuda":
        _import_cupy()[0].cuda.Device(device.index).use()


# GPU memory pool: the budget cap and the numbers for the memory report.

# What a card spends outside CuPy's pool: the CUDA context (~300 MiB with the runtime's
# modules loaded), cuBLAS's workspace (32 MiB per handle on sm_90, 4 MiB before) and the cuDNN
# workspace, plus the pool's rounding and fragmentation (a few percent).
GPU_CONTEXT_RESERVE = 320 << 20
GPU_LIBRARY_RESERVE = 64 << 20
GPU_FRAGMENTATION = 0.05


def gpu_pool_limit(budget_bytes: int) -> int:
    """The pool cap that makes a run fit a card of `budget_bytes`: the budget less the CUDA
    context, library workspaces and fragmentation (at least 1/4 of the budget)."""
    usable = int(budget_bytes * (1 - GPU_FRAGMENTATION)) - GPU_CONTEXT_RESERVE - GPU_LIBRARY_RESERVE
    return max(usable, int(budget_bytes) // 4)


def cap_gpu_pool(budget_bytes: int | None, device: Device | None = None) -> bool:
    """Cap CuPy's default memory pool on `device` (the current one by default) so the process
    fits a card of `budget_bytes` (None or 0 lifts the cap): a big card then fails like a small
    one would. Returns False where there is no GPU."""
    cp = _import_cupy()[0]
    if cp is None:
        return False
    index = device.index if device is not None else cp.cuda.runtime.getDevice()
    with cp.cuda.Device(index):
        limit = gpu_pool_limit(int(budget_bytes)) if budget_bytes else 0
        cp.get_default_memory_pool().set_limit(size=limit)
    return True


def gpu_pool_stats(device: Device | None = None) -> dict | None:
    """{"used_bytes", "total_bytes", "limit_bytes"} of CuPy's default pool on `device` (the
    current one by default), None without a GPU.

    used = bytes in live arrays; total = bytes the pool holds from the driver (used + cached).
    """
    cp = _import_cupy()[0]
    if cp is None:
        return None
    index = device.index if device is not None else cp.cuda.runtime.getDevice()
    with cp.cuda.Device(index):
        pool = cp.get_default_memory_pool()
        return {"used_bytes": int(pool.used_bytes()), "total_bytes": int(pool.total_bytes()),
                "limit_bytes": int(pool.get_limit())}


class GpuPeak:
    """The true peak of CuPy's pool on a device, from a memory hook on every pool malloc/free
    (the pool itself keeps no peak), with the tracker's categories at the moment of the peak:
    what a small card sees. `unattributed` is what the pool held beyond the arrays pocket
    tracks (CuPy's own temporaries, rounding to the pool's 512-byte blocks)."""

    def __init__(self, device: Device) -> None:
        cp = _import_cupy()[0]
        self.device = device
        self.live = 0
        self.peak = 0
        self.at_peak: dict = {}
        self._sizes: dict = {}
        owner = self

        class _Hook(cp.cuda.MemoryHook):
            name = "pocket_gpu_peak"

            def malloc_postprocess(self, device_id, size, mem_size, mem_ptr, pmem_id):
                if device_id == owner.device.index:
                    owner._malloc(mem_ptr, mem_size)

            def free_postprocess(self, device_id, mem_size, mem_ptr, pmem_id):
                if device_id == owner.device.index:
                    owner._free(mem_ptr)

        self._hook = _Hook()
        self._hook.__enter__()
        with cp.cuda.Device(device.index):
            self.live = self.peak = int(cp.get_default_memory_pool().used_bytes())

    def _malloc(self, ptr, size: int) -> None:
        self._sizes[ptr] = int(size)
        self.live += int(size)
        if self.live > self.peak:
            self.peak = self.live
            from pocket.train.memory import get_tracker

            self.at_peak = dict(get_tracker().live)

    def _free(self, ptr) -> None:
        self.live -= self._sizes.pop(ptr, 0)

    def reset(self) -> None:
        self.peak = self.live
        self.at_peak = {}

    def report(self) -> dict:
        cats = dict(self.at_peak)
        return {"peak_bytes": self.peak, "at_peak": cats,
                "unattributed_bytes": max(0, self.peak - sum(cats.values()))}

    def close(self) -> None:
        if self._hook is not None:
            self._hook.__exit__(None, None, None)
            self._hook = None


# Host memory: what the memory savers free should leave the process, not stay in the heap.

_M_MMAP_THRESHOLD = -3  # glibc mallopt parameter


def return_freed_host_memory() -> bool:
    """Serve every host array above 128 KiB from its own mapping (glibc), so an activation
    freed in backward goes back to the OS at once; returns False where that is not possible.

    NOTE: glibc raises its mmap threshold each time a large block is freed, after which
    arrays of that size come from the heap, whose high-water mark is never given back: on the
    cnn_cifar reference model with checkpointing that kept the peak RSS 40% above the live
    bytes. A fixed threshold costs a page-fault pass per large array, so it is only set when
    a memory saver or budget asks for low memory.
    """
    import ctypes
    import ctypes.util
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, 128 * 1024))
    except (OSError, AttributeError):  # not glibc (musl, ...): nothing to tune
        return False
