"""Spiking primitives: the LIF neuron over a time axis with surrogate gradients, and the input
encoders. The IR semantics (and the layout, time on axis 1) are in pocket/formats/ops_spiking.

The step s = H(u - threshold) has no useful derivative; the backward uses a surrogate's
instead (Neftci, Mostafa & Zenke, 2019, "Surrogate Gradient Learning in Spiking Neural
Networks"):

    sigmoid(alpha):     ds/du ~ alpha * sig(alpha x) * (1 - sig(alpha x)),  x = u - threshold
    rectangular(width): ds/du ~ 1/width where |x| < width/2, else 0

`smooth=True` runs the forward with the surrogate itself (sig(alpha x), or the ramp
clip(x/width + 1/2, 0, 1)) in place of the step, so the backward is then the exact derivative
of the forward: what a float64 finite-difference check can verify, for the surrogate alone
(`spike`) and for the whole unrolled layer (`lif`).

The layer's backward is backpropagation through time over the saved membranes u_t (one array
the size of the input: T multiplies the layer's saved activations), through the reset too
(not detached), with gradients for the input current, the decay and the threshold.
"""

from __future__ import annotations

import numpy as np

from pocket.formats import ops
from pocket.train import backend
from pocket.train.tensor import Tensor, as_tensor, primitive

SURROGATES = ("sigmoid", "rectangular")


def _xp(a):
    return backend.get_array_module(a)


def surrogate(name: str, x, param: float, smooth: bool = False):
    """The surrogate's value (smooth) or the step (not smooth), and its derivative, at x."""
    xp = _xp(x)
    if name == "sigmoid":
        sg = 0.5 * (1.0 + xp.tanh(0.5 * param * x))  # the logistic, without exp's overflow
        d = param * sg * (1.0 - sg)
        val = sg if smooth else (x >= 0)
    elif name == "rectangular":
        inside = xp.abs(x) < param / 2
        d = inside / param
        val = xp.clip(x / param + 0.5, 0.0, 1.0) if smooth else (x >= 0)
    else:
        raise ValueError(f"unknown surrogate {name!r}; use {' or '.join(SURROGATES)}")
    return val.astype(x.dtype, copy=False), d.astype(x.dtype, copy=False)


def _spike_fwd(ctx, x, surrogate_name="sigmoid", param=4.0, smooth=False):
    s, d = surrogate(surrogate_name, x, param, smooth)
    ctx.save(d if ctx.needs[0] else None)
    return s


def _spike_bwd(ctx, gy):
    return (gy * ctx.saved[0],)


_spike = primitive("spike", _spike_fwd, _spike_bwd)


def spike(x, surrogate_name: str = "sigmoid", param: float = 4.0, smooth: bool = False) -> Tensor:
    """H(x) forward, the surrogate's derivative backward."""
    return _spike(as_tensor(x), surrogate_name=surrogate_name, param=param, smooth=smooth)


# ---------------------------------------------------------------- the LIF layer


def _lif_fwd(ctx, x, decay, threshold, reset="subtract", surrogate_name="sigmoid", param=4.0,
             smooth=False, membrane=False):
    # x (N, T, ...) currents, decay/threshold 0-d -> spikes (N, T, ...), or u (N, T, ...) when
    # membrane (a non-firing neuron: no threshold, no reset)
    xp = _xp(x)
    # NOTE: a learned decay is clamped to [0, 1] (the IR's range) in the forward, and gets no
    # gradient while clamped, so what trains is what exports
    beta = xp.clip(decay, 0, 1).astype(x.dtype)
    theta = threshold.astype(x.dtype)
    out = xp.empty_like(x)
    u_all = xp.empty_like(x) if any(ctx.needs) and not membrane else None
    v = xp.zeros_like(x[:, 0])
    for t in range(x.shape[1]):
        u = beta * v + x[:, t]
        if membrane:
            out[:, t] = u
            v = u
            continue
        s = (surrogate(surrogate_name, u - theta, param, True)[0] if smooth
             else (u >= theta).astype(x.dtype))
        out[:, t] = s
        if u_all is not None:
            u_all[:, t] = u
        v = u - s * theta if reset == "subtract" else u * (1 - s)
    ctx.attrs.update(reset=reset, surrogate_name=surrogate_name, param=param, smooth=smooth,
                     membrane=membrane, shapes=(decay.shape, threshold.shape))
    ctx.save(out if membrane and ctx.needs[1] else u_all, beta, theta)
    ctx.attrs["decay_inside"] = bool((decay >= 0) & (decay <= 1))
    return out


