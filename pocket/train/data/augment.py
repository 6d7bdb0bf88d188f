"""Batch augmentations: vectorized NumPy over the whole batch, randomness from the caller's rng.

Each takes x (N, C, H, W) float32 and a Generator and returns a new array of the same shape;
the input is never modified (it may be a view of the dataset).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

CROP_PAD = 4


def random_crop(x: np.ndarray, rng: np.random.Generator, pad: int = CROP_PAD) -> np.ndarray:
    """Zero-pad by `pad` on every side, then cut an HxW window at a random offset per sample.

    NOTE: x is already normalized, so the zero padding is the training-set mean colour, not
    black; that is the usual convention (torchvision pads the normalized tensor too).
    """
    # x (N, C, H, W) -> out (N, C, H, W)
    n, _, h, w = x.shape
    padded = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    dy = rng.integers(0, 2 * pad + 1, n)
    dx = rng.integers(0, 2 * pad + 1, n)
    windows = sliding_window_view(padded, (h, w), axis=(2, 3))  # (N, C, 2p+1, 2p+1, H, W)
    return np.ascontiguousarray(windows[np.arange(n), :, dy, dx])


def random_flip(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Mirror each sample left-right with probability 0.5."""
    # x (N, C, H, W) -> out (N, C, H, W)
    flip = rng.random(x.shape[0]) < 0.5
    out = x.copy()
    out[flip] = x[flip, ..., ::-1]
    return out


AUGMENTATIONS: dict[str, Callable[[np.ndarray, np.random.Generator], np.ndarray]] = {
    "crop": random_crop,
    "flip": random_flip,
}
