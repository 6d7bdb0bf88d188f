"""The OpenBLAS this process loaded (NumPy's own, or a distribution's), reached through its C
entry points with ctypes: its pool's size (_OpenBlas, for the edge install, which has no
threadpoolctl) and its cblas_sgemm / cblas_sgemv (kernels_blas). Standard library and NumPy
only: pools.py imports it before Numba is up."""

from __future__ import annotations

import ctypes
import functools

import numpy as np

# cblas's enums (row-major storage; op(X) = X or its transpose)
ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112


# (prefix, suffix) of OpenBLAS's C entry points: NumPy's wheels bundle scipy-openblas (64-bit
# integers: scipy_openblas_set_num_threads64_), distributions ship plain OpenBLAS
_OPENBLAS_NAMES = (("scipy_", "64_"), ("scipy_", ""), ("", "64_"), ("", ""))


class _OpenBlas:
    """A loaded OpenBLAS's pool, sized through its own C entry points: the part of
    threadpoolctl the engine uses, so that the edge install (NumPy and Numba only) can run
    BLAS on the calling thread too (spin_policy, Pace's solo calls)."""

    internal_api = "openblas"

    def __init__(self, lib: ctypes.CDLL, filepath: str):
        self.filepath = filepath
        for prefix, suffix in _OPENBLAS_NAMES:
            setter = getattr(lib, f"{prefix}openblas_set_num_threads{suffix}", None)
            getter = getattr(lib, f"{prefix}openblas_get_num_threads{suffix}", None)
            if setter is not None and getter is not None:
                break
        else:
            raise LookupError("not an OpenBLAS")
        setter.argtypes, setter.restype = [ctypes.c_int], None
        getter.argtypes, getter.restype = [], ctypes.c_int
        self._set, self._get = setter, getter

    @property
    def num_threads(self) -> int:
        return self._get()

    def set_num_threads(self, k: int) -> None:
        self._set(k)

    def _get_symbol(self, name: str):
        return self._set if name == "openblas_set_num_threads" else None


@functools.cache
def openblas_paths() -> tuple[str, ...]:
    """The files of the OpenBLAS libraries this process has loaded (Linux: /proc/self/maps;
    NumPy loads its BLAS on import), or () (another BLAS, another OS)."""
    try:
        with open("/proc/self/maps") as f:
            return tuple(sorted({fields[5].strip() for fields in (line.split(None, 5) for line in f)
                                 if len(fields) == 6 and "openblas" in fields[5].lower()}))
    except OSError:
        return ()


@functools.cache
def loaded_openblas() -> list:
    """_OpenBlas handles on openblas_paths()."""
    found = []
    for path in openblas_paths():
        try:  # the loaded library's own handle: dlopen of a loaded path loads nothing new
            found.append(_OpenBlas(ctypes.CDLL(path), path))
        except (OSError, LookupError):
            continue
    return found


# (prefix, suffix, integer type) of cblas_sgemm: NumPy's wheels bundle scipy-openblas with
# 64-bit integers; distributions' OpenBLAS takes 32-bit ones
_NAMES = (("scipy_", "64_", ctypes.c_int64), ("", "64_", ctypes.c_int64),
          ("scipy_", "", ctypes.c_int), ("", "", ctypes.c_int))


def find_sgemm():
    """The loaded OpenBLAS's cblas_sgemm as a ctypes function Numba can call, or None (no
    OpenBLAS this process loaded, or one that fails a 2x3 @ 3x2 check)."""
    return _find("sgemm")


def find_sgemv():
    """The same library's cblas_sgemv (a matrix times a vector), or None."""
    return _find("sgemv")


def _prototype(kind: str, integer):
    e, f, p, i = ctypes.c_int, ctypes.c_float, ctypes.c_void_p, integer
    if kind == "sgemm":  # order, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc
        return ctypes.CFUNCTYPE(None, e, e, e, i, i, i, f, p, i, p, i, f, p, i)
    return ctypes.CFUNCTYPE(None, e, e, i, i, f, p, i, p, i, f, p, i)  # order, trans, m, n, ...


@functools.cache
def _find(kind: str):
    for path in openblas_paths():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix, suffix, integer in _NAMES:
            sym = getattr(lib, f"{prefix}cblas_{kind}{suffix}", None)
            if sym is None:
                continue
            f = _prototype(kind, integer)(ctypes.cast(sym, ctypes.c_void_p).value)
            if _works(kind, f):
                return f
    return None


def _works(kind: str, f) -> bool:
    """Whether f computes a small product right (the integer width matches the library's)."""
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(6, dtype=np.float32).reshape(3, 2) - 2
    c = np.zeros((2, 2), np.float32)
    if kind == "sgemv":
        f(ROW_MAJOR, NO_TRANS, 2, 3, 1.0, a.ctypes.data, 3, b[:, 0].copy().ctypes.data, 1, 0.0,
          c.ctypes.data, 1)
        return bool(np.array_equal(c[0], a @ b[:, 0]))
    f(ROW_MAJOR, NO_TRANS, NO_TRANS, 2, 2, 3, 1.0, a.ctypes.data, 3, b.ctypes.data, 2, 0.0,
      c.ctypes.data, 2)
    return bool(np.array_equal(c, a @ b))
