"""Sequence and attention primitives: layer normalisation, embedding lookup and scaled
dot-product attention, each forward with its backward beside it (see train/functional.py for
the primitive protocol). Batched matmul and transpose are functional.matmul/transpose.
"""

from __future__ import annotations

import math

import numpy as np

from pocket.formats import ops
from pocket.train import backend
from pocket.train.tensor import Tensor, as_tensor, primitive


def _xp(a):
    return backend.get_array_module(a)


# ---------------------------------------------------------------- layer norm

def _cpu_rows(*arrays) -> bool:
    # the one-pass row kernels (kernels_seqattn): CPU arrays of one dtype, float32 or float64
    return (_xp(arrays[0]) is np and arrays[0].dtype in (np.float32, np.float64)
            and all(a.dtype == arrays[0].dtype for a in arrays))


def _layer_norm_fwd(ctx, x, w, b, axis=-1, eps=1e-5):
    # x (..., *S), w/b S -> y like x; statistics over the trailing dims S (from `axis` on)
    axes = tuple(range(axis % x.ndim, x.ndim))
    ctx.attrs["axes"] = axes
    if _cpu_rows(x, w, b):
        from pocket.train import kernels_seqattn as K

        x2 = np.ascontiguousarray(x).reshape(-1, w.size)
        y, xhat = np.empty_like(x2), np.empty_like(x2)
        invstd = np.empty(x2.shape[0], x.dtype)
        K.layer_norm_forward(x2, w.reshape(-1), b.reshape(-1), eps, y, xhat, invstd)
        ctx.save(xhat, invstd, w)
        return y.reshape(x.shape)
    # NOTE: fp16 statistics are taken in fp32: a sum of squares over D fp16 values loses its
    # low bits long before the mean does.
    xa = x.astype(np.float32) if x.dtype == np.float16 else x
    mean = xa.mean(axis=axes, keepdims=True)
    xc = xa - mean
    var = (xc * xc).mean(axis=axes, keepdims=True)
    invstd = 1.0 / _xp(x).sqrt(var + eps)
    xhat = (xc * invstd).astype(x.dtype, copy=False)
    ctx.save(xhat, invstd.astype(x.dtype, copy=False), w)
    return xhat * w.astype(x.dtype, copy=False) + b.astype(x.dtype, copy=False)


def _layer_norm_bwd(ctx, gy):
    xhat, invstd, w = ctx.saved
    axes = ctx.attrs["axes"]
    if invstd.ndim == 1 and _cpu_rows(gy, xhat):  # the forward ran kernels_seqattn
        from pocket.train import kernels_seqattn as K

        gy2 = np.ascontiguousarray(gy).reshape(xhat.shape)
        gx = np.empty_like(gy2)
        gw, gb = np.zeros(w.size), np.zeros(w.size)
        K.layer_norm_backward(gy2, xhat, invstd, w.reshape(-1), gx, gw, gb)
        return (gx.reshape(gy.shape) if ctx.needs[0] else None,
                gw.astype(w.dtype).reshape(w.shape) if ctx.needs[1] else None,
                gb.astype(w.dtype).reshape(w.shape) if ctx.needs[2] else None)
    lead = tuple(range(axes[0]))
    gw = (gy * xhat).sum(axis=lead) if ctx.needs[1] else None
    gb = gy.sum(axis=lead) if ctx.needs[2] else None
    gx = None
    if ctx.needs[0]:
        g = gy * w.astype(gy.dtype, copy=False)
        # d/dx of (x - mean) * invstd through the mean and the variance over `axes`
        gx = invstd * (g - g.mean(axis=axes, keepdims=True)
                       - xhat * (g * xhat).mean(axis=axes, keepdims=True))
    return (gx, None if gw is None else gw.astype(w.dtype, copy=False),
            None if gb is None else gb.astype(w.dtype, copy=False))


_layer_norm = primitive("layernorm", _layer_norm_fwd, _layer_norm_bwd)


def layer_norm(x, weight, bias, axis: int = -1, eps: float = 1e-5) -> Tensor:
    """Layer normalisation over the dims from `axis` to the end, with an affine weight and
    bias of those dims' shape. Ba, Kiros & Hinton, 2016."""
    x = as_tensor(x)
    if not -x.ndim <= axis < x.ndim or axis % x.ndim == 0:
        raise ValueError(f"layer_norm axis {axis} must name a non-batch dim of a "
                         f"{x.ndim}-D input")
    norm = tuple(x.shape[axis % x.ndim:])
    if tuple(weight.shape) != norm or tuple(bias.shape) != norm:
        raise ValueError(f"layer_norm weight and bias must have shape {list(norm)}, got "
                         f"{list(weight.shape)} and {list(bias.shape)}")
    return _layer_norm(x, weight, bias, axis=axis % x.ndim, eps=float(eps))


# ---------------------------------------------------------------- embedding

def _embedding_fwd(ctx, w, indices=None):
    # w (V, D), indices (...) int -> out (..., D)
    ctx.attrs.update(indices=indices, shape=w.shape)
    return w[indices]


