"""Trace a model into the graph IR (pocket.formats) for the checkpoint.

The tracer walks the module tree rather than recording array calls: each layer type maps to one
IR op through a table, parameters keep their state_dict names, and anything it does not know is
a clear error at checkpoint time instead of a broken export later.
"""

from __future__ import annotations

import numpy as np

from pocket.errors import PocketError
from pocket.formats import ops
from pocket.formats.ir import Graph, Node, ValueInfo
from pocket.train import backend, nn


class TraceError(PocketError):
    """A model holds a layer the graph IR cannot express."""


class Builder:
    """What a trace function writes into: `param(name)` declares a state_dict entry as a graph
    param and returns its value name; `node(name, op, inputs, **attrs)` appends a node (the name
    made unique) and returns its output value name."""

    def __init__(self, state: dict[str, np.ndarray]):
        self.state = state
        self.nodes: list[Node] = []
        self.params: dict[str, ValueInfo] = {}
        self._names: set[str] = set()

    def param(self, name: str) -> str:
        arr = self.state[name]
        self.params[name] = ValueInfo("f32", tuple(int(d) for d in arr.shape))
        return name

    def derived(self, name: str, array: np.ndarray) -> str:
        """Declare a tensor computed at trace time (a LoRA layer's merged weight) as a graph
        param; the trainer stores it in the checkpoint beside the state dict."""
        self.state[name] = np.asarray(array, np.float32)
        return self.param(name)

    def node(self, name: str, op: str, inputs: list[str], **attrs) -> str:
        name = name or op
        base, i = name, 1
        while name in self._names:
            i += 1
            name = f"{base}_{i}"
        self._names.add(name)
        out = f"{name}:out"
        self.nodes.append(Node(name, op, inputs, [out], attrs))
        return out


