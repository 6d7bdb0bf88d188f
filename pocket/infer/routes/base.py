"""What every route shares: the Route type, the geometry its eligibility reads, the registry.

A route is one way to run one op: `limits(geometry, dtype, cpu)` says why it cannot run a node
(None: eligible), `prepare(ctx, node)` makes its load-time dict (views of the weights, int8
constants, chunking, `scratch_bytes`), and `bind(ctx, step, node, prep, n)` returns the calls
of one batch size. A route may hand a batch size to a sibling (`at_batch`: a Winograd conv
with few tiles runs at its pitch, a linear with few rows as dot products along K).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from pocket.formats.ir import Node
from pocket.infer.kernels_int8 import EXACT_K
from pocket.infer.lowering_common import _EMPTY_F32

if TYPE_CHECKING:
    from pocket.infer.plan import Cpu, PlanContext

ROUTES: dict[str, Route] = {}  # name -> route, filled as the route modules are imported


@dataclass(frozen=True)
class ConvGeometry:
    """A conv2d node's per-sample geometry: input (c, h, w), o output channels, its kernel."""

    c: int
    h: int
    w: int
    o: int
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int
    dw: int
    groups: int
    # int8 weights past kernels_int8.EXACT_K rows along K: the largest sum of |w_q| over one
    # output channel (0 otherwise: float weights, or K short enough to be exact anyway).
    # Every partial sum of x_q * w_q is at most 128 times it, whatever K: within 2**24, a
    # float32 GEMM over the codes is exact (conv_tile.tile_q_max_k)
    w_l1: int = 0

    @staticmethod
    def of(ctx: PlanContext, node: Node) -> ConvGeometry:
        a = node.attrs
        c, h, w = ctx.sample[node.inputs[0]]
        wt = ctx.params[node.inputs[1]]
        o, _, kh, kw = wt.shape
        (sh, sw), (ph, pw), (dh, dw) = a["stride"], a["padding"], a["dilation"]
        w_l1 = (int(np.abs(wt.reshape(o, -1).astype(np.int32)).sum(axis=1).max(initial=0))
                if wt.dtype == np.int8 and wt[0].size > EXACT_K else 0)
        return ConvGeometry(c, h, w, o, kh, kw, sh, sw, ph, pw, dh, dw, a["groups"], w_l1)

    @property
    def ho(self) -> int:
        return (self.h + 2 * self.ph - self.dh * (self.kh - 1) - 1) // self.sh + 1

    @property
    def wo(self) -> int:
        return (self.w + 2 * self.pw - self.dw * (self.kw - 1) - 1) // self.sw + 1

    @property
    def k(self) -> int:  # the reduction length of all groups together
        return self.c * self.kh * self.kw

    @property
    def stride1(self) -> bool:
        return (self.sh, self.sw) == (1, 1)

    def pitch_limit(self) -> str | None:
        """Why a stride-1 conv cannot read its padded images at a pitch, or None.

        NOTE: at stride 1 the pitch routes lay the padded rows W + pw wide (each row's right
        padding is the next row's left padding, see pitch_geometry): that holds only while no
        window reaches past one row's padding, i.e. pw <= dw * (kw - 1); with more padding the
        output is wider than the pitch and those routes read memory the call never wrote.
        The rows' own bound is declared alike (ph <= dh * (kh - 1))."""
        if self.ph > self.dh * (self.kh - 1) or self.pw > self.dw * (self.kw - 1):
            return (f"padding {[self.ph, self.pw]} exceeds the kernel's reach "
                    f"{[self.dh * (self.kh - 1), self.dw * (self.kw - 1)]} (dilation x (k - 1))")
        return None

    def describe(self) -> dict[str, Any]:
        return {"input": [self.c, self.h, self.w], "output": [self.o, self.ho, self.wo],
                "kernel": [self.kh, self.kw], "stride": [self.sh, self.sw],
                "padding": [self.ph, self.pw], "dilation": [self.dh, self.dw], "groups": self.groups}


def sample_rows(ctx: PlanContext, node: Node) -> int:
    """The rows one sample gives a linear: 1 for (N, in), L for (N, L, in), the product of
    the leading dims of (N, ..., in). An int8 linear over (N, ..., in) is the 2-D one on
    n * sample_rows rows (its input and output are contiguous in the arena)."""
    return math.prod(ctx.sample[node.inputs[0]][:-1])


@dataclass(frozen=True)
class LinearGeometry:
    """A linear node: up to `rows` rows (the plan's max_batch x sample_rows) of k inputs to o
    outputs."""

    rows: int
    k: int
    o: int

    @staticmethod
    def of(ctx: PlanContext, node: Node) -> LinearGeometry:
        o, k = ctx.params[node.inputs[1]].shape
        return LinearGeometry(ctx.max_batch * sample_rows(ctx, node), k, o)

    def describe(self) -> dict[str, Any]:
        return asdict(self)


def geometry_of(ctx: PlanContext, node: Node) -> ConvGeometry | LinearGeometry:
    return ConvGeometry.of(ctx, node) if node.op == "conv2d" else LinearGeometry.of(ctx, node)


def dtype_of(node: Node) -> str:
    """'i8' for a quantized conv or linear (its attrs carry x_scale), else 'f32'."""
    return "i8" if "x_scale" in node.attrs else "f32"


