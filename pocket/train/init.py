"""Weight initializers. Each takes an explicit numpy Generator (default: the pocket RNG, see
`backend.manual_seed`) and returns a float32 NumPy array, so a seed fixes every weight."""

from __future__ import annotations

import math

import numpy as np

from pocket.train import backend


def fans(shape: tuple) -> tuple[int, int]:
    """(fan_in, fan_out) for linear (out, in) and conv (O, I, kh, kw) weights."""
    if len(shape) < 2:
        raise ValueError(f"fan needs a weight with at least 2 dims, got shape {shape}")
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def _gain(nonlinearity: str, a: float = 0.0) -> float:
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        return math.sqrt(2.0 / (1 + a * a))
    if nonlinearity == "tanh":
        return 5.0 / 3
    return 1.0


def _rng(rng):
    return rng if rng is not None else backend.default_rng()


def uniform(shape, bound: float, rng=None, dtype=np.float32) -> np.ndarray:
    return _rng(rng).uniform(-bound, bound, size=shape).astype(dtype)


def normal(shape, std: float, rng=None, dtype=np.float32) -> np.ndarray:
    return (_rng(rng).standard_normal(size=shape) * std).astype(dtype)


def zeros(shape, dtype=np.float32) -> np.ndarray:
    return np.zeros(shape, dtype)


def ones(shape, dtype=np.float32) -> np.ndarray:
    return np.ones(shape, dtype)


def kaiming_normal(shape, rng=None, a: float = 0.0, mode: str = "fan_in",
                   nonlinearity: str = "relu") -> np.ndarray:
    """He et al., 2015: std = gain / sqrt(fan)."""
    fan = fans(shape)[0 if mode == "fan_in" else 1]
    return normal(shape, _gain(nonlinearity, a) / math.sqrt(fan), rng)


def kaiming_uniform(shape, rng=None, a: float = 0.0, mode: str = "fan_in",
                    nonlinearity: str = "relu") -> np.ndarray:
    """He et al., 2015: U(-b, b) with b = gain * sqrt(3 / fan)."""
    fan = fans(shape)[0 if mode == "fan_in" else 1]
    return uniform(shape, _gain(nonlinearity, a) * math.sqrt(3.0 / fan), rng)


def xavier_normal(shape, rng=None, gain: float = 1.0) -> np.ndarray:
    """Glorot & Bengio, 2010: std = gain * sqrt(2 / (fan_in + fan_out))."""
    fi, fo = fans(shape)
    return normal(shape, gain * math.sqrt(2.0 / (fi + fo)), rng)


def xavier_uniform(shape, rng=None, gain: float = 1.0) -> np.ndarray:
    fi, fo = fans(shape)
    return uniform(shape, gain * math.sqrt(6.0 / (fi + fo)), rng)
