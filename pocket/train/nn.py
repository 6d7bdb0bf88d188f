"""Modules: parameters and buffers by dotted name, train/eval, state_dict, to(device).

Every layer keeps its hyperparameters as plain attributes and names its graph op in `op`
(None for containers), so a tracer can walk `named_modules()` in registration order and map
each leaf module to one IR node.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from pocket.errors import PocketError
from pocket.train import backend, init
from pocket.train import functional as F
from pocket.train.tensor import Parameter


class StateDictError(PocketError):
    """A state dict that does not fit the model: missing or unexpected keys, wrong shapes."""


class Module:
    op: str | None = None

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "training", True)

    def __setattr__(self, name: str, value) -> None:
        if name in self._buffers and not isinstance(value, Parameter | Module):
            self._set_buffer(name, value)  # e.g. `self.num_batches_tracked += 1`
            return
        for table in (self._parameters, self._buffers, self._modules):
            table.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        object.__setattr__(self, name, value)

    def register_buffer(self, name: str, array) -> None:
        """A non-trainable array saved in the state dict (e.g. BN running statistics)."""
        object.__setattr__(self, name, array)
        self._buffers[name] = array

    def _set_buffer(self, name: str, array) -> None:
        object.__setattr__(self, name, array)
        self._buffers[name] = array

    def forward(self, *args):
        raise NotImplementedError

    def __call__(self, *args):
        return self.forward(*args)

    # ---- traversal (registration order)
    def named_children(self) -> Iterator[tuple[str, Module]]:
        yield from self._modules.items()

    def children(self) -> Iterator[Module]:
        yield from self._modules.values()

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        yield prefix, self
        for name, m in self._modules.items():
            yield from m.named_modules(f"{prefix}.{name}" if prefix else name)

    def modules(self) -> Iterator[Module]:
        for _, m in self.named_modules():
            yield m

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Parameter]]:
        seen: set[int] = set()
        for mname, m in self.named_modules(prefix):
            for name, p in m._parameters.items():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield (f"{mname}.{name}" if mname else name), p

    def parameters(self) -> list[Parameter]:
        return [p for _, p in self.named_parameters()]

    def named_buffers(self, prefix: str = "") -> Iterator[tuple[str, object]]:
        for mname, m in self.named_modules(prefix):
            for name, b in m._buffers.items():
                yield (f"{mname}.{name}" if mname else name), b

    # ---- modes
    def train(self, mode: bool = True) -> Module:
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self) -> Module:
        return self.train(False)

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad = None

    # ---- state
    def state_dict(self) -> dict[str, np.ndarray]:
        """Parameters then buffers by dotted name, as NumPy copies."""
        out = {n: backend.to_numpy(p.data).copy() for n, p in self.named_parameters()}
        out.update({n: backend.to_numpy(b).copy() for n, b in self.named_buffers()})
        return out

    def load_state_dict(self, state: dict, strict: bool = True) -> tuple[list, list]:
        """Copy arrays into the model in place; returns (missing, unexpected) when not strict."""
        params = dict(self.named_parameters())
        owners = {}
        for mname, m in self.named_modules():
            for name in m._buffers:
                owners[f"{mname}.{name}" if mname else name] = (m, name)
        expected = set(params) | set(owners)
        missing = sorted(expected - set(state))
        unexpected = sorted(set(state) - expected)
        if strict and (missing or unexpected):
            raise StateDictError(
                f"state dict does not match the model: missing {missing or 'none'}, "
                f"unexpected {unexpected or 'none'}; was it saved from the same architecture?")
        for key in sorted(expected & set(state)):
            arr = np.asarray(state[key])
            target = params[key].data if key in params else getattr(*owners[key])
            if arr.shape != target.shape:
                raise StateDictError(f"{key}: checkpoint shape {arr.shape} does not fit the "
                                     f"model's {target.shape}; check the layer sizes")
            target[...] = backend.to_device(arr, backend.device_of(target)).astype(
                target.dtype, copy=False)
        return missing, unexpected

    def to(self, device) -> Module:
        device = backend.get_device(device)
        for m in self.modules():
            for p in m._parameters.values():
                p.data = backend.to_device(p.data, device)
                if p.grad is not None:
                    p.grad = backend.to_device(p.grad, device)
            for name, b in list(m._buffers.items()):
                m._set_buffer(name, backend.to_device(b, device))
        return self

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, m in self._modules.items():
            sub = repr(m).replace("\n", "\n  ")
            lines.append(f"  ({name}): {sub}")
        return lines[0] + ")" if len(lines) == 1 else "\n".join(lines) + "\n)"


def _pair(v) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, int | np.integer) else (int(v[0]), int(v[1]))


class Linear(Module):
    op = "linear"

    def __init__(self, in_features: int, out_features: int, bias: bool = True, rng=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        shape = (out_features, in_features)
        # NOTE: PyTorch's default: kaiming_uniform(a=sqrt(5)), i.e. U(+-1/sqrt(fan_in)).
        bound = 1.0 / np.sqrt(in_features)
        self.weight = Parameter(init.uniform(shape, bound, rng))
        self.bias = Parameter(init.uniform((out_features,), bound, rng)) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, bias={self.bias is not None}"


class Conv2d(Module):
    op = "conv2d"

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True, rng=None):
        super().__init__()
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"channels {in_channels}->{out_channels} not divisible by groups "
                             f"{groups}")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = _pair(kernel_size)
        self.stride, self.padding, self.dilation = _pair(stride), _pair(padding), _pair(dilation)
        self.groups = groups
        shape = (out_channels, in_channels // groups) + self.kernel_size
        bound = 1.0 / np.sqrt(init.fans(shape)[0])
        self.weight = Parameter(init.uniform(shape, bound, rng))
        self.bias = Parameter(init.uniform((out_channels,), bound, rng)) if bias else None

    def forward(self, x):
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                        self.groups)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, "
                f"groups={self.groups}")


class _BatchNorm(Module):
    op = "batchnorm"

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = True):
        super().__init__()
        self.num_features, self.eps, self.momentum, self.affine = (
            num_features, eps, momentum, affine)
        self.weight = Parameter(init.ones((num_features,)), requires_grad=affine)
        self.bias = Parameter(init.zeros((num_features,)), requires_grad=affine)
        self.register_buffer("running_mean", init.zeros((num_features,)))
        self.register_buffer("running_var", init.ones((num_features,)))
        self.register_buffer("num_batches_tracked", np.zeros((), np.int64))

    def forward(self, x):
        if self.training:
            self.num_batches_tracked += 1
        return F.batchnorm(x, self.weight, self.bias, self.running_mean, self.running_var,
                           self.training, self.momentum, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}"


class BatchNorm1d(_BatchNorm):
    """Over (N, C) or (N, C, L)."""


class BatchNorm2d(_BatchNorm):
    """Over (N, C, H, W)."""


class MaxPool2d(Module):
    op = "maxpool2d"

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1):
        super().__init__()
        self.kernel_size = _pair(kernel_size)
        self.stride = self.kernel_size if stride is None else _pair(stride)
        self.padding, self.dilation = _pair(padding), _pair(dilation)

    def forward(self, x):
        return F.maxpool2d(x, self.kernel_size, self.stride, self.padding, self.dilation)


class AvgPool2d(Module):
    op = "avgpool2d"

    def __init__(self, kernel_size, stride=None, padding=0, count_include_pad: bool = True):
        super().__init__()
        self.kernel_size = _pair(kernel_size)
        self.stride = self.kernel_size if stride is None else _pair(stride)
        self.padding = _pair(padding)
        self.count_include_pad = count_include_pad

    def forward(self, x):
        return F.avgpool2d(x, self.kernel_size, self.stride, self.padding,
                           self.count_include_pad)


# IR op -> its one-input layer class; the classes below enter themselves (Elementwise), and
# the tracer and the config's layer list (train/models.py) find them here.
ELEMENTWISE: dict[str, type[Elementwise]] = {}


class Elementwise(Module):
    """A one-input layer that is exactly one IR op, with the IR attrs `ir_attrs()`."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.op is not None:
            ELEMENTWISE[cls.op] = cls

    def ir_attrs(self) -> dict:
        return {}

    @classmethod
    def from_ir(cls, **attrs) -> Elementwise:
        """The layer for a node with these IR attrs (the defaults where absent)."""
        return cls(**attrs)


