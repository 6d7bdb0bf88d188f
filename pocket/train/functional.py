"""Primitives with their derivatives side by side, and the ops composed from them.

A primitive is `fwd(ctx, *arrays, **attrs) -> array` plus `bwd(ctx, gy) -> input grads`; the
forward saves (`ctx.save`) only what the backward reads, and only for inputs that need a
gradient (`ctx.needs`). Array code is written once against `xp` (NumPy or CuPy). Conv and pool
live in `pocket.train.conv`; this module re-exports them.
"""

from __future__ import annotations

import math

import numpy as np

from pocket.formats import ops
from pocket.train import backend
from pocket.train.tensor import Tensor, as_tensor, primitive


def _xp(a):
    return backend.get_array_module(a)


def _unbroadcast(g, shape: tuple):
    """Sum g down to `shape`, undoing NumPy broadcasting."""
    if g.shape == shape:
        return g
    lead = g.ndim - len(shape)
    if lead:
        g = g.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, s in enumerate(shape) if s == 1 and g.shape[i] != 1)
    if axes:
        g = g.sum(axis=axes, keepdims=True)
    return g


def _pair(a, b) -> tuple[Tensor, Tensor]:
    if not isinstance(a, Tensor):
        a = as_tensor(a, like=b if isinstance(b, Tensor) else None)
    if not isinstance(b, Tensor):
        b = as_tensor(b, like=a)
    return a, b


# ---------------------------------------------------------------- elementwise arithmetic

def _add_fwd(ctx, a, b):
    ctx.attrs["shapes"] = (a.shape, b.shape)
    return a + b


def _add_bwd(ctx, gy):
    sa, sb = ctx.attrs["shapes"]
    return (_unbroadcast(gy, sa) if ctx.needs[0] else None,
            _unbroadcast(gy, sb) if ctx.needs[1] else None)


def _sub_fwd(ctx, a, b):
    ctx.attrs["shapes"] = (a.shape, b.shape)
    return a - b


def _sub_bwd(ctx, gy):
    sa, sb = ctx.attrs["shapes"]
    return (_unbroadcast(gy, sa) if ctx.needs[0] else None,
            _unbroadcast(-gy, sb) if ctx.needs[1] else None)


def _mul_fwd(ctx, a, b):
    ctx.save(b if ctx.needs[0] else None, a if ctx.needs[1] else None)
    ctx.attrs["shapes"] = (a.shape, b.shape)
    return a * b


def _mul_bwd(ctx, gy):
    b, a = ctx.saved
    sa, sb = ctx.attrs["shapes"]
    return (_unbroadcast(gy * b, sa) if ctx.needs[0] else None,
            _unbroadcast(gy * a, sb) if ctx.needs[1] else None)


def _div_fwd(ctx, a, b):
    out = a / b
    ctx.save(b, out if ctx.needs[1] else None)
    ctx.attrs["shapes"] = (a.shape, b.shape)
    return out


def _div_bwd(ctx, gy):
    b, out = ctx.saved
    sa, sb = ctx.attrs["shapes"]
    ga = gy / b
    # d(a/b)/db = -(a/b)/b
    return (_unbroadcast(ga, sa) if ctx.needs[0] else None,
            _unbroadcast(-ga * out, sb) if ctx.needs[1] else None)


def _neg_fwd(ctx, a):
    return -a


def _neg_bwd(ctx, gy):
    return (-gy,)


def _pow_fwd(ctx, a, p=2.0):
    ctx.save(a)
    ctx.attrs["p"] = p
    return a**p


def _pow_bwd(ctx, gy):
    (a,) = ctx.saved
    p = ctx.attrs["p"]
    return (gy * (p * a ** (p - 1)),)


def _exp_fwd(ctx, a):
    out = _xp(a).exp(a)
    ctx.save(out)
    return out


def _exp_bwd(ctx, gy):
    return (gy * ctx.saved[0],)


def _log_fwd(ctx, a):
    ctx.save(a)
    return _xp(a).log(a)


def _log_bwd(ctx, gy):
    return (gy / ctx.saved[0],)


def _abs_fwd(ctx, a):
    ctx.save(a)
    return _xp(a).abs(a)


def _abs_bwd(ctx, gy):
    return (gy * _xp(gy).sign(ctx.saved[0]),)


