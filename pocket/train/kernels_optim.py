"""Numba kernel of the Adam/AdamW update on the CPU: one pass over a parameter, its gradient
and both moments. The NumPy rule in optim.Optimizer._update is its twin (the tests compare
the two bit for bit).

NOTE: the NumPy rule is 9 passes and 4 temporaries a parameter; for a small model the
per-call overhead dominates (the bench transformer's 39 parameters, 69k values, took 0.9 ms
an AdamW step, most of it in ~350 ufunc calls). The scalars come in the parameter's dtype, in
one array built once a step (each scalar argument costs a Numba call ~0.3 us to type), and the
operations run in NumPy's order, without contraction into FMAs, so both give the same bits.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

# hp's entries
DECAY, WD, B1, C1, B2, C2, BC2, EPS, STEP = range(9)


def hyper(dtype, lr: float, wd: float, decoupled: bool, b1: float, b2: float, eps: float,
          step_count: int) -> np.ndarray:
    """adam_step's scalars, rounded to dtype as NumPy rounds a Python float against an array."""
    bc1, bc2 = 1 - b1**step_count, 1 - b2**step_count
    return np.array([1 - lr * wd if wd and decoupled else 1.0, wd, b1, 1 - b1, b2, 1 - b2, bc2,
                     eps, lr / bc1], dtype)


@njit(cache=True)
def adam_step(x, g, m, v, hp, coupled):
    # x, g, m, v (...) one shape and dtype, C-contiguous; hp (9,) as `hyper` -> x, m, v in place:
    #   decoupled: x *= decay;  coupled: d = g + wd x;  m = b1 m + c1 d;  v = b2 v + c2 d^2
    #   x -= step * m / (sqrt(v / bc2) + eps)   (c1 = 1 - b1, c2 = 1 - b2, step = lr / bc1)
    xf, gf, mf, vf = x.reshape(x.size), g.reshape(g.size), m.reshape(m.size), v.reshape(v.size)
    decay, wd, b1, c1, b2, c2 = hp[DECAY], hp[WD], hp[B1], hp[C1], hp[B2], hp[C2]
    bc2, eps, step = hp[BC2], hp[EPS], hp[STEP]
    for i in range(xf.shape[0]):
        xi = xf[i]
        d = gf[i]
        if coupled:
            d = d + wd * xi
        else:
            xi = xi * decay
        mi = mf[i] * b1 + c1 * d
        vi = vf[i] * b2 + c2 * (d * d)
        mf[i] = mi
        vf[i] = vi
        xf[i] = xi - step * (mi / (math.sqrt(vi / bc2) + eps))
