"""What the lowerings see of a plan: the PlanContext (no Engine, no cycle back into engine.py).

engine.py builds one PlanContext per planned engine and hands it to every prepare function and
builder (lowering.py, lowering_conv.py, routes/): the graph, the weights, per-sample shapes,
the thread count, the CPU's features, the prepared dicts, the plan-level fusion maps, and, once
the arena is laid out, views of it. Nothing here imports the kernels or Numba.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from pocket.errors import PocketError
from pocket.formats.ir import Graph, ValueInfo

ALIGN = 64
NP_DTYPES = {"f32": np.float32, "f16": np.float16, "i8": np.int8, "u8": np.uint8, "i32": np.int32,
             "i64": np.int64}


class EngineError(PocketError):
    """The model or the input cannot be run by this engine; the message says why."""


@dataclass(frozen=True)
class Cpu:
    """The kernel families this machine runs: kernels_fma (AVX-512 fp32), kernels_vnni
    (AVX-512 VNNI int8), kernels_sdot (ARM dotprod int8 convs) and kernels_smull (int8 convs
    on 64-bit ARM without dotprod, the Pi 4); without them, the portable kernels and BLAS."""

    fma: bool
    vnni: bool
    sdot: bool = False
    smull: bool = False

    @staticmethod
    def host() -> Cpu:
        from pocket.infer import kernels_fma as kfma
        from pocket.infer import kernels_sdot as ks
        from pocket.infer import kernels_smull as km
        from pocket.infer import kernels_vnni as kv

        return Cpu(fma=kfma.AVAILABLE, vnni=kv.AVAILABLE, sdot=ks.AVAILABLE, smull=km.AVAILABLE)


@dataclass
class Region:
    """A region of the arena: one root value (plus its aliases) or one node's scratch."""

    nbytes: int  # at max_batch
    first: int  # step that writes it (-1: graph input)
    last: int  # last step that reads it
    offset: int = 0


@dataclass
class PlanContext:
    """One engine's plan as its lowerings use it. The engine fills `prep` and the fusion maps
    while planning, then the arena (`arena`, `buffers`, `root`); `threads` follows
    Engine.set_threads, and a builder adds to `skip` the steps it fuses away."""

    graph: Graph
    params: dict[str, np.ndarray]
    sample: dict[str, tuple[int, ...]]  # per-sample shape of each value
    infos: dict[str, ValueInfo]
    quant: Callable[[str], dict | None]  # a param's int8 quantization parameters
    max_batch: int
    threads: int
    cpu: Cpu
    forced: tuple[str, ...] = ()  # POCKET_ROUTE's names
    readers: dict[str, list[int]] = field(default_factory=dict)  # {value: the steps that read it}
    prep: list[dict] = field(default_factory=list)
    pool_after: dict[int, int] = field(default_factory=dict)  # {conv step: fused maxpool step}
    chained: dict[int, tuple[int, int]] = field(default_factory=dict)  # routes.linear_chain
    pad_after: dict[int, int] = field(default_factory=dict)  # routes.conv_fma_pitch.padded_pairs
    gated: dict[int, tuple[int, int]] = field(default_factory=dict)  # lowering_vision.gated_convs
    add_relu: dict[int, int] = field(default_factory=dict)  # lowering.fused_add_relus
    residual: dict[int, int] = field(default_factory=dict)  # lowering.residual_convs
    blocks: dict[int, tuple] = field(default_factory=dict)  # lowering_block.fusable_blocks
    se_blocks: dict[int, tuple] = field(default_factory=dict)  # lowering_block.fusable_se_blocks
    se_projects: dict[int, int] = field(default_factory=dict)  # {project step: its block's expand}
    skip: set[int] = field(default_factory=set)
    parallel: Callable[[int], bool] = field(default=lambda work: False)
    # the same for an element-wise kernel whose largest array has this many elements
    parallel_elements: Callable[[int], bool] = field(default=lambda size: False)
    arena: np.ndarray | None = None
    buffers: dict[str, Region] = field(default_factory=dict)
    root: dict[str, str] = field(default_factory=dict)
    sub: dict[str, int] = field(default_factory=dict)  # {value: bytes into its root's buffer}

    def view(self, v: str, n: int) -> np.ndarray:
        """Value v at batch n: its weights, or its (n, ...) view of the arena."""
        if v in self.params:
            return self.params[v]
        shape = self.sample[v]
        dtype = np.dtype(NP_DTYPES[self.infos[v].dtype])
        buf = self.buffers[self.root[v]]
        start = buf.offset + self.sub.get(v, 0)
        count = n * math.prod(shape) * dtype.itemsize
        return self.arena[start:start + count].view(dtype).reshape((n, *shape))

    def only_reader(self, v: str) -> int | None:
        """The one step that reads value v, or None (none, several, or v is a graph output):
        what a fusion that keeps v out of the arena's traffic needs."""
        readers = self.readers.get(v, [])
        return readers[0] if len(readers) == 1 and v not in self.graph.outputs else None

    def scratch(self, step: int, dtype, shape: tuple[int, ...], at: int = 0) -> np.ndarray:
        """A view of `step`'s scratch, `at` bytes (a multiple of 64) into it."""
        return self.region(f"#scratch{step}", dtype, shape, at)

    def packed(self, v: str, dtype, shape: tuple[int, ...]) -> np.ndarray:
        """Value v's buffer in another layout than (N, ...): a chained linear's result (see
        routes.linear_chain)."""
        return self.region(self.root[v], dtype, shape)

    def region(self, key: str, dtype, shape: tuple[int, ...], at: int = 0) -> np.ndarray:
        buf = self.buffers[key]
        count = math.prod(shape) * np.dtype(dtype).itemsize
        if at + count > buf.nbytes:
            raise AssertionError(f"arena overflow in {key}")
        start = buf.offset + at
        return self.arena[start:start + count].view(dtype).reshape(shape)


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def import_numba_math() -> None:
    """Import Numba's array-math registry without SciPy's linear algebra (the engine calls
    this before it first imports its kernels).

    NOTE: Numba's first compile or cache load imports numba.np.arraymath, which probes for BLAS
    by importing scipy.linalg: half a second of a warm start on a small board, for a probe
    whose only use is to route np.convolve/np.correlate through np.dot. With the probe blocked
    they use Numba's own loop (our kernels call neither); np.dot inside njit still imports
    scipy.linalg lazily when it is compiled. Skipped when SciPy's linalg is already loaded.
    """
    if "numba.np.arraymath" in sys.modules or "scipy.linalg" in sys.modules:
        return
    blocked = "scipy.linalg.cython_blas"
    sys.modules[blocked] = None  # `import` of a None entry raises ImportError
    try:
        import numba.np.arraymath  # noqa: F401
    finally:
        if sys.modules.get(blocked, 0) is None:
            del sys.modules[blocked]
