"""Calibration: one batched pass of the fp32 graph over the calibration samples, and the
clipping range of every value that pass saw.

`run_pass` runs the reference interpreter once, in chunks of `BATCH` samples (memory stays
bounded by one chunk's activations), and keeps from it what every later export step needs:

- each f32 value's min and max, and for the clipping methods a strided subsample of its
  entries (at most `SUBSAMPLE` per chunk);
- the graph outputs on every sample (the fp32 side of the export's checks);
- optionally the values named in `keep` (the inputs and outputs of the int8 layers), so that
  the int8 guard measures each layer without running the fp32 graph again. They are kept only
  when they fit in `KEEP_BYTES`; otherwise the guard recomputes them chunk by chunk.

`Pass.ranges(method)` turns the statistics into (lo, hi) per value:

- minmax: the observed range;
- percentile: the `percentile` and `100 - percentile` percentiles of the subsample, so a few
  outliers do not stretch the scale;
- mse: the clipping range whose int8 quantize-dequantize, applied to a 2048-bin histogram of
  the subsample, has the least squared error (rounding inside the range, clipping outside);
- entropy: the clipping range minimising KL(P || Q), P the histogram with the clipped mass
  folded into its edge bins and Q the same bins merged into the 256 int8 levels and spread
  back over the non-empty bins (Migacz, "8-bit Inference with TensorRT", GTC 2017), searched
  as both ends shrunk together about zero, then each end alone.

Clipped ranges always contain 0 (see `quant.choose_activation_qparams`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from pocket.formats import quant as Q
from pocket.formats import reference
from pocket.formats.ir import Graph

METHODS = ("minmax", "percentile", "mse", "entropy")
DEFAULT_PERCENTILE = 99.99
BATCH = 64
# ... and the int8 runs (the guard's layers, the agreement's graph) this many at a time: the
# reference interpreter makes whole-chunk temporaries at every op, and at 8 samples they stay
# in cache instead of page-faulting fresh memory (ResNet-18 at 224x224, int8 export: guard
# 19 -> 14 s, agreement 15 -> 11 s on a 2-core Zen 1)
RUN_BATCH = 8
SUBSAMPLE = 200_000    # entries per value and chunk for the clipping methods
BINS = 2048
LEVELS = 256           # int8 codes
KEEP_BYTES = 1536 << 20  # activations kept for the guard (ResNet-18 at 224x224, 64 samples: ~1 GiB)


def batches(x: np.ndarray, size: int = BATCH):
    for i in range(0, len(x), size):
        yield x[i:i + size]


def check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"calibration method must be one of {', '.join(METHODS)}, "
                         f"got {method!r}")


@dataclass
class Pass:
    """What one fp32 pass over the calibration samples yields (see the module docstring)."""

    samples: int
    lo: dict[str, float] = field(default_factory=dict)
    hi: dict[str, float] = field(default_factory=dict)
    parts: dict[str, list[np.ndarray]] = field(default_factory=dict)
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    kept: list[dict[str, np.ndarray]] | None = None   # per chunk of BATCH samples
    _clips: dict[tuple, tuple[float, float]] = field(default_factory=dict, repr=False)

    def ranges(self, method: str = "minmax",
               percentile: float = DEFAULT_PERCENTILE) -> dict[str, tuple[float, float]]:
        """value -> (lo, hi), every f32 value of the graph."""
        check_method(method)
        if method != "minmax" and not self.parts and self.lo:
            raise ValueError("this pass kept no subsamples; run it with subsample=True")
        return {v: self.range(v, method, percentile) for v in self.lo}

    def range(self, v: str, method: str = "minmax",
              percentile: float = DEFAULT_PERCENTILE) -> tuple[float, float]:
        lo, hi = self.lo[v], self.hi[v]
        if method == "minmax":
            return lo, hi
        key = (v, method, percentile if method == "percentile" else None)
        if key not in self._clips:
            self._clips[key] = self._clip(v, method, percentile)
        return self._clips[key]

    def _clip(self, v: str, method: str, percentile: float) -> tuple[float, float]:
        lo, hi = self.lo[v], self.hi[v]
        allv = np.concatenate(self.parts[v])
        if method == "percentile":
            return (float(np.percentile(allv, 100 - percentile)),
                    float(np.percentile(allv, percentile)))
        counts, edges = histogram(allv, lo, hi)
        if counts is None:
            return lo, hi
        return (mse_clip if method == "mse" else entropy_clip)(counts, edges)


def run_pass(graph: Graph, params: Mapping[str, np.ndarray], x: np.ndarray, *,
             subsample: bool = False, keep: Iterable[str] = (),
             keep_bytes: int = KEEP_BYTES) -> Pass:
    """The fp32 graph over x in chunks of BATCH; statistics of every f32 value (see Pass)."""
    infos = graph.validate()
    keep = sorted(set(keep))
    per_sample = sum(4 * math.prod(infos[v].shape[1:]) for v in keep)
    p = Pass(len(x), kept=[] if keep and per_sample * len(x) <= keep_bytes else None)
    outs: dict[str, list[np.ndarray]] = {o: [] for o in graph.outputs}
    for xb in batches(x):
        env = reference.run(graph, params, xb, keep_all=True)
        for name, v in env.items():
            if name in graph.params or v.dtype != np.float32 or v.size == 0:
                continue
            lo, hi = float(v.min()), float(v.max())
            if name in p.lo:
                lo, hi = min(lo, p.lo[name]), max(hi, p.hi[name])
            p.lo[name], p.hi[name] = lo, hi
            if subsample:
                # NOTE: a strided subsample keeps memory bounded on big activations (the same
                # subsample the percentile method has always used, so its ranges are unchanged)
                flat = v.reshape(-1)
                p.parts.setdefault(name, []).append(flat[::max(1, flat.size // SUBSAMPLE)])
        for o in graph.outputs:
            outs[o].append(env[o])
        if p.kept is not None:
            p.kept.append({v: env[v] for v in keep})
    p.outputs = {o: np.concatenate(a) for o, a in outs.items()}
    return p


# --------------------------------------------------------------------------- clipping


def histogram(values: np.ndarray, lo: float, hi: float, bins: int = BINS):
    """counts (bins,) i64 and edges (bins + 1,) f64 over [min(lo, 0), max(hi, 0)]; None, None
    for a (near) constant value, whose range needs no clipping."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if hi - lo < 1e-12:
        return None, None
    counts, edges = np.histogram(np.asarray(values, np.float64), bins=bins, range=(lo, hi))
    return counts, edges


