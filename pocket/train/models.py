"""The model zoo by name, and the declarative layer list of a config's [model] section.

Every model is a `Sequential` of traceable layers (plus `ResidualBlock`), so the tracer can
turn it into the graph IR without running Python it does not understand.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable

import numpy as np

from pocket.errors import PocketError
from pocket.formats import ops
from pocket.train import nn


class ModelError(PocketError):
    """The [model] section names an unknown model or layer, or shapes do not fit."""


def _conv_bn_relu(c_in: int, c_out: int, bn: bool, rng) -> list[nn.Module]:
    layers: list[nn.Module] = [nn.Conv2d(c_in, c_out, 3, padding=1, bias=not bn, rng=rng)]
    if bn:
        layers.append(nn.BatchNorm2d(c_out))
    layers.append(nn.ReLU())
    return layers


def mlp(input_shape, num_outputs, *, hidden=None, dropout=0.0, rng=None, **_) -> nn.Sequential:
    """Fully connected: flatten, hidden ReLU layers (default 256, 128), linear head."""
    hidden = hidden or [256, 128]
    layers: list[nn.Module] = [nn.Flatten()] if len(input_shape) > 1 else []
    width = int(np.prod(input_shape))
    for h in hidden:
        layers += [nn.Linear(width, h, rng=rng), nn.ReLU()]
        if dropout:
            layers.append(nn.Dropout(dropout))
        width = h
    layers.append(nn.Linear(width, num_outputs, rng=rng))
    return nn.Sequential(*layers)


def mlp_regressor(input_shape, num_outputs, *, hidden=None, dropout=0.0, rng=None, **_):
    """An MLP for tabular regression (default hidden 64, 64)."""
    return mlp(input_shape, num_outputs, hidden=hidden or [64, 64], dropout=dropout, rng=rng)


def cnn(input_shape, num_outputs, *, channels=None, hidden=None, dropout=0.0, batchnorm=True,
        rng=None, **_) -> nn.Sequential:
    """A small CNN for 8x8 to 32x32 images: [conv-BN-ReLU x2, maxpool] per stage, then a
    hidden linear layer. Default channels (32, 64): two stages."""
    c_in, h, w = input_shape
    channels = channels or [32, 64]
    layers: list[nn.Module] = []
    for c in channels:
        layers += _conv_bn_relu(c_in, c, batchnorm, rng) + _conv_bn_relu(c, c, batchnorm, rng)
        layers.append(nn.MaxPool2d(2))
        c_in, h, w = c, h // 2, w // 2
        if h < 1 or w < 1:
            raise ModelError(f"cnn: {len(channels)} pooling stages are too many for a "
                             f"{input_shape[1]}x{input_shape[2]} input; give fewer channels")
    layers.append(nn.Flatten())
    width = c_in * h * w
    for units in hidden or [128]:
        layers += [nn.Linear(width, units, rng=rng), nn.ReLU()]
        if dropout:
            layers.append(nn.Dropout(dropout))
        width = units
    layers.append(nn.Linear(width, num_outputs, rng=rng))
    return nn.Sequential(*layers)


def vgg(input_shape, num_outputs, *, channels=None, batchnorm=True, dropout=0.0, rng=None, **_):
    """VGG-style for 32x32 (the cnn_cifar reference model): 8 conv3x3-BN-ReLU layers,
    channels 64,64,128,128,256,256,256,256, maxpool after layers 2, 4, 6, global average
    pool, linear head. Simonyan & Zisserman, 2015."""
    channels = channels or [64, 64, 128, 128, 256, 256, 256, 256]
    c_in = input_shape[0]
    layers: list[nn.Module] = []
    for i, c in enumerate(channels):
        layers += _conv_bn_relu(c_in, c, batchnorm, rng)
        if i in (1, 3, 5):
            layers.append(nn.MaxPool2d(2))
        c_in = c
    layers += [nn.GlobalAvgPool2d(), nn.Flatten()]
    if dropout:
        layers.append(nn.Dropout(dropout))
    layers.append(nn.Linear(c_in, num_outputs, rng=rng))
    return nn.Sequential(*layers)


def resnet(input_shape, num_outputs, *, channels=None, width=None, rng=None, **_):
    """ResNet-style for 32x32 (He et al., 2016, the CIFAR variant): a conv3x3 stem, three
    stages of `width` residual blocks (default 1) at channels 16, 32, 64 with stride 2 between
    stages, global average pool, linear head."""
    channels = channels or [16, 32, 64]
    blocks = width or 1
    layers: list[nn.Module] = _conv_bn_relu(input_shape[0], channels[0], True, rng)
    c_in = channels[0]
    for s, c in enumerate(channels):
        for b in range(blocks):
            stride = 2 if (s > 0 and b == 0) else 1
            layers.append(nn.ResidualBlock(c_in, c, stride, rng=rng))
            c_in = c
    layers += [nn.GlobalAvgPool2d(), nn.Flatten(), nn.Linear(c_in, num_outputs, rng=rng)]
    return nn.Sequential(*layers)


ZOO: dict[str, Callable] = {"mlp": mlp, "mlp_regressor": mlp_regressor, "cnn": cnn, "vgg": vgg,
                            "resnet": resnet}
# Zoo models that need (C, H, W) input, and the input rank of the others that need one.
INPUT_RANK: dict[str, int] = {"cnn": 3, "vgg": 3, "resnet": 3}
# The [model] keys every zoo model may take (config.DEFAULTS has them); others are a model's own.
COMMON_OPTIONS = ("hidden", "channels", "dropout", "batchnorm", "width")


def register_model(name: str, *, input_rank: int | None = None):
    """Decorator: a zoo model `fn(input_shape, num_outputs, *, rng=None, **options)`.

    Its keyword-only arguments besides `rng` are its [model] options: a config may set them
    as keys of [model] (checked against the defaults' types), e.g. `width_mult = 0.5`.
    `input_rank` (3 for images) makes a config with other input fail with a clear line.
    """
    def deco(fn):
        if name in ZOO:
            raise ValueError(f"zoo model {name!r} is registered twice")
        ZOO[name] = fn
        if input_rank is not None:
            INPUT_RANK[name] = input_rank
        return fn
    return deco


def model_options(name: str) -> dict:
    """A zoo model's own [model] options and their defaults (COMMON_OPTIONS excluded)."""
    fn = ZOO.get(name)
    if fn is None:
        return {}
    return {p.name: p.default for p in inspect.signature(fn).parameters.values()
            if p.kind is p.KEYWORD_ONLY and p.name != "rng" and p.name not in COMMON_OPTIONS}


# --------------------------------------------------------------------------- layer lists

# The keys each layer type takes. A one-input layer that is one IR op (nn.ELEMENTWISE: the
# activations, softmax, global_avgpool) takes its op's attrs under their IR names.
_LAYER_KEYS = {
    "linear": {"out", "bias"},
    "conv2d": {"out", "kernel", "stride", "padding", "dilation", "groups", "bias"},
    "batchnorm": {"eps", "momentum"},
    "maxpool2d": {"kernel", "stride", "padding"},
    "avgpool2d": {"kernel", "stride", "padding", "count_include_pad"},
    "flatten": set(), "dropout": {"p"}, "residual": {"out", "stride"},
    **{op: set(ops.OPS[op].attrs) for op in nn.ELEMENTWISE},
}


# Layer-list kinds that families add: kind -> fn(spec, shape, num_outputs, last, rng)
# returning (module, output shape without the batch).
_BUILDERS: dict[str, Callable] = {}


def register_layer(kind: str, keys: set[str] | frozenset[str] = frozenset()):
    """Decorator: a layer-list kind `{type = kind, ...}` taking `keys`, built by `fn(spec,
    shape, num_outputs, last, rng) -> (module, out_shape)`; `last` is whether it is the head.
    A ValueError or TypeError it raises becomes the config's error line, naming the layer."""
    def deco(fn):
        if kind in _LAYER_KEYS:
            raise ValueError(f"layer kind {kind!r} is registered twice")
        _LAYER_KEYS[kind] = set(keys)
        _BUILDERS[kind] = fn
        return fn
    return deco


def _out_hw(size: int, k: int, s: int, p: int, d: int = 1) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def from_layers(input_shape, num_outputs, layers: list[dict], rng=None) -> nn.Sequential:
    """Build a Sequential from a list of {type = "...", ...} tables; shapes are tracked so
    `in` sizes never need writing. The last linear may omit `out`: it becomes the head."""
    return build_layers(input_shape, num_outputs, layers, rng)[0]


def build_layers(input_shape, num_outputs, layers: list[dict], rng=None,
                 where: str = "[model] layers", head: bool = True) -> tuple[nn.Sequential, tuple]:
    """from_layers with the output shape, for nested lists (a block's branches): `where`
    names the list in errors; `head` says whether its last linear may omit `out`."""
    if not isinstance(layers, list | tuple):
        raise ModelError(f"{where} must be a list of tables, got {layers!r}")
    shape = tuple(input_shape)
    mods: list[nn.Module] = []
    # The head is the last linear, which may still be followed by e.g. a softmax.
    last = max((i for i, s in enumerate(layers) if isinstance(s, dict) and s.get("type") == "linear"),
               default=-1) if head else -1
    for i, spec in enumerate(layers):
        here = f"{where}[{i}]"
        if not isinstance(spec, dict) or "type" not in spec:
            raise ModelError(f"{here}: each layer is a table with a 'type'")
        kind = spec["type"]
        if kind not in _LAYER_KEYS:
            close = difflib.get_close_matches(str(kind), _LAYER_KEYS, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f"; known: {', '.join(_LAYER_KEYS)}"
            raise ModelError(f"{here}: unknown layer type {kind!r}{hint}")
        extra = set(spec) - _LAYER_KEYS[kind] - {"type"}
        if extra:
            raise ModelError(f"{here} ({kind}): unknown key(s) {', '.join(sorted(extra))}; "
                             f"it takes {', '.join(sorted(_LAYER_KEYS[kind])) or 'none'}")
        try:
            m, shape = _layer(kind, spec, shape, num_outputs, i == last, rng, here)
        except (TypeError, ValueError, IndexError) as e:
            raise ModelError(f"{here} ({kind}): {e} (input shape {list(shape)})") from None
        mods.append(m)
    return nn.Sequential(*mods), shape


def _layer(kind, spec, shape, num_outputs, last, rng, where):
    if kind in _BUILDERS:
        fn = _BUILDERS[kind]
        # A nesting kind (a block) takes `where` so its inner errors name their place.
        if "where" in inspect.signature(fn).parameters:
            return fn(spec, shape, num_outputs, last, rng, where=where)
        return fn(spec, shape, num_outputs, last, rng)
    if kind == "linear":
        # over the last axis: (F,) -> (out,), and a sequence (L, F) -> (L, out)
        if len(shape) not in (1, 2):
            raise ValueError("linear needs a flat or (L, F) input; add {type = \"flatten\"} before it")
        out = spec.get("out", num_outputs if last else None)
        if out is None:
            raise ValueError("give 'out' (only the last linear may omit it)")
        return nn.Linear(shape[-1], out, bias=spec.get("bias", True), rng=rng), (*shape[:-1], out)
    if kind in ("conv2d", "residual"):
        if len(shape) != 3:
            raise ValueError(f"{kind} needs (C, H, W) input")
        if "out" not in spec:
            raise ValueError("give 'out' (its number of output channels)")
        c, h, w = shape
        if kind == "residual":
            s = spec.get("stride", 1)
            return (nn.ResidualBlock(c, spec["out"], s, rng=rng),
                    (spec["out"], _out_hw(h, 3, s, 1), _out_hw(w, 3, s, 1)))
        k, s = spec.get("kernel", 3), spec.get("stride", 1)
        p, d = spec.get("padding", 0), spec.get("dilation", 1)
        m = nn.Conv2d(c, spec["out"], k, s, p, d, spec.get("groups", 1), spec.get("bias", True),
                      rng=rng)
        ho = _out_hw(h, m.kernel_size[0], m.stride[0], m.padding[0], m.dilation[0])
        wo = _out_hw(w, m.kernel_size[1], m.stride[1], m.padding[1], m.dilation[1])
        if ho < 1 or wo < 1:
            raise ValueError("the output would be empty")
        return m, (spec["out"], ho, wo)
    if kind == "batchnorm":
        cls = nn.BatchNorm2d if len(shape) == 3 else nn.BatchNorm1d
        return cls(shape[0], spec.get("eps", 1e-5), spec.get("momentum", 0.1)), shape
    if kind in ("maxpool2d", "avgpool2d"):
        k = spec.get("kernel", 2)
        if kind == "maxpool2d":
            m = nn.MaxPool2d(k, spec.get("stride"), spec.get("padding", 0))
        else:
            m = nn.AvgPool2d(k, spec.get("stride"), spec.get("padding", 0),
                             spec.get("count_include_pad", True))
        c, h, w = shape
        ho = _out_hw(h, m.kernel_size[0], m.stride[0], m.padding[0])
        wo = _out_hw(w, m.kernel_size[1], m.stride[1], m.padding[1])
        if ho < 1 or wo < 1:
            raise ValueError("the output would be empty")
        return m, (c, ho, wo)
    if kind == "flatten":
        return nn.Flatten(), (int(np.prod(shape)),)
    if kind == "dropout":
        return nn.Dropout(_dropout_p(spec.get("p", 0.5))), shape
    schema = ops.OPS[kind]
    attrs = {k: ops.check_attr("value", k, schema.attrs[k], v) for k, v in spec.items() if k != "type"}
    layer = nn.ELEMENTWISE[kind].from_ir(**attrs)
    return layer, ((shape[0], 1, 1) if kind == "global_avgpool" else shape)


def _dropout_p(p):
    if isinstance(p, bool) or not isinstance(p, int | float) or not 0 <= p < 1:
        raise ValueError(f"dropout p must be a number in [0, 1), got {p!r}")
    return p


def _check_zoo_args(kwargs: dict) -> None:
    """The [model] keys a zoo model takes, checked before they reach a constructor."""
    for key in ("hidden", "channels"):
        v = kwargs.get(key)
        ok = isinstance(v, list | tuple) and v and all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in v)
        if v is not None and not ok:
            raise ModelError(f"[model] {key} must be a non-empty list of positive integers, "
                             f"got {v!r}")
    w = kwargs.get("width")
    if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
        raise ModelError(f"[model] width must be a positive integer, got {w!r}")
    try:
        _dropout_p(kwargs.get("dropout", 0.0))
    except ValueError as e:
        raise ModelError(f"[model] {e}") from None


def build_model(model_cfg: dict, input_shape, num_outputs: int, rng) -> nn.Sequential:
    """The model a config's [model] section describes."""
    if model_cfg.get("layers"):
        return from_layers(input_shape, num_outputs, model_cfg["layers"], rng)
    name = model_cfg["name"]
    if name not in ZOO:
        close = difflib.get_close_matches(str(name), ZOO, n=1)
        hint = f"did you mean '{close[0]}'?" if close else f"known: {', '.join(ZOO)}"
        raise ModelError(f"unknown model {name!r}; {hint} (or give [model] layers = [...])")
    rank = INPUT_RANK.get(name)
    if rank is not None and len(input_shape) != rank:
        what = "image input (C, H, W)" if rank == 3 else f"input of rank {rank}"
        raise ModelError(f"model {name!r} needs {what}, but the data has shape "
                         f"{list(input_shape)}; use mlp or mlp_regressor")
    kwargs = {k: model_cfg[k] for k in COMMON_OPTIONS if model_cfg.get(k) is not None}
    _check_zoo_args(kwargs)
    kwargs.update({k: model_cfg[k] for k in model_options(name) if model_cfg.get(k) is not None})
    return ZOO[name](tuple(input_shape), num_outputs, rng=rng, **kwargs)


# The families' zoo models and layer-list kinds register themselves on import.
from pocket.train import (  # noqa: E402, F401
    models_block,
    models_edge,
    models_seqattn,
    models_seqconv,
    models_spiking,
    models_ssm,
    models_vision,
)
