"""The engine's two thread pools (Numba's OpenMP one and BLAS's) and when a plan uses them.

- spin_policy: whether OpenMP's threads spin between a plan's kernels and whether BLAS runs on
  the calling thread (its pool pinned to one thread), by the plan's GEMM sizes;
- Pace: with 2+ threads, whether each call of a bound plan runs as a team (its large kernels
  split across the pool) or solo (every kernel on the calling thread), by the latencies it
  measures of both, so that a busy neighbour process does not make 2 threads slower than 1.
"""

from __future__ import annotations

import math
import os
from functools import partial

import numpy as np

from pocket.formats.ir import Graph
from pocket.infer import blas_libs
from pocket.infer.plan import EngineError

# GEMMs of this many multiply-adds a sample gain from BLAS's own threads (ResNet-18's 3x3 convs
# at 1 thread 52 ms, 2: 43 ms; pinned: 46)
BIG_GEMM = 1 << 24


def spin_policy(graph: Graph, sample: dict, threads: int | None) -> tuple[bool, bool]:
    """(whether OpenMP's threads spin between the plan's kernels, whether its BLAS calls run on
    one thread, BLAS's pool pinned): spin_if_no_blas's plans spin; so does a plan on 2+ threads
    where BLAS's pool can be pinned and either its GEMMs can split across Numba's threads
    (split_gemms: the loaded OpenBLAS's cblas_sgemm, kernels_blas) or they are mostly small
    (blas_small), its GEMMs then on the calling thread. Otherwise BLAS keeps its pool
    (Engine._serial).

    NOTE: BLAS's own pool never runs beside spinning OpenMP threads, which starve it: where they
    spin (for this plan, an earlier one of the process, or the user's OMP settings) a plan with
    BLAS calls pins its pool to one thread, large GEMMs and all. With split GEMMs, pinned beat
    BLAS's own pool on the large ones too (2-core AMD Zen 2, 2 threads, interleaved: ResNet-18
    fp32 33-35 -> 26-27 ms, SqueezeNet fp32 8.1-11.3 -> 6.5-6.8 ms)."""
    if spin_if_no_blas(graph):
        return True, False
    top = threads if threads is not None else default_threads()
    blas = blas_controllers()  # (threadpoolctl scans the loaded libraries: once)
    if top < 2 or not blas:
        if top < 2 and blas and default_threads() >= 2 and split_gemms():
            # NOTE: the process's first engine starts OpenMP's pool, which reads its wait policy
            # then and never again: a one-thread engine built first (its plan never enters the
            # pool) left a later two-thread engine's workers asleep, each of its parallel
            # kernels waiting ~60 us to wake one (MobileNetV3-small portable, its calls timed one
            # by one: 7.3 ms on two threads against 2.2 on one). What a two-thread plan here
            # would set, set now
            let_omp_spin()
        return False, False
    if split_gemms() or blas_small(graph, sample):
        let_omp_spin()
    spinning = omp_spins()
    return spinning, spinning


def split_gemms() -> bool:
    """Whether pinned plans split their GEMMs across Numba's threads (kernels_blas): where the
    loaded BLAS is an OpenBLAS whose cblas_sgemm answers, unless POCKET_SPLIT_GEMM=0."""
    if os.environ.get("POCKET_SPLIT_GEMM", "1") == "0":
        return False
    return blas_libs.find_sgemm() is not None


def let_omp_spin() -> None:
    """GOMP_SPINCOUNT=100000, unless the user set it or a wait policy (see spin_if_no_blas)."""
    if "GOMP_SPINCOUNT" not in os.environ and os.environ.get(
            "OMP_WAIT_POLICY", "PASSIVE").upper() == "PASSIVE":
        os.environ["GOMP_SPINCOUNT"] = "100000"


# Whether OpenMP's pool spins, as its environment said when an engine first started it (see
# note_launch); None before
_SPIN_AT_LAUNCH: bool | None = None


