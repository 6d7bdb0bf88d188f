"""Engine kernels of the embedding family: `l2norm`. Twin of formats/reference_embed.py."""

from __future__ import annotations

import math

import numpy as np
from numba import prange

from pocket.infer.jit import kernel


@kernel
def l2norm(out, x, eps):
    """x (A, L, B) -> out (A, L, B) = x / max(||x|| along L, eps), the sum in float64."""
    a, length, b = x.shape
    for r in prange(a * b):
        i, k = r // b, r % b
        s = 0.0
        for j in range(length):
            v = np.float64(x[i, j, k])
            s += v * v
        d = max(math.sqrt(s), eps)
        for j in range(length):
            out[i, j, k] = np.float32(np.float64(x[i, j, k]) / d)
