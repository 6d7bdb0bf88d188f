"""Keep freed memory in the C heap between training steps (glibc only).

NOTE: a CPU training step allocates and frees the same few MiB of activations and gradients
every step, in blocks of 100 KiB to a few MiB. glibc serves blocks above its mmap threshold
(128 KiB, raised on the fly up to 32 MiB after such a block is freed) with a fresh mmap and
gives the top of the heap back to the OS once more than the trim threshold is free there, so
which blocks come back as fresh zero pages changes from run to run: the bench transformer
step (bench/seq_train.py, 13 ms without faults) took 850-970 minor page faults a step
(3.4-3.9 MiB of new pages) and 23-33 ms in some processes. A fixed mmap threshold at glibc's
ceiling and a trim threshold above a step's working set keep the pages mapped once touched.
The peak RSS stays what the step needs; what is freed stays mapped for the next step.
`POCKET_MALLOC=default` leaves the allocator as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit)
TRIM_THRESHOLD = 256 << 20

_done: list = []


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds once a process; True when they were set."""
    if _done:
        return _done[0]
    ok = False
    if sys.platform.startswith("linux") and os.environ.get("POCKET_MALLOC", "") != "default":
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            mallopt = libc.mallopt
        except (OSError, AttributeError):  # not glibc (musl has no mallopt to call)
            mallopt = None
        if mallopt is not None:
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            ok = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
                mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    _done.append(ok)
    return ok
