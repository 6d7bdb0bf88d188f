"""The edge engine: mmap a model container, compile a plan once, run it with no allocation.

Loading (`Engine(path)`) reads the `.bin` through `pocket.formats.container` (weights stay
read-only views into the mmap; kernel layouts such as OIHW -> (O, C*kh*kw) are views too),
validates the graph, rejects every unsupported op in one error, and plans:

- a topological schedule (the graph's node order);
- one static activation arena sized for `max_batch`: each value gets an offset by buffer
  liveness (a value's bytes are reused once no later node reads it), flatten/reshape/dropout
  are views of their input, and im2col scratch lives in the arena only during its node;
- a conv2d (groups 1) runs per chunk of images as im2col into (C*kh*kw, chunk*Ho*Wo), one
  sgemm, and one epilogue pass (bias, activation, a fused maxpool, back to NCHW); stride-1
  convs pad the images first and lay the pixels at a pitch of the padded width, so each
  im2col row is one contiguous copy; 3x3 stride-1 convs with 64+ input channels and enough
  tiles a call run as Winograd F(2x2, 3x3) (kernels_winograd: 16 GEMMs, 2.25x fewer
  multiply-adds); on a CPU with AVX-512 every fp32 GEMM is kernels_fma's instead of BLAS, a
  stride-1 conv reads its padded images in place (no im2col) but for one image whose pixels
  fill whole tiles (im2col, then a GEMM that writes NCHW with its bias and ReLU), and
  Winograd takes 32+ channels, reads the images unpadded, and runs each thread's own images'
  whole conv in L2-sized chunks (kernels_fma_winograd);
- plan-level fusion: a conv2d whose only reader is an unpadded maxpool2d (and whose
  activation is non-decreasing) writes the pooled output from its epilogue, and a linear whose
  only reader is a linear on the same GEMM route leaves its result in that one's packed
  layout (routes/linear_chain.py); the IR is unchanged;
- int8 conv2d (groups 1) and linear on a CPU with AVX-512 VNNI run the int8 GEMMs of
  kernels_vnni (64 int8 multiply-adds per instruction); elsewhere, those with enough rows run
  as exact float32 BLAS GEMMs on the int8 codes, the float32 copies of weights and inputs
  living in the node's scratch for that call only, so arena_bytes counts them and the mmapped
  int8 weights stay the only lasting copy (so do kernels_vnni's reordered conv weights);
  lowering.py dispatches each op; a conv2d or linear takes the first route of routes/'s
  ordered table that is eligible for its geometry, dtype and CPU (`Engine.routes()` and
  `pocket inspect --routes` list them). `POCKET_ROUTE=<name>[,<name>...]` forces routes (for
  tests, benchmarks, bug reports): a node takes the first named route of its op that can run
  it; an unknown name, or a node of that op none of the named routes can run, is an
  EngineError naming the node, the route and why;
- for each batch size seen, the bound calls (kernels with their views) are built once and
  cached, so `run()` after the first call of a batch size allocates no arrays; calls with
  little work (batch 1, small layers) run on the calling thread alone (see _PARALLEL_WORK);
- where BLAS's pool is pinned to one thread (pools.spin_policy), a large float32 GEMM runs
  as kernels_blas.gemm_parts: one cblas_sgemm call a thread on its block of the output
  (POCKET_SPLIT_GEMM=0 keeps the single BLAS call);
- an engine of 2+ threads times its calls and runs a plan all on the calling thread while
  that measures faster (a busy machine: pools.Pace, `mode()`), the same bytes either way;
  `adaptive_threads=False` or POCKET_ADAPTIVE_THREADS=0 keeps the split.

`Engine(path, interpret_first=True)` defers all of that (and importing Numba, ~0.4 s) and
answers batches of up to _INTERPRET_ROWS from formats/reference.py until its calls have taken
_INTERPRET_SECONDS, then plans: for a process that runs a few small inferences and exits
(`pocket infer`); `warmup()` plans at once.

Arrays returned by `run()` are views into the arena, overwritten by the next call; pass
`copy=True` to keep them. Batches larger than `max_batch` are split (and the result is a new
array). Kernels are Numba functions compiled on first use and cached on disk (next to the
package, or under NUMBA_CACHE_DIR when that is set); `warmup()` compiles them all up front.
Numba kernels use `threads` threads; so do the BLAS GEMMs (none on AVX-512 x86), through
threadpoolctl or, without it, the entry points of the OpenBLAS NumPy loaded (pools.py); with
any other BLAS and no threadpoolctl they follow OPENBLAS_NUM_THREADS / OMP_NUM_THREADS.
"""

from __future__ import annotations

import math
import os
import threading
import time
from functools import partial

import numpy as np

from pocket.formats import ops
from pocket.formats.errors import FormatError
from pocket.formats.ir import Graph, ValueInfo
from pocket.infer import bound as _b
from pocket.infer import pools
from pocket.infer.bound import Bound as _Bound
from pocket.infer.plan import ALIGN, Cpu, EngineError, PlanContext, import_numba_math
from pocket.infer.plan import NP_DTYPES as _NP
from pocket.infer.plan import Region as _Buffer

