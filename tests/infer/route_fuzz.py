"""The route geometry fuzzer behind test_route_fuzz.py: random conv2d / pool / linear models, each
run through the engine with its arena and input against guard pages and compared with
formats/reference.py. Run as a script it is the worker process the test starts:

    python tests/infer/route_fuzz.py --dtype f32 --examples 200 [--seed 0]

(the environment picks the kernels: POCKET_FP32_FMA=0 POCKET_INT8_VNNI=0 for the portable ones,
NUMBA_BOUNDSCHECK=1 for bounds-checked kernels). Before each example it writes `CASE {json}` to
stderr, so a crash (a segfault on a guard page) still names its geometry; at the end, one
`DONE {json}` line on stdout: examples, seconds, and the kernels that ran.

Guard pages: the arena (engine._alloc_arena, patched here) and the input each end exactly where
a PROT_NONE page starts and sit one page above another, so a read or write past either end
faults. The arena is filled with POISON first: a kernel that reads arena bytes the call never
wrote then gives results off by ~1e38 (fp32) or wrong codes (int8), not a silent zero.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import mmap
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from models import FakeContainer  # noqa: E402

from pocket.formats import quant as qm  # noqa: E402
from pocket.formats import reference as ref  # noqa: E402
from pocket.formats.ir import Graph, Node, ValueInfo  # noqa: E402

PAGE = mmap.PAGESIZE
PROT_NONE = 0
# 0x7F bytes: float32 3.39e38 (finite: a 0 * junk product stays 0, as with real data) and
# int8 127
POISON = 0x7F
# (ReLU and none twice: the register and pooled epilogues take only those)
FP32_ACTS = ("none", "none", "relu", "relu", "leaky_relu", "sigmoid", "tanh", "gelu")
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def guarded(nbytes: int) -> np.ndarray:
    """nbytes of writable uint8 (zeros) whose last byte is the last before a PROT_NONE page,
    with another PROT_NONE page below its first page."""
    data = -(-max(nbytes, 1) // PAGE) * PAGE
    region = mmap.mmap(-1, data + 2 * PAGE)
    raw = np.frombuffer(region, np.uint8)
    base = raw.ctypes.data
    for at in (base, base + PAGE + data):
        if _libc.mprotect(at, PAGE, PROT_NONE) != 0:
            raise OSError(ctypes.get_errno(), "mprotect failed")
    start = PAGE + data - nbytes
    return raw[start:start + nbytes]


def guarded_copy(x: np.ndarray) -> np.ndarray:
    """x's values in guarded memory (C order)."""
    out = guarded(x.nbytes).view(x.dtype).reshape(x.shape)
    np.copyto(out, x)
    return out


def poisoned_arena(nbytes: int) -> np.ndarray:
    """engine._alloc_arena's stand-in: guarded, and POISON where it promised zeros."""
    arena = guarded(nbytes)
    arena.fill(POISON)
    return arena


# --------------------------------------------------------------------------- the cases


