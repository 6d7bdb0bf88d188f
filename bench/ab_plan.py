"""Two plans of one model in one process, their calls interleaved: the tool that resolves a 2-5%
change on a machine whose speed swings by more than that from one second to the next (a tuning
aid, not a benchmark).

    python bench/ab_plan.py MODEL.bin                       # A/A: the instrument's own bias
    python bench/ab_plan.py MODEL.bin --route conv_tile_q   # B forced onto a route (POCKET_ROUTE)
    python bench/ab_plan.py MODEL.bin --patch p.py --threads 2 --rounds 100

Engine A is planned as the code stands. Engine B is planned with POCKET_ROUTE set (--route) and
after running the file given by --patch, which may call `patch(obj, "name", value)` to change a
module attribute that planning reads (a route's threshold, a predicate); the attributes are put
back once B is planned and bound for its batch. Both then run the same input, alternating (A B,
B A, ...), and the figure is the median of each adjacent pair's B/A ratio, which drifting
machine speed cancels. Constants that compiled kernels read (module globals inside @njit code)
are frozen at compile time and cannot be patched this way.

The outputs are compared first: `max |A - B|` 0 means the two plans give the same bytes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--route", default="", help="POCKET_ROUTE for engine B's plan")
    ap.add_argument("--patch", default="", help="a Python file run before B's plan (see above)")
    args = ap.parse_args()

    from pocket.infer import Engine

    a = Engine(args.model, threads=args.threads, max_batch=1)
    x = np.random.default_rng(1).random((1, *a.input_shape), dtype=np.float32).astype(a.input_dtype)
    ya = a.run(x, copy=True)  # A bound (its batch's calls chosen) before any patch
    undo = []

    def patch(obj, name, value):
        undo.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    saved = os.environ.get("POCKET_ROUTE")
    if args.route:
        os.environ["POCKET_ROUTE"] = args.route
    try:
        if args.patch:
            with open(args.patch) as f:
                exec(compile(f.read(), args.patch, "exec"), {"patch": patch})
        b = Engine(args.model, threads=args.threads, max_batch=1)
        # NOTE: and bound under the patches: some choices are made at bind, per batch size
        # (Winograd's channel floor, conv_winograd.at_batch); before, those patches were put
        # back at construction and B ran A's plan
        yb = b.run(x, copy=True)
    finally:
        for obj, name, value in reversed(undo):
            setattr(obj, name, value)
        os.environ.pop("POCKET_ROUTE", None)
        if saved is not None:
            os.environ["POCKET_ROUTE"] = saved

    print(f"max |A - B| {float(np.abs(ya.astype(np.float64) - yb).max()):.3g}")
    for _ in range(5):
        a.run(x)
        b.run(x)
    ta, tb = [], []
    clock = time.perf_counter
    for r in range(args.rounds):
        for eng, times in ((a, ta), (b, tb)) if r % 2 == 0 else ((b, tb), (a, ta)):
            t = clock()
            eng.run(x)
            times.append(clock() - t)
    ma, mb = statistics.median(ta), statistics.median(tb)
    pair = statistics.median(q / p for p, q in zip(ta, tb))
    print(f"A {ma * 1e3:.3f} ms  B {mb * 1e3:.3f} ms  B/A {mb / ma:.3f}  pairwise {pair:.3f}")


if __name__ == "__main__":
    main()
