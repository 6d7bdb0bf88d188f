"""A strict CuPy stand-in on NumPy, so every GPU branch of pocket.train runs in CI.

It refuses what CuPy refuses and counts what costs on a real card:
- a ufunc or function mixing host (NumPy) and device arrays: TypeError;
- `device[...] = host_array`: TypeError;
- implicit conversion to NumPy (`np.asarray(d)`, `np.testing.assert_allclose(d, ...)`):
  TypeError, as CuPy's `__array__`;
- NumPy functions called on device arrays (`np.concatenate([d])`): TypeError;
- an array used while another device is current: ValueError, as CuPy's kernel launch;
- counts host syncs (`.get()`, `float()`, `int()`, `bool()`, `.item()`, `.tolist()`, printing),
  kernel launches (every op, every custom kernel) and allocations (every result that owns new
  memory), per `Counters`;
- runs each custom kernel (ElementwiseKernel, ReductionKernel, RawKernel, RawModule) through
  the NumPy twin registered next to it (`pocket.train.backend.KERNEL_TWINS`); a kernel with no
  twin is refused, and so is a RawKernel pointer argument that is not C-contiguous;
- a memory pool per device with `set_limit` that raises OutOfMemoryError when exceeded.

The device array is a wrapper, not an ndarray subclass: NumPy converts a subclass with
`np.asarray` without asking it (so implicit conversion could not be refused) and every
`isinstance(a, np.ndarray)` check would take a device array for a host one, which a CuPy
array never is.
"""

from __future__ import annotations

import contextlib
import numbers
import types
import weakref

import numpy as np


class Counters:
    def __init__(self) -> None:
        self.syncs = 0
        self.launches = 0
        self.allocs = 0
        self.sync_sites: list[str] = []

    def reset(self) -> None:
        self.__init__()

    def snapshot(self) -> dict:
        return {"syncs": self.syncs, "launches": self.launches, "allocs": self.allocs}


COUNTERS = Counters()
_TRACE_SYNCS = [False]


def _sync(what: str) -> None:
    COUNTERS.syncs += 1
    if _TRACE_SYNCS[0]:
        import traceback

        COUNTERS.sync_sites.append(what + "\n" + "".join(traceback.format_stack(limit=8)[:-2]))


# ----------------------------------------------------------------------------- devices, pool


class OutOfMemoryError(MemoryError):
    pass


class _Pool:
    """CuPy's default pool: per-device used bytes and limit (the limit of the current device)."""

    def __init__(self) -> None:
        self.used = {}
        self.peak = {}
        self.limit = {}

    def _alloc(self, dev: int, nbytes: int) -> None:
        lim = self.limit.get(dev, 0)
        used = self.used.get(dev, 0) + nbytes
        if lim and used > lim:
            raise OutOfMemoryError(f"Out of memory allocating {nbytes:,} bytes "
                                   f"(allocated so far: {self.used.get(dev, 0):,} bytes, limit set "
                                   f"to: {lim:,} bytes).")
        self.used[dev] = used
        self.peak[dev] = max(self.peak.get(dev, 0), used)

    def _free(self, dev: int, nbytes: int) -> None:
        self.used[dev] = self.used.get(dev, 0) - nbytes

    def used_bytes(self) -> int:
        return self.used.get(_current[-1], 0)

    def total_bytes(self) -> int:
        return self.peak.get(_current[-1], 0)

    def set_limit(self, size=None, fraction=None) -> None:
        if fraction is not None:
            size = int(fraction * TOTAL_MEMORY)
        self.limit[_current[-1]] = int(size or 0)

    def get_limit(self) -> int:
        return self.limit.get(_current[-1], 0)

    def free_all_blocks(self) -> None:
        pass


DEVICE_COUNT = 2
TOTAL_MEMORY = 8 << 30
_current = [0]
_POOL = _Pool()


class Device:
    def __init__(self, device=None) -> None:
        self.id = _current[-1] if device is None else int(device)
        if not 0 <= self.id < DEVICE_COUNT:
            raise RuntimeError(f"cudaErrorInvalidDevice: invalid device ordinal {self.id}")

    def __enter__(self):
        _current.append(self.id)
        return self

    def __exit__(self, *exc) -> None:
        _current.pop()

    def use(self) -> None:
        _current[-1] = self.id

    @property
    def compute_capability(self) -> str:
        return "90"

    @property
    def mem_info(self):
        return (TOTAL_MEMORY - _POOL.used.get(self.id, 0), TOTAL_MEMORY)

    def synchronize(self) -> None:
        _sync("Device.synchronize")

    def __eq__(self, other) -> bool:
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self) -> int:
        return self.id

    def __repr__(self) -> str:
        return f"<CUDA Device {self.id}>"