def _conv_strategy(st, draw, dtype: str, wino: bool, pitch: bool = False) -> dict:
    """A conv2d's geometry within the validator's limits: any padding (also past the kernel's
    reach), strides, dilations, groups, non-square maps and kernels."""
    if wino:  # Winograd's geometry: 3x3, stride 1, many channels and tiles
        c = draw(st.sampled_from([32, 36, 64, 72]))
        o = draw(st.sampled_from([8, 30, 64]))
        k, s, d, g = (3, 3), (1, 1), (1, 1), 1
        p = (draw(st.integers(0, 3)), draw(st.integers(0, 3)))
        h, w = draw(st.integers(6, 20)), draw(st.integers(6, 20))
    else:
        shape = draw(st.sampled_from(["dense", "dense", "dense", "depthwise", "grouped", "wide",
                                      "dw_square"]))
        if shape == "dw_square":  # AVX-512's depthwise kernels: rows, flat planes, 16-channel groups
            c = o = g = draw(st.sampled_from([1, 3, 16, 21]))
        elif shape == "wide":  # enough channels for the pitch, quad and wide-tile routes
            c, o, g = draw(st.sampled_from([4, 16, 32, 40])), draw(st.sampled_from([6, 16, 17, 33])), 1
        elif shape == "dense":
            c, o, g = draw(st.integers(1, 9)), draw(st.integers(1, 13)), 1
        else:
            g = draw(st.integers(1, 4)) if shape == "grouped" else draw(st.integers(1, 8))
            c = g * (1 if shape == "depthwise" else draw(st.integers(1, 3)))
            o = g * draw(st.integers(1, 3))
        k = (draw(st.integers(1, 5)), draw(st.integers(1, 5)))
        strides = st.sampled_from([1, 1, 1, 2, 3])
        s = (1, 1) if pitch else (draw(strides), draw(strides))
        d = (draw(st.sampled_from([1, 1, 2, 3])), draw(st.sampled_from([1, 1, 2, 3])))
        if not pitch and draw(st.sampled_from([True, False, False, False])):
            s, d = (2, 2), (1, 1)  # the stride-2 convs' own route (conv_fma_phase)
        if shape == "dw_square":  # (a 3x3 or 5x5 square at stride 1 or 2 both ways: the
            # random kernels and strides above drew it in about one case of 400)
            q = draw(st.sampled_from([3, 5]))
            k, d = (q, q), (1, 1)
            s = (1, 1) if pitch else (draw(st.sampled_from([1, 2])),) * 2
        # the pointwise routes' geometry (conv_pw, conv_pw_int8, conv_fma_1x1, conv_pointwise)
        pointwise = g == 1 and draw(st.sampled_from([True, False, False, False]))
        if pointwise:
            k, s, d = (1, 1), (1, 1), (1, 1)
        reach = [d[i] * (k[i] - 1) for i in range(2)]
        # the padding often past the kernel's reach (legal, and where pitch layouts break)
        p = (0, 0) if pointwise else tuple(draw(st.sampled_from(sorted(
            {0, 1, r // 2, r, r + 1, r + 2, r + 3} - ({r + 1, r + 2, r + 3} if pitch else set()))))
            for r in reach)
        if shape == "dw_square" and draw(st.booleans()):
            p = (k[0] // 2,) * 2  # "same" padding: small planes at stride 1 take dw_conv_fma_flat
        lo = [max(1, reach[i] + 1 - 2 * p[i]) for i in range(2)]
        h, w = draw(st.integers(lo[0], lo[0] + 11)), draw(st.integers(lo[1], lo[1] + 11))
        if pointwise and draw(st.sampled_from([True, False, False])):
            h = w = 1  # a squeeze-and-excitation conv's 1x1 map (conv_gemv)
        if s == (1, 1) and draw(st.booleans()):
            # NOTE: a boundary value: the maps whose pixels, laid at the pitch of a row and its
            # left padding (kernels_fma's and kernels_vnni's stride-1 layouts), fill whole
            # vectors of 16, so that no junk columns sit between one image's last row and the
            # next channel's first
            ho = h + 2 * p[0] - reach[0]
            w += next(i for i in range(16) if (w + i + p[1]) * ho % 16 == 0 or i == 15)
    acts = ("none", "relu") if dtype == "i8" else FP32_ACTS
    return {"c": c, "o": o, "groups": g, "kernel": list(k), "stride": list(s), "padding": list(p),
            "dilation": list(d), "h": h, "w": w, "bias": draw(st.booleans()),
            "activation": draw(st.sampled_from(acts))}


def _pool_strategy(st, draw, h: int, w: int, fusable: bool) -> dict:
    """A maxpool2d that fits an (h, w) map: unpadded (what a conv's epilogue may fuse; often
    2x2/2, the pooled epilogues' own case) or padded."""
    kh, kw = draw(st.integers(1, min(3, h))), draw(st.integers(1, min(3, w)))
    pad = [0, 0] if fusable else [draw(st.integers(0, kh // 2)), draw(st.integers(0, kw // 2))]
    stride = draw(st.sampled_from([None, [1, 1], [2, 2], [kh, kw], [1, 2]]))
    if fusable and min(h, w) >= 2 and draw(st.booleans()):  # the 2x2/2 pool epilogues
        kh, kw, stride = 2, 2, None
    return {"kernel": [kh, kw], "stride": stride, "padding": pad}


def kinds(dtype: str) -> list[str]:
    """The families of fuzz cases: each worker run draws the same number of each, but those of
    SMALL_FAMILIES."""
    return ["conv", "conv_pool", "wino", "linear", "pool"] + (
        ["conv_pool_conv", "global_avgpool", "stem_pool"] if dtype == "f32" else [])


# {family: the share of --examples it draws (1 / n)} for the few cases one route's own geometry
# needs: a stem (3 channels, stride 2, maps of 30-60) and its 2x2 or 3x3 stride-2 maxpool
# (kernels_tile_pool, whose rows must fill a vector), which the small maps above never reach
SMALL_FAMILIES = {"stem_pool": 25}


def _stem_pool(st, draw) -> tuple[dict, dict]:
    k = draw(st.sampled_from([2, 3, 5, 7]))
    conv = {"c": draw(st.integers(1, 4)), "o": draw(st.integers(1, 20)), "groups": 1,
            "kernel": [k, k], "stride": [2, 2], "padding": [draw(st.sampled_from([0, k // 2]))] * 2,
            "dilation": [1, 1], "h": draw(st.integers(30, 60)), "w": draw(st.integers(30, 60)),
            "bias": draw(st.booleans()),
            # (sigmoid: monotone, so a pool may fuse, but not in the tiles: the route declines)
            "activation": draw(st.sampled_from(["none", "relu", "clip", "sigmoid"]))}
    if conv["activation"] == "clip":
        conv["alpha"] = 6.0
    pk = draw(st.sampled_from([2, 3]))
    return conv, {"kernel": [pk, pk], "stride": [2, 2], "padding": [draw(st.integers(0, pk // 2))] * 2}


def cases(dtype: str, kind: str):
    """The hypothesis strategy of fuzz cases of one kind (see kinds) for dtype 'f32' or 'i8'
    (JSON-able dicts)."""
    from hypothesis import strategies as st

    @st.composite
    def case(draw):
        batch = draw(st.sampled_from([1, 1, 2, 3, 5, 17] if kind != "linear" else [1, 2, 3, 15, 16, 17, 33]))
        threads = draw(st.sampled_from([1, 2]))
        out = {"kind": kind, "dtype": dtype, "batch": batch, "threads": threads,
               "max_batch": draw(st.sampled_from([batch, batch, batch + 3, max(1, batch // 2)])),
               # every call on the thread pool, however small (its parallel twin's splits)
               "split": threads == 2 and draw(st.booleans()), "seed": draw(st.integers(0, 2**16))}
        if kind == "linear":
            # K a multiple of 4 half the time (the VNNI tiles' packed words)
            out["linears"] = [draw(st.integers(1, 75)) * draw(st.sampled_from([1, 4]))]
            for _ in range(draw(st.integers(1, 2))):  # two: a chained pair
                out["linears"].append(draw(st.sampled_from([1, 4, 10, 16, 17, 64, 130])))
            out["activation"] = [draw(st.sampled_from(("none", "relu") if dtype == "i8" else FP32_ACTS))
                                 for _ in out["linears"][1:]]
            out["bias"] = draw(st.booleans())
            out["to_int8"] = draw(st.booleans())
            # int8 over (N, ..., in): the int8 routes on its N * ... rows; a single linear
            # only (those do not chain, linear_chain), its leading dims picked by the seed and
            # not drawn, so that the other cases stay as they were (a rare chained pair
            # reaches requant_cols_pack)
            if dtype == "i8" and len(out["linears"]) == 2:
                out["seq"] = [[], [], [1], [7], [3, 2]][out["seed"] % 5]
            return out
        if kind in ("pool", "global_avgpool"):
            c, h, w = draw(st.integers(1, 6)), draw(st.integers(1, 13)), draw(st.integers(1, 13))
            out["input"] = [c, h, w]
            if kind == "pool":
                ops = ["maxpool2d"] if dtype == "i8" else ["maxpool2d", "avgpool2d"]
                out["pool_op"] = draw(st.sampled_from(ops))
                out["pool"] = _pool_strategy(st, draw, h, w, False)
                out["pool"]["count_include_pad"] = draw(st.booleans())
            return out
        if kind == "stem_pool":
            conv, out["pool"] = _stem_pool(st, draw)
            out.update(convs=[conv], input=[conv["c"], conv["h"], conv["w"]], to_int8=True)
            return out
        # (conv -> pool -> conv: the first one stride 1 with its padding in reach, so that it
        # may take a pitch route and write the pooled maps into the next one's padded images)
        conv = _conv_strategy(st, draw, dtype, kind == "wino", pitch=kind == "conv_pool_conv")
        out["convs"] = [conv]
        out["input"] = [conv["c"], conv["h"], conv["w"]]
        out["to_int8"] = draw(st.booleans()) or kind in ("conv_pool", "conv_pool_conv")
        ho, wo = _conv_hw(conv)
        if kind in ("conv_pool", "conv_pool_conv") or (kind == "wino" and draw(st.booleans())):
            fusable = kind == "conv_pool_conv" or draw(st.booleans())
            out["pool"] = _pool_strategy(st, draw, ho, wo, fusable)
            if kind == "conv_pool_conv":
                out["pool"]["kernel"], out["pool"]["stride"] = [2, 2], None
                if ho < 2 or wo < 2:
                    out["pool"] = None
        if kind == "conv_pool_conv" and out["pool"] is not None:
            o = conv["o"]
            nxt = {"c": o, "o": draw(st.integers(1, 12)), "groups": 1, "kernel": [3, 3], "stride": [1, 1],
                   "padding": [1, 1], "dilation": [1, 1], "bias": draw(st.booleans()),
                   "activation": draw(st.sampled_from(FP32_ACTS))}
            out["convs"].append(nxt)
        return out

    return case()


# Known engine bugs, by name: a predicate on cases that each one breaks. The fuzz tests leave
# these cases out and a strict xfail test runs them alone, so a fix shows up as an XPASS (then
# delete the entry). Empty: the padding past the kernel's reach at stride 1, which the pitch
# routes misread (issue 21), is now a declared limit of those routes (routes.base.pitch_limit).
KNOWN_BUGS: dict = {}


def _conv_hw(a: dict) -> tuple[int, int]:
    return tuple((size + 2 * p - d * (k - 1) - 1) // s + 1 for size, k, s, p, d in zip(
        (a["h"], a["w"]), a["kernel"], a["stride"], a["padding"], a["dilation"]))


# --------------------------------------------------------------------------- the models


def build(case: dict) -> tuple[Graph, dict, dict, np.ndarray]:
    """(graph, params, quant, x) for a case: x (batch, ...) f32 or i8."""
    rng = np.random.default_rng(case["seed"])
    int8 = case["dtype"] == "i8"
    shape = [*case.get("seq", []), case["linears"][0]] if case["kind"] == "linear" else case["input"]
    dt = "i8" if int8 else "f32"
    inputs = {"x": ValueInfo(dt, ("N", *shape))}
    nodes, params, quant = [], {}, {}
    infos: dict[str, ValueInfo] = {}
    last, x_scale, x_zp = "x", 0.02, int(rng.integers(-20, 21))

    def add(op, ins, attrs):
        nonlocal last
        out = f"{op}{len(nodes)}:0"
        nodes.append(Node(f"{op}{len(nodes)}", op, [last, *ins], [out], attrs))
        last = out

    def weights(name, shape, fan, bias, attrs, is_last):
        """The weight (and bias) params of a conv/linear; int8: per-channel scales and qparams."""
        nonlocal x_scale, x_zp
        ins = [name + ".w"]
        if not int8:
            params[ins[0]] = (rng.standard_normal(shape) / math.sqrt(fan)).astype(np.float32)
            if bias:
                ins.append(name + ".b")
                params[ins[1]] = (0.3 * rng.standard_normal(shape[0])).astype(np.float32)
            return ins
        o = shape[0]
        params[ins[0]] = rng.integers(-127, 128, shape).astype(np.int8)
        w_scale = (0.01 * (0.5 + rng.random(o))).astype(np.float32)
        quant[ins[0]] = {"scale": w_scale.tolist(), "zero_point": [0] * o, "axis": 0}
        if bias:
            ins.append(name + ".b")
            params[ins[1]] = rng.integers(-3000, 3001, o).astype(np.int32)
        attrs.update(x_scale=x_scale, x_zero_point=x_zp)
        if case.get("to_int8") or not is_last:
            # outputs of a few dozen codes: neither all saturated nor all zero
            y_scale = qm.f32(x_scale * float(w_scale.mean()) * math.sqrt(fan) * 74 * 73 / 40)
            x_scale, x_zp = y_scale, int(rng.integers(-30, 31))
            attrs.update(y_scale=y_scale, y_zero_point=x_zp)
        return ins

    if case["kind"] == "linear":
        dims, acts = case["linears"], case["activation"]
        for i, (k, o) in enumerate(zip(dims, dims[1:])):
            attrs = {"activation": acts[i]}
            ins = weights(f"fc{i}", (o, k), k, case["bias"], attrs, i == len(dims) - 2)
            add("linear", ins, attrs)
    elif case["kind"] in ("pool", "global_avgpool"):
        if case["kind"] == "pool":
            add(case["pool_op"], [], {k: v for k, v in case["pool"].items()
                                      if k != "count_include_pad" or case["pool_op"] == "avgpool2d"})
        else:
            add("global_avgpool", [], {})
    else:
        convs = case["convs"]
        for i, cv in enumerate(convs):
            kh, kw = cv["kernel"]
            wshape = (cv["o"], cv["c"] // cv["groups"], kh, kw)
            attrs = {k: cv[k] for k in ("stride", "padding", "dilation", "groups", "activation", "alpha")
                     if k in cv}
            ins = weights(f"conv{i}", wshape, wshape[1] * kh * kw, cv["bias"], attrs,
                          i == len(convs) - 1 and (case.get("pool") is None or not int8))
            add("conv2d", ins, attrs)
            if i == 0 and case.get("pool") is not None:
                add("maxpool2d", [], dict(case["pool"]))
    for name, a in params.items():
        infos[name] = ValueInfo({np.float32: "f32", np.int8: "i8", np.int32: "i32"}[a.dtype.type],
                                tuple(a.shape))
    graph = Graph(inputs, [last], nodes, infos, {})
    graph.validate()
    n = case["batch"]
    x = (rng.integers(-128, 128, (n, *shape)).astype(np.int8) if int8 else
         rng.standard_normal((n, *shape)).astype(np.float32))
    return graph, params, quant, x


# --------------------------------------------------------------------------- one example


def kernel_names(calls) -> set[str]:
    """The kernels a bound plan calls (NumPy's matmul and friends by their own names)."""
    names = set()
    for call in calls:
        f = getattr(call, "func", call)
        f = getattr(f, "py_func", f)
        name = getattr(f, "__name__", "") or repr(f)
        names.add(name[:-len("_serial")] if name.endswith("_serial") and name != "_serial" else name)
    return names


def eligible_routes(eng) -> set[str]:
    """The routes (routes.TABLE names) that every conv2d, or every linear, of the engine's
    graph is eligible for on this CPU: those POCKET_ROUTE can force on the whole model."""
    from pocket.infer.routes import TABLE
    from pocket.infer.routes.base import dtype_of, geometry_of

    per_op: dict[str, set[str]] = {}
    for node in eng.graph.nodes:
        if node.op in TABLE:
            geo, dtype = geometry_of(eng._ctx, node), dtype_of(node)
            ok = {r.name for r in TABLE[node.op] if r.limits(geo, dtype, eng._ctx.cpu) is None}
            per_op[node.op] = per_op.get(node.op, ok) & ok
    return set().union(*per_op.values())


def check(case: dict, seen: dict[str, int] | None = None) -> None:
    """Run one case through the engine on the route the table picks and then forced on each
    other eligible route (POCKET_ROUTE), each twice (the first call copies the input into the
    arena, the second may read the caller's array in place), and compare with the reference:
    fp32 within 1e-5 of the output's largest magnitude, int8 exactly."""
    print("CASE", json.dumps(case, sort_keys=True), file=sys.stderr, flush=True)
    graph, params, quant, x = build(case)
    want = ref.run(graph, params, {"x": x}, quant)[graph.outputs[0]]
    seen = {} if seen is None else seen
    taken, others = _run(case, graph, params, quant, x, want, None, seen)
    for route in sorted(others - taken):
        _run(case, graph, params, quant, x, want, route, seen)


def _run(case, graph, params, quant, x, want, route: str | None, seen: dict) -> tuple[set, set]:
    """One engine (POCKET_ROUTE=route where given) on the case; (routes taken, routes eligible)."""
    from pocket.infer import Engine
    from pocket.infer import engine as engine_mod

    saved, env = engine_mod._PARALLEL_WORK, os.environ.pop("POCKET_ROUTE", None)
    engine_mod._PARALLEL_WORK = 0 if case["split"] else saved
    if route is not None:
        os.environ["POCKET_ROUTE"] = route
    try:
        with Engine(FakeContainer(graph, params, quant), threads=case["threads"],
                    max_batch=case["max_batch"]) as eng:
            taken = {r["route"] for r in eng.routes()}
            for name in taken:
                seen["route:" + name] = seen.get("route:" + name, 0) + 1
            xg = guarded_copy(x)
            for n in {min(case["batch"], eng.max_batch), case["batch"] % eng.max_batch} - {0}:
                for name in kernel_names(eng._bind(n).calls):
                    seen[name] = seen.get(name, 0) + 1
            for attempt in ("copied", "in place"):
                got = eng.run(xg)
                _compare(got, want, f"route {route or 'as the table picks'}, {attempt} input")
            return taken, eligible_routes(eng)
    finally:
        engine_mod._PARALLEL_WORK = saved
        os.environ.pop("POCKET_ROUTE", None)
        if env is not None:
            os.environ["POCKET_ROUTE"] = env


def _compare(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype)
    if want.dtype == np.int8:
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, (f"{what}: {bad.size} of {want.size} int8 codes differ, first at "
                               f"{np.unravel_index(bad[0], want.shape)}: {got.flat[bad[0]]} "
                               f"vs {want.flat[bad[0]]}")
        return
    top = float(np.abs(want).max(initial=0.0))
    err = np.abs(got.astype(np.float64) - want)
    worst = float(np.nanmax(err, initial=0.0)) if not np.isnan(got).any() else math.inf
    assert worst <= 1e-5 * max(top, 1e-30), (
        f"{what}: max error {worst:.3g} against a reference max of {top:.3g}, first bad at "
        f"{np.unravel_index(int(np.argmax(np.nan_to_num(err, nan=np.inf))), want.shape)}")


# --------------------------------------------------------------------------- the worker


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", choices=["f32", "i8"], required=True)
    ap.add_argument("--examples", type=int, default=100)
    ap.add_argument("--seed", type=int, default=None, help="a fixed seed (default: derandomized)")
    known = ap.add_mutually_exclusive_group()
    known.add_argument("--skip-known", action="store_true", help="leave out the cases of KNOWN_BUGS")
    known.add_argument("--only-known", choices=sorted(KNOWN_BUGS), help="only that known bug's cases")
    args = ap.parse_args(argv)
    from hypothesis import HealthCheck, given, seed, settings

    from pocket.infer import engine as engine_mod

    engine_mod._alloc_arena = poisoned_arena
    seen: dict[str, int] = {}
    count = [0]

    t = time.perf_counter()
    families = kinds(args.dtype)
    for kind in families:
        strategy = cases(args.dtype, kind)
        if args.skip_known:
            strategy = strategy.filter(lambda c: not any(bug(c) for bug in KNOWN_BUGS.values()))
        elif args.only_known:
            if kind not in ("conv", "conv_pool"):
                continue
            strategy = strategy.filter(KNOWN_BUGS[args.only_known])

        share = SMALL_FAMILIES.get(kind) or len(set(families) - set(SMALL_FAMILIES))
        @settings(max_examples=max(1, args.examples // share), derandomize=args.seed is None,
                  deadline=None, database=None, suppress_health_check=list(HealthCheck), print_blob=False)
        @given(strategy)
        def fuzz(case):
            count[0] += 1
            check(case, seen)

        if args.seed is not None:
            fuzz = seed(args.seed)(fuzz)
        fuzz()
    print("DONE", json.dumps({"examples": count[0], "seconds": round(time.perf_counter() - t, 2),
                              "kernels": dict(sorted(seen.items())),
                              "env": {k: os.environ.get(k) for k in ("POCKET_FP32_FMA", "POCKET_INT8_VNNI",
                                                                     "NUMBA_BOUNDSCHECK")}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
