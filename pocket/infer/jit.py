"""The decorator of every engine kernel: one Python function, two compiled twins.

`kernel(fn)` is `fn` compiled with parallel=True: its `prange` loops share Numba's thread pool.
`kernel(fn).serial` is the same code with `prange` as a plain loop. Waking the pool costs ~1 µs
a call even with one thread (and switching its size another ~1 µs), more than many calls of a
batch-1 plan do; the engine binds the serial twin for those (see engine._PARALLEL_WORK).

Both cache on disk (next to the package, or under NUMBA_CACHE_DIR) and compile on first use,
so a plan that only ever runs serially never compiles or loads the parallel twins.
"""

from __future__ import annotations

import types

from numba import njit


def kernel(fn=None, *, contract: bool = False, reassoc: bool = False):
    """contract=True lets LLVM fuse a multiply and an add into one FMA (one rounding, not
    two: the float32 results move by rounding only), nothing else of fast-math: NaN and
    infinities keep IEEE semantics. Without FMA, x86 runs a multiply and an add per tap.
    reassoc=True lets it reorder a sum (a float64 reduction then runs on vector lanes: the
    sum moves by float64 rounding only), again nothing else."""
    if fn is None:
        return lambda f: kernel(f, contract=contract, reassoc=reassoc)
    math = {flag for flag, on in (("contract", contract), ("reassoc", reassoc)) if on} or False
    twin = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__ + "_serial",
                              fn.__defaults__, fn.__closure__)
    # NOTE: its own qualified name, so the twins keep separate entries in the on-disk cache
    twin.__qualname__ = fn.__qualname__ + "_serial"
    twin.__module__, twin.__doc__ = fn.__module__, fn.__doc__
    par = njit(cache=True, parallel=True, fastmath=math)(fn)
    par.serial = njit(cache=True, fastmath=math)(twin)
    return par
