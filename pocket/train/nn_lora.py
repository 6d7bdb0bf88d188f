"""Low-rank adapters (LoRA) on linear layers and on attention projections.

Hu et al., 2021, "LoRA: Low-Rank Adaptation of Large Language Models": the pretrained weight W
stays frozen and the update is learned as a product of two thin matrices,

    y = x W^T + b + (alpha / r) * dropout(x) A^T B^T,     A (r, in), B (out, r),

with A Kaiming-uniform and B zero (as Hugging Face PEFT), so training starts exactly at the base
model. Only A and B have gradients and optimizer state. For inference the update folds into the
plain weight, W + (alpha / r) B A, so an adapted model exports as the same graph as its base
(train/trace_lora.py).
"""

from __future__ import annotations

import fnmatch

import numpy as np

from pocket.errors import PocketError
from pocket.train import backend, init
from pocket.train import functional as F
from pocket.train.nn import Linear, Module
from pocket.train.tensor import Parameter

# [lora] targets that name a kind of layer rather than a layer: every linear layer (attention
# projections and the head included), or only the q/k/v/out projections of attention layers.
KINDS = ("linear", "attention")
ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")


class LoRAError(PocketError):
    """A [lora] setting that cannot be applied to the model (bad rank, nothing matched...)."""


class LoRALinear(Linear):
    """A linear layer with a trainable low-rank update over its frozen weight and bias.

    Built from an existing `Linear`, whose weight and bias it takes over (the same Parameter
    objects, frozen), so the state dict keeps the base layer's names and adds `lora_A` and
    `lora_B`: a base checkpoint loads into it as it is.
    """

    def __init__(self, base: Linear, rank: int, alpha: float | None = None,
                 dropout: float = 0.0, rng=None):
        Module.__init__(self)
        if not isinstance(rank, int | np.integer) or rank < 1:
            raise LoRAError(f"LoRA rank must be a positive int, got {rank!r}")
        if not 0.0 <= dropout < 1.0:
            raise LoRAError(f"LoRA dropout must be in [0, 1), got {dropout!r}")
        self.in_features, self.out_features = base.in_features, base.out_features
        self.rank = int(rank)
        self.alpha = float(rank if alpha is None else alpha)
        if not (np.isfinite(self.alpha) and self.alpha > 0):
            raise LoRAError(f"LoRA alpha must be a positive number, got {alpha!r}")
        # NOTE: `rng` draws A only; dropout draws from the backend RNG, which checkpoints
        # store, so a resumed run replays the same masks.
        self.dropout = float(dropout)
        self.weight = base.weight
        self.bias = base.bias
        for p in (self.weight, self.bias):
            if p is not None:
                p.requires_grad = False
                p.grad = None
        like = self.weight.data
        # NOTE: PEFT's kaiming_uniform_(a=sqrt(5)) on A (r, in) is U(+-1/sqrt(in)).
        a = init.uniform((self.rank, self.in_features), 1.0 / np.sqrt(self.in_features), rng)
        self.lora_A = Parameter(backend.to_device(a, backend.device_of(like)).astype(like.dtype))
        b = backend.get_array_module(like).zeros((self.out_features, self.rank), like.dtype)
        self.lora_B = Parameter(b)

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def forward(self, x):
        # x (..., in) -> y (..., out)
        y = F.linear(x, self.weight, self.bias)
        h = F.dropout(x, self.dropout, self.training)
        h = F.linear(F.linear(h, self.lora_A), self.lora_B)
        return y + h * self.scaling

    def extra_repr(self) -> str:
        return (f"{self.in_features}, {self.out_features}, bias={self.bias is not None}, "
                f"rank={self.rank}, alpha={self.alpha:g}, dropout={self.dropout:g}")


def _linear_layers(model: Module) -> list[tuple[str, Module, str, Linear]]:
    """(dotted name, parent, attribute, layer) of every plain Linear that is a layer of its own,
    in model order; not the synapse inside a layer that is one IR op (a spiking linear)."""
    out = []
    for pname, parent in model.named_modules():
        if parent.op is not None:
            continue
        for attr, child in parent.named_children():
            if type(child) is Linear:
                out.append((f"{pname}.{attr}" if pname else attr, parent, attr, child))
    order = {name: i for i, (name, _) in enumerate(model.named_modules())}
    return sorted(out, key=lambda t: order[t[0]])