def _runtime():
    rt = types.SimpleNamespace()
    rt.getDeviceCount = lambda: DEVICE_COUNT
    rt.getDevice = lambda: _current[-1]
    rt.memGetInfo = lambda: Device().mem_info
    rt.runtimeGetVersion = lambda: 12080
    rt.driverGetVersion = lambda: 12080
    rt.getDeviceProperties = lambda i: {"name": b"pocket gpu_sim", "totalGlobalMem": TOTAL_MEMORY,
                                        "major": 9, "minor": 0}
    rt.CUDARuntimeError = RuntimeError
    return rt


# ----------------------------------------------------------------------------- the array


def _is_host_array(a) -> bool:
    return isinstance(a, np.ndarray)


def _refuse_host(a, where: str):
    raise TypeError(f"Unsupported type {type(a)} in {where}: a host (NumPy) array cannot be mixed "
                    "with device arrays; move it with cupy.asarray first")


def _unwrap(a, where: str):
    """Device array -> its NumPy storage (checked against the current device); host arrays
    refused; lists and tuples unwrapped element by element."""
    if isinstance(a, ndarray):
        if a._dev != _current[-1]:
            raise ValueError(f"The device where the array resides ({a._dev}) is different from "
                             f"the current device ({_current[-1]}).")
        return a._a
    if _is_host_array(a):
        _refuse_host(a, where)
    if isinstance(a, list | tuple):
        return type(a)(_unwrap(x, where) for x in a)
    return a


def _roots(arrays) -> list:
    out = []
    for a in arrays:
        if isinstance(a, np.ndarray):
            out.append(a)
        elif isinstance(a, list | tuple):
            out.extend(_roots(a))
    return out


def _root(a: np.ndarray) -> np.ndarray:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _wrap(res, inputs=()):
    """Wrap a NumPy result as device arrays; count an allocation when it owns new memory
    (a result whose storage is not one of the inputs' storage)."""
    if isinstance(res, np.generic):
        res = np.asarray(res)
    if isinstance(res, np.ndarray):
        dev = _current[-1]
        root = _root(res)
        if not any(_root(i) is root for i in inputs):
            _account(root, dev)
        return ndarray._make(res, dev)
    if isinstance(res, tuple):
        return tuple(_wrap(r, inputs) for r in res)
    if isinstance(res, list):
        return [_wrap(r, inputs) for r in res]
    return res


_accounted: dict[int, tuple] = {}


def _account(root: np.ndarray, dev: int) -> None:
    if id(root) in _accounted:
        return
    COUNTERS.allocs += 1
    n = -(-int(root.nbytes) // 512) * 512  # the pool's 512-byte rounding
    _POOL._alloc(dev, n)
    _accounted[id(root)] = (dev, n)
    for h in _HOOKS:
        h.malloc_postprocess(device_id=dev, size=int(root.nbytes), mem_size=n,
                             mem_ptr=id(root), pmem_id=0)
    weakref.finalize(root, _release, id(root))


def _release(key: int) -> None:
    dev, n = _accounted.pop(key, (0, 0))
    _POOL._free(dev, n)
    for h in _HOOKS:
        h.free_postprocess(device_id=dev, mem_size=n, mem_ptr=key, pmem_id=0)


_HOOKS: list = []


class MemoryHook:
    """cupy.cuda.MemoryHook: active inside `with hook:`; called after every pool malloc/free."""

    name = "MemoryHook"

    def __enter__(self):
        _HOOKS.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _HOOKS.remove(self)

    def malloc_postprocess(self, **kwargs) -> None:
        pass

    def free_postprocess(self, **kwargs) -> None:
        pass


def _call(fn, args, kwargs, where: str):
    COUNTERS.launches += 1
    out = kwargs.get("out")
    uargs = _unwrap(list(args), where)
    ukw = {k: _unwrap(v, where) for k, v in kwargs.items()}
    res = fn(*uargs, **ukw)
    if out is not None:
        return out
    return _wrap(res, _roots(uargs) + _roots(list(ukw.values())))


class _DeviceRef:
    def __init__(self, i: int) -> None:
        self.id = i

    def __repr__(self) -> str:
        return f"<CUDA Device {self.id}>"

    def __eq__(self, other) -> bool:
        return getattr(other, "id", None) == self.id

    def __hash__(self) -> int:
        return self.id


_BINOPS = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "truediv": np.true_divide,
    "floordiv": np.floor_divide, "mod": np.remainder, "pow": np.power, "matmul": np.matmul,
    "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
    "lshift": np.left_shift, "rshift": np.right_shift,
}
_CMPOPS = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
           "eq": np.equal, "ne": np.not_equal}


