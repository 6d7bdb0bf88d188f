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
        return Device("cuda", index)
    raise PocketError(f"bad device {spec!r}; use auto, cpu, cuda or cuda:N")


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
    with cp.cuda.Device(device.index):
        return cp.asarray(arr)


def to_numpy(arr) -> np.ndarray:
    if get_array_module(arr) is np:
        return np.asarray(arr)
    return arr.get()


def erf(x):
    """Elementwise erf; NumPy has none, so the CPU path is a Numba kernel."""
    if get_array_module(x) is np:
        from pocket.train.kernels_cpu import erf as erf_cpu

        return erf_cpu(x)
    import cupyx.scipy.special as sp

    return sp.erf(x)


def scatter_add(a, index, values) -> None:
    """a[index] += values with repeated indices accumulated."""
    if get_array_module(a) is np:
        np.add.at(a, index, values)
    else:
        import cupyx

        cupyx.scatter_add(a, index, values)


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
    """U[0, 1) of `like`'s dtype on `like`'s device, drawn from the pocket RNG."""
    rng = rng or _rng[0]
    xp = get_array_module(like)
    if xp is np:
        return rng.random(shape, dtype=np.float32 if like.dtype == np.float32 else np.float64)
    # NOTE: seed CuPy's generator from ours so GPU dropout stays reproducible from one seed.
    g = xp.random.default_rng(int(rng.integers(2**63 - 1)))
    return g.random(shape, dtype=like.dtype)


# GPU fused elementwise kernels, built on first use (cannot run without CUDA).
_kernels: dict = {}

_KERNEL_SOURCES = {
    "relu_backward": ("T gy, T y", "T gx", "gx = y > 0 ? gy : (T)0"),
    "bias_relu": ("T x, T b", "T y", "y = max(x + b, (T)0)"),
    "sgd_momentum": (
        "T g, T lr, T mom, T wd, T damp, int32 nesterov, int32 first",
        "T p, T buf",
        """
        T d = g + wd * p;
        buf = first ? d : mom * buf + (1 - damp) * d;
        d = nesterov ? d + mom * buf : buf;
        p -= lr * d;
        """,
    ),
    "adam": (
        "T g, T lr, T b1, T b2, T eps, T wd, T decoupled, T bc1, T bc2",
        "T p, T m, T v",
        """
        T d = decoupled ? g : g + wd * p;
        if (decoupled) p -= lr * wd * p;
        m = b1 * m + (1 - b1) * d;
        v = b2 * v + (1 - b2) * d * d;
        p -= lr * (m / bc1) / (sqrt(v / bc2) + eps);
        """,
    ),
}


def gpu_kernel(name: str):
    """A cupy.ElementwiseKernel by name, or None on CPU-only installs."""
    cp = _import_cupy()[0]
    if cp is None:
        return None
    if name not in _kernels:
        ins, outs, body = _KERNEL_SOURCES[name]
        _kernels[name] = cp.ElementwiseKernel(ins, outs, body, f"pocket_{name}")
    return _kernels[name]


# GPU memory pool: the budget cap and the numbers for the memory report.

def cap_gpu_pool(budget_bytes: int | None) -> bool:
    """Cap CuPy's default memory pool at `budget_bytes` (None or 0 lifts the cap), so a big
    card fails like a small one would; returns False where there is no GPU."""
    cp = _import_cupy()[0]
    if cp is None:
        return False
    cp.get_default_memory_pool().set_limit(size=int(budget_bytes or 0))
    return True


def gpu_pool_stats() -> dict | None:
    """{"used_bytes", "total_bytes", "limit_bytes"} of CuPy's default pool, None without a GPU.

    used = bytes in live arrays; total = bytes the pool holds from the driver (used + cached).
    """
    cp = _import_cupy()[0]
    if cp is None:
        return None
    pool = cp.get_default_memory_pool()
    return {"used_bytes": int(pool.used_bytes()), "total_bytes": int(pool.total_bytes()),
            "limit_bytes": int(pool.get_limit())}


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
