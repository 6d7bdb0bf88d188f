"""Embedding layers: `L2Norm` (the IR's `l2norm`), the training-only class heads, and
`EmbeddingNet`, the model the `embedding` task trains.

EmbeddingNet holds two children: `net`, the backbone with its linear projection to D dims and
the L2Norm (what `forward` runs, what is traced, exported and deployed), and `head`, the class
weights the loss reads. The head is a child module so that its weights are parameters the
optimizer updates and state_dict entries the checkpoint keeps (a resume restores them), but
the tracer walks `net` alone: the class weights never reach the graph, so export never sees
them, and the deployed model works for classes it never trained on.
"""

from __future__ import annotations

import numpy as np

from pocket.formats import ops
from pocket.train import functional_embed as FE
from pocket.train import init, nn
from pocket.train.tensor import Parameter, Tensor
from pocket.train.trace import register_module, trace_module

LOSSES = ("arcface", "softmax")


class L2Norm(nn.Elementwise):
    """x / max(||x||_2, eps) over `axis` (torch.nn.functional.normalize)."""

    op = "l2norm"

    def __init__(self, axis: int = -1, eps: float = 1e-12):
        super().__init__()
        self.axis, self.eps = int(axis), float(eps)

    def forward(self, x):
        return FE.l2_normalize(x, self.axis, self.eps)

    def ir_attrs(self) -> dict:
        return {"axis": self.axis, "eps": self.eps}


class ArcFaceHead(nn.Module):
    """Class centres (K, D) for the ArcFace loss (scale s, margin m, easy_margin)."""

    def __init__(self, num_classes: int, dim: int, s: float = 30.0, m: float = 0.5,
                 easy_margin: bool = False, rng=None):
        super().__init__()
        self.s, self.m, self.easy_margin = float(s), float(m), bool(easy_margin)
        rng = rng if rng is not None else np.random.default_rng(0)
        # NOTE: the rows are normalised in the loss, so only their directions matter
        self.weight = Parameter(rng.standard_normal((num_classes, dim)).astype(np.float32))

    def loss(self, x: Tensor, y) -> Tensor:
        return FE.arcface_loss(x, self.weight, y, self.s, self.m, self.easy_margin)

    def logits(self, x: Tensor, y) -> Tensor:
        return FE.arcface_logits(x, self.weight, y, self.s, self.m, self.easy_margin)


class SoftmaxHead(nn.Module):
    """A plain linear softmax classifier on the normalised features (the baseline)."""

    def __init__(self, num_classes: int, dim: int, rng=None):
        super().__init__()
        bound = 1.0 / np.sqrt(dim)
        self.weight = Parameter(init.uniform((num_classes, dim), bound, rng))
        self.bias = Parameter(init.uniform((num_classes,), bound, rng))

    def loss(self, x: Tensor, y) -> Tensor:
        return FE.softmax_loss(x, self.weight, self.bias, y)


class EmbeddingNet(nn.Module):
    """`net` (backbone -> D -> L2Norm) for inference, `head` for the training loss only."""

    def __init__(self, net: nn.Module, head: nn.Module):
        super().__init__()
        self.net = net
        self.head = head

    def forward(self, x):
        return self.net(x)

    def loss(self, x: Tensor, y) -> Tensor:
        return self.head.loss(x, y)


def build_embedding(backbone: nn.Module, num_classes: int, dim: int, loss: str, *,
                    s: float = 30.0, m: float = 0.5, easy_margin: bool = False,
                    rng=None) -> EmbeddingNet:
    """backbone (ending in a D-wide linear) + L2Norm, with the `loss` head over num_classes."""
    if loss not in LOSSES:
        raise ValueError(f"unknown embedding loss {loss!r}; use {' or '.join(LOSSES)}")
    net = nn.Sequential(*backbone, L2Norm(axis=1))
    head = (ArcFaceHead(num_classes, dim, s, m, easy_margin, rng=rng) if loss == "arcface"
            else SoftmaxHead(num_classes, dim, rng=rng))
    return EmbeddingNet(net, head)


@ops.register("trace", "l2norm")
def _trace_l2norm(b, m: L2Norm, prefix: str, x: str) -> str:
    return b.node(prefix, "l2norm", [x], **m.ir_attrs())


@register_module(EmbeddingNet)
def _trace_embedding_net(b, m: EmbeddingNet, prefix: str, x: str) -> str:
    return trace_module(b, m.net, f"{prefix}.net" if prefix else "net", x)