def _lif_bwd(ctx, gy):
    saved, beta, theta = ctx.saved
    a = ctx.attrs
    xp = _xp(gy)
    gx = xp.empty_like(gy)
    gbeta = xp.zeros((), gy.dtype)
    gtheta = xp.zeros((), gy.dtype)
    gu_next = xp.zeros_like(gy[:, 0])
    steps = gy.shape[1]
    for t in range(steps - 1, -1, -1):
        gv = beta * gu_next  # dL/dv_t through u_{t+1}
        if a["membrane"]:
            gu = gy[:, t] + gv
            if t > 0 and ctx.needs[1]:
                gbeta += (gu * saved[:, t - 1]).sum()
        else:
            u = saved[:, t]
            s, d = surrogate(a["surrogate_name"], u - theta, a["param"], a["smooth"])
            if a["reset"] == "subtract":  # v = u - s * theta
                gs = gy[:, t] - gv * theta
                gu = gv + gs * d
                gtheta -= (gv * s).sum() + (gs * d).sum()
            else:  # v = u * (1 - s)
                gs = gy[:, t] - gv * u
                gu = gv * (1 - s) + gs * d
                gtheta -= (gs * d).sum()
            if t > 0 and ctx.needs[1]:
                up = saved[:, t - 1]
                sp, _ = surrogate(a["surrogate_name"], up - theta, a["param"], a["smooth"])
                vp = up - sp * theta if a["reset"] == "subtract" else up * (1 - sp)
                gbeta += (gu * vp).sum()
        gx[:, t] = gu
        gu_next = gu
    sb, st = a["shapes"]
    return (gx if ctx.needs[0] else None,
            gbeta.reshape(sb) * a["decay_inside"] if ctx.needs[1] else None,
            gtheta.reshape(st) if len(ctx.needs) > 2 and ctx.needs[2] else None)


_lif = ops.register("train", "lif")(primitive("lif", _lif_fwd, _lif_bwd))


def lif(x, decay, threshold, reset: str = "subtract", surrogate_name: str = "sigmoid",
        param: float = 4.0, smooth: bool = False, membrane: bool = False) -> Tensor:
    """Leaky integrate-and-fire neurons over axis 1 of x (N, T, ...): spikes (N, T, ...), or
    with membrane=True the membrane u_t of non-firing neurons. decay and threshold are 0-d
    Tensors (learnable when they require grad)."""
    if reset not in ("subtract", "zero"):
        raise ValueError(f"reset must be 'subtract' or 'zero', got {reset!r}")
    if surrogate_name not in SURROGATES:
        raise ValueError(f"unknown surrogate {surrogate_name!r}; use {' or '.join(SURROGATES)}")
    x = as_tensor(x)
    return _lif(x, as_tensor(decay, like=x), as_tensor(threshold, like=x), reset=reset,
                surrogate_name=surrogate_name, param=float(param), smooth=smooth,
                membrane=membrane)


# ---------------------------------------------------------------- encoders


def encode_array(x, steps: int, mode: str, gain: float, offset: float, noise=None):
    """x (N, ...) -> (N, T, ...) by the IR's spike_encode rule; noise (T, ...) for rate."""
    xp = _xp(x)
    if mode == "direct":
        return xp.broadcast_to(x[:, None], (x.shape[0], steps, *x.shape[1:])).copy()
    p = xp.clip(x * x.dtype.type(gain) + x.dtype.type(offset), 0, 1)
    if mode == "rate":
        return (noise[None].astype(x.dtype) < p[:, None]).astype(x.dtype)
    if mode == "latency":
        when = xp.floor((1 - p) * x.dtype.type(steps - 1) + x.dtype.type(0.5))
        t = xp.arange(steps, dtype=x.dtype).reshape((1, steps) + (1,) * (x.ndim - 1))
        return ((when[:, None] == t) & (p[:, None] > 0)).astype(x.dtype)
    raise ValueError(f"unknown encoding {mode!r}; use direct, rate or latency")


def _encode_fwd(ctx, x, *noise, steps=1, mode="direct", gain=0.25, offset=0.5):
    return encode_array(x, steps, mode, gain, offset, noise[0] if noise else None)


def _encode_bwd(ctx, gy):
    # direct passes the current on, so its gradient is the sum over time; rate and latency
    # are thresholdings with no gradient (the input is data, not a parameter)
    g = gy.sum(axis=1) if ctx.needs[0] else None
    return (g,) + (None,) * (len(ctx.needs) - 1)


_encode = ops.register("train", "spike_encode")(primitive("spike_encode", _encode_fwd,
                                                          _encode_bwd))


def spike_encode(x, steps: int, mode: str = "direct", gain: float = 0.25, offset: float = 0.5,
                 noise=None) -> Tensor:
    x = as_tensor(x)
    ins = (x,) if noise is None else (x, as_tensor(noise, like=x))
    return _encode(*ins, steps=int(steps), mode=mode, gain=float(gain), offset=float(offset))


def poisson_noise(rng: np.random.Generator, shape, like) -> object:
    """Uniform [0, 1) draws for rate coding, from a seeded generator, on `like`'s device."""
    return backend.to_device(rng.random(shape, dtype=np.float32), backend.device_of(like))
