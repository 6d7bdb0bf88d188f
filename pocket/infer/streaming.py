"""Streaming a sequence model: `Engine.stream(chunk)` feeds a sequence a chunk of steps at a time
and keeps every `ssm` layer's state between calls.

    with Engine("ssm.bin") as eng:
        s = eng.stream(chunk=1)          # one step per call
        for x_t in steps:                # x_t (N, 1, F)
            y_t = s(x_t)                 # (N, 1, ...) = the whole-sequence output at step t
        s.reset()                        # start a new sequence

Engine.stream plans a second engine over the same weights whose input is (N, chunk, F) and whose
graph metadata says "streaming", so that lowering_ssm keeps the state (float64, outside the
arena) instead of zeroing it at each call. Concatenating the chunks' outputs gives the output
of the whole sequence (tests/infer/test_ssm_engine.py). Only a model whose every node acts on
each time step alone, or carries its state (a causal ssm), can stream: a head that mixes
steps (flatten + linear over the window) or a bidirectional ssm is an EngineError naming the
node. The batch size is fixed from the first call until `reset()`.
"""

from __future__ import annotations

import numpy as np

from pocket.formats import ops
from pocket.formats.errors import FormatError
from pocket.formats.ir import Graph, ValueInfo
from pocket.infer.lowering_ssm import STREAMING_KEY
from pocket.infer.plan import EngineError

# ops that act on each time step of (N, L, ...) alone, given an axis that is not time's
_PER_STEP = {"ssm", "glu", "linear", "layernorm", "add", "dropout", "softmax", "quantize",
             "dequantize", *ops.activations()}


class _Retimed:
    """The container with its graph's time dim set to the chunk length."""

    def __init__(self, container, graph: Graph):
        self.kind, self.graph, self.tensors = "model", graph, container.tensors
        self.quant = container.quant

    def close(self) -> None:
        pass


def retimed(container, chunk: int) -> _Retimed:
    """`container` whose graph takes chunks of `chunk` steps and whose ssm nodes keep state."""
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise EngineError(f"stream chunk must be a positive number of steps, got {chunk!r}")
    graph = container.graph
    if len(graph.inputs) != 1 or len(graph.outputs) != 1:
        raise EngineError("streaming needs a model with one input and one output")
    (name, info), = graph.inputs.items()
    if len(info.shape) != 3:
        raise EngineError(f"streaming needs a sequence input (N, L, features), got {list(info.shape)}")
    for node in graph.nodes:
        axis = node.attrs.get("axis", -1)
        # a constant added along time (a positional encoding) is not per step either
        timed = any(len(graph.params[v].shape) >= 2 and graph.params[v].shape[-2] != 1
                    for v in node.inputs if node.op == "add" and v in graph.params)
        if node.op not in _PER_STEP or timed or (
                node.op in ("glu", "softmax", "layernorm") and axis in (1, -2)):
            raise EngineError(f"node '{node.name}' ({node.op}) mixes time steps, so the model "
                              f"cannot be streamed; streamable ops: {', '.join(sorted(_PER_STEP))}")
    inputs = {name: ValueInfo(info.dtype, (info.shape[0], chunk, info.shape[2]))}
    g = Graph(inputs, list(graph.outputs), list(graph.nodes), dict(graph.params),
              {**graph.metadata, STREAMING_KEY: True})
    try:
        g.validate()
    except FormatError as e:
        raise EngineError(f"the model cannot run on chunks of {chunk} steps: {e}") from None
    return _Retimed(container, g)


class Stream:
    """A sequence fed in chunks of `chunk` steps; see the module docstring."""

    def __init__(self, engine, chunk: int):
        self.chunk = chunk
        self._engine = engine  # planned on retimed(container, chunk)
        self._batch: int | None = None
        self.steps = 0  # steps fed since the last reset

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """x (N, chunk, F) -> (N, chunk, ...), the outputs of these steps given all before."""
        x = np.asarray(x)
        if self._batch is not None and x.ndim >= 1 and x.shape[0] != self._batch:
            raise EngineError(f"this stream carries the state of {self._batch} sequences; got a "
                              f"batch of {x.shape[0]} (call reset() to start new sequences)")
        if x.ndim != 3 or x.shape[0] > self._engine.max_batch:
            raise EngineError(f"stream input must be (N <= {self._engine.max_batch}, "
                              f"{self.chunk}, features), got {tuple(x.shape)}")
        y = self._engine.run(x, copy=True)
        self._batch = x.shape[0]
        self.steps += self.chunk
        return y

    def reset(self) -> None:
        """Zero every state: the next call starts new sequences."""
        # NOTE: the state arrays are the ssm nodes' prepared dicts (lowering_ssm._prep_ssm)
        for prep in self._engine._prep:
            for state in prep.get("state", ()):
                state[...] = 0.0
        self._batch, self.steps = None, 0

    def close(self) -> None:
        self._engine.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
