"""The temporal convolutional network (`tcn`) and the layer-list kinds of the sequence convs.

Input (C, L): features by time, batched (N, C, L).
"""

from __future__ import annotations

from pocket.train import models, nn, trace
from pocket.train import nn_seqconv as nn1


class TemporalBlock(nn.Module):
    """One residual block of a TCN (Bai, Kolter & Koltun, 2018, "An Empirical Evaluation of
    Generic Convolutional and Recurrent Networks for Sequence Modeling", fig. 1b): two dilated
    causal conv1d, each followed by ReLU and dropout, plus the input (through a 1x1 conv when
    the channels change), then ReLU. The paper's weight normalization is left out: it is a
    reparametrization of training only (the folded weights are plain convs at inference)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int,
                 dropout: float = 0.0, rng=None):
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.dilation = kernel_size, dilation
        self.conv1 = nn1.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation,
                                causal=True, rng=rng)
        self.relu1 = nn.ReLU()
        self.drop1 = nn.Dropout(dropout)
        self.conv2 = nn1.Conv1d(out_channels, out_channels, kernel_size, dilation=dilation,
                                causal=True, rng=rng)
        self.relu2 = nn.ReLU()
        self.drop2 = nn.Dropout(dropout)
        self.shortcut = (nn1.Conv1d(in_channels, out_channels, 1, rng=rng)
                         if in_channels != out_channels else None)
        self.add = nn.Add()
        self.relu = nn.ReLU()

    def forward(self, x):
        y = self.drop2(self.relu2(self.conv2(self.drop1(self.relu1(self.conv1(x))))))
        return self.relu(self.add(y, x if self.shortcut is None else self.shortcut(x)))

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"dilation={self.dilation}")


_BODY = ("conv1", "relu1", "drop1", "conv2", "relu2", "drop2")


@trace.register_module(TemporalBlock)
def _trace_block(b, m, prefix, x):
    y = x
    for name in _BODY:
        y = trace.trace_module(b, getattr(m, name), f"{prefix}.{name}", y)
    short = x if m.shortcut is None else trace.trace_module(b, m.shortcut, f"{prefix}.shortcut", x)
    s = b.node(f"{prefix}.add", "add", [y, short])
    return b.node(f"{prefix}.relu", "relu", [s])


def receptive_field(kernel: int, levels: int) -> int:
    """Time steps an output of `levels` blocks sees: 1 + 2 (K - 1) (2^levels - 1)."""
    return 1 + 2 * (kernel - 1) * (2**levels - 1)


@models.register_model("tcn", input_rank=2)
def tcn(input_shape, num_outputs, *, channels=None, kernel: int = 3, dropout=0.0, rng=None,
        **_) -> nn.Sequential:
    """A TCN (Bai et al., 2018): one TemporalBlock per entry of `channels` (default 32 x 4),
    dilation 1, 2, 4, ... (doubling per block), causal convs of `kernel` taps; then the mean
    over time (global_avgpool1d) and a linear head. Input (C, L): features by time.

    NOTE: the head averages over time rather than taking the last step (the paper's choice):
    slicing a step is no op of this family, and global_avgpool1d is one IR op in every stage
    (ONNX GlobalAveragePool) that also works for any window length. With the receptive field
    (`receptive_field`) at least the window, the late steps see the whole window anyway.
    """
    if isinstance(kernel, bool) or not isinstance(kernel, int) or kernel < 1:
        raise models.ModelError(f"[model] kernel must be a positive integer, got {kernel!r}")
    c_in = input_shape[0]
    layers: list[nn.Module] = []
    for i, c in enumerate(channels or [32, 32, 32, 32]):
        layers.append(TemporalBlock(c_in, c, kernel, 2**i, dropout, rng=rng))
        c_in = c
    layers += [nn1.GlobalAvgPool1d(), nn.Linear(c_in, num_outputs, rng=rng)]
    return nn.Sequential(*layers)


# --------------------------------------------------------------------------- layer lists


def _need_seq(kind: str, shape) -> tuple[int, int]:
    if len(shape) != 2:
        raise ValueError(f"{kind} needs (C, L) input (features by time)")
    return shape


def _nonempty(length: int) -> int:
    if length < 1:
        raise ValueError("the output would be empty")
    return length


@models.register_layer("conv1d", {"out", "kernel", "stride", "padding", "dilation", "groups",
                                  "bias", "causal"})
def _conv1d(spec, shape, num_outputs, last, rng):
    c, length = _need_seq("conv1d", shape)
    padding = spec.get("padding", 0)
    m = nn1.Conv1d(c, spec["out"], spec.get("kernel", 3), spec.get("stride", 1),
                   list(padding) if isinstance(padding, list | tuple) else padding,
                   spec.get("dilation", 1), spec.get("groups", 1), spec.get("bias", True),
                   spec.get("causal", False), rng=rng)
    return m, (spec["out"], _nonempty(m.out_length(length)))


@models.register_layer("tcn_block", {"out", "kernel", "dilation", "dropout"})
def _tcn_block(spec, shape, num_outputs, last, rng):
    c, length = _need_seq("tcn_block", shape)
    p = models._dropout_p(spec.get("dropout", 0.0))
    return (TemporalBlock(c, spec["out"], spec.get("kernel", 3), spec.get("dilation", 1), p,
                          rng=rng), (spec["out"], length))


def _pool(kind: str, cls):
    keys = {"kernel", "stride", "padding"} | ({"count_include_pad"} if kind == "avgpool1d" else set())

    @models.register_layer(kind, keys)
    def build(spec, shape, num_outputs, last, rng):
        c, length = _need_seq(kind, shape)
        kw = {"count_include_pad": spec.get("count_include_pad", True)} if kind == "avgpool1d" else {}
        m = cls(spec.get("kernel", 2), spec.get("stride"), spec.get("padding", 0), **kw)
        return m, (c, _nonempty(m.out_length(length)))

    return build


_pool("maxpool1d", nn1.MaxPool1d)
_pool("avgpool1d", nn1.AvgPool1d)


def _global(kind: str, cls):
    @models.register_layer(kind)
    def build(spec, shape, num_outputs, last, rng):
        c, _ = _need_seq(kind, shape)
        return cls(), (c,)

    return build


_global("global_avgpool1d", nn1.GlobalAvgPool1d)
_global("global_maxpool1d", nn1.GlobalMaxPool1d)
