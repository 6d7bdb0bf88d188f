"""The state-space family in training: `ssm` as a primitive (forward and backward side by side)
and `glu` composed from primitives. The IR meaning is in formats/ops_ssm.py.

Training runs the layer as its equivalent long convolution, not a scan. The kernel
K_l = 2 Re(sum_n C dB dA^l) is one Vandermonde product over (H, S, L), and the convolution
is an FFT per (sample, channel): O(L log L) with every step vectorized in NumPy/CuPy. A
sequential scan would loop over L in Python, and a parallel (associative) scan keeps a complex
state per (N, L, H, S) element, S times the memory of the convolution's (N, L, H). The
recurrence is the reference (formats/reference_ssm.py), and the tests hold the two forms to
1e-6 in float64.

The kernel is built once a step (the forward keeps it, and its parts, for the backward). The
backward goes through the FFT convolution (a correlation each for the input and the
kernel) and then through the kernel to the parameters by the complex chain rule: for a real
loss f and a complex z, write g_z = df/dRe z + i df/dIm z; through a holomorphic w -> z,
g_w = g_z * conj(dz/dw); through a real t -> z, df/dt = Re(conj(g_z) dz/dt).
"""

from __future__ import annotations

from pocket.formats import ops
from pocket.train import backend
from pocket.train import functional as F
from pocket.train.tensor import Tensor, as_tensor, primitive


def fft_length(length: int) -> int:
    """The power of two n >= 2L - 1: a linear convolution of two length-L signals fits in n
    points without wrapping.

    NOTE: NumPy's rfft of (32, 32, L = 104) float32 along the last axis took 1.84 ms at
    n = 2L = 208, 1.87 at 216 (5-smooth), 1.70 at 240, 1.58 at 256 (min of 6 x 40 calls)."""
    return 1 << (2 * length - 2).bit_length()


def _doubling_powers(xp, ez, length: int):
    # ez (H, S) complex -> (H, S, L): ez ** l by doubling, log2(L) vectorized products
    # NOTE: exp(l z) for every l was the kernel's cost (complex exp is not vectorized in
    # NumPy); doubling rounds log2(L) times (~1e-15 in complex128)
    v = xp.empty(ez.shape + (length,), ez.dtype)
    v[..., 0] = 1.0
    m, p = 1, ez
    while m < length:
        c = min(m, length - m)
        v[..., m:m + c] = v[..., :c] * p[..., None]
        p = p * p
        m += c
    return v


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
    v = _doubling_powers(xp, ez, length)  # (H, S, L): dA^l
    k = 2.0 * (w.transpose(1, 0, 2) @ v).real.transpose(1, 0, 2)  # (D, H, L)
    return dict(dt=dt, a=a, z=z, ez=ez, e=e, bc=bc, cc=cc, w=w, v=v, steps=steps), k


# NOTE: the FFTs run along the last axis of (N, H, L) copies: along the strided time axis of
# (N, L, H) NumPy's FFT took a third longer. With U = rfft(u), K_d = rfft(k_d) (n points):
# causal y = k0 * u is irfft(U K0), the anti-causal direction y[t] = sum_j k1[j] u[t + j] is
# irfft(U conj(K1)), and the adjoints swap them: dL/du = irfft(G (conj(K0) + K1)),
# dL/dk0 = irfft(sum_b G conj(U)), dL/dk1 = irfft(sum_b conj(G) U), each kept to [0, L).


def _ssm_fwd(ctx, u, log_dt, log_a_re, a_im, b_re, b_im, c_re, c_im, d, bidirectional=False):
    # u (N, L, H); params (H,), (H, S) x4, (D, H, S) x2, (H,) -> y (N, L, H)
    xp = backend.get_array_module(u)
    params = (log_dt, log_a_re, a_im, b_re, b_im, c_re, c_im)
    length = u.shape[1]
    parts, k = _kernel_parts(xp, *params, length)
    n = fft_length(length)
    kf = xp.fft.rfft(k.astype(u.dtype), n=n, axis=-1)  # (D, H, n/2 + 1)
    uf = xp.fft.rfft(xp.ascontiguousarray(u.transpose(0, 2, 1)), n=n, axis=-1)  # (N, H, n/2+1)
    filt = kf[0] + xp.conj(kf[1]) if bidirectional else kf[0]
    y = xp.fft.irfft(uf * filt, n=n, axis=-1)[..., :length].transpose(0, 2, 1)
    y = (y + u * d).astype(u.dtype)
    ctx.save(u, uf, kf, d, parts.pop("v"), *params)
    ctx.attrs.update(bidirectional=bidirectional, parts=parts)  # (the small (H, S) parts)
    return y


def _ssm_bwd(ctx, gy):
    u, uf, kf, d, v, *params = ctx.saved
    p = ctx.attrs["parts"]
    xp = backend.get_array_module(gy)
    bidir = ctx.attrs["bidirectional"]
    length = u.shape[1]
    n = fft_length(length)
    gf = xp.fft.rfft(xp.ascontiguousarray(gy.transpose(0, 2, 1)), n=n, axis=-1)  # (N, H, n/2+1)
    gu = None
    if ctx.needs[0]:
        filt = xp.conj(kf[0]) + kf[1] if bidir else xp.conj(kf[0])
        gu = xp.fft.irfft(gf * filt, n=n, axis=-1)[..., :length].transpose(0, 2, 1)
        gu = (gu + gy * d).astype(u.dtype)
    gd = (gy * u).sum(axis=(0, 1)) if ctx.needs[8] else None
    if not any(ctx.needs[1:8]):
        return (gu, *([None] * 7), gd)
    cross = [(gf * xp.conj(uf)).sum(axis=0)]  # (H, n/2 + 1)
    if bidir:
        cross.append(xp.conj(cross[0]))  # sum_b conj(G) U
    g_k = xp.fft.irfft(xp.stack(cross), n=n, axis=-1)[..., :length].astype(xp.float64)  # (D, H, L)
    w = p["w"]
    # K = 2 Re(sum_n W V): g_W = 2 sum_l G conj(V); through V = exp(l z), g_z = conj(2 sum W G l V)
    g_w = 2.0 * (g_k.transpose(1, 0, 2) @ xp.conj(v).transpose(0, 2, 1)).transpose(1, 0, 2)
    gv = (g_k * p["steps"]).transpose(1, 0, 2) @ v.transpose(0, 2, 1)  # (H, D, S)
    g_z = xp.conj(2.0 * (w.transpose(1, 0, 2) * gv).sum(axis=1))
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