def omp_spins() -> bool:
    """Whether OpenMP's idle threads spin (GOMP_SPINCOUNT or OMP_WAIT_POLICY=ACTIVE): as set when
    its pool started, once it has (libgomp reads its environment then, and never again)."""
    if _SPIN_AT_LAUNCH is not None:
        return _SPIN_AT_LAUNCH
    return _env_spins()


def _env_spins() -> bool:
    return (os.environ.get("GOMP_SPINCOUNT", "") not in ("", "0")
            or os.environ.get("OMP_WAIT_POLICY", "").upper() == "ACTIVE")


def note_launch() -> None:
    """Called before an engine sets Numba's thread count, which starts its OpenMP pool on the
    first call in the process: what the pool will do between kernels from then on."""
    global _SPIN_AT_LAUNCH
    if _SPIN_AT_LAUNCH is None:
        _SPIN_AT_LAUNCH = _env_spins()


def default_threads() -> int:
    """Numba's default pool size (without starting the pool)."""
    import numba

    return numba.config.NUMBA_NUM_THREADS


def blas_small(graph: Graph, sample: dict) -> bool:
    """Whether GEMMs of BIG_GEMM or more multiply-adds a sample hold under half of the plan's
    conv and linear multiply-adds (depthwise and grouped convs, which never take BLAS, apart):
    the MobileNets, ShuffleNetV2 and EfficientNet-B0 (0-22%), not ResNet-18 (98%) or SqueezeNet
    (74%), whose large GEMMs gain more from BLAS's threads than the small kernels lose."""
    sizes = []
    for n in graph.nodes:
        if n.op == "conv2d" and n.attrs.get("groups", 1) == 1:
            o, ho, wo = sample[n.outputs[0]]
            w = graph.params[n.inputs[1]]
            sizes.append(o * ho * wo * math.prod(w.shape[1:]))
        elif n.op == "linear":
            o, k = graph.params[n.inputs[1]].shape
            sizes.append(o * k * math.prod(sample[n.inputs[0]][:-1]))
    total = sum(sizes)
    return total > 0 and sum(m for m in sizes if m >= BIG_GEMM) < total / 2


def spin_if_no_blas(graph: Graph) -> bool:
    """Let OpenMP threads spin ~0.1-1 ms between kernels when no BLAS call will run beside them.

    NOTE: pocket.infer makes OpenMP wait passively (see __init__): spinning threads of Numba's
    pool starve OpenBLAS's between the im2col and GEMM of every fp32 conv. A plan of Numba
    kernels only (int8 on AVX-512 VNNI, fp32 on AVX-512) has no such neighbour, and there
    waking sleeping threads for each of a batch-1 plan's small kernels made 2 threads slower than 1
    (cnn_cifar int8: 1.45 ms vs 1.28; spinning: 0.94 ms). On a VM a parked vCPU took ~40 µs to
    wake: 10000 spins (~0.1 ms) still let it park between a batch-1 plan's parallel GEMMs
    (100000: 3.5 µs a wake-up, measured). libgomp reads GOMP_SPINCOUNT when
    Numba first starts its pool, so this only acts before the process's first parallel
    kernel, and never against the user's own setting. True when the plan's threads spin.
    """
    from pocket.infer import kernels_fma as kfma
    from pocket.infer import kernels_vnni as kv

    blas = any(n.op in ("conv2d", "linear") and not (kv.AVAILABLE if "x_scale" in n.attrs else
                                                     kfma.AVAILABLE) for n in graph.nodes)
    if not blas:
        let_omp_spin()
    return not blas and omp_spins()


def check_threads(threads: int | None) -> int | None:
    """Validate a thread count without importing Numba (its default pool size is the CPUs
    this process may use, or NUMBA_NUM_THREADS)."""
    if threads is None:
        return None
    env = os.environ.get("NUMBA_NUM_THREADS", "")
    top = int(env) if env.isdigit() else len(os.sched_getaffinity(0)) if hasattr(
        os, "sched_getaffinity") else os.cpu_count() or 1
    if not 1 <= threads <= top:
        raise EngineError(f"threads must be between 1 and {top}, got {threads}")
    return threads