def _embedding_bwd(ctx, gy):
    at = ctx.attrs
    g = _xp(gy).zeros(at["shape"], gy.dtype)
    backend.scatter_add(g, at["indices"], gy)  # a token seen twice gets both gradients
    return (g,)


_embedding = primitive("embedding", _embedding_fwd, _embedding_bwd)


def as_indices(ids, num_embeddings: int):
    """Integer token ids as int64 on ids' device; float ids must hold whole numbers (a data
    loader may hand them over as float32). Ids outside [0, V) are a ValueError: NumPy would
    wrap a negative one silently."""
    a = ids.data if isinstance(ids, Tensor) else ids
    xp = _xp(a)
    a = xp.asarray(a)
    if a.dtype.kind == "f":
        r = xp.rint(a)
        if bool((r != a).any()):
            raise ValueError("embedding ids must be whole numbers")
        a = r
    elif a.dtype.kind not in "iu":
        raise ValueError(f"embedding ids must be integers, got dtype {a.dtype}")
    if a.size:
        lo, hi = int(a.min()), int(a.max())
        if lo < 0 or hi >= num_embeddings:
            raise ValueError(f"embedding id {lo if lo < 0 else hi} is outside [0, "
                             f"{num_embeddings}); the vocabulary has {num_embeddings} entries")
    return a.astype(np.int64, copy=False)


def embedding(ids, weight) -> Tensor:
    """weight[ids]: ids (...) integer in [0, V), weight (V, D) -> (..., D)."""
    weight = as_tensor(weight)
    return _embedding(weight, indices=as_indices(ids, weight.shape[0]))


# ---------------------------------------------------------------- attention

def causal_mask(xp, lq: int, lk: int, dtype):
    """(lq, lk): 0 where key j <= query i, -inf above (the upper-left aligned triangle,
    as torch's is_causal)."""
    keep = xp.tril(xp.ones((lq, lk), dtype=bool))
    return xp.where(keep, 0.0, -np.inf).astype(dtype)


def _attention_fwd(ctx, q, k, v, causal=False, scale=1.0, dropout_p=0.0, rng=None):
    # q (..., L, D), k (..., S, D), v (..., S, Dv) -> out (..., L, Dv)
    xp = _xp(q)
    s = (q @ k.swapaxes(-1, -2)) * q.dtype.type(scale)
    if causal:
        s += causal_mask(xp, q.shape[-2], k.shape[-2], s.dtype)
    if _cpu_rows(s) and s.flags.c_contiguous:
        from pocket.train import kernels_seqattn as K

        (K.softmax_rows32 if s.dtype == np.float32 else K.softmax_rows64)(s.reshape(-1, s.shape[-1]))
        p = s
    else:
        s -= s.max(axis=-1, keepdims=True)
        p = xp.exp(s, out=s)
        p /= p.sum(axis=-1, keepdims=True)
    mask = None
    if dropout_p:
        mask = backend.dropout_mask(p.shape, p, dropout_p, rng)
        pd = p * mask
    else:
        pd = p
    n = ctx.needs
    ctx.save(q if n[1] else None, k if n[0] else None, v if (n[0] or n[1]) else None,
             p if (n[0] or n[1]) else None, mask, pd if n[2] else None)
    ctx.attrs["scale"] = scale
    return pd @ v


def _attention_bwd(ctx, gy):
    q, k, v, p, mask, pd = ctx.saved
    scale = gy.dtype.type(ctx.attrs["scale"])
    n = ctx.needs
    gv = pd.swapaxes(-1, -2) @ gy if n[2] else None
    gq = gk = None
    if n[0] or n[1]:
        gp = gy @ v.swapaxes(-1, -2)
        if mask is not None:
            gp *= mask
        # softmax backward; masked entries have p = 0 and so get no gradient
        if _cpu_rows(gp, p) and gp.flags.c_contiguous and p.flags.c_contiguous:
            from pocket.train import kernels_seqattn as K

            K.softmax_backward_rows(p.reshape(-1, p.shape[-1]), gp.reshape(-1, gp.shape[-1]), scale)
            gs = gp
        else:
            gs = p * (gp - (gp * p).sum(axis=-1, keepdims=True))
            gs *= scale
        gq = gs @ k if n[0] else None
        gk = gs.swapaxes(-1, -2) @ q if n[1] else None
    return gq, gk, gv


_attention = primitive("attention", _attention_fwd, _attention_bwd)


def attention(q, k, v, causal: bool = False, scale: float | None = None, dropout_p: float = 0.0,
              rng=None) -> Tensor:
    """softmax(q k^T * scale [+ causal mask]) v over the last two dims; scale defaults to
    1/sqrt(D). Dropout (training only) drops attention weights, as torch does. Vaswani et al.,
    2017."""
    q, k, v = as_tensor(q), as_tensor(k), as_tensor(v)
    if q.ndim < 2 or k.ndim != q.ndim or v.ndim != q.ndim:
        raise ValueError(f"attention wants q, k, v of one rank >= 2, got {q.shape}, {k.shape}, "
                         f"{v.shape}")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"attention: q {q.shape}, k {k.shape}, v {v.shape} do not fit "
                         "(q and k share D, k and v share the length)")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"attention dropout must be in [0, 1), got {dropout_p}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return _attention(q, k, v, causal=bool(causal), scale=scale, dropout_p=float(dropout_p),
                      rng=rng)



