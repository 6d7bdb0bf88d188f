"""Sequence-convolution layers on (N, C, L): Conv1d (causal, dilated, grouped), MaxPool1d,
AvgPool1d, GlobalAvgPool1d, GlobalMaxPool1d; each traces to one IR op (ops_seqconv).

`nn` re-exports them (nn.Conv1d, ...). Their trace functions are registered here, in slot
"trace", so a model holding them traces wherever `nn` is imported.
"""

from __future__ import annotations

import numpy as np

from pocket.formats import ops
from pocket.train import functional_seqconv as F1
from pocket.train import init
from pocket.train.nn import Module
from pocket.train.tensor import Parameter


def _int(v, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 0:
        raise ValueError(f"{what} must be a non-negative integer, got {v!r}")
    return int(v)


class Conv1d(Module):
    """1-D convolution over time, as torch.nn.Conv1d; `causal=True` pads [(K-1)*dilation, 0]
    so output step t sees inputs up to t only (van den Oord et al., 2016, WaveNet; Bai, Kolter
    & Koltun, 2018, "An Empirical Evaluation of Generic Convolutional and Recurrent Networks
    for Sequence Modeling"). padding: an int (both sides) or [left, right]."""

    op = "conv1d"

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,
                 padding=0, dilation: int = 1, groups: int = 1, bias: bool = True,
                 causal: bool = False, rng=None):
        super().__init__()
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"channels {in_channels}->{out_channels} not divisible by groups "
                             f"{groups}")
        k = _int(kernel_size, "kernel")
        self.stride, self.dilation = _int(stride, "stride"), _int(dilation, "dilation")
        if k < 1 or self.stride < 1 or self.dilation < 1:
            raise ValueError("kernel, stride and dilation must be >= 1")
        pads = F1.pads1d(padding)
        if causal and pads != (0, 0):
            raise ValueError("give either causal=True or a padding, not both")
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, k
        self.groups, self.causal = int(groups), bool(causal)
        self.padding = ((k - 1) * self.dilation, 0) if causal else pads
        shape = (out_channels, in_channels // groups, k)
        bound = 1.0 / np.sqrt(init.fans(shape)[0])
        self.weight = Parameter(init.uniform(shape, bound, rng))
        self.bias = Parameter(init.uniform((out_channels,), bound, rng)) if bias else None

    def forward(self, x):
        return F1.conv1d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                         self.groups)

    def out_length(self, length: int) -> int:
        return (length + sum(self.padding) - self.dilation * (self.kernel_size - 1) - 1
                ) // self.stride + 1

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={list(self.padding)}, dilation={self.dilation}, "
                f"groups={self.groups}, causal={self.causal}")


class _Pool1d(Module):
    def __init__(self, kernel_size: int, stride: int | None = None, padding: int = 0):
        super().__init__()
        self.kernel_size = _int(kernel_size, "kernel")
        self.stride = self.kernel_size if stride is None else _int(stride, "stride")
        self.padding = _int(padding, "padding")
        if self.kernel_size < 1 or self.stride < 1:
            raise ValueError("kernel and stride must be >= 1")
        if 2 * self.padding > self.kernel_size:
            raise ValueError(f"padding {self.padding} must be at most half the kernel "
                             f"{self.kernel_size}")

    def out_length(self, length: int) -> int:
        return (length + 2 * self.padding - self.kernel_size) // self.stride + 1


class MaxPool1d(_Pool1d):
    op = "maxpool1d"

    def forward(self, x):
        return F1.maxpool1d(x, self.kernel_size, self.stride, self.padding)


class AvgPool1d(_Pool1d):
    op = "avgpool1d"

    def __init__(self, kernel_size: int, stride: int | None = None, padding: int = 0,
                 count_include_pad: bool = True):
        super().__init__(kernel_size, stride, padding)
        self.count_include_pad = bool(count_include_pad)

    def forward(self, x):
        return F1.avgpool1d(x, self.kernel_size, self.stride, self.padding,
                            self.count_include_pad)


class GlobalAvgPool1d(Module):
    """(N, C, L) -> (N, C): the mean over time."""

    op = "global_avgpool1d"

    def forward(self, x):
        return F1.global_avgpool1d(x)


class GlobalMaxPool1d(Module):
    """(N, C, L) -> (N, C): the max over time."""

    op = "global_maxpool1d"

    def forward(self, x):
        return F1.global_maxpool1d(x)


# --------------------------------------------------------------------------- tracing


def _p(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _trace_conv1d(b, m, prefix, x):
    ins = [x, b.param(_p(prefix, "weight"))]
    if m.bias is not None:
        ins.append(b.param(_p(prefix, "bias")))
    return b.node(prefix, "conv1d", ins, stride=m.stride, padding=list(m.padding),
                  dilation=m.dilation, groups=m.groups)


def _trace_pool1d(b, m, prefix, x):
    attrs = {"kernel": m.kernel_size, "stride": m.stride, "padding": m.padding}
    if m.op == "avgpool1d":
        attrs["count_include_pad"] = m.count_include_pad
    return b.node(prefix, m.op, [x], **attrs)


def _trace_global(b, m, prefix, x):
    return b.node(prefix, m.op, [x])


ops.register_table("trace", {
    "conv1d": _trace_conv1d, "maxpool1d": _trace_pool1d, "avgpool1d": _trace_pool1d,
    "global_avgpool1d": _trace_global, "global_maxpool1d": _trace_global,
})