class GlobalAvgPool2d(Elementwise):
    """(N, C, H, W) -> (N, C, 1, 1), like ONNX GlobalAveragePool."""

    op = "global_avgpool"

    def forward(self, x):
        return F.global_avgpool(x)


class ReLU(Elementwise):
    op = "relu"

    def forward(self, x):
        return F.relu(x)


class LeakyReLU(Elementwise):
    op = "leaky_relu"

    def __init__(self, negative_slope: float = 0.01):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x):
        return F.leaky_relu(x, self.negative_slope)

    def ir_attrs(self) -> dict:
        return {"alpha": float(self.negative_slope)}

    @classmethod
    def from_ir(cls, alpha: float = 0.01) -> LeakyReLU:
        return cls(alpha)


class Sigmoid(Elementwise):
    op = "sigmoid"

    def forward(self, x):
        return F.sigmoid(x)


class Tanh(Elementwise):
    op = "tanh"

    def forward(self, x):
        return F.tanh(x)


class Hardswish(Elementwise):
    """x * relu6(x + 3) / 6; Howard et al., 2019 (MobileNetV3)."""

    op = "hardswish"

    def forward(self, x):
        return F.hardswish(x)


class Hardsigmoid(Elementwise):
    """relu6(x + 3) / 6; Howard et al., 2019 (MobileNetV3)."""

    op = "hardsigmoid"

    def forward(self, x):
        return F.hardsigmoid(x)