def _operand_ok(o) -> bool:
    return isinstance(o, ndarray | numbers.Number | np.generic | bool | np.ndarray)


class ndarray:  # noqa: N801 - the name CuPy gives it
    """A device array: NumPy storage that refuses to meet host arrays."""

    __slots__ = ("_a", "_dev", "__weakref__")
    __array_priority__ = 100
    __hash__ = None

    def __init__(self, shape, dtype=float) -> None:
        a = np.empty(shape, dtype)
        self._a, self._dev = a, _current[-1]
        _account(a, self._dev)

    @classmethod
    def _make(cls, a: np.ndarray, dev: int):
        self = object.__new__(cls)
        self._a, self._dev = a, dev
        return self

    # ---- what CuPy refuses
    def __array__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use `.get()` "
                        "to construct a NumPy array explicitly.")

    def __array_function__(self, func, types_, args, kwargs):
        raise TypeError(f"NumPy function {func.__module__}.{func.__name__} called on a device "
                        "array; use the cupy function (xp) instead")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        out = kwargs.pop("out", None)
        for a in list(inputs) + list(out or ()):
            if _is_host_array(a):
                _refuse_host(a, f"numpy.{ufunc.__name__}")
        fn = ufunc if method == "__call__" else getattr(ufunc, method)
        if out:
            kwargs["out"] = tuple(out)
            _call(fn, inputs, kwargs, f"numpy.{ufunc.__name__}")
            return out[0] if len(out) == 1 else tuple(out)
        return _call(fn, inputs, kwargs, f"numpy.{ufunc.__name__}")

    # ---- host syncs
    def get(self, stream=None, out=None, order="C", blocking=True) -> np.ndarray:
        _sync("get")
        return np.array(self._a)

    def set(self, arr, stream=None) -> None:
        if isinstance(arr, ndarray):
            raise TypeError("set() takes a host array")
        self._a[...] = arr

    def item(self, *args):
        _sync("item")
        return self._a.item(*args)

    def tolist(self):
        _sync("tolist")
        return self._a.tolist()

    def __float__(self) -> float:
        _sync("float")
        return float(self._a)

    def __int__(self) -> int:
        _sync("int")
        return int(self._a)

    def __index__(self) -> int:
        _sync("index")
        return self._a.__index__()

    def __bool__(self) -> bool:
        _sync("bool")
        return bool(self._a)

    def __complex__(self) -> complex:
        _sync("complex")
        return complex(self._a)

    def __repr__(self) -> str:
        _sync("repr")
        return "device_" + repr(self._a)

    __str__ = __repr__

    # ---- attributes
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    device = property(lambda self: _DeviceRef(self._dev))
    T = property(lambda self: ndarray._make(self._a.T, self._dev))

    @property
    def base(self):
        return None if self._a.base is None else ndarray._make(self._a.base, self._dev)

    def __len__(self) -> int:
        return len(self._a)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __getattr__(self, name):
        if name.startswith("__"):
            # __array_interface__, __array_struct__, __dlpack__...: NumPy would convert
            # through them without asking __array__
            raise AttributeError(name)
        attr = getattr(self._a, name)
        if not callable(attr):
            return _wrap(attr, (self._a,))

        def method(*args, **kwargs):
            a = _unwrap(self, name)
            uargs = _unwrap(list(args), f"ndarray.{name}")
            ukw = {k: _unwrap(v, f"ndarray.{name}") for k, v in kwargs.items()}
            res = attr(*uargs, **ukw)
            if not (isinstance(res, np.ndarray) and _root(res) is _root(a)):
                COUNTERS.launches += 1
            if "out" in kwargs:
                return kwargs["out"]
            return _wrap(res, [a] + _roots(uargs) + _roots(list(ukw.values())))

        return method

    def __getitem__(self, index):
        ui = _unwrap_index(index)
        res = self._a[ui]
        if not (isinstance(res, np.ndarray) and _root(res) is _root(self._a)):
            COUNTERS.launches += 1
        return _wrap(res, [self._a])

    def __setitem__(self, index, value) -> None:
        if _is_host_array(value):
            raise TypeError(f"Unsupported type {type(value)}: cannot assign a host (NumPy) array "
                            "into a device array; move it with cupy.asarray first")
        COUNTERS.launches += 1
        self._a[_unwrap_index(index)] = _unwrap(value, "__setitem__")

    def __neg__(self):
        return _call(np.negative, (self,), {}, "neg")

    def __pos__(self):
        return _call(np.positive, (self,), {}, "pos")

    def __abs__(self):
        return _call(np.absolute, (self,), {}, "abs")

    def __invert__(self):
        return _call(np.invert, (self,), {}, "invert")