def _attention_names(model: Module) -> set[str]:
    from pocket.train.nn_seqattn import MultiheadAttention

    return {f"{name}.{proj}" if name else proj for name, m in model.named_modules()
            if isinstance(m, MultiheadAttention) for proj in ATTENTION_PROJECTIONS}


def _matches(name: str, target: str) -> bool:
    # PEFT's rule (a target names a layer or the end of its dotted name), plus shell globs
    return name == target or name.endswith("." + target) or fnmatch.fnmatchcase(name, target)


def select(model: Module, targets: list[str]) -> list[str]:
    """The dotted names of the linear layers `targets` picks (see KINDS), in model order.
    Each target must pick at least one linear layer."""
    if not targets:
        raise LoRAError("[lora] targets is empty; name the layers to adapt, e.g. "
                        "targets = [\"linear\"] or [\"attention\"]")
    layers = [name for name, *_ in _linear_layers(model)]
    attention = _attention_names(model)
    chosen: set[str] = set()
    for t in targets:
        if not isinstance(t, str) or not t:
            raise LoRAError(f"[lora] targets must be layer names or kinds (strings), got {t!r}")
        if t == "linear":
            hit = set(layers)
        elif t == "attention":
            hit = attention & set(layers)
        else:
            hit = {n for n in layers if _matches(n, t)}
            if not hit:
                mods = dict(model.named_modules())
                other = next((n for n in mods if n and _matches(n, t)), None)
                if other is not None and type(mods[other]) is Linear:
                    parent = other.rpartition(".")[0]
                    raise LoRAError(f"[lora] targets {t!r} names {other}, the linear inside "
                                    f"{parent or 'the model'} ({type(mods[parent]).__name__}), "
                                    "which is one op of the graph; LoRA adapts linear layers of "
                                    "their own")
                if other is not None:
                    raise LoRAError(f"[lora] targets {t!r} names {other} "
                                    f"({type(mods[other]).__name__}); LoRA adapts linear layers "
                                    "(and attention's projections)")
        if not hit:
            shown = ", ".join(layers[:12]) + (" ..." if len(layers) > 12 else "")
            raise LoRAError(f"[lora] targets {t!r} matched no linear layer; the model's linear "
                            f"layers are: {shown or 'none'} (kinds: {', '.join(KINDS)})")
        chosen |= hit
    return [n for n in layers if n in chosen]


def _trained_in_full(model: Module, names: list[str], adapted: list[str]) -> list:
    """The parameters of the layers `names` picks (PEFT's modules_to_save), each of which may
    be any layer but not an adapted one."""
    out = []
    for t in names:
        hit = [(n, m) for n, m in model.named_modules() if n and _matches(n, t)]
        if not hit:
            raise LoRAError(f"[lora] trainable {t!r} matched no layer of the model")
        for n, m in hit:
            if n in adapted:
                raise LoRAError(f"[lora] layer {n} is both in targets (adapted) and in "
                                "trainable (trained in full); give it in one of the two")
            out += m.parameters()
    return out


def apply_lora(model: Module, rank: int, alpha: float | None = None, dropout: float = 0.0,
               targets=("linear",), rng=None, trainable=()) -> list[str]:
    """Freeze every parameter of `model`, then replace the linear layers `targets` picks by
    LoRALinear adapters (in place, keeping their position and names); the layers `trainable`
    picks stay trained in full (a new head, say). Returns the adapted layers' names."""
    names = select(model, list(targets))
    full = {id(p) for p in _trained_in_full(model, list(trainable), names) if p.requires_grad}
    for p in model.parameters():
        p.requires_grad = id(p) in full
        p.grad = None
    wanted = set(names)
    for name, parent, attr, layer in _linear_layers(model):
        if name in wanted:
            adapter = LoRALinear(layer, rank, alpha, dropout, rng)
            # NOTE: in place in the children table: a setattr would pop and re-append the
            # entry, moving the layer to the end of a Sequential.
            parent._modules[attr] = adapter
            object.__setattr__(parent, attr, adapter)
    return names


def adapters(model: Module) -> list[tuple[str, LoRALinear]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, LoRALinear)]