def _astype_fwd(ctx, a, dtype=None):
    ctx.attrs["dtype"] = a.dtype
    return a.astype(dtype)


def _astype_bwd(ctx, gy):
    return (gy.astype(ctx.attrs["dtype"]),)


_add = primitive("add", _add_fwd, _add_bwd)
_sub = primitive("sub", _sub_fwd, _sub_bwd)
_mul = primitive("mul", _mul_fwd, _mul_bwd)
_div = primitive("div", _div_fwd, _div_bwd)
neg = primitive("neg", _neg_fwd, _neg_bwd)
_pow = primitive("pow", _pow_fwd, _pow_bwd)
exp = primitive("exp", _exp_fwd, _exp_bwd)
log = primitive("log", _log_fwd, _log_bwd)
abs = primitive("abs", _abs_fwd, _abs_bwd)  # noqa: A001 - NumPy's name
_astype = primitive("astype", _astype_fwd, _astype_bwd)


def add(a, b) -> Tensor:
    return _add(*_pair(a, b))


def sub(a, b) -> Tensor:
    return _sub(*_pair(a, b))


def mul(a, b) -> Tensor:
    return _mul(*_pair(a, b))


def div(a, b) -> Tensor:
    return _div(*_pair(a, b))


def pow(a, p) -> Tensor:  # noqa: A001 - NumPy's name
    """a ** p for a scalar p; a tensor exponent is exp(p * log(a))."""
    if isinstance(p, Tensor):
        return exp(mul(p, log(a)))
    return _pow(as_tensor(a), p=float(p))


def astype(a, dtype) -> Tensor:
    a = as_tensor(a)
    return a if a.dtype == np.dtype(dtype) else _astype(a, dtype=np.dtype(dtype))


# ---------------------------------------------------------------- matmul

def _matmul_fwd(ctx, a, b):
    # a (..., n, k), b (..., k, m) -> out (..., n, m)
    ctx.save(b if ctx.needs[0] else None, a if ctx.needs[1] else None)
    ctx.attrs["shapes"] = (a.shape, b.shape)
    return a @ b


def _matmul_bwd(ctx, gy):
    b, a = ctx.saved
    sa, sb = ctx.attrs["shapes"]
    ga = _unbroadcast(gy @ b.swapaxes(-1, -2), sa) if ctx.needs[0] else None
    gb = _unbroadcast(a.swapaxes(-1, -2) @ gy, sb) if ctx.needs[1] else None
    return ga, gb


_matmul = primitive("matmul", _matmul_fwd, _matmul_bwd)


def matmul(a, b) -> Tensor:
    a, b = _pair(a, b)
    if a.ndim == 1 and b.ndim == 1:
        return reshape(_matmul(reshape(a, (1, -1)), reshape(b, (-1, 1))), ())
    if a.ndim == 1:
        return reshape(_matmul(reshape(a, (1, -1)), b), b.shape[:-2] + b.shape[-1:])
    if b.ndim == 1:
        return reshape(_matmul(a, reshape(b, (-1, 1))), a.shape[:-1])
    return _matmul(a, b)


# ---------------------------------------------------------------- reductions

def _norm_axes(axis, ndim: int) -> tuple:
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, int):
        axis = (axis,)
    return tuple(sorted(a % ndim for a in axis))


def _expand(gy, axes: tuple, keepdims: bool, shape: tuple):
    """Broadcast a reduced gradient back to the input shape."""
    if not keepdims:
        gy = _xp(gy).expand_dims(gy, axes) if axes else gy
    return _xp(gy).broadcast_to(gy, shape)


def _sum_fwd(ctx, a, axis=None, keepdims=False):
    axes = _norm_axes(axis, a.ndim)
    ctx.attrs.update(axes=axes, keepdims=keepdims, shape=a.shape)
    return _xp(a).asarray(a.sum(axis=axes, keepdims=keepdims))


def _sum_bwd(ctx, gy):
    at = ctx.attrs
    return (_expand(gy, at["axes"], at["keepdims"], at["shape"]),)


def _max_fwd(ctx, a, axis=None, keepdims=False):
    axes = _norm_axes(axis, a.ndim)
    out = a.max(axis=axes, keepdims=True)
    ctx.save(a, out)
    ctx.attrs.update(axes=axes, keepdims=keepdims)
    return out if keepdims else _xp(a).asarray(out.reshape(
        tuple(s for i, s in enumerate(a.shape) if i not in axes)))


