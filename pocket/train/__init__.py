"""pocket.train: tensors, autograd, ops, layers, optimizers and memory accounting.

Importing this package never imports CuPy; `backend` does that lazily on first GPU use.
"""

import os

# NOTE: a training step alternates Numba's thread pool (im2col, pooling, batchnorm) with the
# BLAS pool (GEMM). With OpenMP's default spin-waiting the idle pool burns the cores the busy
# one needs: on 2 cores a digits CNN step went from 50 ms to 2 s. Passive waiting must be set
# before the OpenMP runtime starts; a user's own setting wins. (pocket.infer does the same.)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from pocket.train import functional, heap, init, nn, optim  # noqa: E402
from pocket.train.backend import (
    Device,
    get_array_module,
    get_device,
    get_rng_state,
    manual_seed,
    set_rng_state,
    to_device,
    to_numpy,
)
from pocket.train.gradcheck import gradcheck
from pocket.train.memory import MemoryTracker, get_tracker, reset_tracker
from pocket.train.tensor import Parameter, Tensor, enable_grad, no_grad

heap.keep_freed_memory()  # see heap.py: page faults were half of a small model's step

__all__ = [
    "Device", "MemoryTracker", "Parameter", "Tensor", "enable_grad", "functional",
    "get_array_module", "get_device", "get_rng_state", "get_tracker", "gradcheck", "init",
    "manual_seed", "nn", "no_grad", "optim", "reset_tracker", "set_rng_state", "to_device",
    "to_numpy",
]
