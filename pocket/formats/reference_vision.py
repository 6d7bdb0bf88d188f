"""The executable meaning of the vision ops (see reference.py's conventions): clip and silu (also
as the activation a conv2d/linear fuses), broadcast mul, channel_shuffle and slice (f32 or i8).

A fused clip has no `min` on the layer (ops.py: it fuses only at min 0), hence the default.
reference.py imports this module at its end; it imports nothing from reference.py (the formats
package keeps its imports acyclic), so the two helpers below are reference.py's twins.
"""

from __future__ import annotations

import numpy as np

from pocket.formats import ops


def _f64(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float64)


def _f32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x).astype(np.float32)


def _elementwise(name: str):
    """fn64(x float64, attrs) -> float64 becomes op `name`'s reference fn(attrs, x) -> float32;
    `fn.f64` is the float64 form a fused layer applies (as reference._elementwise)."""

    def deco(fn64):
        def op(a, x, **_):
            return _f32(fn64(_f64(x), a))

        op.f64 = fn64
        op.__name__ = op.__qualname__ = name
        return ops.register("reference", name)(op)

    return deco


@_elementwise("clip")
def clip(x, a):
    return np.clip(x, a.get("min", 0.0), a.get("max", 6.0))  # NaN stays NaN


@_elementwise("silu")
def silu(x, a):
    with np.errstate(over="ignore"):  # exp(-x) = inf for x < -709 gives -0, as it should
        return x / (1.0 + np.exp(-x))


@ops.register("reference", "mul")
def mul(a, x, y, **_):
    return _f32(_f64(x) * _f64(y))


@ops.register("reference", "channel_shuffle")
def channel_shuffle(a, x, **_):
    """x (N, C, H, W) -> (N, C, H, W): output channel i*g + k is input channel k*(C/g) + i."""
    n, c, h, w = x.shape
    g = a["groups"]
    return np.ascontiguousarray(x.reshape(n, g, c // g, h, w).swapaxes(1, 2).reshape(n, c, h, w))


@ops.register("reference", "slice")
def slice_(a, x, **_):
    index = [slice(None)] * x.ndim
    index[a.get("axis", 1)] = slice(a["start"], a["end"])
    return np.ascontiguousarray(x[tuple(index)])
