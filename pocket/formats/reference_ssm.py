"""Reference meaning of the state-space family (ops_ssm.py): `ssm` as its recurrence, `glu`.

The recurrence is the definition (a state updated one step at a time), written in complex
float64 with a plain loop over time; `ssm_kernel` gives the same map as a convolution kernel,
which the ONNX export writes as a Conv and the tests hold against the recurrence. NumPy only.
"""

from __future__ import annotations

import numpy as np

from pocket.formats import ops


def ssm_discretize(log_dt, log_a_re, a_im, b_re, b_im, c_re, c_im):
    """ZOH: (dA (H, S), W (D, H, S)) in complex128, W = C * dB with dB = (dA - 1) / A * B.

    The output is 2 Re(sum_n W z_t) for the state z_t = dA z_{t-1} + x_t: the recurrence on
    s = dB z, with dB folded into the read-out, so no step divides by it."""
    f = lambda v: np.asarray(v, np.float64)  # noqa: E731
    dt = np.exp(f(log_dt))[:, None]
    a = -np.exp(f(log_a_re)) + 1j * f(a_im)
    da = np.exp(dt * a)
    db = (da - 1.0) / a * (f(b_re) + 1j * f(b_im))
    return da, (f(c_re) + 1j * f(c_im)) * db


def ssm_kernel(params: dict, length: int) -> np.ndarray:
    """The convolution kernels K (D, H, length) float64: K[d, h, l] = 2 Re(sum_n W dA^l)."""
    da, w = ssm_discretize(*(params[k] for k in ("log_dt", "log_a_re", "a_im", "b_re", "b_im",
                                                  "c_re", "c_im")))
    powers = da[:, :, None] ** np.arange(length)  # (H, S, L)
    return 2.0 * np.einsum("dhs,hsl->dhl", w, powers).real


def ssm_scan64(x, log_dt, log_a_re, a_im, b_re, b_im, c_re, c_im, d, bidirectional=False):
    """x (N, L, H) -> y (N, L, H) float64, one time step at a time."""
    x = np.asarray(x, np.float64)
    da, w = ssm_discretize(log_dt, log_a_re, a_im, b_re, b_im, c_re, c_im)
    n, length, h = x.shape
    y = x * np.asarray(d, np.float64)
    for k, steps in enumerate([range(length), reversed(range(length))][:1 + bool(bidirectional)]):
        z = np.zeros((n, h, da.shape[1]), np.complex128)
        for t in steps:
            z = da * z + x[:, t, :, None]
            y[:, t] += 2.0 * (z * w[k]).sum(axis=-1).real
    return y


@ops.register("reference", "ssm")
def ssm(a, x, log_dt, log_a_re, a_im, b_re, b_im, c_re, c_im, d, **_):
    return ssm_scan64(x, log_dt, log_a_re, a_im, b_re, b_im, c_re, c_im, d,
                      a.get("bidirectional", False)).astype(np.float32)


@ops.register("reference", "glu")
def glu(a, x, **_):
    x = np.asarray(x, np.float64)
    first, gate = np.split(x, 2, axis=a.get("axis", -1))
    with np.errstate(over="ignore"):
        return (first / (1.0 + np.exp(-gate))).astype(np.float32)
