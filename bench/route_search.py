"""Is each route a model's plan takes the fastest one for its nodes here? For every route the
plan uses, a second plan with that route switched off (its nodes take the next eligible route
of the table), both timed per node in one process (a tuning aid, not a benchmark).

    python bench/route_search.py bench/results/models/edge/efficientnet_b0.int8.bin
    python bench/route_search.py MODEL.bin --rounds 30 --routes conv_pw_int8,conv_tile_q
    python bench/route_search.py MODEL.bin --threads 2

Each round runs every bound call of plan A, then of plan B, in sequence (each call timed on its
own, the cache as a real call leaves it); the figures are medians over rounds, summed by node.
A line per switched-off route: how many nodes changed route, `max |A - B|` of the outputs (0:
the same bytes), the plans' totals and the changed nodes' sum; then each changed node of 20 us
or more: its route and time in A, the route it took in B and its time there, and the ratio. A
ratio below 1 on nodes of one kind is a route the table (or a route's `declines`) should not
pick there: session s29's `conv_pw_int8` on x86 was found this way. Routes with no fallback
(the plan fails without them) are reported as such.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def _per_node(engine, medians) -> dict[int, float]:
    bound = engine._bound[1]
    out: dict[int, float] = {}
    for i, step in enumerate(bound.steps[:len(bound.calls)]):
        out[step] = out.get(step, 0.0) + medians[i]
    return out


def _medians(engines, rounds: int) -> list[np.ndarray]:
    calls = [e._bound[1].calls for e in engines]
    times = [np.zeros((rounds, len(c))) for c in calls]
    clock = time.perf_counter
    for r in range(rounds):
        for cs, t in zip(calls, times):
            for i, c in enumerate(cs):
                t0 = clock()
                c()
                t[r, i] = clock() - t0
    return [np.median(t, axis=0) * 1e6 for t in times]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--routes", default="", help="only these routes (comma-separated)")
    args = ap.parse_args()

    from pocket.infer import Engine, EngineError
    from pocket.infer import routes as rt

    def plan():
        e = Engine(args.model, threads=args.threads, max_batch=1, adaptive_threads=False)
        e.bind(1)
        return e

    a = plan()
    x = np.random.default_rng(1).random((1, *a.input_shape), dtype=np.float32).astype(a.input_dtype)
    ya = a.run(x, copy=True)
    routes_a = {r["node"]: r for r in a.routes()}
    step_of = {n.name: i for i, n in enumerate(a.graph.nodes)}
    only = {s for s in args.routes.split(",") if s}
    for off in sorted({r["route"] for r in routes_a.values()}):
        if only and off not in only:
            continue
        route = rt.ROUTES[off]
        limits = route.limits
        route.limits = lambda *_a, **_k: "switched off"
        try:
            b = plan()
        except EngineError as e:
            print(f"[{off}] off: no plan without it ({e})")
            continue
        finally:
            route.limits = limits
        yb = b.run(x, copy=True)
        routes_b = {r["node"]: r["route"] for r in b.routes()}
        changed = [n for n, r in routes_a.items() if r["route"] != routes_b.get(n)]
        ma, mb = _medians([a, b], args.rounds)
        na, nb = _per_node(a, ma), _per_node(b, mb)
        sa = sum(na.get(step_of[n], 0.0) for n in changed)
        sb = sum(nb.get(step_of[n], 0.0) for n in changed)
        print(f"[{off}] off: {len(changed)} node(s) change route, max |A - B| "
              f"{float(np.abs(ya.astype(np.float64) - yb).max()):.3g}; plan {ma.sum():.0f} -> "
              f"{mb.sum():.0f} us; changed nodes {sa:.0f} -> {sb:.0f} us (x{sb / max(sa, 1e-9):.3f})")
        for n in changed:
            s = step_of[n]
            ta, tb = na.get(s, 0.0), nb.get(s, 0.0)
            if max(ta, tb) < 20:
                continue
            g = routes_a[n].get("geometry") or {}
            shape = (f"{g.get('input')} -> {g.get('output')} k{g.get('kernel')} s{g.get('stride')}"
                     if g else "")
            print(f"    {n:26s} {off:>18s} {ta:8.1f} -> {routes_b.get(n):>18s} {tb:8.1f}  "
                  f"x{tb / max(ta, 1e-9):.2f}  {shape}")


if __name__ == "__main__":
    main()
