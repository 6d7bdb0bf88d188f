"""Embedding primitives: L2 normalisation (the IR's `l2norm`, pocket/formats/ops_embed) and the
margin losses an embedding is trained with.

ArcFace (Deng et al., 2019, "ArcFace: Additive Angular Margin Loss for Deep Face
Recognition"): features x and class weights W are unit vectors, so a logit is the cosine of the
angle between a sample and a class centre, cos(theta_j); the target class's logit becomes
cos(theta_y + m), the others stay cos(theta_j), all times a scale s, then softmax
cross-entropy. The margin pulls each class into a tighter cone than plain softmax does, which
is what makes the features of classes never seen in training separate too.

cos(theta + m) is not monotone in theta past pi - m, so the paper's code switches branches
there (the "threshold handling"):

    easy_margin:  phi = cos(theta + m) where cos(theta) > 0,            else cos(theta)
    otherwise:    phi = cos(theta + m) where cos(theta) > th = cos(pi - m),
                  else cos(theta) - mm,  mm = sin(pi - m) * m

The margin itself is one elementwise primitive of the target cosine (`arc_margin`), its
derivative beside it; the rest is composed from core ops.
"""

from __future__ import annotations

import math

import numpy as np

from pocket.formats import ops
from pocket.train import backend
from pocket.train import functional as F
from pocket.train.tensor import Tensor, as_tensor, primitive


def _xp(a):
    return backend.get_array_module(a)


def _l2norm_fwd(ctx, x, axis=-1, eps=1e-12):
    # x (N, ...) -> x / max(||x|| over axis, eps)
    xp = _xp(x)
    norm = xp.sqrt((x * x).sum(axis=axis, keepdims=True))
    d = xp.maximum(norm, x.dtype.type(eps))
    y = x / d
    ctx.save(y if ctx.needs[0] else None, d, norm > eps)
    ctx.attrs["axis"] = axis
    return y


def _l2norm_bwd(ctx, gy):
    y, d, live = ctx.saved
    # where the norm is above eps: (gy - y <gy, y>) / ||x||; where clamped, y = x / eps
    proj = (gy * y).sum(axis=ctx.attrs["axis"], keepdims=True)
    return ((gy - live * y * proj) / d,)


_l2norm = primitive("l2norm", _l2norm_fwd, _l2norm_bwd)


@ops.register("train", "l2norm")
def l2_normalize(x, axis: int = -1, eps: float = 1e-12) -> Tensor:
    """x / max(||x||_2 over axis, eps), as torch.nn.functional.normalize."""
    return _l2norm(as_tensor(x), axis=int(axis), eps=float(eps))


def margin_constants(m: float) -> tuple[float, float, float, float]:
    """(cos m, sin m, th, mm) of the paper's code."""
    return math.cos(m), math.sin(m), math.cos(math.pi - m), math.sin(math.pi - m) * m


def _arc_margin_fwd(ctx, c, m=0.5, easy_margin=False):
    # c (N,) target cosines -> phi (N,)
    xp = _xp(c)
    cos_m, sin_m, th, mm = margin_constants(m)
    sin = xp.sqrt(xp.clip(1.0 - c * c, 0.0, 1.0))
    phi = c * cos_m - sin * sin_m
    on = c > 0 if easy_margin else c > th
    out = xp.where(on, phi, c if easy_margin else c - mm)
    # NOTE: d sin / d c = -c / sin blows up at c = +-1 (a sample exactly on its centre); the
    # floor keeps the gradient finite there, where the loss is flat anyway
    ctx.save(xp.where(on, cos_m + sin_m * c / xp.maximum(sin, 1e-6), 1.0).astype(c.dtype))
    return out.astype(c.dtype)


def _arc_margin_bwd(ctx, gy):
    return (gy * ctx.saved[0],)


_arc_margin = primitive("arc_margin", _arc_margin_fwd, _arc_margin_bwd)


def arc_margin(cos_target, m: float = 0.5, easy_margin: bool = False) -> Tensor:
    """cos(theta + m) of target cosines (N,), with the branch of the paper past pi - m."""
    return _arc_margin(as_tensor(cos_target), m=float(m), easy_margin=bool(easy_margin))


def arcface_logits(x, weight, target, s: float = 30.0, m: float = 0.5,
                   easy_margin: bool = False) -> Tensor:
    """x (N, D) features, weight (K, D) class centres, target (N,) ids -> logits (N, K)."""
    x, weight = as_tensor(x), as_tensor(weight)
    xp = _xp(x.data)
    t = xp.asarray(target.data if isinstance(target, Tensor) else target).astype(np.int64)
    cos = F.matmul(l2_normalize(x, axis=1), F.transpose(l2_normalize(weight, axis=1)))
    rows = xp.arange(t.shape[0])
    c = F.getitem(cos, (rows, t))
    onehot = xp.zeros(cos.shape, cos.dtype)
    onehot[rows, t] = 1
    # only the target column moves: cos + onehot * (phi - cos)
    shift = F.mul(Tensor(onehot), F.reshape(F.sub(arc_margin(c, m, easy_margin), c), (-1, 1)))
    return F.mul(F.add(cos, shift), float(s))


def arcface_loss(x, weight, target, s: float = 30.0, m: float = 0.5,
                 easy_margin: bool = False) -> Tensor:
    """Mean ArcFace loss: softmax cross-entropy of `arcface_logits`."""
    t = target.data if isinstance(target, Tensor) else target
    return F.cross_entropy(arcface_logits(x, weight, t, s, m, easy_margin), t)


def softmax_loss(x, weight, bias, target) -> Tensor:
    """The baseline: a plain linear softmax classifier on the (normalised) features."""
    t = target.data if isinstance(target, Tensor) else target
    logits = F.matmul(as_tensor(x), F.transpose(as_tensor(weight)))
    if bias is not None:
        logits = F.add(logits, bias)
    return F.cross_entropy(logits, t)