def _p(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _trace_module(b: Builder, m: nn.Module, prefix: str, x: str) -> str:
    # Containers by type; a layer by the IR op it names, through the registry.
    # The exact type first, so that a registered subclass of Sequential wins over Sequential.
    fn = _CONTAINERS.get(type(m)) or next(
        (f for cls, f in _CONTAINERS.items() if isinstance(m, cls)), None)
    if fn is None and m.op is not None:
        fn = ops.OPS[m.op].impls.get("trace") if m.op in ops.OPS else None
    if fn is None:
        layers = sorted({*(c.__name__ for c in _CONTAINERS),
                         *(n for n, f in ops.implementations("trace").items())})
        raise TraceError(f"cannot trace layer '{prefix or 'model'}' ({type(m).__name__}) into the "
                         f"graph IR; supported layers and ops: {', '.join(layers)}")
    return fn(b, m, prefix, x)


def _sequential(b, m, prefix, x):
    for name, child in m.named_children():
        x = _trace_module(b, child, _p(prefix, name), x)
    return x


def _linear(b, m, prefix, x):
    ins = [x, b.param(_p(prefix, "weight"))]
    if m.bias is not None:
        ins.append(b.param(_p(prefix, "bias")))
    return b.node(prefix, "linear", ins)


def _conv2d(b, m, prefix, x):
    ins = [x, b.param(_p(prefix, "weight"))]
    if m.bias is not None:
        ins.append(b.param(_p(prefix, "bias")))
    return b.node(prefix, "conv2d", ins, stride=list(m.stride), padding=list(m.padding),
                  dilation=list(m.dilation), groups=int(m.groups))


def _batchnorm(b, m, prefix, x):
    ins = [x] + [b.param(_p(prefix, n)) for n in ("weight", "bias", "running_mean", "running_var")]
    return b.node(prefix, "batchnorm", ins, eps=float(m.eps))


def _maxpool(b, m, prefix, x):
    if tuple(m.dilation) != (1, 1):
        raise TraceError(f"layer '{prefix}': maxpool with dilation is not in the graph IR")
    return b.node(prefix, "maxpool2d", [x], kernel=list(m.kernel_size), stride=list(m.stride),
                  padding=list(m.padding))


def _avgpool(b, m, prefix, x):
    return b.node(prefix, "avgpool2d", [x], kernel=list(m.kernel_size), stride=list(m.stride),
                  padding=list(m.padding), count_include_pad=bool(m.count_include_pad))


def _flatten(b, m, prefix, x):
    if m.start_dim != 1 or m.end_dim != -1:
        raise TraceError(f"layer '{prefix}': only Flatten(start_dim=1, end_dim=-1) is in the IR")
    return b.node(prefix, "flatten", [x])


def _residual(b, m, prefix, x):
    y = x
    for name in ("conv1", "bn1", "relu1", "conv2", "bn2"):
        y = _trace_module(b, getattr(m, name), _p(prefix, name), y)
    short = x if m.shortcut is None else _trace_module(b, m.shortcut, _p(prefix, "shortcut"), x)
    s = b.node(_p(prefix, "add"), "add", [y, short])
    return b.node(_p(prefix, "relu2"), "relu", [s])


def _elementwise(b, m, prefix, x):
    return b.node(prefix, m.op, [x], **m.ir_attrs())


_CONTAINERS = {nn.Sequential: _sequential, nn.ResidualBlock: _residual}


def register_module(cls: type[nn.Module]):
    """Decorator: `fn(builder, module, prefix, x) -> value name` traces every `cls` module.

    This is how a custom module becomes traceable: its function emits IR nodes through the
    `Builder` (calling `trace_module` for child modules) and returns the name of its output.

        @register_module(MyBlock)
        def _my_block(b, m, prefix, x):
            y = trace_module(b, m.body, f"{prefix}.body", x)
            return b.node(f"{prefix}.add", "add", [x, y])
    """
    def deco(fn):
        _CONTAINERS[cls] = fn
        return fn
    return deco


trace_module = _trace_module

# Checks on every finished trace, fn(model, builder): each raises TraceError when the graph
# misses something the model computes (train/trace_lora.py: an adapter nobody traced).
_CHECKS: list = []


def register_check(fn):
    _CHECKS.append(fn)
    return fn

ops.register_table("trace", {
    "linear": _linear, "conv2d": _conv2d, "batchnorm": _batchnorm, "maxpool2d": _maxpool,
    "avgpool2d": _avgpool, "flatten": _flatten, "dropout": _elementwise,
    **dict.fromkeys(nn.ELEMENTWISE, _elementwise),
})


def trace(model: nn.Module, input_shape, metadata: dict | None = None,
          input_name: str = "input", output_name: str = "output", *,
          state: dict | None = None) -> tuple[Graph, dict[str, np.ndarray]]:
    """model -> (validated inference Graph, {param name: float32 array}).

    input_shape excludes the batch, which becomes the symbol "N". `state`: the arrays to
    trace with instead of the model's own (the trainer's fp32 masters in fp16 mode).
    """
    state = {k: np.asarray(backend.to_numpy(v))
             for k, v in (model.state_dict() if state is None else state).items()}
    b = Builder(state)
    out = _trace_module(b, model, "", input_name)
    for check in _CHECKS:
        check(model, b)
    if out == input_name:
        raise TraceError("the model has no layers to trace")
    # Rename the last value so exports have a stable output name.
    last = b.nodes[-1]
    last.outputs = [output_name]
    # token ids read straight by an embedding make an integer input
    dtype = "i64" if any(n.op == "embedding" and n.inputs[0] == input_name for n in b.nodes) else "f32"
    inputs = {input_name: ValueInfo(dtype, ("N", *(int(d) for d in input_shape)))}
    g = Graph(inputs, [output_name], b.nodes, b.params, dict(metadata or {}))
    g.validate()
    params = {k: np.ascontiguousarray(state[k], dtype=np.float32) for k in b.params}
    return g, params


from pocket.train import (  # noqa: E402, F401  (their tracers)
    nn_embed,
    nn_spiking,
    trace_lora,
    trace_seqattn,
    trace_ssm,
)
