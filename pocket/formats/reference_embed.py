"""The reference of the embedding ops (semantics in pocket/formats/ops_embed.py): float64,
rounded to float32 once."""

from __future__ import annotations

import numpy as np

from pocket.formats import ops


@ops.register("reference", "l2norm")
def l2norm(a, x, **_):
    """x (N, ...) -> x / max(||x||_2 over axis, eps), same shape."""
    x64 = np.asarray(x, np.float64)
    norm = np.sqrt(np.sum(x64 * x64, axis=a["axis"], keepdims=True))
    return (x64 / np.maximum(norm, a["eps"])).astype(np.float32)
