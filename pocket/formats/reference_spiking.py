"""The reference of the spiking ops (semantics in pocket/formats/ops_spiking.py).

The synapse follows reference.py's rule (float64, rounded to float32 once: I_t); an int8 weight
is w_q * w_scale per output channel, its sum taken in float64 (exact for 0/1 spikes). The neuron
recurrence and the encoders are defined in float32 and computed so here, step by step, because
a spike is a comparison: every engine must reach the same float32 u_t to emit the same spikes.
"""

from __future__ import annotations

import numpy as np

from pocket.formats import ops


@ops.register("reference", "spike_encode")
def spike_encode(a, x, noise=None, **_):
    """x (N, ...) -> (N, T, ...)."""
    x = np.asarray(x, np.float32)
    steps = a["T"]
    if a["mode"] == "direct":
        return np.repeat(x[:, None], steps, axis=1)
    p = np.clip(x * np.float32(a["gain"]) + np.float32(a["offset"]), np.float32(0), np.float32(1))
    if a["mode"] == "rate":
        return (np.asarray(noise, np.float32)[None] < p[:, None]).astype(np.float32)
    when = np.floor((np.float32(1) - p) * np.float32(steps - 1) + np.float32(0.5))
    t = np.arange(steps, dtype=np.float32).reshape((1, steps) + (1,) * (x.ndim - 1))
    return ((when[:, None] == t) & (p[:, None] > 0)).astype(np.float32)


def _conv64(x: np.ndarray, w: np.ndarray, stride, padding) -> np.ndarray:
    """x (N, C, H, W), w (O, C, kh, kw) float64 -> (N, O, Ho, Wo), one kernel tap at a time."""
    (sh, sw), (ph, pw) = stride, padding
    o, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    ho = (xp.shape[2] - kh) // sh + 1
    wo = (xp.shape[3] - kw) // sw + 1
    out = np.zeros((x.shape[0], o, ho, wo))
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i:i + sh * (ho - 1) + 1:sh, j:j + sw * (wo - 1) + 1:sw]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return out


def _synapse(a, x, w, b, w_scale) -> np.ndarray:
    """x (N, T, ...) -> currents (N, T, ...) float32: the synapse applied at each step."""
    n, steps = x.shape[:2]
    if a["synapse"] == "none":
        return np.asarray(x, np.float32)
    w64 = np.asarray(w, np.float64)
    flat = np.asarray(x, np.float64).reshape((n * steps,) + x.shape[2:])
    if a["synapse"] == "linear":
        y = flat.reshape(n * steps, -1) @ w64.reshape(w.shape[0], -1).T
    else:
        y = _conv64(flat, w64, a["stride"], a["padding"])
    shape = (1, -1) + (1,) * (y.ndim - 2)
    if w.dtype == np.int8:  # the sum of x * w_q, then the channel's scale
        y = y * np.asarray(w_scale, np.float64).reshape(shape)
    if b is not None:
        y = y + np.asarray(b, np.float64).reshape(shape)
    return y.astype(np.float32).reshape((n, steps) + y.shape[1:])


def neurons(a, current: np.ndarray) -> np.ndarray:
    """currents (N, T, ...) float32 -> spikes (N, T, ...), count or mean membrane (N, ...)."""
    beta, theta = np.float32(a["decay"]), np.float32(a["threshold"])
    steps = current.shape[1]
    v = np.zeros_like(current[:, 0])
    if a["output"] == "membrane":
        total = np.zeros_like(v)
        for t in range(steps):
            v = beta * v + current[:, t]
            total = total + v
        return total / np.float32(steps)
    spikes = np.empty_like(current)
    for t in range(steps):
        u = beta * v + current[:, t]
        s = u >= theta
        v = np.where(s, u - theta, u) if a["reset"] == "subtract" else np.where(s, np.float32(0), u)
        spikes[:, t] = s
    return spikes.sum(axis=1, dtype=np.float32) if a["output"] == "count" else spikes


@ops.register("reference", "lif")
def lif(a, x, w=None, b=None, *, w_scale=None):
    """x (N, T, ...) [, w, b] -> see ops_spiking."""
    return neurons(a, _synapse(a, x, w, b, w_scale))