def _max_bwd(ctx, gy):
    a, out = ctx.saved
    axes, keepdims = ctx.attrs["axes"], ctx.attrs["keepdims"]
    if not keepdims:
        gy = _xp(gy).expand_dims(gy, axes)
    # NOTE: ties share the gradient equally, like torch.amax.
    mask = (a == out).astype(gy.dtype)
    return (mask * (gy / mask.sum(axis=axes, keepdims=True)),)


_sum = primitive("sum", _sum_fwd, _sum_bwd)
_max = primitive("max", _max_fwd, _max_bwd)


def sum(a, axis=None, keepdims: bool = False) -> Tensor:  # noqa: A001 - NumPy's name
    return _sum(as_tensor(a), axis=axis, keepdims=keepdims)


def max(a, axis=None, keepdims: bool = False) -> Tensor:  # noqa: A001 - NumPy's name
    return _max(as_tensor(a), axis=axis, keepdims=keepdims)


def mean(a, axis=None, keepdims: bool = False) -> Tensor:
    a = as_tensor(a)
    n = math.prod(a.shape[i] for i in _norm_axes(axis, a.ndim))
    return mul(sum(a, axis=axis, keepdims=keepdims), 1.0 / n)


# ---------------------------------------------------------------- shape

def _reshape_fwd(ctx, a, shape=()):
    ctx.attrs["shape"] = a.shape
    return a.reshape(shape)


def _reshape_bwd(ctx, gy):
    return (gy.reshape(ctx.attrs["shape"]),)


def _transpose_fwd(ctx, a, axes=None):
    axes = tuple(reversed(range(a.ndim))) if axes is None else tuple(ax % a.ndim for ax in axes)
    ctx.attrs["axes"] = axes
    return a.transpose(axes)


def _transpose_bwd(ctx, gy):
    return (gy.transpose(tuple(np.argsort(ctx.attrs["axes"]))),)


def _has_array_index(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(not (isinstance(i, int | slice) or i is None or i is Ellipsis) for i in items)


def _getitem_fwd(ctx, a, index=None):
    ctx.attrs.update(index=index, shape=a.shape, dtype=a.dtype)
    return a[index]


def _getitem_bwd(ctx, gy):
    at = ctx.attrs
    g = _xp(gy).zeros(at["shape"], at["dtype"])
    if _has_array_index(at["index"]):
        backend.scatter_add(g, at["index"], gy)  # repeated indices accumulate
    else:
        g[at["index"]] = gy
    return (g,)


def _concat_fwd(ctx, *arrays, axis=0):
    ctx.attrs.update(axis=axis, sizes=[a.shape[axis] for a in arrays])
    return _xp(arrays[0]).concatenate(arrays, axis=axis)


def _concat_bwd(ctx, gy):
    axis, sizes = ctx.attrs["axis"], ctx.attrs["sizes"]
    cuts = np.cumsum(sizes)[:-1].tolist()
    return tuple(_xp(gy).split(gy, cuts, axis=axis))


_reshape = primitive("reshape", _reshape_fwd, _reshape_bwd)
_transpose = primitive("transpose", _transpose_fwd, _transpose_bwd)
_getitem = primitive("getitem", _getitem_fwd, _getitem_bwd)
_concat = primitive("concat", _concat_fwd, _concat_bwd)


def reshape(a, shape) -> Tensor:
    return _reshape(as_tensor(a), shape=tuple(shape))


def transpose(a, axes=None) -> Tensor:
    return _transpose(as_tensor(a), axes=axes)


def flatten(a, start_dim: int = 1, end_dim: int = -1) -> Tensor:
    a = as_tensor(a)
    s, e = start_dim % a.ndim, end_dim % a.ndim
    return reshape(a, a.shape[:s] + (math.prod(a.shape[s:e + 1]),) + a.shape[e + 1:])


def getitem(a, index) -> Tensor:
    if isinstance(index, Tensor):
        index = index.data
    elif isinstance(index, tuple):
        index = tuple(i.data if isinstance(i, Tensor) else i for i in index)
    return _getitem(as_tensor(a), index=index)


def concat(tensors, axis: int = 0) -> Tensor:
    tensors = [as_tensor(t) for t in tensors]
    return _concat(*tensors, axis=axis % tensors[0].ndim)


# ---------------------------------------------------------------- activations

# NOTE: a Numba call costs a dispatch (and, when compiled parallel, a thread-pool wake-up:
# milliseconds on a busy machine); below this many elements one NumPy pass is as fast.
_CPU_KERNEL_MIN_SIZE = 1 << 15


def _relu_fwd(ctx, x):
    out = _xp(x).maximum(x, 0)
    ctx.save(out)
    return out


def _relu_bwd(ctx, gy):
    (out,) = ctx.saved
    if (_xp(gy) is np and gy.size >= _CPU_KERNEL_MIN_SIZE and gy.dtype == out.dtype
            and gy.dtype in (np.float32, np.float64)):
        from pocket.train import kernels_cpu

        gx = np.empty(gy.shape, gy.dtype)
        kernels_cpu.relu_backward(np.ascontiguousarray(gy).reshape(-1),
                                  np.ascontiguousarray(out).reshape(-1), gx.reshape(-1))
        return (gx,)
    if _xp(gy) is not np and gy.dtype == out.dtype and gy.dtype in backend.GPU_FLOAT_DTYPES:
        gy = _xp(gy).ascontiguousarray(gy)
        gx = _xp(gy).empty_like(gy)
        backend.gpu_launch("relu_backward", gy.dtype, gy.size, gy,
                           _xp(out).ascontiguousarray(out), gx, np.int64(gy.size))
        return (gx,)
    return (gy * (out > 0),)


def _leaky_relu_fwd(ctx, x, slope=0.01):
    ctx.save(x)
    ctx.attrs["slope"] = slope
    return _xp(x).where(x > 0, x, x * slope)


def _leaky_relu_bwd(ctx, gy):
    (x,) = ctx.saved
    return (_xp(gy).where(x > 0, gy, gy * ctx.attrs["slope"]),)


def _sigmoid_fwd(ctx, x):
    xp = _xp(x)
    # NOTE: exp of -|x| only, so large |x| never overflows.
    e = xp.exp(-xp.abs(x))
    out = xp.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)
    ctx.save(out)
    return out


