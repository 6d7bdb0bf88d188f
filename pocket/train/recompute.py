"""Activation checkpointing: run segments of a Sequential without keeping their insides.

Chainer's `F.forget` and Chen et al., 2016 ("Training Deep Nets with Sublinear Memory Cost"):
each checkpointed segment is one node in the graph. Its forward runs under `no_grad` and keeps
only the segment's input; its backward re-runs the segment with the graph on, backpropagates
the incoming gradient through that fresh sub-graph (parameter gradients land in the leaf
parameters with +=, as in a plain run), and hands back the input gradient. With k segments
the live activations are the k segment inputs plus one segment's insides, instead of all of
them, at the price of a second forward.

The module tree is untouched (no wrapper modules), so parameter names, state dicts and the
tracer see the same model as without checkpointing.
"""

from __future__ import annotations

import numpy as np

from pocket.train import backend
from pocket.train.tensor import Tensor, enable_grad, no_grad, primitive


def split_segments(n: int, segments: int) -> list[tuple[int, int]]:
    """Cut n children into `segments` contiguous [start, stop) runs, sizes differing by <= 1."""
    segments = max(1, min(int(segments), n))
    base, extra = divmod(n, segments)
    cuts, start = [], 0
    for i in range(segments):
        stop = start + base + (1 if i < extra else 0)
        cuts.append((start, stop))
        start = stop
    return cuts


def _run(modules, x: Tensor) -> Tensor:
    for m in modules:
        x = m(x)
    return x


def _module_rngs(modules) -> list:
    """Generators owned by layers (e.g. `Dropout(rng=...)`), which the backend RNG misses."""
    out = []
    for top in modules:
        for m in top.modules():
            g = getattr(m, "rng", None)
            if isinstance(g, np.random.Generator):
                out.append(g)
    return out


def _rng_state(modules) -> tuple:
    return backend.get_rng_state(), [g.bit_generator.state for g in _module_rngs(modules)]


def _set_rng_state(modules, state: tuple) -> None:
    backend.set_rng_state(state[0])
    for g, s in zip(_module_rngs(modules), state[1]):
        g.bit_generator.state = s


def _snapshot_buffers(modules) -> list:
    return [(m, name, buf, buf.copy()) for top in modules for m in top.modules()
            for name, buf in m._buffers.items()]


def _restore_buffers(snapshot: list) -> None:
    for m, name, buf, copy in snapshot:
        buf[...] = copy  # BN updates in place, so the original array is the one to rewrite
        m._set_buffer(name, buf)


def _segment_fwd(ctx, x, *param_arrays, modules=()):
    # x: the segment input; param_arrays only make the node record (and be reached) when x
    # itself needs no gradient, e.g. the first segment fed by data.
    ctx.attrs["rng"] = _rng_state(modules)
    ctx.attrs["modules"] = modules
    ctx.save(x)
    with no_grad():
        return _run(modules, Tensor(x)).data


def _segment_bwd(ctx, gy):
    (x,) = ctx.saved
    modules = ctx.attrs["modules"]
    # NOTE: the recompute must draw the same dropout masks as the original forward, so the RNG
    # is rewound to the state before it; afterwards it goes back to where it is now (not to the
    # state after this segment's forward: later segments drew from it since, and rewinding
    # there would make the next step repeat their masks).
    now = _rng_state(modules)
    # NOTE: BN recomputes in training mode (batch statistics, as the original forward did) but
    # must not move the running statistics a second time: one step is one momentum update.
    # Snapshot the buffers and put them back after the recompute.
    buffers = _snapshot_buffers(modules)
    _set_rng_state(modules, ctx.attrs["rng"])
    try:
        xin = Tensor(x, requires_grad=ctx.needs[0])
        with enable_grad():
            out = _run(modules, xin)
        if out.requires_grad:
            out.backward(gy)  # a nested run of the iterative engine over the fresh sub-graph
    finally:
        _set_rng_state(modules, now)
        _restore_buffers(buffers)
    # Parameter gradients were accumulated by the inner backward; None keeps the outer
    # engine from adding them a second time.
    return (xin.grad if ctx.needs[0] else None,) + (None,) * (len(ctx.needs) - 1)


_segment = primitive("checkpoint", _segment_fwd, _segment_bwd)


def checkpoint(modules, x: Tensor) -> Tensor:
    """Run `modules` in order on x as one recomputed segment."""
    modules = tuple(modules)
    params = [p for m in modules for p in m.parameters() if p.requires_grad]
    return _segment(x, *params, modules=modules)


def checkpoint_sequential(seq, x: Tensor, segments: int) -> Tensor:
    """seq(x) with its children cut into `segments` runs; all but the last are checkpointed.

    The last run is not: its activations are needed by the backward right away, so dropping
    and recomputing them would cost time and save nothing. segments <= 1, or a run without a
    graph (no_grad / eval), is plain `seq(x)`.
    """
    children = list(seq.children())
    if segments <= 1 or len(children) < 2:
        return seq(x)
    runs = split_segments(len(children), segments)
    for i, (a, b) in enumerate(runs):
        if i == len(runs) - 1:
            x = _run(children[a:b], x)
        else:
            x = checkpoint(children[a:b], x)
    return x
