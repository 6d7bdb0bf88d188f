"""Where an engine call's time goes: each bound kernel call of a model timed on its own, summed
by kernel name, beside the whole call and onnxruntime's on the same model (a tuning aid, not a
benchmark: the per-call times miss the cache effects between calls).

    python bench/engine_profile.py bench/results/models/edge/mobilenet_v2.fp32.bin
    python bench/engine_profile.py MODEL.bin --threads 2 --rounds 200 --calls dw_conv
    python bench/engine_profile.py MODEL.bin --onnx MODEL.onnx      # ORT beside (default: the
                                                                    # .onnx next to the .bin)

The rounds interleave: each round times every call once, then one whole engine call and one
onnxruntime call, so that machine load hits them alike; the figures are medians over rounds.
`--calls NAME` lists that kernel's calls one by one (step, node, argument shapes).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from pathlib import Path

import numpy as np


def _name(call) -> str:
    f = call.func
    return getattr(f, "__name__", None) or getattr(getattr(f, "py_func", None), "__name__", repr(f))


def _shapes(call) -> str:
    return " ".join("x".join(map(str, a.shape)) for a in call.args if isinstance(a, np.ndarray))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--onnx", help="the ONNX twin (default: MODEL with .onnx for .bin)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--calls", default="", help="list the calls of kernels whose name has this")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()

    from pocket.infer.engine import Engine

    eng = Engine(args.model, threads=args.threads, max_batch=1)
    eng.bind(1)
    bound = eng._bound[1]
    names, shapes = [_name(c) for c in bound.calls], [_shapes(c) for c in bound.calls]
    nodes = eng.graph.nodes
    steps = list(bound.steps) + [len(nodes)] * (len(bound.calls) - len(bound.steps))
    x = np.random.default_rng(0).random((1, *eng.input_shape), dtype=np.float32)
    x = x.astype(eng.input_dtype)
    for _ in range(3):
        eng.run(x)
    calls = eng._bound[1].calls  # now bound to the compiled entry points, same order

    ort = None
    onnx = Path(args.onnx) if args.onnx else Path(args.model).with_suffix(".onnx")
    if onnx.exists():
        import onnxruntime as rt

        so = rt.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = args.threads, 1
        sess = rt.InferenceSession(str(onnx), so, providers=["CPUExecutionProvider"])
        feed = {sess.get_inputs()[0].name: x}
        for _ in range(3):
            sess.run(None, feed)
        ort = lambda: sess.run(None, feed)  # noqa: E731

    per = [[] for _ in calls]
    whole, theirs = [], []
    clock = time.perf_counter
    for _ in range(args.rounds):
        for i, c in enumerate(calls):
            t = clock()
            c()
            per[i].append(clock() - t)
        eng.run(x)  # the calls above ran out of order for in-place ones: re-establish the arena
        t = clock()
        eng.run(x)
        whole.append(clock() - t)
        if ort is not None:
            t = clock()
            ort()
            theirs.append(clock() - t)

    med = [statistics.median(p) for p in per]
    by = defaultdict(lambda: [0.0, 0])
    for n, m in zip(names, med):
        by[n][0] += m
        by[n][1] += 1
    total = sum(med)
    w = statistics.median(whole)
    print(f"{Path(args.model).name}: {len(calls)} calls, threads {args.threads}, "
          f"{args.rounds} rounds")
    line = f"engine call {w * 1e3:.3f} ms, calls summed {total * 1e3:.3f} ms"
    if theirs:
        o = statistics.median(theirs)
        line += f"; onnxruntime {o * 1e3:.3f} ms; engine/onnxruntime {w / o:.3f}"
    print(line)
    print(f"{'kernel':32s} {'calls':>5s} {'ms':>8s} {'share':>6s}")
    for n, (s, k) in sorted(by.items(), key=lambda kv: -kv[1][0])[:args.top]:
        print(f"{n:32s} {k:5d} {s * 1e3:8.3f} {s / total:6.1%}")
    if args.calls:
        print()
        for i, n in enumerate(names):
            if args.calls in n:
                node = nodes[steps[i]] if steps[i] < len(nodes) else None
                where = f"{node.op} {node.name}" if node is not None else "-"
                print(f"{i:4d} {n:28s} {med[i] * 1e6:9.1f} us  {where}  {shapes[i]}")


if __name__ == "__main__":
    main()
