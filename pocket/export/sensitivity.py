"""Per-layer int8 sensitivity, and the fp32 fallback that meets `--int8-target`.

Sensitivity of an int8 layer: the SQNR (dB) of the model's output against fp32 when that layer
alone is int8 and every other layer fp32, on a few calibration samples. A layer's own error
(the guard in `quantize.py`) says how well it is quantized; its sensitivity says how much that
error costs at the output, after the rest of the network has amplified or absorbed it.

Target: the least sensitive layers stay int8 and the k most sensitive ones go back to fp32,
with the smallest k whose whole int8 model reaches the target SQNR on the same samples. k is
found by doubling (0, 1, 2, 4, ...) and then bisection, on the premise that more fp32 layers
never lower the SQNR much; every k tried is reported, and k = all layers is fp32 throughout,
so a target is always met.

Each run reuses the fp32 values that do not depend on the quantized layers (everything
upstream of the first change), computed once on the samples.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from pocket.export.quantize import Quantized
from pocket.formats import quant as Q
from pocket.formats import reference
from pocket.formats.ir import Graph

SENSITIVITY_SAMPLES = 16


def unchanged_values(base: Graph, g: Graph) -> set[str]:
    """Values of g computed exactly as in base: by a node identical to base's node of the same
    name, from graph inputs, same-typed params and other unchanged values."""
    nodes = {n.name: n for n in base.nodes}
    clean = set(g.inputs)
    for n in g.nodes:
        b = nodes.get(n.name)
        if (b is not None and (b.op, b.inputs, b.outputs, b.attrs) == (n.op, n.inputs, n.outputs,
                                                                      n.attrs)
                and all(i in clean or (i in g.params and _same(base.params.get(i), g.params[i]))
                        for i in n.inputs)):
            clean.update(n.outputs)
    return clean - set(g.inputs)


def _same(a, b) -> bool:
    return a is not None and a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape)


def _output(graph: Graph, qz: Quantized, xs: np.ndarray, env: Mapping[str, np.ndarray]):
    known = {v: env[v] for v in unchanged_values(graph, qz.graph)}
    return reference.run(qz.graph, qz.params, xs, qz.quant, known=known)[graph.outputs[0]]


def layer_sensitivity(graph: Graph, qz: Quantized, xs: np.ndarray,
                      env: Mapping[str, np.ndarray],
                      quantize: Callable[..., Quantized]) -> dict[str, float]:
    """int8 layer name -> output SQNR (dB) with only it in int8.

    env: every fp32 value of `graph` on xs (reference.run(..., keep_all=True)); quantize: makes
    the int8 graph given keep_fp32 (quantize_graph with the pass and errors bound).
    """
    layers = [r["name"] for r in qz.layers if r["int8"]]
    ref = env[graph.outputs[0]]
    out = {}
    for name in layers:
        alone = quantize(keep_fp32={n: "" for n in layers if n != name})
        out[name] = Q.sqnr_db(ref, _output(graph, alone, xs, env))
    return out


def meet_target(graph: Graph, qz: Quantized, xs: np.ndarray, env: Mapping[str, np.ndarray],
                target_db: float, sensitivity: Mapping[str, float],
                quantize: Callable[..., Quantized]) -> tuple[Quantized, dict]:
    """The int8 model with the fewest most-sensitive layers in fp32 that reaches target_db."""
    order = sorted(sensitivity, key=lambda n: (sensitivity[n], n))
    ref = env[graph.outputs[0]]
    tried: dict[int, tuple[Quantized, float]] = {}

    def measure(k: int) -> bool:
        if k not in tried:
            keep = {n: (f"kept fp32 for --int8-target {target_db:g} dB (alone in int8 the "
                        f"output SQNR is {sensitivity[n]:.1f} dB)") for n in order[:k]}
            qk = quantize(keep_fp32=keep) if k else qz
            tried[k] = (qk, Q.sqnr_db(ref, _output(graph, qk, xs, env)))
        return tried[k][1] >= target_db

    ok, bad = len(order), -1
    k = 0
    while k < len(order):
        if measure(k):
            ok = k
            break
        bad = k
        k = 1 if k == 0 else 2 * k
    else:
        measure(ok)
    while ok - bad > 1:
        mid = (ok + bad) // 2
        if measure(mid):
            ok = mid
        else:
            bad = mid
    best, sqnr = tried[ok]
    info = {"sqnr_db": float(target_db), "samples": len(xs), "met": sqnr >= target_db,
            "reached_db": sqnr, "layers_fp32": order[:ok],
            "tried": [{"fp32_layers": k, "sqnr_db": s} for k, (_, s) in sorted(tried.items())]}
    return best, info
