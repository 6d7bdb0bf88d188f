"""A plan bound to one batch size (Bound) and how the engine makes its calls: the calls
bound once to their kernels' compiled entry points, the caller's input fed to the one call
that reads it, and a team call's run that stops at a deadline (see pools.Pace)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from pocket.infer import pools


@dataclass
class Bound:
    """The plan bound to one batch size: views into the arena and ready-to-call kernels."""

    inputs: dict[str, np.ndarray]
    outputs: list[np.ndarray]
    calls: list[Any] = field(default_factory=list)
    serial_steps: bool = False  # the calls switch thread counts (restore them on an error)
    direct: bool = False  # the kernels are called through their compiled entry points
    # (call, argument, shape): the one argument of all the calls that reads the input, which
    # run() may pass the caller's array instead of copying it into the arena
    feed: tuple | None = None
    # the direct calls around the fed one: (calls before, its function, its arguments before
    # and after the input, calls after), for run()'s common path
    fed_split: tuple | None = None
    steps: list[int] = field(default_factory=list)  # the graph step of each call
    splits: bool = False  # some call splits its work across the threads
    # a plan of 2+ threads with work to split: the same calls on the calling thread alone,
    # and the choice between the two ways (pools.Pace)
    solo: Bound | None = None
    pace: pools.Pace | None = None
    to_solo: list[int] = field(default_factory=list)  # see Engine._solo_twin


def call_all(calls: list, fed: tuple | None) -> None:
    at = -1 if fed is None else fed[0]
    for i, call in enumerate(calls):
        if i == at:
            call_fed(call, fed)
        else:
            call()


def call_fed(call: partial, fed: tuple) -> None:
    """The call with fed[2] in place of its argument fed[1] (see Engine._feed)."""
    args = call.args
    call.func(*args[:fed[1]], fed[2], *args[fed[1] + 1:], **call.keywords)


def feedable(x: np.ndarray) -> bool:
    """Whether a kernel may read x in place of its arena input (see Engine._feed)."""
    flags = x.flags
    return flags.c_contiguous and flags.aligned and flags.writeable


def call_until(calls: list, fed: tuple | None, deadline: float) -> int:
    """call_all, checking the clock after each call: -1 when all ran, else the index of the
    last call that ran once time.perf_counter() passed the deadline (not the last call)."""
    at, last, clock = -1 if fed is None else fed[0], len(calls) - 1, time.perf_counter
    for i, call in enumerate(calls):
        if i == at:
            call_fed(call, fed)
        else:
            call()
        if i < last and clock() > deadline:
            return i
    return -1


def make_direct(bound: Bound, compile_: bool = False) -> None:
    """Bind a plan's calls to their compiled entry points: its kernels compiled or loaded
    already (a first call made them), or here with compile_ (a solo twin's serial kernels,
    so that the first solo call does not stop to compile them)."""
    bound.calls, bound.direct = [direct(c, compile_) for c in bound.calls], True
    if bound.feed is not None and not bound.serial_steps:
        at, arg, _ = bound.feed
        fed = bound.calls[at]
        # (a BLAS call takes its output as a keyword: np.matmul(x, w, out=y))
        func = partial(fed.func, **fed.keywords) if fed.keywords else fed.func
        bound.fed_split = (bound.calls[:at], func, fed.args[:arg], fed.args[arg + 1:],
                           bound.calls[at + 1:])


def direct(call: partial, compile_: bool = False) -> partial:
    """A bound Numba call made straight to the compiled overload for its arguments (compiled
    or loaded from the cache first with compile_).

    NOTE: a dispatcher works out the argument types on every call (~0.2 µs a kernel, a fifth
    of a batch-1 MLP); a bound call's arguments never change, so it is done once here.
    """
    f = call.func
    if not hasattr(f, "overloads") or call.keywords:
        return call
    sig = tuple(f.typeof_pyval(a) for a in call.args)
    if compile_ and sig not in f.overloads:
        f.compile(sig)
    cres = f.overloads.get(sig)
    return partial(cres.entry_point, *call.args) if cres is not None else call


def serial(call: partial) -> partial:
    """The call with its kernel's serial twin (jit.py), or the call itself (no twin)."""
    twin = getattr(call.func, "serial", None)
    return call if twin is None else partial(twin, *call.args, **call.keywords)


def solo(call: partial) -> partial:
    """serial(call) for a solo call (Engine._solo_twin): where the kernel names `one_part`
    (the positions of its per-part scratch arrays, one row a part, whose parts only divide
    outputs that are computed the same way whichever part computes them), those arrays cut to
    their first row, so the serial twin runs the work as one part, as a 1-thread plan's call
    does, and writes the same bytes as the team's parts.

    NOTE: the team's parts one after another cost 0.3-1.1% a call over a 1-thread plan
    (MobileNetV3-small: a GEMM's pixel block packed once per part, its channel groups in two
    runs), which is what two threads under a busy neighbour paid over one."""
    twin = getattr(call.func, "serial", None)
    if twin is None:
        return call
    rows = getattr(call.func, "one_part", ())
    args = tuple(a[:1] if i in rows else a for i, a in enumerate(call.args))
    return partial(twin, *args, **call.keywords)
