"""Engine lowering of the state-space family: `ssm` as its recurrence (kernels_ssm.ssm_scan)
with a state that lives outside the arena, and `glu`.

At load, the layer is discretized once (formats/reference_ssm.ssm_discretize, float64) and its
state arrays are allocated for max_batch. A plain run resets the state at every call; a plan
made by Engine.stream() (infer/streaming.py; the graph's metadata says "streaming") keeps it
between calls, so a sequence fed in chunks gives the outputs of the whole sequence.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np

from pocket.formats import ops
from pocket.formats.ops_ssm import SSM_PARAMS
from pocket.formats.reference_ssm import ssm_discretize
from pocket.infer import kernels_ssm as ks
from pocket.infer.plan import EngineError, PlanContext

STREAMING_KEY = "streaming"  # graph metadata flag set by infer/streaming.py


def _prep_ssm(ctx: PlanContext, node) -> dict:
    p = {k: ctx.params[v] for k, v in zip(SSM_PARAMS, node.inputs[1:])}
    da, w = ssm_discretize(*(p[k] for k in SSM_PARAMS[:-1]))
    h, s = da.shape
    stream = bool(ctx.graph.metadata.get(STREAMING_KEY, False))
    bidir = bool(node.attrs.get("bidirectional", False))
    if stream and bidir:
        raise EngineError(f"node '{node.name}': a bidirectional ssm reads the future and cannot "
                          "be streamed; stream a causal (bidirectional = false) model")
    c = np.ascontiguousarray  # (S, H) and (D, S, H): channels are ssm_scan's vector lanes
    return {"da_re": c(da.real.T), "da_im": c(da.imag.T), "w_re": c(w.real.transpose(0, 2, 1)),
            "w_im": c(w.imag.transpose(0, 2, 1)), "d": np.asarray(p["d"], np.float64),
            "stream": stream, "state": [np.zeros((2, ctx.max_batch, s, h)) for _ in range(w.shape[0])]}


def _b_ssm(ctx: PlanContext, step: int, node, n: int) -> list:
    x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
    pr = ctx.prep[step]
    calls = []
    for k, state in enumerate(pr["state"]):
        calls.append(partial(ks.ssm_scan, y, x, pr["da_re"], pr["da_im"], pr["w_re"][k],
                             pr["w_im"][k], pr["d"], state[0, :n], state[1, :n],
                             not pr["stream"] or k == 1, k == 1, k == 1))
    return calls


def _b_glu(ctx: PlanContext, step: int, node, n: int) -> list:
    x, y = ctx.view(node.inputs[0], n), ctx.view(node.outputs[0], n)
    ax = node.attrs["axis"] % x.ndim
    shape = (math.prod(x.shape[:ax]), x.shape[ax], math.prod(x.shape[ax + 1:]))
    return [partial(ks.glu, y.reshape(shape[0], shape[1] // 2, shape[2]), x.reshape(shape))]


PREPARE = {"ssm": _prep_ssm}
BUILDERS = ops.register_table("engine", {"ssm": _b_ssm, "glu": _b_glu})