def qdq_error(counts: np.ndarray, edges: np.ndarray, lo, hi) -> np.ndarray:
    """Sum over bins of count * (center - dequantize(quantize(center)))^2 under the int8
    qparams that [lo, hi] gets: the squared error the clip range causes on the histogram.
    lo, hi: floats or equal-length sequences of candidates (then one error per candidate)."""
    qp = [Q.choose_activation_qparams(a, b) for a, b in np.broadcast(lo, hi)]
    scale = np.array([s for s, _ in qp])[:, None]
    zp = np.array([z for _, z in qp], np.float64)[:, None]
    c = (edges[:-1] + edges[1:]) / 2
    q = np.clip(np.rint(c / scale) + zp, Q.QMIN, Q.QMAX)
    err = np.sum(counts * (c - (q - zp) * scale) ** 2, axis=1)
    return err if np.ndim(lo) or np.ndim(hi) else float(err[0])


def mse_clip(counts: np.ndarray, edges: np.ndarray, steps: int = 256) -> tuple[float, float]:
    """The (lo, hi) with the least `qdq_error`: first both ends shrunk together about 0, then
    each end alone with the other fixed (coordinate descent on a grid of `steps` per end)."""
    lo0, hi0 = float(edges[0]), float(edges[-1])
    grid = np.arange(1, steps + 1) / steps

    def best(los, his):
        i = int(np.argmin(qdq_error(counts, edges, los, his)))
        return float(np.broadcast_to(los, grid.shape)[i]), float(np.broadcast_to(his, grid.shape)[i])

    lo, hi = best(grid * lo0, grid * hi0)
    for _ in range(2):
        if hi0 > 0:
            lo, hi = best(lo, grid * hi0)
        if lo0 < 0:
            lo, hi = best(grid * lo0, hi)
    return lo, hi


def kl_divergence(counts: np.ndarray, i0: int, i1: int, levels: int = LEVELS) -> float:
    """KL(P || Q) of clipping the histogram to bins [i0, i1) (see the module docstring)."""
    sliced = counts[i0:i1].astype(np.float64)
    p = sliced.copy()
    p[0] += counts[:i0].sum()
    p[-1] += counts[i1:].sum()
    m = i1 - i0
    merged = m // levels
    # Each level's mass spread evenly over its non-empty bins; the last level takes the rest.
    group = np.minimum(np.arange(m) // merged, levels - 1)
    mass = np.bincount(group, weights=sliced, minlength=levels)
    nonzero = np.bincount(group, weights=(sliced > 0), minlength=levels)
    q = np.where(sliced > 0, mass[group] / np.maximum(nonzero[group], 1), 0.0)
    p, q = p / p.sum(), q / max(q.sum(), 1e-300)
    live = p > 0
    # NOTE: an edge bin that only holds folded outliers has p > 0 but q = 0; a small floor
    # (TensorRT smooths the same way) keeps the divergence finite and penalises that clip.
    return float(np.sum(p[live] * np.log(p[live] / np.maximum(q[live], 1e-4 / m))))


def entropy_clip(counts: np.ndarray, edges: np.ndarray, levels: int = LEVELS,
                 step: int = 8) -> tuple[float, float]:
    """The (lo, hi) minimising `kl_divergence` over bin ranges [i0, i1) of at least `levels`
    bins that contain 0: first both ends shrunk together about 0 (for a one-sided histogram,
    TensorRT's search), then each end alone with the other fixed, in steps of `step` bins.
    Of equal minima the first (the narrowest range) wins."""
    n = len(counts)
    if n < levels:
        return float(edges[0]), float(edges[-1])
    z = -edges[0] / ((edges[-1] - edges[0]) / n)  # where 0 falls, in bins
    zlo, zhi = int(math.floor(z)), int(math.ceil(z))
    cache: dict[tuple[int, int], float] = {}

    def best(cands):
        cands = [(i0, i1) for i0, i1 in cands
                 if 0 <= i0 <= zlo and zhi <= i1 <= n and i1 - i0 >= levels]
        for c in cands:
            if c not in cache:
                cache[c] = kl_divergence(counts, c[0], c[1], levels)
        return min(cands, key=lambda c: cache[c])

    def shrunk(m):
        i0 = min(max(int(round(z * (1 - m / n))), 0), n - m)
        return i0, i0 + m

    i0, i1 = best([shrunk(m) for m in [*range(levels, n, step), n]])
    for _ in range(2):
        i0, i1 = best([(i0, j) for j in [*range(i0 + levels, n, step), n, i1]])
        i0, i1 = best([(j, i1) for j in [*range(i1 - levels, -1, -step), 0, i0]][::-1])
    return float(edges[i0]), float(edges[i1])
