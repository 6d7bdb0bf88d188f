"""conv2d, maxpool2d, avgpool2d: forward and backward side by side.

Convolution is im2col + one GEMM per batch chunk (grouped convs batch the GEMM over groups).
The columns are tap-major, col (C*kh*kw, n*Ho*Wo), so every GEMM is a plain 2-D sgemm:
forward W (O, K) @ col, weight gradient gy (O, m) @ col.T, input gradient W.T @ gy then col2im;
gy and the output are moved between NCHW and (O, n*Ho*Wo) by one copy each.
The chunk bounds the im2col workspace (`CONV_WORKSPACE_BYTES`): on the GPU it keeps a big batch
from allocating a huge column buffer; on the CPU 16 MiB keeps the columns near the cache
between im2col and the GEMM (faster than one whole-batch GEMM) without the many small GEMMs
whose thread hand-offs stall on a busy machine (4 MiB was a little faster on an idle one).
The forward saves only x and w and rebuilds the columns in the backward. Keeping them would
cost kh*kw times x's bytes of activation memory (about the whole of PyTorch's peak on the
CIFAR reference CNN) to save one im2col per conv, a few percent of a step once im2col runs at
copy speed.
CPU loops are Numba kernels (`kernels_cpu`); on the GPU im2col and col2im are one RawKernel
each (`gpu_kernels`, the fallback and test twin of cuDNN) and the GEMMs are cuBLAS.
"""

from __future__ import annotations

import contextlib

import numpy as np

from pocket.train import backend
from pocket.train.memory import get_tracker
from pocket.train.tensor import Tensor, as_tensor, primitive, saved_activations_fp16

CONV_WORKSPACE_BYTES = {"cpu": 16 << 20, "cuda": 256 << 20}


def _pair2(v) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, int | np.integer) else (int(v[0]), int(v[1]))


