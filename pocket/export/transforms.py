"""Graph rewrites that keep the meaning of a graph and make it cheaper to run.

Each transform takes (graph, params) and returns a `Rewrite`: a new validated graph, the params
it reads (new arrays only where values changed; the inputs are never written) and how many
rewrites it made. `optimize` runs them in the order export needs:

    drop_dropout -> fold_batchnorm -> fuse_activations -> remove_dead

A value that leaves the graph (a graph output) keeps its name through every rewrite, so the
engine, onnxruntime and `pocket compare` find the output where the checkpoint said it was.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from pocket.formats import ops
from pocket.formats.ir import Graph, Node, ValueInfo


class Rewrite(NamedTuple):
    graph: Graph
    params: dict[str, np.ndarray]
    count: int


# --------------------------------------------------------------------------- helpers


def _copy(graph: Graph) -> Graph:
    return copy.deepcopy(graph)


def consumers(graph: Graph) -> dict[str, list[Node]]:
    """value name -> the nodes that read it (a node reading a value twice appears twice)."""
    out: dict[str, list[Node]] = {}
    for node in graph.nodes:
        for x in node.inputs:
            out.setdefault(x, []).append(node)
    return out


def producers(graph: Graph) -> dict[str, Node]:
    return {o: node for node in graph.nodes for o in node.outputs}


def _sole_reader(graph: Graph, uses: dict[str, list[Node]], value: str) -> Node | None:
    """The one node reading `value`, if nothing else (another node or the caller) sees it."""
    readers = uses.get(value, [])
    if len(readers) != 1 or value in graph.outputs:
        return None
    return readers[0]


def _bypass(graph: Graph, node: Node) -> bool:
    """Remove a one-in one-out node whose output equals its input; False if it must stay.

    Readers of the output read the input instead; when the output is a graph output, the
    producer of the input is renamed to it instead, so the graph's interface does not change.
    """
    src, dst = node.inputs[0], node.outputs[0]
    if dst in graph.outputs:
        if src in graph.inputs or src in graph.params or src in graph.outputs:
            return False
        old, new = src, dst
    else:
        old, new = dst, src
    graph.nodes.remove(node)
    for n in graph.nodes:
        n.inputs = [new if x == old else x for x in n.inputs]
        n.outputs = [new if x == old else x for x in n.outputs]
    return True


def _fresh(name: str, taken) -> str:
    if name not in taken:
        return name
    i = 1
    while f"{name}_{i}" in taken:
        i += 1
    return f"{name}_{i}"


def _finish(graph: Graph, params: Mapping[str, np.ndarray], count: int) -> Rewrite:
    """Validate, and describe each param the graph lists by the array it now holds."""
    out = {n: params[n] for n in graph.params}
    graph.params = {n: ValueInfo(DTYPE_NAMES[a.dtype], tuple(a.shape)) for n, a in out.items()}
    graph.validate()
    return Rewrite(graph, out, count)


DTYPE_NAMES = {np.dtype(np.float32): "f32", np.dtype(np.float16): "f16", np.dtype(np.int8): "i8",
                np.dtype(np.uint8): "u8", np.dtype(np.int32): "i32", np.dtype(np.int64): "i64"}


# --------------------------------------------------------------------------- the transforms


def drop_dropout(graph: Graph, params: Mapping[str, np.ndarray]) -> Rewrite:
    """Dropout is the identity at inference: rewire its readers to its input."""
    g = _copy(graph)
    count = 0
    for node in [n for n in g.nodes if n.op == "dropout"]:
        count += _bypass(g, node)
    return _finish(g, params, count)


def fold_batchnorm(graph: Graph, params: Mapping[str, np.ndarray]) -> Rewrite:
    """Fold `batchnorm(conv2d|linear(x))` into the conv/linear's weight and bias.

    With k = gamma / sqrt(var + eps): w' = w * k (per output channel), b' = (b - mean) * k + beta.
    Only when the BatchNorm is the sole reader of a conv/linear output that has no fused
    activation; any other BatchNorm stays (it is a valid op of its own).
    """
    g = _copy(graph)
    params = dict(params)
    uses = consumers(g)
    made = producers(g)
    # A weight read by two nodes (tied weights) must not change under the other reader.
    reads = {}
    for n in g.nodes:
        for x in n.inputs:
            reads[x] = reads.get(x, 0) + 1
    count = 0
    for bn in [n for n in g.nodes if n.op == "batchnorm"]:
        prod = made.get(bn.inputs[0])
        if (prod is None or prod.op not in ("conv2d", "linear")
                or prod.attrs.get("activation", "none") != "none"
                or _sole_reader(g, uses, bn.inputs[0]) is not bn
                or any(x not in params for x in bn.inputs[1:])):
            continue
        gamma, beta, mean, var = (np.asarray(params[x], np.float64) for x in bn.inputs[1:])
        # NOTE: float64 all the way, one rounding to float32 at the end: the folded layer then
        # differs from conv-then-BN by about one float32 ulp of the output.
        k = gamma / np.sqrt(var + bn.attrs["eps"])
        w = np.asarray(params[prod.inputs[1]], np.float64)
        b = (np.asarray(params[prod.inputs[2]], np.float64) if len(prod.inputs) > 2
             else np.zeros(w.shape[0]))
        w_name = prod.inputs[1] if reads[prod.inputs[1]] == 1 else _fresh(f"{prod.name}.weight",
                                                                           params)
        if len(prod.inputs) > 2 and reads[prod.inputs[2]] == 1:
            b_name = prod.inputs[2]
        else:
            b_name = _fresh(f"{prod.name}.bias", params)
        params[w_name] = (w * k.reshape((-1,) + (1,) * (w.ndim - 1))).astype(np.float32)
        params[b_name] = ((b - mean) * k + beta).astype(np.float32)
        g.params.update({w_name: None, b_name: None})
        prod.inputs = [prod.inputs[0], w_name, b_name]
        # The BN's output takes over from the conv's: its name is the one the rest of the
        # graph (and possibly the caller) knows.
        g.nodes.remove(bn)
        prod.outputs = list(bn.outputs)
        count += 1
    return _finish(g, params, count)


def fuse_activations(graph: Graph, params: Mapping[str, np.ndarray]) -> Rewrite:
    """Move an activation node into the `activation` attr of the conv2d/linear it reads.

    The registry says which ops fuse and which of their attrs travel (`ops.fusable`); one whose
    other attrs are not at their defaults (gelu's tanh approximation) stays a node.
    """
    g = _copy(graph)
    uses = consumers(g)
    made = producers(g)
    count = 0
    for act in [n for n in g.nodes if ops.fusable(n)]:
        prod = made.get(act.inputs[0])
        if (prod is None or "activation" not in ops.OPS[prod.op].attrs
                or prod.attrs.get("activation", "none") != "none"
                or _sole_reader(g, uses, act.inputs[0]) is not act):
            continue
        prod.attrs.update(ops.fused_attrs(act))
        g.nodes.remove(act)
        prod.outputs = list(act.outputs)
        count += 1
    return _finish(g, params, count)


def remove_dead(graph: Graph, params: Mapping[str, np.ndarray]) -> Rewrite:
    """Drop nodes no graph output depends on, and params no node reads."""
    g = _copy(graph)
    live = set(g.outputs)
    keep = []
    for node in reversed(g.nodes):
        if any(o in live for o in node.outputs):
            keep.append(node)
            live.update(node.inputs)
    count = len(g.nodes) - len(keep)
    g.nodes = keep[::-1]
    used = {x for n in g.nodes for x in n.inputs}
    count += sum(1 for n in g.params if n not in used)
    g.params = {n: v for n, v in g.params.items() if n in used}
    return _finish(g, params, count)


def optimize(graph: Graph, params: Mapping[str, np.ndarray]) -> tuple[Graph, dict, list[str]]:
    """All transforms in order; returns the graph, its params and what was done, in words."""
    applied = []
    for fn, what in ((drop_dropout, "dropped {} dropout"), (fold_batchnorm, "folded {} batchnorm"),
                     (fuse_activations, "fused {} activations"),
                     (remove_dead, "removed {} dead nodes/params")):
        graph, params, n = fn(graph, params)
        if n:
            applied.append(what.format(n))
    return graph, params, applied