class GELU(Elementwise):
    op = "gelu"

    def __init__(self, approximate: str = "none"):
        super().__init__()
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, self.approximate)

    def ir_attrs(self) -> dict:
        return {"approximate": self.approximate}


class Softmax(Elementwise):
    op = "softmax"

    def __init__(self, axis: int = -1):
        super().__init__()
        self.axis = axis

    def forward(self, x):
        return F.softmax(x, self.axis)

    def ir_attrs(self) -> dict:
        return {"axis": int(self.axis)}


class Dropout(Module):
    op = "dropout"

    def __init__(self, p: float = 0.5, rng=None):
        super().__init__()
        self.p = p
        self.rng = rng

    def forward(self, x):
        return F.dropout(x, self.p, self.training, self.rng)

    def ir_attrs(self) -> dict:
        return {"p": float(self.p)}


class Flatten(Module):
    op = "flatten"

    def __init__(self, start_dim: int = 1, end_dim: int = -1):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        return F.flatten(x, self.start_dim, self.end_dim)


class Add(Module):
    """x + y; a module so that residual sums appear as `add` nodes."""

    op = "add"

    def forward(self, x, y):
        return F.add(x, y)


class Sequential(Module):
    def __init__(self, *modules: Module):
        super().__init__()
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __len__(self) -> int:
        return len(self._modules)

    def __getitem__(self, i: int) -> Module:
        return list(self._modules.values())[i]

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def forward(self, x):
        for m in self._modules.values():
            x = m(x)
        return x


class ResidualBlock(Module):
    """He et al., 2016 basic block: conv3x3-BN-ReLU-conv3x3-BN, plus the identity or a
    1x1-conv+BN projection when the shape changes, then ReLU."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1, rng=None):
        super().__init__()
        self.in_channels, self.out_channels, self.stride = in_channels, out_channels, stride
        self.conv1 = Conv2d(in_channels, out_channels, 3, stride, 1, bias=False, rng=rng)
        self.bn1 = BatchNorm2d(out_channels)
        self.relu1 = ReLU()
        self.conv2 = Conv2d(out_channels, out_channels, 3, 1, 1, bias=False, rng=rng)
        self.bn2 = BatchNorm2d(out_channels)
        if stride != 1 or in_channels != out_channels:
            self.shortcut = Sequential(
                Conv2d(in_channels, out_channels, 1, stride, bias=False, rng=rng),
                BatchNorm2d(out_channels))
        else:
            self.shortcut = None
        self.add = Add()
        self.relu2 = ReLU()

    def forward(self, x):
        y = self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x)))))
        return self.relu2(self.add(y, x if self.shortcut is None else self.shortcut(x)))


# The vision family's layers (nn_vision.py), as nn.<Name>.
from pocket.train.nn_vision import ChannelShuffle, Clip, Mul, ReLU6, SiLU, Slice  # noqa: E402, F401


def __getattr__(name: str):
    # NOTE: nn.Block lives in nn_block, which registers its tracer and so imports trace, which
    # imports this module: a lazy attribute keeps the import order free.
    if name == "Block":
        from pocket.train.nn_block import Block
        return Block
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# Op families' layers, re-exported so that nn.<Layer> names every layer.
from pocket.train.nn_seqconv import (  # noqa: E402, F401
    AvgPool1d,
    Conv1d,
    GlobalAvgPool1d,
    GlobalMaxPool1d,
    MaxPool1d,
)
from pocket.train.nn_ssm import GLU, S4D, SSM, SSMBlock  # noqa: E402, F401
