"""Where an engine call's time goes: each bound kernel call of a bench/seqconv.py model timed on
its own, summed by kernel (the function the call makes), over repeated runs.

    python bench/seq_profile.py --model transformer --precision fp32 --batch 1
    python bench/seq_profile.py --model ssm --precision int8 --batch 64 --top 8

The calls run in their bound order, so each reads what the one before wrote, as in
Engine.run; the sum of the parts runs a little above a plain run's time (a timer read per call,
~0.1 us). Reads Engine internals (_bound): a bench aid, not an interface.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import seqconv as sc  # noqa: E402


def _label(call) -> str:
    fn = getattr(call, "func", call)
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return name.removesuffix("_serial")


def profile(model: str, precision: str, batch: int, runs: int, threads: int) -> tuple[list, float, int]:
    from pocket.infer import Engine

    files = sc.build(model, sc.RESULTS / "models")
    eng = Engine(files[f"{precision}.bin"], threads=threads, max_batch=max(batch, 1))
    x = np.random.default_rng(1).standard_normal((batch, *sc.MODELS[model]["input"]))
    x = x.astype(np.float32)
    eng.run(x)
    bound = eng._bound[batch]
    arena_in = bound.inputs[eng.input_name]
    total: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    clock = time.perf_counter
    whole = []
    for _ in range(runs):
        t_run = clock()
        # NOTE: every run, as Engine.run does when it cannot feed x itself: the planner may
        # reuse the input's arena bytes for a later value
        np.copyto(arena_in, x)
        total["input copy"] += clock() - t_run
        for call in bound.calls:
            t0 = clock()
            call()
            total[_label(call)] += clock() - t0
        whole.append(clock() - t_run)
    count["input copy"] = 1
    for call in bound.calls:
        count[_label(call)] += 1
    rows = sorted(((k, v / runs, count[k]) for k, v in total.items()), key=lambda r: -r[1])
    return rows, float(np.median(whole)), len(bound.calls)



def _fail(message: str) -> None:
    """Bad input: one `Error:` line on stderr, exit 3 (the project's rule)."""
    print(f"Error: {message}", file=sys.stderr)
    raise SystemExit(3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="transformer", choices=sorted(sc.MODELS))
    ap.add_argument("--precision", default="fp32", choices=["fp32", "int8"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--top", type=int, default=10)
    a = ap.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        if os.environ.get(var) != str(a.threads):
            _fail(f"set {var}={a.threads} (every thread pool at --threads) and rerun")
    rows, whole, n_calls = profile(a.model, a.precision, a.batch, a.runs, a.threads)
    parts = sum(r[1] for r in rows)
    print(f"{a.model} {a.precision} batch {a.batch}: {n_calls} calls, {whole * 1e3:.3f} ms a run "
          f"timed per call ({parts * 1e3:.3f} ms in the calls)")
    print("| kernel | calls | ms | share |\n|---|---|---|---|")
    for name, sec, n in rows[: a.top]:
        print(f"| {name} | {n} | {sec * 1e3:.3f} | {100 * sec / parts:.0f}% |")


if __name__ == "__main__":
    main()