# NOTE: the kernels (and with them Numba, ~0.4 s to import and set up) are imported when the
# engine first plans, not here: an engine that interprets first may answer without them.
SUPPORTED_OPS = frozenset(ops.OPS)  # every IR op: test_registry checks each has a builder
ALIAS_OPS = ("flatten", "reshape", "dropout")  # views of their input: no kernel, no buffer
__all__ = ["ALIGN", "ALIAS_OPS", "SUPPORTED_OPS", "Engine", "EngineError"]
# The Numba thread count an engine last set on each thread (Engine._own_threads)
_NUMBA_THREADS = threading.local()
# A call with less work than this (multiply-adds for a GEMM, 16 per element written for a
# kernel) runs on the calling thread: below it a thread pool's wake-up and barrier cost more
# than the work they share (batch 1, small layers). 1 << 22 left the 4x4 and 8x8 layers of
# cnn_cifar int8 serial (packing by table, the 4x4 GEMMs): at 1 << 21 its batch 1 on two
# threads went 757 -> 688 us; the other reference models within noise.
_PARALLEL_WORK = 1 << 21
# A plan whose BLAS GEMMs are mostly small (see pools.blas_small) runs them on the calling thread
# alone, BLAS's pool pinned to one thread, and lets OpenMP's threads spin between its Numba
# kernels; those then split from this much work (a wake-up of a spinning thread costs ~1 us).
# On a 2-core AMD Zen 2, 2 threads, interleaved A/B: MobileNetV2-0.5 2.23 -> 1.82 ms,
# EfficientNet-B0 22.4 -> 18.5 ms; with BLAS's own pool of 2 they ran no faster than 1 thread
_PARALLEL_WORK_PINNED = 1 << 17
# An engine made with interpret_first answers with the reference interpreter
# (formats/reference.py: NumPy only, the definition the kernels match) until its calls have
# taken this long in all, then plans and switches to the kernels for good.
_INTERPRET_SECONDS = 0.25
_INTERPRET_ROWS = 8  # a bigger batch plans at once: the naive interpreter could take seconds


def _per_sample(info: ValueInfo, where: str) -> tuple[int, ...]:
    rest = info.shape[1:]
    if not all(isinstance(d, int) for d in rest):
        raise EngineError(f"{where}: dims after the batch must be fixed, got {list(info.shape)}")
    return tuple(rest)


