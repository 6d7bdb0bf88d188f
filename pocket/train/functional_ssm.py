"""The state-space family in training: `ssm` as a primitive (forward and backward side by side)
and `glu` composed from primitives. The IR meaning is in formats/ops_ssm.py.

Training runs the layer as its equivalent long convolution, not a scan. The kernel
K_l = 2 Re(sum_n C dB dA^l) is one Vandermonde product over (H, S, L), and the convolution
is an FFT per (sample, channel): O(L log L) with every step vectorized in NumPy/CuPy. A
sequential scan would loop over L in Python, and a parallel (associative) scan keeps a complex
state per (N, L, H, S) element, S times the memory of the convolution's (N, L, H). The
recurrence is the reference (formats/reference_ssm.py), and the tests hold the two forms to
1e-6 in float64.

The backward goes through the FFT convolution (a correlation each for the input and the
kernel) and then through the kernel to the parameters by the complex chain rule: for a real
loss f and a complex z, write g_z = df/dRe z + i df/dIm z; through a holomorphic w -> z,
g_w = g_z * conj(dz/dw); through a real t -> z, df/dt = Re(conj(g_z) dz/dt).
"""

from __future__ import annotations

from pocket.formats import ops
from pocket.train import backend
from pocket.train import functional as F
from pocket.train.tensor import Tensor, as_tensor, primitive


def _causal_conv(xp, k, u, n: int):
    # k (L, H) real, u (N, L, H) -> (N, L, H): y[t] = sum_{j <= t} k[j] u[t - j]
    length = u.shape[1]
    kf = xp.fft.rfft(k, n=n, axis=0)
    return xp.fft.irfft(xp.fft.rfft(u, n=n, axis=1) * kf, n=n, axis=1)[:, :length]


def _correlate(xp, g, u, n: int):
    # g, u (N, L, H) -> c (L, H): c[j] = sum_b sum_t g[b, t] u[b, t - j]
    length = u.shape[1]
    prod = (xp.fft.rfft(g, n=n, axis=1) * xp.conj(xp.fft.rfft(u, n=n, axis=1))).sum(axis=0)
    return xp.fft.irfft(prod, n=n, axis=0)[:length]


def _kernel_parts(xp, log_dt, log_a_re, a_im, b_re, b_im, c_re, c_im, length: int):
    """The discretized layer in complex128 (the kernel is small: H * S * L)."""
    f = lambda v: v.astype(xp.float64)  # noqa: E731
    dt = xp.exp(f(log_dt))[:, None]  # (H, 1)
    a = -xp.exp(f(log_a_re)) + 1j * f(a_im)  # (H, S)
    z = dt * a
    ez = xp.exp(z)
    e = (ez - 1.0) / a  # dB / B
    bc = f(b_re) + 1j * f(b_im)
    cc = f(c_re) + 1j * f(c_im)  # (D, H, S)
    w = cc * (e * bc)
    steps = xp.arange(length, dtype=xp.float64)
    v = xp.exp(z[:, :, None] * steps)  # (H, S, L): dA^l
    k = 2.0 * xp.einsum("dhs,hsl->dhl", w, v).real
    return dict(dt=dt, a=a, z=z, ez=ez, e=e, bc=bc, cc=cc, w=w, v=v, steps=steps), k


def _ssm_fwd(ctx, u, log_dt, log_a_re, a_im, b_re, b_im, c_re, c_im, d, bidirectional=False):
    # u (N, L, H); params (H,), (H, S) x4, (D, H, S) x2, (H,) -> y (N, L, H)
    xp = backend.get_array_module(u)
    params = (log_dt, log_a_re, a_im, b_re, b_im, c_re, c_im)
    length = u.shape[1]
    _, k = _kernel_parts(xp, *params, length)
    k = k.astype(u.dtype)
    n = 2 * length  # zero padding: the circular convolution never wraps
    y = _causal_conv(xp, k[0].T, u, n)
    if bidirectional:
        y = y + _causal_conv(xp, k[1].T, u[:, ::-1], n)[:, ::-1]
    y = (y + u * d).astype(u.dtype)
    ctx.save(u, k, d, *params)
    ctx.attrs["bidirectional"] = bidirectional
    return y