def _out_size(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def conv_out_hw(h: int, w: int, m) -> int:
    """Output pixels of conv module m (nn.Conv2d) on an H x W image."""
    return (_out_size(h, m.kernel_size[0], m.stride[0], m.padding[0], m.dilation[0])
            * _out_size(w, m.kernel_size[1], m.stride[1], m.padding[1], m.dilation[1]))


def _chunks(n: int, bytes_per_item: int, device: str):
    step = max(1, min(n, CONV_WORKSPACE_BYTES[device] // max(bytes_per_item, 1)))
    for n0 in range(0, n, step):
        yield n0, min(n, n0 + step)


@contextlib.contextmanager
def _temporaries(*arrays):
    """Count a conv chunk's workspace (columns, GEMM results) in the memory report while it
    lives: it is the largest memory a step holds beyond what the graph saves."""
    tracker = get_tracker()
    key = ("conv_workspace", id(arrays[0]))
    tracker.alloc("temporaries", key, sum(int(a.nbytes) for a in arrays))
    try:
        yield
    finally:
        tracker.free("temporaries", key)


def _im2col(x, k, s, p, d, ho, wo):
    # x (n, C, H, W) -> col (C*kh*kw, n*Ho*Wo)
    xp = backend.get_array_module(x)
    n, c = x.shape[:2]
    col = xp.empty((c, k[0], k[1], n, ho, wo), x.dtype)
    if xp is np:
        from pocket.train import kernels_cpu

        kernels_cpu.im2col(np.ascontiguousarray(x), *k, *s, *p, *d, col)
    else:
        backend.gpu_launch("im2col", x.dtype, col.size, backend.contiguous(x), col,
                           *_geometry(x.shape, k, s, p, d, ho, wo))
    return col.reshape(c * k[0] * k[1], n * ho * wo)


def _geometry(shape, k, s, p, d, ho, wo):
    # the int32 geometry arguments of the im2col/col2im kernels
    return tuple(np.int32(v) for v in (*shape, *k, *s, *p, *d, ho, wo))


def _col2im(col, k, s, p, d, ho, wo, gx):
    # col (C*kh*kw, n*Ho*Wo) -> gx (n, C, H, W), written in place
    xp = backend.get_array_module(col)
    n, c = gx.shape[:2]
    col = col.reshape(c, k[0], k[1], n, ho, wo)
    if xp is np:
        from pocket.train import kernels_cpu

        kernels_cpu.col2im(np.ascontiguousarray(col), *k, *s, *p, *d, gx)
    else:
        # one gather kernel (each input element sums the taps that read it); gx is a batch
        # slice of a C-contiguous array, so it is contiguous itself
        backend.gpu_launch("col2im", col.dtype, gx.size, backend.contiguous(col), gx,
                           *_geometry(gx.shape, k, s, p, d, ho, wo))


def _to_nchw(y, b, out):
    # y (O, n*Ho*Wo) -> out (n, O, Ho, Wo) = y + b, written in place
    xp = backend.get_array_module(y)
    n, o = out.shape[:2]
    y = y.reshape(o, n, -1)
    out = out.reshape(n, o, -1)
    if xp is np:
        from pocket.train import kernels_cpu

        kernels_cpu.rows_to_nchw(np.ascontiguousarray(y), np.zeros(o, y.dtype) if b is None else b, out)
    elif b is None:
        out[...] = y.transpose(1, 0, 2)
    else:
        xp.add(y.transpose(1, 0, 2), b[:, None], out=out)


def _to_rows(gy):
    # gy (n, O, Ho, Wo) -> (O, n*Ho*Wo)
    xp = backend.get_array_module(gy)
    n, o = gy.shape[:2]
    gy = gy.reshape(n, o, -1)
    if xp is not np:
        return xp.ascontiguousarray(gy.transpose(1, 0, 2)).reshape(o, -1)
    from pocket.train import kernels_cpu

    rows = np.empty((o, n, gy.shape[2]), gy.dtype)
    kernels_cpu.nchw_to_rows(np.ascontiguousarray(gy), rows)
    return rows.reshape(o, -1)


def _conv2d_fwd(ctx, x, w, b=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    # x (N, C, H, W), w (O, C/g, kh, kw), b (O,) -> out (N, O, Ho, Wo)
    xp = backend.get_array_module(x)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    k = (kh, kw)
    ho = _out_size(h, kh, stride[0], padding[0], dilation[0])
    wo = _out_size(wd, kw, stride[1], padding[1], dilation[1])
    if cg * groups != c or o % groups or ho < 1 or wo < 1:
        raise ValueError(f"conv2d: input {x.shape} does not fit weight {w.shape} "
                         f"with groups={groups}, stride={stride}, padding={padding}")
    wg = w.reshape(groups, o // groups, -1)  # (g, O/g, C/g*kh*kw)
    out = xp.empty((n, o, ho, wo), x.dtype)
    dev = "cpu" if xp is np else "cuda"
    if dev == "cuda" and backend.cudnn_conv("fprop", x, w, out, stride, padding, dilation):
        if b is not None:
            out += b.reshape(1, o, 1, 1)
    else:
        for n0, n1 in _chunks(n, ho * wo * c * kh * kw * x.itemsize, dev):
            col = _im2col(x[n0:n1], k, stride, padding, dilation, ho, wo)  # (K, m)
            y = _grouped_mm(wg, col, groups)
            with _temporaries(col, y):
                _to_nchw(y, b, out[n0:n1])
            del col, y
    ctx.save(x if ctx.needs[1] else None, w if ctx.needs[0] else None)
    ctx.attrs.update(x_shape=x.shape, w_shape=w.shape, k=k, s=stride, p=padding, d=dilation,
                     g=groups, ho=ho, wo=wo, dtype=x.dtype)
    return out


def _grouped_mm(a, b, groups: int):
    # a (g, M, K) with g == groups, b (g*K, P) -> (g*M, P): one GEMM per group
    xp = backend.get_array_module(b)
    if groups == 1:
        return a[0] @ b
    return xp.matmul(a, b.reshape(groups, -1, b.shape[1])).reshape(-1, b.shape[1])


def _conv2d_bwd(ctx, gy):
    x, w = ctx.saved
    at = ctx.attrs
    xp = backend.get_array_module(gy)
    n, c, h, wd = at["x_shape"]
    o = at["w_shape"][0]
    g, k, s, p, d, ho, wo = at["g"], at["k"], at["s"], at["p"], at["d"], at["ho"], at["wo"]
    need_x, need_w = ctx.needs[0], ctx.needs[1]
    need_b = len(ctx.needs) > 2 and ctx.needs[2]
    # NOTE: the weight and bias gradients are summed over the batch chunks in fp32 under fp16
    # (each chunk's GEMM already accumulates in fp32): an fp16 running sum stops growing once
    # it is 2048 times a chunk's share, and a scaled gradient passes 65504.
    acc = np.float32 if at["dtype"] == np.float16 else at["dtype"]
    dt = at["dtype"]
    gx = xp.empty(at["x_shape"], dt) if need_x else None
    dev = "cpu" if xp is np else "cuda"
    gw_done = None
    if dev == "cuda" and (need_x or need_w):
        # cuDNN for what it has an engine for; the chunked loop below does the rest
        gy = backend.contiguous(gy)
        if need_x and backend.cudnn_conv("dgrad", gy, w, gx, s, p, d):
            need_x = False
        if need_w:
            gw_done = xp.empty(at["w_shape"], dt)
            if backend.cudnn_conv("wgrad", x, gy, gw_done, s, p, d):
                need_w = False
            else:
                gw_done = None
    if need_b and not (need_x or need_w):
        gb = gy.sum(axis=(0, 2, 3), dtype=acc).astype(dt, copy=False)
        return gx, gw_done, gb
    gb = xp.zeros(o, acc) if need_b else None
    gw = xp.zeros((g, o // g, c // g * k[0] * k[1]), acc) if need_w else None
    # W^T per group: (g, C/g*kh*kw, O/g)
    wt = w.reshape(g, o // g, -1).transpose(0, 2, 1) if need_x else None
    for n0, n1 in _chunks(n, ho * wo * c * k[0] * k[1] * gy.itemsize, dev):
        gy_r = _to_rows(gy[n0:n1])  # (O, m)
        m = gy_r.shape[1]
        if need_w:
            col = _im2col(x[n0:n1], k, s, p, d, ho, wo)  # (K, m)
            with _temporaries(gy_r, col):
                if g == 1:
                    gw[0] += gy_r @ col.T
                else:
                    gw += xp.matmul(gy_r.reshape(g, -1, m),
                                    col.reshape(g, -1, m).transpose(0, 2, 1))
            del col
        if need_x:
            gcol = _grouped_mm(wt, gy_r, g)  # (C*kh*kw, m)
            with _temporaries(gy_r, gcol):
                _col2im(gcol, k, s, p, d, ho, wo, gx[n0:n1])
            del gcol
        if need_b:
            gb += gy_r.sum(axis=1, dtype=acc)
    if need_w:
        gw_done = gw.reshape(at["w_shape"]).astype(dt, copy=False)
    return gx, gw_done, gb.astype(dt, copy=False) if need_b else None


def _f32_on_cpu(fwd, bwd):
    """Run a primitive's fp16 inputs in fp32 on the CPU, where the Numba kernels and BLAS have
    no float16; on the GPU (CuPy) the arrays go through as they are.

    NOTE: fp16 x fp16 products are exact in fp32, so this is the arithmetic of an fp16 GEMM
    with fp32 accumulation (what tensor cores do); the output is rounded back to fp16. The
    arrays the forward saves are kept as fp16 (exact: they were fp16 to begin with)."""

    def fwd16(ctx, *arrays, **attrs):
        if backend.get_array_module(arrays[0]) is not np or not any(
                a is not None and a.dtype == np.float16 for a in arrays):
            return fwd(ctx, *arrays, **attrs)
        ctx.attrs["fp16_dtypes"] = [None if a is None else a.dtype for a in arrays]
        up = [a.astype(np.float32) if a is not None and a.dtype == np.float16 else a
              for a in arrays]
        with saved_activations_fp16(True):
            out = fwd(ctx, *up, **attrs)
        return out.astype(np.float16)

    def bwd16(ctx, gy):
        dtypes = ctx.attrs.get("fp16_dtypes")
        if dtypes is None:
            return bwd(ctx, gy)
        grads = bwd(ctx, gy.astype(np.float32))
        return tuple(None if g is None else g.astype(dt) for g, dt in zip(grads, dtypes))

    return fwd16, bwd16


_conv2d = primitive("conv2d", *_f32_on_cpu(_conv2d_fwd, _conv2d_bwd))


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1) -> Tensor:
    """2-D cross-correlation, NCHW input and OIHW weight, as torch.nn.functional.conv2d."""
    x = as_tensor(x)
    if x.ndim != 4:
        raise ValueError(f"conv2d wants x (N, C, H, W), got shape {x.shape}")
    kw = dict(stride=_pair2(stride), padding=_pair2(padding), dilation=_pair2(dilation),
              groups=int(groups))
    return _conv2d(x, weight, **kw) if bias is None else _conv2d(x, weight, bias, **kw)


def _pool_geometry(x, k, s, p, d):
    n, c, h, w = x.shape
    if p[0] * 2 > k[0] or p[1] * 2 > k[1]:
        raise ValueError(f"pool padding {p} must be at most half the kernel {k}")
    return (n, c, _out_size(h, k[0], s[0], p[0], d[0]), _out_size(w, k[1], s[1], p[1], d[1]))


def _maxpool_fwd(ctx, x, k=(2, 2), s=(2, 2), p=(0, 0), d=(1, 1)):
    # x (N, C, H, W) -> out (N, C, Ho, Wo); saves the argmax (int32), not x
    xp = backend.get_array_module(x)
    shape = _pool_geometry(x, k, s, p, d)
    if xp is np:
        from pocket.train import kernels_cpu

        out = np.empty(shape, x.dtype)
        arg = np.empty(shape, np.int32)
        xc = np.ascontiguousarray(x)
        if p == (0, 0) and d == (1, 1):
            kernels_cpu.maxpool2d_forward_valid(xc, *k, *s, out, arg)
        else:
            kernels_cpu.maxpool2d_forward(xc, *k, *s, *p, *d, out, arg)
    else:
        out, arg = _maxpool_taps(x, shape, k, s, p, d)
    ctx.save(arg)
    ctx.attrs.update(x_shape=x.shape, dtype=x.dtype, k=k, s=s, p=p, d=d)
    return out


def _maxpool_taps(x, shape, k, s, p, d):
    # GPU path: arg is the winning tap index i*kw+j, compared tap by tap
    xp = backend.get_array_module(x)
    ho, wo = shape[2:]
    xpad = xp.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])), constant_values=-xp.inf)
    out = xp.full(shape, -xp.inf, x.dtype)
    arg = xp.zeros(shape, np.int32)
    for i in range(k[0]):
        for j in range(k[1]):
            h0, w0 = i * d[0], j * d[1]
            tap = xpad[:, :, h0:h0 + s[0] * (ho - 1) + 1:s[0], w0:w0 + s[1] * (wo - 1) + 1:s[1]]
            # NOTE: a NaN tap wins (tap != tap), as on the CPU and in PyTorch: dropping it
            # would hide an fp16 overflow from the loss scaler.
            better = (tap > out) | (tap != tap)
            out = xp.where(better, tap, out)
            arg = xp.where(better, i * k[1] + j, arg)
    return out, arg


def _maxpool_bwd(ctx, gy):
    (arg,) = ctx.saved
    at = ctx.attrs
    xp = backend.get_array_module(gy)
    if xp is np:
        from pocket.train import kernels_cpu

        gx = np.empty(at["x_shape"], at["dtype"])
        kernels_cpu.maxpool2d_backward(np.ascontiguousarray(gy), arg, gx)
        return (gx,)
    k, s, p, d = at["k"], at["s"], at["p"], at["d"]
    n, c, h, w = at["x_shape"]
    ho, wo = gy.shape[2:]
    gpad = xp.zeros((n, c, h + 2 * p[0], w + 2 * p[1]), gy.dtype)
    for i in range(k[0]):
        for j in range(k[1]):
            h0, w0 = i * d[0], j * d[1]
            gpad[:, :, h0:h0 + s[0] * (ho - 1) + 1:s[0], w0:w0 + s[1] * (wo - 1) + 1:s[1]] += (
                gy * (arg == i * k[1] + j))
    return (gpad[:, :, p[0]:p[0] + h, p[1]:p[1] + w],)


def _avgpool_fwd(ctx, x, k=(2, 2), s=(2, 2), p=(0, 0), include_pad=True):
    # x (N, C, H, W) -> out (N, C, Ho, Wo); saves nothing
    xp = backend.get_array_module(x)
    shape = _pool_geometry(x, k, s, p, (1, 1))
    ctx.attrs.update(x_shape=x.shape, dtype=x.dtype, k=k, s=s, p=p, include_pad=include_pad)
    if xp is np:
        from pocket.train import kernels_cpu

        out = np.empty(shape, x.dtype)
        kernels_cpu.avgpool2d_forward(np.ascontiguousarray(x), *k, *s, *p, include_pad, out)
        return out
    return _avgpool_taps(x, shape, k, s, p, include_pad)


def _avgpool_divisor(xp, shape, hw, k, s, p, include_pad, dtype):
    if include_pad:
        return k[0] * k[1]
    ones = xp.ones((1, 1) + hw, dtype)
    return _avgpool_taps(ones, (1, 1) + shape[2:], k, s, p, True) * (k[0] * k[1])


def _avgpool_taps(x, shape, k, s, p, include_pad):
    # GPU path: sum of strided taps over the zero-padded input
    xp = backend.get_array_module(x)
    ho, wo = shape[2:]
    xpad = xp.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])))
    out = xp.zeros(shape, x.dtype)
    for i in range(k[0]):
        for j in range(k[1]):
            out += xpad[:, :, i:i + s[0] * (ho - 1) + 1:s[0], j:j + s[1] * (wo - 1) + 1:s[1]]
    return out / _avgpool_divisor(xp, shape, x.shape[2:], k, s, p, include_pad, x.dtype)


