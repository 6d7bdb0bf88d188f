"""pocket.train: tensors, autograd, ops, layers, optimizers and memory accounting.

Importing this package never imports CuPy; `backend` does that lazily on first GPU use.
"""

from pocket.train import functional, init, nn, optim
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

__all__ = [
    "Device", "MemoryTracker", "Parameter", "Tensor", "enable_grad", "functional",
    "get_array_module", "get_device", "get_rng_state", "get_tracker", "gradcheck", "init",
    "manual_seed", "nn", "no_grad", "optim", "reset_tracker", "set_rng_state", "to_device",
    "to_numpy",
]