def blas_controllers() -> list:
    """Handles on the loaded BLAS libraries' pools: threadpoolctl's (any BLAS it knows), or
    without it (the edge install) the OpenBLAS NumPy loaded (_OpenBlas), or []."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return blas_libs.loaded_openblas()
    return list(ThreadpoolController().select(user_api="blas").lib_controllers)


def blas_setter(c):
    """The C function that sets an OpenBLAS pool's size: threadpoolctl's wrapper allocates a
    little on every call, which run() must not; other BLAS libraries go through the wrapper."""
    get = getattr(c, "_get_symbol", None)
    f = get("openblas_set_num_threads") if get and c.internal_api == "openblas" else None
    return f if f is not None else c.set_num_threads


# Where OpenMP's threads spin between kernels (see spin_if_no_blas) a wake-up costs a few
# µs, not tens, and an element-wise kernel counts this much more work per element (cnn_cifar
# fp32 batch 1, 2 threads: im2col and the Winograd transforms of 50-130 µs each ran on one
# core). The GEMMs keep their own measure: int8 VNNI tiles of ~10 µs lost when split.
SPIN_ELEMENT_WORK = 64


def call_work(call: partial, spinning: bool = False) -> int:
    """A bound call's work, for the serial/parallel choice (see engine._PARALLEL_WORK)."""
    from pocket.infer import kernels_fma as kfma
    from pocket.infer import kernels_fma_block as kb
    from pocket.infer import kernels_fma_cv as kcv
    from pocket.infer import kernels_fma_dw as kfd
    from pocket.infer import kernels_fma_dwcv as kdc
    from pocket.infer import kernels_fma_linear as kfl
    from pocket.infer import kernels_fma_winograd as kfw
    from pocket.infer import kernels_fp32 as kf
    from pocket.infer import kernels_int8 as ki
    from pocket.infer import kernels_pw as kp
    from pocket.infer import kernels_tile as kt
    from pocket.infer import kernels_vnni as kv

    if call.func is np.matmul:
        return call.keywords["out"].size * call.args[0].shape[-1]
    if call.func is kp.pw_conv or call.func is kp.pw_conv_q:
        # out (N, O, P), x (N, K, P)
        return call.args[0].size * call.args[1].shape[1]
    # NOTE: the routes size these kernels' parts by the same measure (routes.conv_tile): gemm_q
    # once counted as an element-wise kernel, parallel twin and one part
    if call.func is kt.gemm_act or call.func is kt.gemm_q:  # out (N, O, P), w, x (N, K, P)
        return call.args[0].size * call.args[2].shape[1]
    # NOTE: a VNNI multiply-add costs about a quarter of a float32 one
    if call.func is kv.gemm_cols:
        return call.args[0].size * call.args[2].shape[0]
    # NOTE: counted 4x: its items split evenly and it runs in plans without BLAS, where the
    # pool spins between kernels; from ~1M multiply-adds (~12 µs) two threads win (measured,
    # cnn_cifar fp32 batch 1: 2.25 -> 1.9 ms)
    if call.func is kfma.gemm:  # nb GEMMs of (o, K) @ (K, m)
        return 4 * call.args[4] * call.args[5] * call.args[6] * call.args[3].shape[0]
    if call.func is kb.se_parts:  # means, e (1, C1, H, W), d (1, C1, Ho, Wo), x (K, H*W), ..., w2
        e, d, x, w2 = call.args[1], call.args[2], call.args[3], call.args[9]
        taps = w2.shape[1] if call.args[8] == kb.DW_CV else w2[0].size
        return 4 * e.size * x.shape[0] + 4 * d.size * taps
    if call.func is kb.se_project:  # psum (parts, C3, P), d (C1, P): one GEMM
        return 4 * call.args[0].shape[1] * call.args[1].size
    if call.func is kb.block_parts:  # psum (parts, C3, P2), e (1, C1, H, W), d, x (K, H*W): 2 GEMMs
        psum, e, x = call.args[0], call.args[1], call.args[3]
        return 4 * e.size * x.shape[0] + 4 * psum.shape[1] * psum.shape[2] * e.shape[1]
    if call.func is kfl.gemm_t:  # one GEMM of (o, K) @ (K, m)
        return 4 * call.args[5] * call.args[6] * call.args[4].shape[0]
    if call.func is kcv.gemm_cv:  # nb GEMMs of (o, K) @ (K, m), W packed (vectors, K, 16)
        return 4 * call.args[3] * call.args[4] * call.args[5] * call.args[1].shape[1]
    if call.func is kfma.gemm_pixels:  # one GEMM of (o, K) @ (K, m)
        return 4 * call.args[4] * call.args[5] * call.args[3].shape[0]
    if call.func is kfl.gemm_rows:  # the same (the transposes counted in)
        return 4 * call.args[5] * call.args[6] * call.args[4].shape[0]
    if call.func is kfma.gemm_pool2_pitch:  # the same, and the pooled epilogue
        return 4 * call.args[5] * call.args[6] * call.args[7] * call.args[4].shape[0]
    if call.func is kfw.fused_conv:  # its 16 GEMMs of (O, C) @ (C, tiles), as kfma.gemm's
        out, x, _, _, _, _, _, th, tw = call.args[:9]
        return 4 * 16 * out.shape[1] * x.shape[1] * x.shape[0] * th * tw
    # NOTE: memory-bound: two cores read the weights twice as fast (counted 16x, MobileNetV3's
    # SE convs, 144 x 576 and 576 x 144, ran 9.5 us each on one thread where two took 7)
    if call.func is kfma.gemv:
        return 32 * call.args[0].size * call.args[1].shape[1]
    if call.func is kv.gemm_rows:
        return call.args[0].size * call.args[2].shape[1] // 4
    size = max((a.size for a in call.args if isinstance(a, np.ndarray)), default=0)
    if call.func is kfd.dw_conv_fma or call.func is kfd.dw_conv_fma_flat:  # w (C, 1, kh, kw)
        return depthwise_work(size, call.args[2][0].size, spinning)
    if call.func is kdc.dw_conv_fma_cv:  # out, x, then w packed (groups, k*k, 16)
        return depthwise_work(max(call.args[0].size, call.args[1].size), call.args[2].shape[1], spinning)
    # NOTE: im2col pays a row's bookkeeping every few elements on small maps (~1 ns an
    # element on 4x4 maps): counted 4x (cnn_cifar fp32 batch 1, 2 threads: 43 -> 19 us a call)
    if call.func is kf.im2col or call.func is kf.im2col_same:
        return 4 * element_work(size, spinning)
    # (kernels_fma's im2col_same, a vector at a time and 2-4x faster, counts as any other)
    # NOTE: quantizing is a cheap stream: split across cores, its output lands in both
    # caches and the (serial) packing after it pays more than the split saved; counted as in
    # a plan whose pool sleeps (mlp int8 batch 64, 2 threads: 96 -> 80 us)
    if call.func is ki.quantize:
        return 16 * size
    return element_work(size, spinning)