def _sigmoid_bwd(ctx, gy):
    (out,) = ctx.saved
    return (gy * out * (1 - out),)


def _tanh_fwd(ctx, x):
    out = _xp(x).tanh(x)
    ctx.save(out)
    return out


def _tanh_bwd(ctx, gy):
    (out,) = ctx.saved
    return (gy * (1 - out * out),)


_GELU_C = math.sqrt(2.0 / math.pi)


def _gelu_cpu_kernels(x) -> bool:
    # one fused pass forward and one backward (float32 on a vectorized erf, float64 on math.erf)
    return _xp(x) is np and x.dtype in (np.float32, np.float64)


def _gelu_fwd(ctx, x, approximate="none"):
    xp = _xp(x)
    ctx.attrs["approximate"] = approximate
    if approximate == "none" and _gelu_cpu_kernels(x):
        from pocket.train import kernels_gelu

        if not ctx.needs[0]:
            return kernels_gelu.gelu(x)
        # NOTE: the derivative is saved instead of x (as many bytes): one more exp in the
        # forward spares the backward its erfc and exp (GELU was 14% of a transformer step)
        y, d = kernels_gelu.gelu_and_grad(x)
        ctx.save(d)
        ctx.attrs["saved"] = "grad"
        return y
    ctx.save(x)
    if approximate == "tanh":
        return 0.5 * x * (1 + xp.tanh(_GELU_C * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + backend.erf(x * (1 / math.sqrt(2.0))))


def _gelu_bwd(ctx, gy):
    (x,) = ctx.saved
    xp = _xp(x)
    if ctx.attrs.get("saved") == "grad":  # the CPU forward saved GELU'(x), not x
        return (gy * x.astype(gy.dtype, copy=False),)
    if ctx.attrs["approximate"] == "tanh":
        t = xp.tanh(_GELU_C * (x + 0.044715 * x**3))
        d = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _GELU_C * (1 + 3 * 0.044715 * x * x)
    elif _gelu_cpu_kernels(x) and gy.dtype == x.dtype:
        from pocket.train import kernels_gelu

        return (kernels_gelu.gelu_grad(x, gy),)
    else:
        cdf = 0.5 * (1 + backend.erf(x * (1 / math.sqrt(2.0))))
        pdf = xp.exp(-0.5 * x * x) * (1 / math.sqrt(2 * math.pi))
        d = cdf + x * pdf
    return (gy * d.astype(gy.dtype, copy=False),)


def _hardswish_fwd(ctx, x):
    ctx.save(x)
    return x * _xp(x).clip(x + 3, 0, 6) / 6


def _hardswish_bwd(ctx, gy):
    (x,) = ctx.saved
    xp = _xp(x)
    # NOTE: at the kinks, PyTorch's one-sided choice: 0 up to x = -3, (2x + 3) / 6 below x = 3.
    d = xp.where(x <= -3, 0, xp.where(x < 3, (2 * x + 3) / 6, 1))
    return (gy * d.astype(gy.dtype, copy=False),)


def _hardsigmoid_fwd(ctx, x):
    ctx.save(x)
    return _xp(x).clip(x + 3, 0, 6) / 6


def _hardsigmoid_bwd(ctx, gy):
    (x,) = ctx.saved
    return (gy * ((x > -3) & (x < 3)).astype(gy.dtype) / 6,)


def _dropout_fwd(ctx, x, p=0.5, rng=None):
    mask = backend.dropout_mask(x.shape, x, p, rng)
    ctx.save(mask)
    return x * mask


def _dropout_bwd(ctx, gy):
    return (gy * ctx.saved[0],)


def _softmax_fwd(ctx, x, axis=-1):
    xp = _xp(x)
    e = xp.exp(x - x.max(axis=axis, keepdims=True))
    e /= e.sum(axis=axis, keepdims=True)
    ctx.save(e)
    ctx.attrs["axis"] = axis
    return e


def _softmax_bwd(ctx, gy):
    (out,) = ctx.saved
    return (out * (gy - (gy * out).sum(axis=ctx.attrs["axis"], keepdims=True)),)


def _log_softmax_array(x, axis):
    xp = _xp(x)
    z = x - x.max(axis=axis, keepdims=True)
    return z - xp.log(xp.exp(z).sum(axis=axis, keepdims=True))


def _log_softmax_fwd(ctx, x, axis=-1):
    out = _log_softmax_array(x, axis)
    ctx.save(out)
    ctx.attrs["axis"] = axis
    return out


def _log_softmax_bwd(ctx, gy):
    (out,) = ctx.saved
    return (gy - _xp(out).exp(out) * gy.sum(axis=ctx.attrs["axis"], keepdims=True),)


relu = primitive("relu", _relu_fwd, _relu_bwd)
_leaky_relu = primitive("leaky_relu", _leaky_relu_fwd, _leaky_relu_bwd)
sigmoid = primitive("sigmoid", _sigmoid_fwd, _sigmoid_bwd)
tanh = primitive("tanh", _tanh_fwd, _tanh_bwd)
_gelu = primitive("gelu", _gelu_fwd, _gelu_bwd)
hardswish = ops.register("train", "hardswish")(
    primitive("hardswish", _hardswish_fwd, _hardswish_bwd))  # Howard et al., 2019 (MobileNetV3)
hardsigmoid = ops.register("train", "hardsigmoid")(
    primitive("hardsigmoid", _hardsigmoid_fwd, _hardsigmoid_bwd))
_dropout = primitive("dropout", _dropout_fwd, _dropout_bwd)
_softmax = primitive("softmax", _softmax_fwd, _softmax_bwd)
_log_softmax = primitive("log_softmax", _log_softmax_fwd, _log_softmax_bwd)


def leaky_relu(x, negative_slope: float = 0.01) -> Tensor:
    return _leaky_relu(as_tensor(x), slope=negative_slope)


def gelu(x, approximate: str = "none") -> Tensor:
    if approximate not in ("none", "tanh"):
        raise ValueError("gelu approximate must be 'none' or 'tanh'")
    return _gelu(as_tensor(x), approximate=approximate)


def dropout(x, p: float = 0.5, training: bool = True, rng=None) -> Tensor:
    """Inverted dropout: scale kept units by 1/(1-p) so eval is the identity."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout p must be in [0, 1), got {p}")
    x = as_tensor(x)
    if not training or p == 0.0:
        return x
    return _dropout(x, p=p, rng=rng)


def softmax(x, axis: int = -1) -> Tensor:
    return _softmax(as_tensor(x), axis=axis)


def log_softmax(x, axis: int = -1) -> Tensor:
    return _log_softmax(as_tensor(x), axis=axis)


# ---------------------------------------------------------------- linear and batchnorm

def _linear_fwd(ctx, x, w, b=None):
    # x (..., in), w (out, in), b (out,) -> y (..., out)
    x2 = x.reshape(-1, x.shape[-1])
    y = x2 @ w.T
    if b is not None:
        y += b
    ctx.save(x2 if ctx.needs[1] else None, w if ctx.needs[0] else None)
    ctx.attrs["shape"] = x.shape
    return y.reshape(x.shape[:-1] + (w.shape[0],))


def _linear_bwd(ctx, gy):
    x2, w = ctx.saved
    gy2 = gy.reshape(-1, gy.shape[-1])
    gx = (gy2 @ w).reshape(ctx.attrs["shape"]) if ctx.needs[0] else None
    gw = gy2.T @ x2 if ctx.needs[1] else None
    gb = None
    if len(ctx.needs) > 2 and ctx.needs[2]:
        # NOTE: on the CPU as one GEMV: NumPy's sum down the rows of (N*L, out) took 4x longer
        gb = (np.ones(gy2.shape[0], gy2.dtype) @ gy2 if _xp(gy2) is np and gy2.ndim == 2
              and gy2.dtype in (np.float32, np.float64) else gy2.sum(axis=0))
    return gx, gw, gb


_linear = primitive("linear", _linear_fwd, _linear_bwd)


def linear(x, weight, bias=None) -> Tensor:
    """y = x @ W.T + b, with W (out, in) as in PyTorch and ONNX Gemm(transB=1)."""
    x = as_tensor(x)
    return _linear(x, weight) if bias is None else _linear(x, weight, bias)


def _bn_shape(x) -> tuple:
    # per-channel vectors broadcast against (N, C, ...)
    return (1, x.shape[1]) + (1,) * (x.ndim - 2)


def _bn_cpu_kernels(x) -> bool:
    # the fused Numba kernels: CPU, float32/float64, with a spatial axis (N, C, ...)
    return (_xp(x) is np and x.ndim >= 3 and x.size >= _CPU_KERNEL_MIN_SIZE
            and x.dtype in (np.float32, np.float64))


def _batchnorm_fwd(ctx, x, gamma, beta, running_mean=None, running_var=None, training=True,
                   momentum=0.1, eps=1e-5):
    # x (N, C, ...), gamma/beta (C,) -> y like x
    xp = _xp(x)
    axes = (0,) + tuple(range(2, x.ndim))
    shape = _bn_shape(x)
    m = x.size // x.shape[1]
    if training and _bn_cpu_kernels(x):
        from pocket.train import kernels_cpu

        n, c = x.shape[:2]
        x3 = np.ascontiguousarray(x).reshape(n, c, -1)
        xhat, y = np.empty_like(x3), np.empty_like(x3)
        mean, var = np.empty(c), np.empty(c)
        kernels_cpu.batchnorm_forward(x3, gamma.astype(x.dtype, copy=False),
                                      beta.astype(x.dtype, copy=False), float(eps), xhat, y,
                                      mean, var)
        invstd = (1.0 / np.sqrt(var + eps)).astype(x.dtype)
        xhat, y = xhat.reshape(x.shape), y.reshape(x.shape)
    elif training:
        # NOTE: fp16 statistics are summed in fp32: a sum over N*H*W fp16 values (or their
        # squares) passes 65504 long before the mean does.
        acc = xp.float32 if x.dtype == xp.float16 else x.dtype
        mean = x.mean(axis=axes, dtype=acc)
        xc = x - mean.astype(x.dtype, copy=False).reshape(shape)
        sq = xc.astype(acc, copy=False)
        var = (sq * sq).mean(axis=axes) if m > 0 else xp.zeros_like(mean)
        del sq
        invstd = (1.0 / xp.sqrt(var + eps)).astype(x.dtype, copy=False)
        xhat = xc
        xhat *= invstd.reshape(shape)
        y = xhat * _as(gamma, x).reshape(shape) + _as(beta, x).reshape(shape)
    else:
        mean = running_mean.astype(x.dtype, copy=False)
        var = running_var.astype(x.dtype, copy=False)
        invstd = (1.0 / xp.sqrt(var + eps)).astype(x.dtype, copy=False)
        xhat = x - mean.reshape(shape)
        xhat *= invstd.reshape(shape)
        y = xhat * _as(gamma, x).reshape(shape) + _as(beta, x).reshape(shape)
    if training and running_mean is not None:
        # NOTE: running var is the unbiased estimate, as in PyTorch.
        running_mean *= 1 - momentum
        running_mean += momentum * mean.astype(running_mean.dtype)
        running_var *= 1 - momentum
        running_var += (momentum * m / (m - 1 if m > 1 else 1)) * var.astype(running_var.dtype)
    ctx.save(xhat, invstd, gamma)
    ctx.attrs.update(training=training, axes=axes, shape=shape)
    return y


def _batchnorm_bwd(ctx, gy):
    xhat, invstd, gamma = ctx.saved
    axes, shape = ctx.attrs["axes"], ctx.attrs["shape"]
    if ctx.attrs["training"] and _bn_cpu_kernels(gy) and xhat.dtype == gy.dtype:
        from pocket.train import kernels_cpu

        n, c = gy.shape[:2]
        gx = np.empty((n, c, gy.size // (n * c)), gy.dtype)
        gbeta, ggamma = np.empty(c), np.empty(c)
        kernels_cpu.batchnorm_backward(np.ascontiguousarray(gy).reshape(gx.shape),
                                       np.ascontiguousarray(xhat).reshape(gx.shape),
                                       (gamma * invstd).astype(gy.dtype, copy=False), gx,
                                       gbeta, ggamma)
        return (gx.reshape(gy.shape) if ctx.needs[0] else None,
                ggamma.astype(gamma.dtype) if ctx.needs[1] else None,
                gbeta.astype(gamma.dtype) if ctx.needs[2] else None)
    # NOTE: under fp16 the per-channel sums run in fp32 and the gamma/beta gradients stay fp32
    # (mixed precision keeps BN's parameters fp32): a sum over N*H*W scaled fp16 gradients
    # loses its low bits and can pass 65504.
    acc = np.float32 if gy.dtype == np.float16 else gy.dtype
    gbeta = gy.sum(axis=axes, dtype=acc)
    ggamma = (gy * xhat).sum(axis=axes, dtype=acc)
    gx = None
    if ctx.needs[0]:
        scale = (gamma * invstd).astype(gy.dtype, copy=False).reshape(shape)
        if ctx.attrs["training"]:
            m = gy.size // gy.shape[1]
            # d/dx of (x - mean) * invstd through the batch mean and variance
            gx = scale * (gy - (gbeta / m).astype(gy.dtype, copy=False).reshape(shape)
                          - xhat * (ggamma / m).astype(gy.dtype, copy=False).reshape(shape))
        else:
            gx = gy * scale
    return (gx, ggamma.astype(gamma.dtype, copy=False) if ctx.needs[1] else None,
            gbeta.astype(gamma.dtype, copy=False) if ctx.needs[2] else None)


def _as(a, like):
    return a.astype(like.dtype, copy=False)


_batchnorm = primitive("batchnorm", _batchnorm_fwd, _batchnorm_bwd)


def batchnorm(x, weight, bias, running_mean=None, running_var=None, training: bool = True,
              momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """Batch normalization over all axes but 1; updates running stats in place when training.

    Ioffe & Szegedy, 2015. Eval (training=False) normalizes with the running statistics.
    """
    x = as_tensor(x)
    if not training and running_mean is None:
        raise ValueError("batchnorm in eval mode needs running_mean and running_var")
    return _batchnorm(x, weight, bias, running_mean=running_mean, running_var=running_var,
                      training=training, momentum=momentum, eps=eps)


# ---------------------------------------------------------------- losses

def _cross_entropy_fwd(ctx, x, target=None, label_smoothing=0.0, reduction="mean"):
    # x (N, K) logits, target (N,) int -> loss () or (N,)
    xp = _xp(x)
    n, k = x.shape
    logp = _log_softmax_array(x, 1)
    rows = xp.arange(n)
    loss = -(1 - label_smoothing) * logp[rows, target]
    if label_smoothing:
        loss = loss - (label_smoothing / k) * logp.sum(axis=1)
    probs = xp.exp(logp, out=logp)
    ctx.save(probs, target)
    ctx.attrs.update(ls=label_smoothing, reduction=reduction)
    if reduction == "none":
        return loss
    total = loss.sum()
    return xp.asarray(total / n if reduction == "mean" else total, dtype=x.dtype)


def _cross_entropy_bwd(ctx, gy):
    probs, target = ctx.saved
    n, k = probs.shape
    ls, reduction = ctx.attrs["ls"], ctx.attrs["reduction"]
    g = probs.copy()
    g[_xp(g).arange(n), target] -= 1 - ls
    if ls:
        g -= ls / k
    if reduction == "none":
        g *= gy[:, None]
    else:
        g *= gy / n if reduction == "mean" else gy
    return (g,)


_cross_entropy = primitive("cross_entropy", _cross_entropy_fwd, _cross_entropy_bwd)


def cross_entropy(logits, target, label_smoothing: float = 0.0, reduction: str = "mean"):
    """Softmax cross entropy from logits (N, K) and integer class targets (N,)."""
    if reduction not in ("mean", "sum", "none"):
        raise ValueError("reduction must be 'mean', 'sum' or 'none'")
    logits = as_tensor(logits)
    t = target.data if isinstance(target, Tensor) else target
    t = _xp(logits.data).asarray(t).astype(np.int64, copy=False)
    if logits.ndim != 2 or t.shape != (logits.shape[0],):
        raise ValueError(f"cross_entropy wants logits (N, K) and targets (N,), got "
                         f"{logits.shape} and {t.shape}")
    return _cross_entropy(logits, target=t, label_smoothing=float(label_smoothing),
                          reduction=reduction)


def _reduce(loss: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return mean(loss)
    if reduction == "sum":
        return sum(loss)
    return loss


def mse_loss(pred, target, reduction: str = "mean") -> Tensor:
    pred, target = _pair(pred, target)
    d = sub(pred, target)
    return _reduce(mul(d, d), reduction)


def l1_loss(pred, target, reduction: str = "mean") -> Tensor:
    pred, target = _pair(pred, target)
    return _reduce(abs(sub(pred, target)), reduction)


def _huber_fwd(ctx, d, delta=1.0):
    xp = _xp(d)
    ad = xp.abs(d)
    ctx.save(d)
    ctx.attrs["delta"] = delta
    return xp.where(ad <= delta, 0.5 * d * d, delta * (ad - 0.5 * delta)).astype(d.dtype)


def _huber_bwd(ctx, gy):
    (d,) = ctx.saved
    delta = ctx.attrs["delta"]
    return (gy * _xp(d).clip(d, -delta, delta),)


_huber = primitive("huber", _huber_fwd, _huber_bwd)


def huber_loss(pred, target, delta: float = 1.0, reduction: str = "mean") -> Tensor:
    pred, target = _pair(pred, target)
    return _reduce(_huber(sub(pred, target), delta=float(delta)), reduction)


def global_avgpool(x) -> Tensor:
    """(N, C, H, W) -> (N, C, 1, 1), like ONNX GlobalAveragePool."""
    return mean(x, axis=(2, 3), keepdims=True)


from pocket.train.conv import avgpool2d, conv2d, maxpool2d  # noqa: E402, F401

# The differentiable forward of each IR op (pocket.formats.ops): a registry entry whose op is
# trainable and has no "train" implementation fails tests/formats/test_registry.py.
ops.register_table("train", {
    "linear": linear, "conv2d": conv2d, "batchnorm": batchnorm, "relu": relu,
    "leaky_relu": leaky_relu, "sigmoid": sigmoid, "tanh": tanh, "gelu": gelu,
    "maxpool2d": maxpool2d, "avgpool2d": avgpool2d, "global_avgpool": global_avgpool,
    "flatten": flatten, "reshape": reshape, "add": add, "concat": concat, "dropout": dropout,
    "softmax": softmax,
})

# The vision family as F.<name> too (mul is above; slice, which would shadow the builtin here,
# is functional_vision.slice).
# Op families: their differentiable forwards register themselves in slot "train" on import.
from pocket.train import (  # noqa: E402, F401
    functional_embed,
    functional_seqattn,
    functional_seqconv,
    functional_spiking,
    functional_ssm,
)
from pocket.train.functional_vision import (  # noqa: E402, F401
    channel_shuffle,
    clip,
    relu6,
    silu,
)