class Engine:
    """Runs one model container. See the module docstring for the memory rules."""

    def __init__(self, path_or_container, *, threads: int | None = None, max_batch: int = 64,
                 interpret_first: bool = False, adaptive_threads: bool | None = None):
        if isinstance(path_or_container, str | os.PathLike):
            from pocket.formats.container import read_container

            self._container = read_container(path_or_container, expect_kind="model")
            self._owns = True
        else:
            self._container = path_or_container
            self._owns = False
            if self._container.kind != "model":
                raise FormatError(f"kind: expected a 'model' container, got "
                                  f"'{self._container.kind}'; export the checkpoint first")
        graph = self._container.graph
        if graph is None:
            raise FormatError("graph: the model container holds no graph")
        if max_batch < 1:
            raise EngineError(f"max_batch must be >= 1, got {max_batch}")
        unsupported = sorted({n.op for n in graph.nodes if n.op not in SUPPORTED_OPS})
        if unsupported:
            raise EngineError(f"this engine cannot run op(s) {', '.join(unsupported)}; "
                              f"it supports {', '.join(sorted(SUPPORTED_OPS))}")
        self.graph: Graph = graph
        self._infos = graph.validate()
        batch = next(iter(graph.inputs.values())).shape[0]
        self.max_batch = min(max_batch, batch) if isinstance(batch, int) else max_batch
        self._params = {name: self._container.tensors[name] for name in graph.params}
        self._sample = {v: _per_sample(info, f"value '{v}'") for v, info in self._infos.items()
                        if v not in graph.params}
        self._want_threads = pools.check_threads(threads)
        if adaptive_threads is None:
            adaptive_threads = os.environ.get("POCKET_ADAPTIVE_THREADS", "1") != "0"
        self._adaptive = adaptive_threads
        self._bound: dict[int, _Bound] = {}
        self._planned = False
        self._interpret_left = _INTERPRET_SECONDS if interpret_first else 0.0
        self._quant: dict | None = None  # the weights' int8 scales, for the interpreter
        self._fast: tuple | None = None  # (input dtype, per-sample shape) once planned
        self._ctx: PlanContext | None = None  # what the lowerings see of the plan (plan.py)
        self._spinning = self._pinned = False  # OpenMP's threads spin; BLAS on one thread
        if not interpret_first:
            self._plan()

    def _plan(self) -> None:
        """Import the kernels, prepare every node and lay out the arena (once)."""
        import_numba_math()
        from pocket.infer import routes
        from pocket.infer.lowering import (
            PREPARE,
            chained_linears,
            fusable_pools,
            fused_add_relus,
            no_prep,
            padded_pairs,
            residual_convs,
        )
        from pocket.infer.lowering_block import fusable_blocks, fusable_se_blocks, reserve, reserve_se
        from pocket.infer.lowering_vision import gated_convs
        from pocket.infer.routes import ROUTES

        self._spinning, self._pinned = pools.spin_policy(self.graph, self._sample, self._want_threads)
        self._sgemm = None  # where BLAS runs on the calling thread: its GEMMs split by Numba's
        if self._pinned and pools.split_gemms():
            from pocket.infer import blas_libs

            self._sgemm = blas_libs.find_sgemm()
        ctx = self._ctx = PlanContext(
            self.graph, self._params, self._sample, self._infos, self._container.quant, self.max_batch,
            threads=1, cpu=Cpu.host(), forced=routes.forced_routes(), readers=self.readers(),
            parallel=self._parallel,
            parallel_elements=lambda size: self._parallel(pools.element_work(size, self._spinning)))
        self._apply_threads()
        ctx.prep = self._prep = [PREPARE.get(n.op, no_prep)(ctx, n) for n in self.graph.nodes]
        ctx.pool_after = self._pool_after = fusable_pools(ctx)
        ctx.chained = self._chained = chained_linears(ctx)
        ctx.pad_after = self._pad_after = padded_pairs(ctx)
        ctx.gated = self._gated = gated_convs(ctx)
        ctx.add_relu = self._add_relu = fused_add_relus(ctx)
        ctx.blocks = self._blocks = fusable_blocks(ctx) if ctx.cpu.fma else {}
        for e in self._blocks:  # the block's sums and rows after the expand conv's own scratch
            reserve(ctx, e)
        ctx.se_blocks = fusable_se_blocks(ctx) if ctx.cpu.fma else {}
        ctx.se_projects = {v[3]: e for e, v in ctx.se_blocks.items()}
        for e in ctx.se_blocks:
            reserve_se(ctx, e)
        ctx.residual = residual_convs(ctx) if ctx.cpu.fma else {}  # (only AVX-512 routes fuse them)
        for conv_step, _ in self._gated.values():
            ROUTES["conv_fma_1x1"].gate_scratch(self._prep[conv_step], self.max_batch)
        self._plan_arena()
        self._planned, self._interpret_left = True, 0.0
        g = self.graph
        if len(g.inputs) == 1 and len(g.outputs) == 1:  # run()'s fast path
            self._fast = (np.dtype(_NP[g.inputs[self.input_name].dtype]), self._sample[self.input_name])

    # ---- public properties

    @property
    def input_name(self) -> str:
        return next(iter(self.graph.inputs))

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Per-sample input shape (without the batch dim)."""
        return self._sample[self.input_name]

    @property
    def input_dtype(self) -> np.dtype:
        return np.dtype(_NP[self.graph.inputs[self.input_name].dtype])

    @property
    def output_names(self) -> list[str]:
        return list(self.graph.outputs)

    @property
    def metadata(self) -> dict:
        return self.graph.metadata

    @property
    def labels(self) -> list[str] | None:
        return self.metadata.get("labels")

    @property
    def task(self) -> str | None:
        return self.metadata.get("task")

    @property
    def preprocessing(self) -> dict:
        return self.metadata.get("preprocessing") or {}

    @property
    def arena_bytes(self) -> int:
        if not self._planned:
            self._plan()
        return self._arena.nbytes

    @property
    def prepared_bytes(self) -> int:
        """Bytes of weights kept in another layout than the file's (routes.base.prepared: int8
        weights as float32 for BLAS, VNNI-ordered copies), made at the first bind that needed
        them: what this engine holds beyond the mmapped file and the arena."""
        if not self._planned:
            self._plan()
        return sum(_prepared_in(p) for p in self._prep)

    def routes(self) -> list[dict]:
        """Each conv2d and linear node's route on this machine (plans first), in graph order:
        {"node", "op", "dtype" ("f32"/"i8"), "geometry" (what its eligibility read), "route",
        "scratch_bytes" (its scratch in the arena at max_batch), "prepared_bytes" (its weights
        prepared in another layout so far: see prepared_bytes), "batch_1" (the route a batch
        of one takes, where the route hands it to a sibling, else absent)}. See routes/."""
        if not self._planned:
            self._plan()
        from pocket.infer.routes.base import dtype_of, geometry_of, route_at, route_of

        rows = []
        for step, (node, prep) in enumerate(zip(self.graph.nodes, self._prep)):
            if "route" not in prep:
                continue
            route = route_of(prep)
            row = {"node": node.name, "op": node.op, "dtype": dtype_of(node),
                   "geometry": geometry_of(self._ctx, node).describe(), "route": route.name,
                   "scratch_bytes": route.scratch_bytes(prep), "prepared_bytes": _prepared_in(prep)}
            one, at_1 = route_at(self._ctx, step, 1)
            one = one.with_pool(self._ctx, step, at_1, 1, step in self._pool_after)[0]
            if one is not route:
                row["batch_1"] = one.name
            rows.append(row)
        return rows

    def weights(self) -> dict[str, np.ndarray]:
        """The arrays the kernels read, by param name (views of the container's mmap)."""
        return dict(self._params)

    # ---- threads

    def set_threads(self, threads: int | None) -> None:
        """Numba's and BLAS's thread count (see the module docstring); None keeps the current one."""
        self._want_threads = pools.check_threads(threads)
        if self._planned:
            self._apply_threads()

    def _apply_threads(self) -> None:
        import numba

        threads = self._want_threads
        pools.note_launch()
        if threads is not None:
            numba.set_num_threads(threads)
        self._threads = _NUMBA_THREADS.n = numba.get_num_threads()
        if self._ctx is not None:
            self._ctx.threads = self._threads
        self._bound = {}  # the plans' serial/parallel switches depend on the thread count
        # NOTE: threads=1 sets BLAS's pool too: left alone, OpenBLAS ran on every core under a
        # 1-thread engine (a busy neighbour process made a portable MobileNetV2 call's mean
        # 2.3x its median); the per-call switching (_serial) is for engines of 2+ threads
        blas = pools.blas_controllers() if threads is not None or self._threads > 1 or self._pinned else []
        for c in blas:
            if self._pinned:
                c.set_num_threads(1)
            elif threads is not None:
                c.set_num_threads(threads)
        self._blas = ([(pools.blas_setter(c), c.num_threads) for c in blas]
                      if self._threads > 1 and not self._pinned else [])

    def _parallel(self, work: int) -> bool:
        """Whether a call of this much work (see pools.call_work) runs on the thread pool."""
        return self._threads > 1 and work >= (_PARALLEL_WORK_PINNED if self._pinned else _PARALLEL_WORK)

    def _serial(self, on: bool) -> None:
        """A step of a bound plan: BLAS on the calling thread alone, or on its full pool again."""
        for set_num_threads, k in self._blas:
            set_num_threads(1 if on else k)

    def _solo(self, on: bool) -> None:
        """The first and last step of a solo call (see pools.Pace): BLAS's pool on the calling
        thread alone, or back to the engine's threads.

        NOTE: Numba's pool is left as it is: a solo call runs every kernel's serial twin
        (_solo_twin), which never enters it, and setting its size back after a serial stretch
        cost ~10 us a call (1-2% of MobileNetV2's)."""
        self._serial(on)

    def mode(self, n: int = 1) -> str:
        """How batch size n's calls run now: 'team' (large kernels split across the threads),
        'solo' (all on the calling thread: it measured faster, a busy machine), or 'serial'
        (nothing to split: 1 thread or small kernels only; or n not run yet)."""
        bound = self._bound.get(n)
        if bound is None or not bound.splits:
            return "serial"
        return "solo" if bound.pace is not None and bound.pace.solo else "team"

    # ---- planning

    def readers(self) -> dict[str, list[int]]:
        """{value: the steps that read it}."""
        readers: dict[str, list[int]] = {}
        for step, node in enumerate(self.graph.nodes):
            for v in node.inputs:
                readers.setdefault(v, []).append(step)
        return readers

    def _plan_arena(self) -> None:
        g = self.graph
        root: dict[str, str] = {name: name for name in g.inputs}
        buffers: dict[str, _Buffer] = {}
        from pocket.infer.lowering_block import block_lifetimes

        # {step: the input whose bytes its output is}: a ReLU the add before it writes
        # (fused_add_relus), a gate the conv after it takes into its weights (gated_convs)
        laid_over = {relu: g.nodes[relu].inputs[0] for relu in self._add_relu.values()}
        laid_over.update((step, g.nodes[step].inputs[big]) for step, (_, big) in self._gated.items())
        sub: dict[str, int] = {}

        def nbytes(v: str) -> int:
            size = self.max_batch * math.prod(self._sample[v]) * np.dtype(
                _NP[self._infos[v].dtype]).itemsize
            return -(-size // ALIGN) * ALIGN

        for name in g.inputs:
            buffers[name] = _Buffer(nbytes(name), -1, -1)
        for step, node in enumerate(g.nodes):
            for v in node.inputs:
                if v in root:
                    buffers[root[v]].last = step
            out = node.outputs[0]
            at = self._slice_view(node, root)
            if at is not None:
                # a view of its input: readers read the input's bytes (its lifetime grows)
                root[out], sub[out] = root[node.inputs[0]], sub.get(node.inputs[0], 0) + at
            elif step in laid_over:
                src = laid_over[step]
                root[out] = root[src]
                if src in sub:
                    sub[out] = sub[src]
            elif node.op in ALIAS_OPS:
                if node.inputs[0] not in root:
                    raise EngineError(f"node '{node.name}': {node.op} of a param is not supported")
                root[out] = root[node.inputs[0]]
            else:
                root[out] = out
                buffers[out] = _Buffer(nbytes(out), step, step)
                if node.op == "concat":
                    for v, at in self._concat_slices(step, node, root, buffers).items():
                        # v is written straight into its slice of the concat's output
                        buffers[out].first = min(buffers[out].first, buffers.pop(v).first)
                        root[v], sub[v] = out, at
            scratch = self._prep[step].get("scratch_bytes", 0)
            if scratch:
                buffers[f"#scratch{step}"] = _Buffer(-(-scratch // ALIGN) * ALIGN, step, step)
        for conv_step, pool_step in self._pool_after.items():
            # a fused conv writes the pool's output while it still reads its input and scratch
            pooled = buffers[root[g.nodes[pool_step].outputs[0]]]
            pooled.first = min(pooled.first, conv_step)
        for a_step, b_step in self._pad_after.items():
            # a conv that writes the next one's padded images while it still reads its own
            buffers[f"#scratch{b_step}"].first = a_step
        block_lifetimes(self._ctx, buffers, root)
        for conv_step, add in self._ctx.residual.items():
            # a conv that writes its residual add's output (where its route fuses the add)
            out = buffers[root[g.nodes[add].outputs[0]]]
            out.first = min(out.first, conv_step)
        for step, (conv_step, big) in self._gated.items():
            gate = buffers[root[g.nodes[step].inputs[1 - big]]]  # read by the conv's weights
            gate.last = max(gate.last, conv_step)
        for step, (_, nbytes) in self._chained.items():
            # the value in the next linear's packed layout: whole tiles of columns
            out = buffers[root[g.nodes[step].outputs[0]]]
            out.nbytes = max(out.nbytes, -(-nbytes // ALIGN) * ALIGN)
        for o in g.outputs:
            if o not in root:
                raise EngineError(f"output '{o}' is a param; this engine returns computed values")
            buffers[root[o]].last = len(g.nodes)
        total = _assign_offsets(list(buffers.values()))
        self._arena = self._ctx.arena = _alloc_arena(total)
        self._root, self._buffers = self._ctx.root, self._ctx.buffers = root, buffers
        self._ctx.sub = sub

    def _slice_view(self, node, root: dict) -> int | None:
        """The byte offset of a slice's output in its input when it can be a view (batch 1,
        a contiguous run of the input, aligned), else None. ShuffleNetV2's channel splits
        copied half of every unit's input (~5% of its time)."""
        if node.op != "slice" or self.max_batch != 1 or node.inputs[0] not in root:
            return None
        shape = self._sample[node.inputs[0]]
        axis = node.attrs.get("axis", 1) % (len(shape) + 1)
        if axis == 0 or math.prod(shape[:axis - 1]) != 1:
            return None
        item = np.dtype(_NP[self._infos[node.outputs[0]].dtype]).itemsize
        at = node.attrs["start"] * math.prod(shape[axis:]) * item
        return at if at % ALIGN == 0 else None

    def _concat_slices(self, step: int, node, root: dict, buffers: dict) -> dict[str, int]:
        """{input: byte offset in the output} for the inputs of a concat at `step` that their
        producers can write in place, so that the concat copies nothing for them: at batch 1
        (max_batch 1: then a slice along axis 1 is one contiguous run), each a value of its
        own that only this concat reads, from a node that writes it as (N, ...) (not a
        chained linear's packed layout), at an aligned offset. SqueezeNet's fire modules and
        ShuffleNetV2's units copied every output of their branches (~8% of the time)."""
        out = node.outputs[0]
        shape = self._sample[out]
        axis = node.attrs["axis"] % (len(shape) + 1)
        if self.max_batch != 1 or axis == 0 or math.prod(shape[:axis - 1]) != 1:
            return {}
        item = np.dtype(_NP[self._infos[out].dtype]).itemsize
        g, readers = self.graph, self._ctx.readers
        slices, at = {}, 0
        for v in node.inputs:
            size = math.prod(self._sample[v]) * item
            if (root.get(v) == v and v in buffers and buffers[v].first >= 0
                    and buffers[v].first not in self._chained and readers.get(v) == [step]
                    and node.inputs.count(v) == 1 and v not in g.outputs
                    and self._infos[v].dtype == self._infos[out].dtype and at % ALIGN == 0):
                slices[v] = at
            at += size
        return slices

    def _view(self, v: str, n: int) -> np.ndarray:
        return self._ctx.view(v, n)

    def _bind(self, n: int) -> _Bound:
        bound = self._bound.get(n)
        if bound is None:
            from pocket.infer.lowering import BUILDERS

            g = self.graph
            bound = _Bound({v: self._view(v, n) for v in g.inputs},
                           [self._view(o, n) for o in g.outputs])
            skip = self._ctx.skip = set()  # steps that an earlier builder fused away
            in_serial = False
            steps = []  # the step of each call
            for step, node in enumerate(g.nodes):
                if step in skip:
                    continue
                node_calls = list(BUILDERS[node.op](self._ctx, step, node, n))
                while node_calls:
                    call = node_calls.pop(0)
                    # NOTE: a fork/join of either pool costs microseconds to tens of them (far
                    # more on a loaded machine): a small call runs on the calling thread alone,
                    # a Numba kernel as its serial twin (see jit.py), a BLAS call with BLAS's
                    # pool shrunk to one thread around it.
                    small = not self._parallel(pools.call_work(call, self._spinning))
                    if call.func is np.matmul and not small and self._sgemm is not None:
                        call = self._split_gemm(call, node_calls)
                    if getattr(call.func, "serial", None) is not None:
                        call = _b.serial(call) if small else call
                    elif self._blas and call.func is np.matmul and small != in_serial:
                        bound.calls.append(partial(self._serial, small))
                        bound.serial_steps, in_serial = True, small
                    bound.calls.append(call)
                steps += [step] * (len(bound.calls) - len(steps))
            if in_serial:
                bound.calls.append(partial(self._serial, False))
            bound.feed = self._feed(bound, steps)
            bound.steps = steps
            bound.splits = self._threads > 1 and any(
                getattr(c.func, "serial", None) is not None or (c.func is np.matmul and self._blas)
                for c in bound.calls)
            if bound.splits and self._adaptive:
                bound.solo, bound.pace = self._solo_twin(bound), pools.Pace()
            self._bound[n] = bound
        return bound

    def _split_gemm(self, call: partial, rest: list) -> partial:
        """A BLAS call of a pinned plan as kernels_blas.gemm_parts (its output in a block a
        thread), the bias_act after it (the first of `rest`, the node's calls still to bind)
        in its epilogue; or the call itself where its operands do not split."""
        from pocket.infer import kernels_blas as kb

        split = kb.split_call(self._sgemm, call, self._threads, rest[0] if rest else None)
        if split is None:
            return call
        if split[1]:
            rest.pop(0)
        return split[0]

    def _solo_twin(self, bound: _Bound) -> _Bound:
        """The bound plan's calls on the calling thread alone: each parallel kernel as its
        serial twin (split GEMMs too: their parts one after another; the tile GEMMs and the
        padded depthwise planes as one part, bound.solo), so the same bytes out; no per-call
        BLAS switches; where a call reaches BLAS, between two calls that shrink its pool to one
        thread and restore it.

        NOTE: not the parallel kernels on a pool of one: under a busy neighbour each still
        entered OpenMP, and MobileNetV2's solo calls took 3.0 ms against 2.6 on 1 thread."""
        from pocket.infer import kernels_blas as kbl

        # NOTE: the switches only where a call reaches BLAS: around a plan of Numba kernels
        # alone they cost 10-45 us a call and did nothing (Numba's pool: _solo)
        blas = bool(self._blas) and any(c.func is np.matmul or c.func is kbl.gemm_parts
                                        or c.func is kbl.gemv_parts for c in bound.calls)
        calls, steps = ([partial(self._solo, True)], [0]) if blas else ([], [])
        bound.to_solo = []  # the index in the solo calls of what follows each team call
        for i, call in enumerate(bound.calls):
            if call.func != self._serial:
                calls.append(_b.solo(call))
                steps.append(bound.steps[i] if i < len(bound.steps) else len(self.graph.nodes))
            bound.to_solo.append(len(calls))
        solo = _Bound(bound.inputs, bound.outputs, calls + ([partial(self._solo, False)] if blas else []),
                      serial_steps=blas)
        solo.feed, solo.steps = self._feed(solo, steps), steps
        if solo.feed is None:  # (the same argument as the team's: never seen to differ)
            bound.feed = None
        return solo

    def _feed(self, bound: _Bound, steps: list[int]) -> tuple | None:
        """Where a single input is read: (call, argument, shape) if exactly one argument of the
        calls in the input's lifetime touches its bytes, and is all of them (same start, size
        and dtype, C order); else None, and run() copies the input into the arena."""
        if len(bound.inputs) != 1:
            return None
        (name, view), = bound.inputs.items()
        buf = self._buffers[self._root[name]]
        if any(self._root.get(o) == self._root[name] for o in self.graph.outputs):
            return None
        hits = [(i, j, a) for i, call in enumerate(bound.calls) if i < len(steps) and steps[i] <= buf.last
                for j, a in enumerate(call.args)
                if isinstance(a, np.ndarray) and np.may_share_memory(a, view)]
        if len(hits) != 1:
            return None
        i, j, a = hits[0]
        if (a.ctypes.data != view.ctypes.data or a.nbytes != view.nbytes or a.dtype != view.dtype
                or not a.flags.c_contiguous):
            return None
        return i, j, a.shape

    # ---- running

    def run(self, x: np.ndarray, *, copy: bool = False) -> np.ndarray:
        """x (N, *input_shape) -> the single output (N, ...). A view into the arena unless copy."""
        # NOTE: the common call (an array of the input's dtype and shape, at most max_batch
        # rows, at a batch size run before) skips run_all's general checks: ~3 us, a fifth of
        # a batch-1 call of a small MLP
        fast = self._fast
        if (fast is not None and type(x) is np.ndarray and x.dtype == fast[0]
                and x.shape[1:] == fast[1] and 0 < x.shape[0] <= self.max_batch):
            bound = self._bound.get(x.shape[0])
            if bound is not None and bound.direct:
                if self._threads > 1:
                    self._own_threads()
                if bound.pace is None:
                    self._run_fed(bound, x)
                elif bound.feed is not None and _b.feedable(x):
                    self._paced(bound, x.reshape(bound.feed[2]))
                else:
                    np.copyto(bound.inputs[self.input_name], x)
                    self._paced(bound, None)
                return bound.outputs[0].copy() if copy else bound.outputs[0]
        if len(self.graph.outputs) != 1:
            raise EngineError(f"the model has {len(self.graph.outputs)} outputs; use run_all()")
        return self.run_all(x, copy=copy)[self.graph.outputs[0]]

    def _run_fed(self, bound: _Bound, x: np.ndarray) -> None:
        """run()'s common path: x's dtype and per-sample shape checked, bound direct."""
        feed = bound.feed
        if feed is not None and _b.feedable(x):
            # NOTE: the one call that reads the input reads x itself (the same type for its
            # compiled kernel: dtype, C order, writeable): no copy into the arena (mlp int8
            # batch 64: 5.5 us of 86)
            split = bound.fed_split
            if split is None:
                self._run_calls(bound, (feed[0], feed[1], x.reshape(feed[2])))
            else:  # (~0.5 us less than _run_calls' general loop)
                for call in split[0]:
                    call()
                split[1](*split[2], x.reshape(feed[2]), *split[3])
                for call in split[4]:
                    call()
        else:
            np.copyto(bound.inputs[self.input_name], x)
            self._run_calls(bound)

    def run_all(self, x, *, copy: bool = False) -> dict[str, np.ndarray]:
        """x: one array (single-input model) or {input name: array} -> {output name: array}."""
        xs = x if isinstance(x, dict) else {self.input_name: x}
        missing = set(self.graph.inputs) - set(xs)
        if missing:
            raise EngineError(f"missing input(s) {', '.join(sorted(missing))}")
        n = None
        for name, arr in xs.items():
            n = self._check_input(name, arr, n)
        if not self._planned:
            if self._interpret_left > 0 and n <= _INTERPRET_ROWS:
                return self._interpret(xs)
            self._plan()
        if n <= self.max_batch:
            bound = self._bind(n)
            self._execute(bound, xs, slice(0, n))
            outs = bound.outputs
            return {o: (a.copy() if copy else a) for o, a in zip(self.graph.outputs, outs)}
        result = {o: np.empty((n, *self._sample[o]), _NP[self._infos[o].dtype])
                  for o in self.graph.outputs}
        for start in range(0, n, self.max_batch):
            stop = min(start + self.max_batch, n)
            bound = self._bind(stop - start)
            self._execute(bound, xs, slice(start, stop))
            for o, a in zip(self.graph.outputs, bound.outputs):
                result[o][start:stop] = a
        return result

    def _interpret(self, xs: dict) -> dict[str, np.ndarray]:
        """One call through the reference interpreter: new arrays, the kernels' results up to
        float32 rounding (int8: bit for bit)."""
        from pocket.formats import reference

        t = time.perf_counter()
        ins = {name: np.asarray(xs[name], _NP[info.dtype]) for name, info in self.graph.inputs.items()}
        if self._quant is None:
            self._quant = {name: self._container.quant(name) for name in self.graph.params}
        out = reference.run(self.graph, self._params, ins, self._quant)
        self._interpret_left -= time.perf_counter() - t
        return {o: np.ascontiguousarray(out[o], _NP[self._infos[o].dtype]) for o in self.graph.outputs}

    def _check_input(self, name: str, arr, n: int | None) -> int:
        if name not in self.graph.inputs:
            raise EngineError(f"unknown input '{name}'; the model takes {', '.join(self.graph.inputs)}")
        arr = np.asarray(arr)
        shape = self._sample[name]
        if arr.ndim != len(shape) + 1 or tuple(arr.shape[1:]) != shape:
            raise EngineError(f"input '{name}' must have shape (N, {', '.join(map(str, shape))}), "
                              f"got {tuple(arr.shape)}")
        want = np.dtype(_NP[self.graph.inputs[name].dtype])
        if not np.can_cast(arr.dtype, want, casting="same_kind"):
            raise EngineError(f"input '{name}' must be {want}, got {arr.dtype}")
        if arr.shape[0] == 0 or (n is not None and arr.shape[0] != n):
            raise EngineError(f"input '{name}' has batch size {arr.shape[0]}; "
                              "inputs must share one non-zero batch size")
        return arr.shape[0]

    def _own_threads(self) -> None:
        """Numba's thread count back to this engine's where another engine of the process (or
        of this thread) set its own since: Numba keeps one count a thread, which each engine
        sets when it plans, and a two-thread engine's parallel kernels ran on one thread after
        a one-thread engine was built."""
        if getattr(_NUMBA_THREADS, "n", None) != self._threads:
            import numba

            numba.set_num_threads(self._threads)
            _NUMBA_THREADS.n = self._threads

    def _execute(self, bound: _Bound, xs: dict, rows: slice) -> None:
        if self._threads > 1:
            self._own_threads()
        for name, dst in bound.inputs.items():
            np.copyto(dst, xs[name][rows], casting="same_kind")
        if not bound.direct:
            self._run_calls(bound)  # compiles (or loads) the kernels on the first call
            _b.make_direct(bound)
            if bound.solo is not None:
                _b.make_direct(bound.solo, compile_=True)
            return
        if bound.pace is None:
            self._run_calls(bound)
        else:
            self._paced(bound, None)

    def _paced(self, bound: _Bound, x: np.ndarray | None) -> None:
        """One call of a plan with a Pace: solo, or as a team until its deadline and solo from
        there (see pools.Pace). x: the input, shaped for the call that reads it in place
        (see _feed), or None when it is in the arena already."""
        pace, solo = bound.pace, bound.solo
        t = time.perf_counter()
        if pace.next_solo():
            self._run_calls(solo, None if x is None else (solo.feed[0], solo.feed[1], x))
            pace.took(True, time.perf_counter() - t)
            return
        fed = None if x is None else (bound.feed[0], bound.feed[1], x)
        try:
            stop = _b.call_until(bound.calls, fed, t + pace.deadline())
            if stop >= 0:  # the rest on the calling thread alone
                at = bound.to_solo[stop]
                if solo.serial_steps:  # (its calls end with the switch back)
                    self._solo(True)
                _b.call_all(solo.calls[at:], None if x is None or solo.feed[0] < at
                          else (solo.feed[0] - at, solo.feed[1], x))
        except BaseException:
            self._solo(False)
            raise
        pace.took(False, time.perf_counter() - t if stop < 0 else math.inf)

    def _run_calls(self, bound: _Bound, fed: tuple | None = None) -> None:
        """Make the bound calls; with fed = (call, argument, array), that call takes the array
        in place of that argument (see _feed)."""
        if not bound.serial_steps:
            _b.call_all(bound.calls, fed)
            return
        try:
            _b.call_all(bound.calls, fed)
        except BaseException:
            self._solo(False)  # both pools back to the engine's threads
            raise

    def bind(self, n: int) -> None:
        """Plan and bind batch size n without running it: what run() does first for a new
        batch size (and where routes prepare their weights; see prepared_bytes)."""
        if not 0 < n <= self.max_batch:
            raise EngineError(f"batch size {n} is outside 1..{self.max_batch} (max_batch)")
        if not self._planned:
            self._plan()
        self._bind(n)

    def warmup(self) -> None:
        """Plan now and compile (or load from the Numba cache) every kernel the plan uses."""
        if not self._planned:
            self._plan()
        self.run_all({v: np.zeros((1, *self._sample[v]), _NP[info.dtype])
                      for v, info in self.graph.inputs.items()})

    def stream(self, chunk: int = 1):
        """A Stream (infer/streaming.py) feeding this model's sequence input `chunk` steps per
        call, every ssm layer keeping its state between calls."""
        from pocket.infer.streaming import Stream, retimed

        sub = Engine(retimed(self._container, chunk), threads=self._want_threads,
                     max_batch=self.max_batch)
        return Stream(sub, chunk)

    # ---- lifetime

    def close(self) -> None:
        self._bound.clear()
        self._params = {}
        self._prep = []
        self._ctx = None  # (it holds views of the weights too: the mapping closes once they go)
        if self._owns:
            self._container.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _prepared_in(prep: dict) -> int:
    """A prepared dict's prepared weights, its siblings' (a pitch or cols plan inside it) too."""
    return prep.get("prepared_bytes", 0) + sum(_prepared_in(v) for v in prep.values()
                                               if isinstance(v, dict) and "route" in v)


def _alloc_arena(nbytes: int) -> np.ndarray:
    """The plan's arena: nbytes zeroed bytes starting at a multiple of ALIGN. The one place the
    arena is allocated, so that a test can place it elsewhere (tests/infer/test_route_fuzz.py
    puts it against a guard page)."""
    raw = np.zeros(nbytes + ALIGN, np.uint8)
    start = (-raw.ctypes.data) % ALIGN
    return raw[start:start + nbytes]


def _assign_offsets(buffers: list[_Buffer]) -> int:
    """Greedy by size: each buffer takes the lowest offset free of every buffer it overlaps
    in time. Returns the arena size."""
    placed: list[_Buffer] = []
    total = 0
    for b in sorted(buffers, key=lambda b: -b.nbytes):
        busy = sorted((p.offset, p.offset + p.nbytes) for p in placed
                      if p.first <= b.last and b.first <= p.last)
        offset = 0
        for lo, hi in busy:
            if offset + b.nbytes <= lo:
                break
            offset = max(offset, hi)
        b.offset = offset
        placed.append(b)
        total = max(total, offset + b.nbytes)
    return total
