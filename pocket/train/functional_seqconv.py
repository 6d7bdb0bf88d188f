"""conv1d, max/avg pool1d and global pooling over time: the sequence-convolution ops in train.

Each 1-D op runs as its 2-D twin on a height-1 view, (N, C, L) -> (N, C, 1, L), so it reuses
conv2d's im2col + GEMM and the pool kernels (CPU Numba and GPU alike) with their backwards;
the reshapes are views. The one new primitive is `pad1d`, the asymmetric zero padding a causal
conv needs ([(K-1)*dilation, 0]) and conv2d does not have: its backward is the slice.
Global pooling over time is mean / max over axis 2 (ties share max's gradient, as torch.amax).
"""

from __future__ import annotations

from pocket.formats import ops
from pocket.train import backend
from pocket.train import functional as F
from pocket.train.tensor import Tensor, as_tensor, primitive


def _int(v, what: str) -> int:
    if isinstance(v, list | tuple):
        if len(v) != 1:
            raise ValueError(f"{what} must be one integer, got {v!r}")
        v = v[0]
    return int(v)


def pads1d(padding) -> tuple[int, int]:
    """An int p (both sides) or [left, right] -> (left, right)."""
    if isinstance(padding, list | tuple):
        if len(padding) != 2:
            raise ValueError(f"conv1d padding must be an int or [left, right], got {padding!r}")
        left, right = int(padding[0]), int(padding[1])
    else:
        left = right = int(padding)
    if left < 0 or right < 0:
        raise ValueError(f"conv1d padding must be >= 0, got {padding!r}")
    return left, right


def _pad1d_fwd(ctx, x, left=0, right=0):
    # x (N, C, L) -> out (N, C, left + L + right), zeros at both ends
    xp = backend.get_array_module(x)
    ctx.attrs.update(left=left, length=x.shape[2])
    out = xp.zeros(x.shape[:2] + (left + x.shape[2] + right,), x.dtype)
    out[:, :, left:left + x.shape[2]] = x
    return out


def _pad1d_bwd(ctx, gy):
    a = ctx.attrs
    return (backend.get_array_module(gy).ascontiguousarray(
        gy[:, :, a["left"]:a["left"] + a["length"]]),)


_pad1d = primitive("pad1d", _pad1d_fwd, _pad1d_bwd)


def pad1d(x, left: int, right: int) -> Tensor:
    x = as_tensor(x)
    return x if left == right == 0 else _pad1d(x, left=int(left), right=int(right))


def _check3(x: Tensor, op: str) -> None:
    if x.ndim != 3:
        raise ValueError(f"{op} wants x (N, C, L), got shape {x.shape}")


def conv1d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1) -> Tensor:
    """1-D cross-correlation: x (N, C, L), weight (O, C/groups, K) -> (N, O, Lo), as
    torch.nn.functional.conv1d, with padding an int or [left, right] (causal: [(K-1)*d, 0])."""
    x, weight = as_tensor(x), as_tensor(weight)
    _check3(x, "conv1d")
    if weight.ndim != 3:
        raise ValueError(f"conv1d wants weight (O, C/groups, K), got shape {weight.shape}")
    left, right = pads1d(padding)
    s, d = _int(stride, "conv1d stride"), _int(dilation, "conv1d dilation")
    if left != right:
        x, left = pad1d(x, left, right), 0
    n, c, length = x.shape
    o, cg, k = weight.shape
    y = F.conv2d(F.reshape(x, (n, c, 1, length)), F.reshape(weight, (o, cg, 1, k)), bias,
                 (1, s), (0, left), (1, d), groups)
    return F.reshape(y, (n, o, y.shape[3]))


def _pool1d(x, kernel, stride, padding, op: str):
    x = as_tensor(x)
    _check3(x, op)
    k = _int(kernel, f"{op} kernel")
    s = k if stride is None else _int(stride, f"{op} stride")
    return x, k, s, _int(padding, f"{op} padding")


def maxpool1d(x, kernel_size, stride=None, padding=0) -> Tensor:
    """x (N, C, L) -> (N, C, Lo); padding counts as -inf, stride defaults to the kernel."""
    x, k, s, p = _pool1d(x, kernel_size, stride, padding, "maxpool1d")
    n, c, length = x.shape
    y = F.maxpool2d(F.reshape(x, (n, c, 1, length)), (1, k), (1, s), (0, p))
    return F.reshape(y, (n, c, y.shape[3]))


def avgpool1d(x, kernel_size, stride=None, padding=0, count_include_pad: bool = True) -> Tensor:
    """x (N, C, L) -> (N, C, Lo); count_include_pad picks the divisor at the edges."""
    x, k, s, p = _pool1d(x, kernel_size, stride, padding, "avgpool1d")
    n, c, length = x.shape
    y = F.avgpool2d(F.reshape(x, (n, c, 1, length)), (1, k), (1, s), (0, p), count_include_pad)
    return F.reshape(y, (n, c, y.shape[3]))


def global_avgpool1d(x) -> Tensor:
    """(N, C, L) -> (N, C): the mean over time."""
    x = as_tensor(x)
    _check3(x, "global_avgpool1d")
    return F.mean(x, axis=2)


def global_maxpool1d(x) -> Tensor:
    """(N, C, L) -> (N, C): the max over time."""
    x = as_tensor(x)
    _check3(x, "global_maxpool1d")
    return F.max(x, axis=2)


ops.register_table("train", {
    "conv1d": conv1d, "maxpool1d": maxpool1d, "avgpool1d": avgpool1d,
    "global_avgpool1d": global_avgpool1d, "global_maxpool1d": global_maxpool1d,
})