def _unwrap_index(index):
    if isinstance(index, tuple):
        return tuple(_unwrap_index(i) for i in index)
    if isinstance(index, ndarray):
        return _unwrap(index, "index")
    return index


def _binop(name, fn, reflected=False, inplace=False):
    def op(self, other):
        if not _operand_ok(other):
            return NotImplemented
        if _is_host_array(other):
            _refuse_host(other, f"operator {name}")
        if inplace:
            _call(fn, (self, other), {"out": self}, name)
            return self
        return _call(fn, (other, self) if reflected else (self, other), {}, name)

    return op


for _n, _f in _BINOPS.items():
    setattr(ndarray, f"__{_n}__", _binop(_n, _f))
    setattr(ndarray, f"__r{_n}__", _binop(_n, _f, reflected=True))
    setattr(ndarray, f"__i{_n}__", _binop(_n, _f, inplace=True))
for _n, _f in _CMPOPS.items():
    setattr(ndarray, f"__{_n}__", _binop(_n, _f))


# ----------------------------------------------------------------------------- the module


class _UFunc:
    def __init__(self, uf) -> None:
        self._uf = uf
        self.__name__ = uf.__name__

    def __call__(self, *args, **kwargs):
        return _call(self._uf, args, kwargs, self.__name__)

    def at(self, a, indices, values=None) -> None:
        COUNTERS.launches += 1
        ua = _unwrap(a, f"{self.__name__}.at")
        ui = _unwrap_index(indices)
        if values is None:
            self._uf.at(ua, ui)
        else:
            self._uf.at(ua, ui, _unwrap(values, f"{self.__name__}.at"))

    def __getattr__(self, name):
        fn = getattr(self._uf, name)
        if not callable(fn):
            return fn
        return lambda *a, **k: _call(fn, a, k, f"{self.__name__}.{name}")


_NOT_DEVICE = {"dtype", "finfo", "iinfo", "result_type", "promote_types", "can_cast", "isscalar",
               "issubdtype", "shape", "ndim", "size"}


def asarray(a, dtype=None, order=None, *, blocking=False):
    if isinstance(a, ndarray):
        if a._dev != _current[-1]:
            return _wrap(np.array(a._a, dtype=dtype), ())
        if dtype is None or np.dtype(dtype) == a.dtype:
            return a
        return a.astype(dtype)
    COUNTERS.launches += 1
    return _wrap(np.array(a, dtype=dtype, order=order or "K"), ())


def array(a, dtype=None, copy=True, order="K", ndmin=0):
    if isinstance(a, ndarray):
        COUNTERS.launches += 1  # a copy, from another device too (peer copy)
        return _wrap(np.array(a._a, dtype=dtype, copy=True, ndmin=ndmin), ())
    COUNTERS.launches += 1
    return _wrap(np.array(a, dtype=dtype, order=order, ndmin=ndmin), ())


def asnumpy(a, stream=None, order="C", out=None, blocking=True):
    if isinstance(a, ndarray):
        return a.get()
    return np.asarray(a)


def get_array_module(*args):
    return _MODULE if any(isinstance(a, ndarray) for a in args) else np


def ascontiguousarray(a, dtype=None):
    ua = _unwrap(a, "ascontiguousarray")
    if ua.flags.c_contiguous and (dtype is None or np.dtype(dtype) == ua.dtype):
        return a
    return _call(np.ascontiguousarray, (a,), {"dtype": dtype}, "ascontiguousarray")


# ----------------------------------------------------------------------------- custom kernels