def _avgpool_bwd(ctx, gy):
    at = ctx.attrs
    k, s, p, inc = at["k"], at["s"], at["p"], at["include_pad"]
    xp = backend.get_array_module(gy)
    if xp is np:
        from pocket.train import kernels_cpu

        gx = np.empty(at["x_shape"], at["dtype"])
        kernels_cpu.avgpool2d_backward(np.ascontiguousarray(gy), *k, *s, *p, inc, gx)
        return (gx,)
    n, c, h, w = at["x_shape"]
    ho, wo = gy.shape[2:]
    g = gy / _avgpool_divisor(xp, gy.shape, (h, w), k, s, p, inc, gy.dtype)
    gpad = xp.zeros((n, c, h + 2 * p[0], w + 2 * p[1]), gy.dtype)
    for i in range(k[0]):
        for j in range(k[1]):
            gpad[:, :, i:i + s[0] * (ho - 1) + 1:s[0], j:j + s[1] * (wo - 1) + 1:s[1]] += g
    return (gpad[:, :, p[0]:p[0] + h, p[1]:p[1] + w],)


_maxpool2d = primitive("maxpool2d", *_f32_on_cpu(_maxpool_fwd, _maxpool_bwd))
_avgpool2d = primitive("avgpool2d", *_f32_on_cpu(_avgpool_fwd, _avgpool_bwd))


def maxpool2d(x, kernel_size, stride=None, padding=0, dilation=1) -> Tensor:
    k = _pair2(kernel_size)
    s = k if stride is None else _pair2(stride)
    return _maxpool2d(as_tensor(x), k=k, s=s, p=_pair2(padding), d=_pair2(dilation))


def avgpool2d(x, kernel_size, stride=None, padding=0, count_include_pad: bool = True) -> Tensor:
    k = _pair2(kernel_size)
    s = k if stride is None else _pair2(stride)
    return _avgpool2d(as_tensor(x), k=k, s=s, p=_pair2(padding), include_pad=count_include_pad)