def depthwise_work(size: int, taps: int, spinning: bool) -> int:
    """element_work of an AVX-512 depthwise conv (kernels_fma_dw, kernels_fma_dwcv) of `taps`
    taps a plane: a 3x3 counts as an element-wise kernel, a 5x5 25/9 of one.

    NOTE: counted as 3x3s, MobileNetV3-small's 5x5 convs ran on one thread: 120 x 14 x 14 27
    us where two threads took 20, 576 x 7 x 7 (the flat kernel) 43 -> 25."""
    return element_work(size * taps // 9, spinning)


def element_work(size: int, spinning: bool) -> int:
    """The work of an element-wise kernel (a depthwise conv, a pool...) whose largest array
    has `size` elements: call_work's measure, which a route that splits such a kernel into
    parts must use too (PlanContext.parallel_elements).

    NOTE: with a different measure a route bound one part where the engine ran the parallel
    twin: MobileNetV2's 96 x 32 x 32 and EfficientNet-B0's 480 x 14 x 14 depthwise convs and
    SqueezeNet's 27 x 27 and 13 x 13 max pools ran on one thread at a pool's cost."""
    return (SPIN_ELEMENT_WORK if spinning else 16) * size


# Pace: each way keeps its last _WINDOW call times; the way not taken is timed again (a probe)
# _PROBE_MIN calls after the last choice, the gap doubling up to _PROBE_MAX while probes lose,
# and taken over when its median is under _SWITCH times the current way's. The first probe
# comes at the plan's third call, so that team calls have a deadline from then on.
_WINDOW = 5
_PROBE_FIRST = 2
_PROBE_MIN = 16
_PROBE_MAX = 512
_SWITCH = 0.9
_DEADLINE = 1.25
# the current way this many calls in a row slower than the other way's median: probe at once
_SLOWER_RUN = 3


class Pace:
    """Whether each call of a bound plan of 2+ threads runs as a team or solo.

    A team call splits its large kernels across Numba's pool (and BLAS's); a solo call runs
    every kernel on the calling thread. With a core to spare the team wins. Under a busy
    neighbour process a team call waits at each kernel's join for a thread the OS has
    descheduled: on 2 cores with one busy process MobileNetV2 took 6.7 ms a call against
    2.5 ms solo, and a team call after a stretch of solo ones (its pool asleep) up to 300 ms.
    onnxruntime's pool lets the caller take back work no thread has started; Numba's cannot.
    So the plan times both ways as it runs and keeps the faster, and a team call that has
    run longer than a solo call and a quarter (its deadline) finishes solo (Engine._paced):
    a probe of the team costs at most about that and one stuck kernel. The results are the
    same bytes either way: the same kernels on the same parts of the work (a split GEMM's
    parts one after another, kernels_blas).
    """

    __slots__ = ("solo", "_times", "_seen", "_left", "_gap", "_medians", "_slower")

    def __init__(self):
        self.solo = False  # the way calls run now (probes apart)
        self._times = ([0.0] * _WINDOW, [0.0] * _WINDOW)  # team's, solo's last call times
        self._seen = [0, 0]
        self._left, self._gap = _PROBE_FIRST, _PROBE_MIN  # calls to the next probe; then
        self._medians = [math.inf, math.inf]  # team's, solo's
        self._slower = 0  # calls in a row slower than the other way's median

    def next_solo(self) -> bool:
        """Whether the next call runs solo (a probe is a call the other way)."""
        self._left -= 1
        return self.solo if self._left > 0 else not self.solo

    def deadline(self) -> float:
        """Seconds after which a team call finishes solo: _DEADLINE times the solo calls'
        median (a team call a little slower than solo calls is no load, and not cut short)."""
        return _DEADLINE * self._medians[1]

    def took(self, solo: bool, seconds: float) -> None:
        """Record a call's time (the way next_solo gave; inf: a team call that passed its
        deadline) and choose the way of the next ones."""
        k = self._seen[solo]
        self._times[solo][k % _WINDOW] = seconds
        self._seen[solo] = n = k + 1
        n = min(n, _WINDOW)
        self._medians[solo] = sorted(self._times[solo][:n])[n // 2]
        if solo == self.solo:
            # NOTE: a load that starts between probes shows as calls slower than the other
            # way's median: look again now rather than up to _PROBE_MAX calls later
            self._slower = self._slower + 1 if seconds > self._medians[not solo] else 0
            if self._slower >= _SLOWER_RUN:
                self._left, self._slower = 0, 0
            return
        mine, theirs = self._medians[self.solo], self._medians[solo]
        if theirs < _SWITCH * mine:
            self.solo, self._gap = solo, _PROBE_MIN
        else:
            # a probe that beat the current way's median (a load that ended) looks again soon
            self._gap = _PROBE_MIN if seconds < mine else min(2 * self._gap, _PROBE_MAX)
        self._left, self._slower = self._gap, 0