class Route:
    """One way to run one op (see the module docstring). Subclasses set name and op."""

    name: ClassVar[str] = ""
    op: ClassVar[str] = ""
    # plan level: its epilogue can write a following maxpool's output (see pool_ok)
    fuses_pool: ClassVar[bool] = False
    # ... a padded maxpool too (pool_ok then gets its (kh, kw, sh, sw, ph, pw))
    fuses_padded_pool: ClassVar[bool] = False

    def limits(self, geo, dtype: str, cpu: Cpu) -> str | None:
        """Why this route cannot run a node of this geometry and dtype here; None if it can."""
        raise NotImplementedError

    def eligible(self, geo, dtype: str, cpu: Cpu) -> bool:
        return self.limits(geo, dtype, cpu) is None

    def declines(self, geo, dtype: str, cpu: Cpu) -> str | None:
        """Why the route table passes over an eligible route for this geometry (it would be
        slower than the next one); POCKET_ROUTE may still force it. None: it takes it."""
        return None

    def prepare(self, ctx: PlanContext, node: Node) -> dict:
        raise NotImplementedError

    def scratch_bytes(self, prep: dict) -> int:
        """The node's scratch in the arena at max_batch (for every batch size it binds)."""
        return prep.get("scratch_bytes", 0)

    def at_batch(self, ctx: PlanContext, step: int, prep: dict, n: int) -> tuple[Route, dict]:
        """The route and prepared dict that bind batch size n (a sibling's for some routes)."""
        return self, prep

    def pool_ok(self, prep: dict, n: int, pool_geom: tuple) -> bool:
        """Whether, at batch n, this route writes a fused maxpool's output (plan.pool_after):
        pool_geom (kh, kw, sh, sw), or with the padding (ph, pw) after them where the pool has
        one (fuses_padded_pool routes only)."""
        return self.fuses_pool and (len(pool_geom) == 4 or self.fuses_padded_pool)

    def with_pool(self, ctx: PlanContext, step: int, prep: dict, n: int, pooled: bool) -> tuple[Route, dict]:
        """The route that binds batch n once it is known whether a maxpool fuses into it."""
        return self, prep

    def bind(self, ctx: PlanContext, step: int, node: Node, prep: dict, n: int, pool=None) -> list:
        """The calls for batch n; pool: (the pool's output view, its (kh, kw, sh, sw)) where the
        conv writes a fused maxpool's output instead of its own."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<route {self.name}>"


def prepared(d: dict, key: str, make) -> np.ndarray:
    """d[key]: weights in the layout a kernel wants, made by make() the first time a bind
    needs them and kept for the engine's life (not remade per call, not in the arena). Each
    counts in d["prepared_bytes"] (Engine.prepared_bytes, `pocket inspect --routes`)."""
    arr = d.get(key)
    if arr is None:
        arr = d[key] = make()
        # read-only like the mmapped weights a kernel gets otherwise: Numba compiles a kernel
        # again for each readonly flag it sees
        arr.flags.writeable = False
        d["prepared_bytes"] = d.get("prepared_bytes", 0) + arr.nbytes
    return arr


def register(cls: type[Route]) -> type[Route]:
    ROUTES[cls.name] = cls()
    return cls


def route_of(prep: dict) -> Route:
    return ROUTES[prep["route"]]


def route_at(ctx: PlanContext, step: int, n: int) -> tuple[Route, dict]:
    """Node `step`'s route and prepared dict at batch n (see Route.at_batch)."""
    d = ctx.prep[step]
    return ROUTES[d["route"]].at_batch(ctx, step, d, n)


def pitch_geometry(geo: ConvGeometry) -> dict:
    """Where a conv's packed inputs put its output pixels: stride 1 at a pitch of Wp, the
    padded width, so that each packed row is one contiguous run of the padded images (junk
    columns ow >= Wo included, see kernels_vnni.pack_cols); otherwise at a pitch of Wo (and
    the VNNI route takes Wo for narrow maps too, see conv_vnni.VNNI_PITCH_MAX_WO).

    At stride 1 the padded rows are W + pw wide, not W + 2pw: each row's pw pad columns come
    first, and a window running off a row's right end reads the next row's (or the next
    plane's) first pw columns, which are padding too; so the pitch has pw fewer junk columns
    (a 3x3 conv on 14x14 maps: 1 in 15 columns junk, not 2 in 16). That needs the padding
    within the kernel's reach (ConvGeometry.pitch_limit)."""
    c, h, w = geo.c, geo.h, geo.w
    hp = h + 2 * geo.ph
    ho, wo = geo.ho, geo.wo
    wp = w + geo.pw if geo.stride1 else w + 2 * geo.pw
    pitch = wp if geo.stride1 else wo
    # padded: elements of one padded image; slack: junk reads past the last one
    return {"hp": hp, "wp": wp, "ho": ho, "wo": wo, "pitch": pitch, "pix": ho * pitch, "padded": c * hp * wp,
            "slack": (geo.kw - 1) * geo.dw + 1}


def conv_prep(ctx: PlanContext, node: Node, name: str) -> dict:
    """The start of every conv route's dict: its geometry, the weights, and fp32's bias."""
    geo = ConvGeometry.of(ctx, node)
    d = {"route": name, "w": ctx.params[node.inputs[1]], "o": geo.o, "k": geo.k, "p": geo.ho * geo.wo,
         "geom": (geo.kh, geo.kw, geo.sh, geo.sw, geo.ph, geo.pw, geo.dh, geo.dw), "groups": geo.groups,
         "geo": geo}
    if "x_scale" not in node.attrs:
        d["b"] = ctx.params[node.inputs[2]] if len(node.inputs) > 2 else _EMPTY_F32
    return d