def _twin(name: str):
    from pocket.train import backend

    twin = backend.KERNEL_TWINS.get(name.split("<", 1)[0])
    if twin is None:
        raise RuntimeError(f"gpu_sim: kernel {name!r} has no NumPy twin in "
                           "pocket.train.backend.KERNEL_TWINS")
    return twin


def _params(spec: str) -> list[tuple[str, str]]:
    out = []
    for part in spec.split(","):
        part = part.strip()
        if part:
            typ, name = part.rsplit(None, 1)
            out.append((typ.replace("raw ", "").strip(), name))
    return out


_CTYPES = {"float16": np.float16, "half": np.float16, "float32": np.float32,
           "float": np.float32, "float64": np.float64, "double": np.float64,
           "int32": np.int32, "int": np.int32, "int64": np.int64, "uint32": np.uint32,
           "uint64": np.uint64, "bool": np.bool_, "int8": np.int8, "uint8": np.uint8}


class ElementwiseKernel:
    def __init__(self, in_params, out_params, operation, name="kernel", **kwargs) -> None:
        self.name = name
        self.ins, self.outs = _params(in_params), _params(out_params)
        self.operation = operation
        self.twin = _twin(name)

    def __call__(self, *args, size=None, **kwargs):
        n_in, n_out = len(self.ins), len(self.outs)
        if len(args) not in (n_in, n_in + n_out):
            raise TypeError(f"{self.name}: wrong number of arguments ({len(args)})")
        COUNTERS.launches += 1
        types_: dict[str, np.dtype] = {}
        arrays = []
        for (typ, pname), a in zip(self.ins + self.outs, args):
            if isinstance(a, ndarray):
                ua = _unwrap(a, self.name)
                if typ in _CTYPES:
                    if ua.dtype != np.dtype(_CTYPES[typ]):
                        raise TypeError(f"{self.name}: {pname} is {ua.dtype}, wants {typ}")
                else:
                    seen = types_.setdefault(typ, ua.dtype)
                    if seen != ua.dtype:
                        raise TypeError(f"{self.name}: type {typ} is both {seen} and {ua.dtype} "
                                        f"(argument {pname})")
                arrays.append(ua)
            elif _is_host_array(a):
                _refuse_host(a, self.name)
        shape = np.broadcast_shapes(*(a.shape for a in arrays)) if arrays else (size,)
        uargs = []
        for (typ, _), a in zip(self.ins, args[:n_in]):
            if isinstance(a, ndarray):
                uargs.append(a._a)
            else:
                dt = _CTYPES.get(typ) or types_.get(typ)
                if dt is None:
                    raise TypeError(f"{self.name}: cannot infer type {typ} from scalars")
                uargs.append(np.dtype(dt).type(a))
        outs = []
        for k, (typ, _) in enumerate(self.outs):
            if len(args) > n_in:
                outs.append(args[n_in + k])
            else:
                dt = _CTYPES.get(typ) or types_.get(typ)
                outs.append(_wrap(np.empty(shape, dt), ()))
        self.twin(*uargs, *(o._a for o in outs))
        return outs[0] if n_out == 1 else tuple(outs)


class ReductionKernel:
    def __init__(self, in_params, out_params, map_expr, reduce_expr, post_map_expr, identity,
                 name="reduce_kernel", **kwargs) -> None:
        self.name = name
        self.twin = _twin(name)

    def __call__(self, *args, axis=None, keepdims=False, **kwargs):
        COUNTERS.launches += 1
        res = self.twin(*_unwrap(list(args), self.name), axis=axis, keepdims=keepdims)
        return _wrap(res, ())


class RawKernel:
    def __init__(self, code: str, name: str, options=(), backend="nvrtc", **kwargs) -> None:
        self.code, self.name, self.options = code, name, options
        self.twin = _twin(name)

    def __call__(self, grid, block, args, shared_mem=0, **kwargs) -> None:
        COUNTERS.launches += 1
        uargs = []
        for a in args:
            if isinstance(a, ndarray):
                if not a._a.flags.c_contiguous:
                    raise ValueError(f"{self.name}: a RawKernel pointer argument must be "
                                     "C-contiguous")
                uargs.append(_unwrap(a, self.name))
            elif _is_host_array(a):
                _refuse_host(a, self.name)
            else:
                uargs.append(a)
        self.twin(tuple(grid), tuple(block), *uargs)