def _ssm_bwd(ctx, gy):
    u, k, d, *params = ctx.saved
    xp = backend.get_array_module(gy)
    bidir = ctx.attrs["bidirectional"]
    length = u.shape[1]
    n = 2 * length
    gu = None
    if ctx.needs[0]:
        # the adjoint of a causal convolution is the anti-causal one: flip, convolve, flip
        gu = _causal_conv(xp, k[0].T, gy[:, ::-1], n)[:, ::-1]
        if bidir:
            gu = gu + _causal_conv(xp, k[1].T, gy, n)
        gu = (gu + gy * d).astype(u.dtype)
    gd = (gy * u).sum(axis=(0, 1)) if ctx.needs[8] else None
    if not any(ctx.needs[1:8]):
        return (gu, *([None] * 7), gd)
    gk = [_correlate(xp, gy, u, n).T]  # (H, L): dLoss/dK[0]
    if bidir:
        gk.append(_correlate(xp, gy[:, ::-1], u[:, ::-1], n).T)
    g_k = xp.stack(gk).astype(xp.float64)  # (D, H, L)
    p, _ = _kernel_parts(xp, *params, length)
    v, w = p["v"], p["w"]
    # K = 2 Re(sum_n W V): g_W = 2 sum_l G conj(V); through V = exp(l z), g_z = conj(2 sum W G l V)
    g_w = 2.0 * xp.einsum("dhl,hsl->dhs", g_k, xp.conj(v))
    g_z = xp.conj(2.0 * xp.einsum("dhs,dhl,hsl->hs", w, g_k * p["steps"], v))
    # W = C * E * B with E = (exp(z) - 1) / A
    g_c = g_w * xp.conj(p["e"] * p["bc"])
    g_e = (g_w * xp.conj(p["cc"] * p["bc"])).sum(axis=0)
    g_b = (g_w * xp.conj(p["cc"] * p["e"])).sum(axis=0)
    a, ez = p["a"], p["ez"]
    g_z = g_z + g_e * xp.conj(ez / a)
    # z = dt * A (dt real); A = -exp(log_a_re) + i a_im; dt = exp(log_dt)
    g_a = g_e * xp.conj(-(ez - 1.0) / (a * a)) + g_z * p["dt"]
    g_dt = (xp.conj(g_z) * a).real.sum(axis=1)
    grads = [g_dt * p["dt"][:, 0], -g_a.real * xp.exp(params[1].astype(xp.float64)), g_a.imag,
             g_b.real, g_b.imag, g_c.real, g_c.imag]
    grads = [g.astype(prm.dtype) if need else None
             for g, prm, need in zip(grads, params, ctx.needs[1:8])]
    return (gu, *grads, gd)


_ssm = primitive("ssm", _ssm_fwd, _ssm_bwd)


def ssm(x, log_dt, log_a_re, a_im, b_re, b_im, c_re, c_im, d,
        bidirectional: bool = False) -> Tensor:
    """The diagonal state-space layer (S4D, ZOH) on x (N, L, H); see formats/ops_ssm.py."""
    x = as_tensor(x)
    params = [as_tensor(p, like=x) for p in (log_dt, log_a_re, a_im, b_re, b_im, c_re, c_im, d)]
    return _ssm(x, *params, bidirectional=bool(bidirectional))


def glu(x, axis: int = -1) -> Tensor:
    """a * sigmoid(b) for the halves a, b of x along `axis` (Dauphin et al. 2017)."""
    x = as_tensor(x)
    ax = axis % x.ndim
    half = x.shape[ax] // 2
    if x.shape[ax] % 2:
        raise ValueError(f"glu splits axis {axis} in halves; its size {x.shape[ax]} is odd")
    lead = (slice(None),) * ax
    return F.mul(x[lead + (slice(0, half),)], F.sigmoid(x[lead + (slice(half, None),)]))


ops.register_table("train", {"ssm": ssm, "glu": glu})