# ---------------------------------------------------------------- fused self-attention (CPU)

def _self_attention_fwd(ctx, x, wq, bq, wk, bk, wv, bv, heads=1, causal=False, dropout_p=0.0,
                        rng=None):
    # x (N, L, E), w* (E, E), b* (E,) -> out (N, L, E): attention over the q/k/v projections
    # of x, the heads merged back (the input of the output projection)
    n, length, e = x.shape
    dh = e // heads
    x2 = x.reshape(-1, e)
    w = np.concatenate((wq, wk, wv))  # (3E, E): one GEMM for the three projections
    qkv = x2 @ w.T
    qkv += np.concatenate((bq, bk, bv))
    q, k, v = _heads(qkv, n, length, heads, dh)
    scale = 1.0 / math.sqrt(dh)
    s = q @ k.swapaxes(-1, -2)
    s *= q.dtype.type(scale)
    if causal:
        s += causal_mask(np, length, length, s.dtype)
    from pocket.train import kernels_seqattn as K

    (K.softmax_rows32 if s.dtype == np.float32 else K.softmax_rows64)(s.reshape(-1, length))
    p = s
    mask = backend.dropout_mask(p.shape, p, dropout_p, rng) if dropout_p else None
    pd = p if mask is None else p * mask
    out = np.empty((n, length, heads, dh), x.dtype)
    np.matmul(pd, v, out=out.transpose(0, 2, 1, 3))  # written in the merged layout
    need_w = any(ctx.needs[1:])
    ctx.save(x2 if need_w else None, w if ctx.needs[0] else None, qkv, p, mask)
    ctx.attrs.update(heads=heads, scale=scale, shape=x.shape)
    return out.reshape(n, length, e)


def _heads(qkv, n, length, heads, dh):
    # qkv (N*L, 3E) -> q, k, v (N, H, L, Dh) strided views
    q5 = qkv.reshape(n, length, 3, heads, dh)
    return tuple(q5[:, :, i].transpose(0, 2, 1, 3) for i in range(3))


def _self_attention_bwd(ctx, gy):
    x2, w, qkv, p, mask = ctx.saved
    at, needs = ctx.attrs, ctx.needs
    n, length, e = at["shape"]
    heads = at["heads"]
    dh = e // heads
    q, k, v = _heads(qkv, n, length, heads, dh)
    gy4 = gy.reshape(n, length, heads, dh).transpose(0, 2, 1, 3)
    g = np.empty_like(qkv)  # (N*L, 3E): dq, dk, dv written in the projections' layout
    gq, gk, gv = _heads(g, n, length, heads, dh)
    pd = p if mask is None else p * mask
    np.matmul(pd.swapaxes(-1, -2), gy4, out=gv)
    gp = gy4 @ v.swapaxes(-1, -2)
    if mask is not None:
        gp *= mask
    from pocket.train import kernels_seqattn as K

    K.softmax_backward_rows(p.reshape(-1, length), gp.reshape(-1, length),
                            gp.dtype.type(at["scale"]))
    np.matmul(gp, k, out=gq)
    np.matmul(gp.swapaxes(-1, -2), q, out=gk)
    gx = (g @ w).reshape(at["shape"]) if needs[0] else None
    gw = g.T @ x2 if any(needs[1::2]) else None
    gb = np.ones(g.shape[0], g.dtype) @ g if any(needs[2::2]) else None
    grads = [gx]
    for i in range(3):
        grads.append(gw[i * e:(i + 1) * e] if needs[1 + 2 * i] else None)
        grads.append(gb[i * e:(i + 1) * e] if needs[2 + 2 * i] else None)
    return tuple(grads)


_self_attention = primitive("self_attention", _self_attention_fwd, _self_attention_bwd)


def fused_self_attention_ok(x, *params) -> bool:
    """Whether `self_attention` runs here: CPU arrays, float32 or float64, one dtype."""
    return _cpu_rows(x.data, *(t.data for t in params)) and x.ndim == 3


def self_attention(x, wq, bq, wk, bk, wv, bv, heads: int, causal: bool = False,
                   dropout_p: float = 0.0, rng=None) -> Tensor:
    """Multi-head self-attention of x (N, L, E) through the q/k/v projections (w (E, E) as
    linear's, b (E,)), heads merged: the value `attention` gives on `linear`'s projections split
    into heads, with one GEMM for the three projections and no head split/merge copies (CPU,
    float32/float64: see fused_self_attention_ok)."""
    x = as_tensor(x)
    return _self_attention(x, wq, bq, wk, bk, wv, bv, heads=int(heads), causal=bool(causal),
                           dropout_p=float(dropout_p), rng=rng)

from pocket.train import functional as F  # noqa: E402  (functional imports this module last)

ops.register_table("train", {
    "layernorm": layer_norm, "embedding": embedding, "attention": attention,
    "matmul": F.matmul, "transpose": F.transpose,
})