class RawModule:
    def __init__(self, code: str | None = None, options=(), name_expressions=None, **kwargs):
        self.code, self.options = code, options
        self.name_expressions = list(name_expressions or ())

    def get_function(self, name: str) -> RawKernel:
        if "<" in name and name not in self.name_expressions:
            raise RuntimeError(f"{name} is not one of the module's name_expressions")
        return RawKernel(self.code, name, self.options)


# ----------------------------------------------------------------------------- random


class _Generator:
    created = 0

    def __init__(self, seed=None) -> None:
        _Generator.created += 1
        self._g = np.random.default_rng(seed)

    def random(self, size=None, dtype=np.float64, out=None):
        COUNTERS.launches += 1
        return _wrap(self._g.random(size, dtype=dtype), ())

    def standard_normal(self, size=None, dtype=np.float64, out=None):
        COUNTERS.launches += 1
        return _wrap(self._g.standard_normal(size, dtype=dtype), ())


def _random_module():
    r = types.SimpleNamespace()
    r.default_rng = _Generator
    r.Generator = _Generator
    return r


# ----------------------------------------------------------------------------- events, streams


class Event:
    def __init__(self, block=False, disable_timing=False, interprocess=False) -> None:
        import time

        self._time = time
        self.t = None

    def record(self, stream=None) -> None:
        self.t = self._time.perf_counter()

    def synchronize(self) -> None:
        _sync("Event.synchronize")


def get_elapsed_time(start: Event, end: Event) -> float:
    return (end.t - start.t) * 1e3


class _Stream:
    ptr = 0  # the legacy default stream

    def synchronize(self) -> None:
        _sync("Stream.synchronize")


class _ModuleType(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        attr = getattr(np, name)
        if isinstance(attr, np.ufunc):
            wrapped = _UFunc(attr)
        elif isinstance(attr, types.ModuleType):
            wrapped = _namespace(attr, f"cupy.{name}")
        elif callable(attr) and not isinstance(attr, type) and name not in _NOT_DEVICE:
            def wrapped(*args, _fn=attr, _name=name, **kwargs):
                return _call(_fn, args, kwargs, _name)
        else:
            wrapped = attr
        setattr(self, name, wrapped)
        return wrapped


def _namespace(mod, qual):
    ns = types.SimpleNamespace()
    for k in dir(mod):
        v = getattr(mod, k)
        if callable(v) and not isinstance(v, type) and not k.startswith("_"):
            setattr(ns, k, (lambda _fn, _k: lambda *a, **kw: _call(_fn, a, kw, f"{qual}.{_k}"))(v, k))
    return ns


def _build():
    m = _ModuleType("cupy")
    m.__doc__ = __doc__
    m.__version__ = "14.0.0-gpu_sim"
    m.ndarray = ndarray
    m.asarray, m.array, m.asnumpy = asarray, array, asnumpy
    m.ascontiguousarray = ascontiguousarray
    m.get_array_module = get_array_module
    m.ElementwiseKernel, m.ReductionKernel = ElementwiseKernel, ReductionKernel
    m.RawKernel, m.RawModule = RawKernel, RawModule
    m.get_default_memory_pool = lambda: _POOL
    m.get_default_pinned_memory_pool = lambda: types.SimpleNamespace(free_all_blocks=lambda: None)
    m.random = _random_module()
    memory = types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError)
    m.cuda = types.SimpleNamespace(
        Device=Device, runtime=_runtime(), memory=memory, Event=Event,
        get_elapsed_time=get_elapsed_time, get_current_stream=lambda: _Stream(),
        MemoryPool=_Pool, MemoryHook=MemoryHook)
    m.is_gpu_sim = True
    return m


_MODULE = _build()


def module():
    return _MODULE


@contextlib.contextmanager
def counting(trace: bool = False):
    """Count syncs/launches/allocations inside the block; yields Counters filled in when the
    block ends."""
    COUNTERS.reset()
    _TRACE_SYNCS[0] = trace
    result = Counters()
    try:
        yield result
    finally:
        _TRACE_SYNCS[0] = False
        # frozen at the end of the block: later syncs (reading the results) do not count
        result.syncs, result.launches, result.allocs = (COUNTERS.syncs, COUNTERS.launches,
                                                        COUNTERS.allocs)
        result.sync_sites = list(COUNTERS.sync_sites)


def reset() -> None:
    """Back to a fresh machine: device 0 current, no pool limits, counters zero."""
    _current[:] = [0]
    _POOL.limit.clear()
    _HOOKS.clear()
    COUNTERS.reset()
    _Generator.created = 0

