"""List every kernel call the engine binds for the bench models, one line a call: for diffing
two trees (a refactor of the lowerings must bind the very same calls) or two machines.

    python scripts/plan_calls.py [--models-dir DIR] [--models mlp,cnn_mnist,cnn_cifar] > calls.txt
    PYTHONPATH=/other/tree python scripts/plan_calls.py > old.txt && diff old.txt calls.txt
    POCKET_FP32_FMA=0 POCKET_INT8_VNNI=0 python scripts/plan_calls.py   # the portable path

Each model (bench/infer.py builds them, fp32 and int8) is planned at max_batch 64 and bound
at batches 1 and 64 on 1 and 2 threads. A call prints as its kernel's module and name, then
its arguments: arrays as dtype, shape, strides and where they live (their byte offset in the
arena, or `param`/`const`), other values by repr. Run both trees on the same model files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def _describe(a, arena: np.ndarray) -> str:
    if isinstance(a, np.ndarray):
        lo = arena.ctypes.data
        at = a.ctypes.data - lo
        where = f"@{at}" if 0 <= at < arena.nbytes else ("param" if not a.flags.writeable else "const")
        return f"{a.dtype}{list(a.shape)}{list(a.strides)}{where}"
    if isinstance(a, np.generic | int | float | bool | str) or a is None:
        return repr(a)
    return type(a).__name__


def _name(f) -> str:
    f = getattr(f, "__func__", f)
    return f"{getattr(f, '__module__', '?')}.{getattr(f, '__qualname__', getattr(f, '__name__', repr(f)))}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models-dir", type=Path, default=ROOT / "bench" / "results" / "models")
    ap.add_argument("--models", default="mlp,cnn_mnist,cnn_cifar")
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--threads", default="1,2")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from bench.infer import build
    from pocket.infer import Engine

    for name in args.models.split(","):
        files = build(name, args.models_dir)
        for prec in ("fp32", "int8"):
            eng = Engine(files[f"{prec}.bin"], max_batch=64)
            for threads in map(int, args.threads.split(",")):
                eng.set_threads(threads)
                for n in map(int, args.batches.split(",")):
                    print(f"== {name} {prec} threads={threads} batch={n} arena={eng.arena_bytes}")
                    for call in eng._bind(n).calls:
                        kw = "".join(f" {k}={_describe(v, eng._arena)}" for k, v in call.keywords.items())
                        print(_name(call.func), *(_describe(a, eng._arena) for a in call.args), kw)
            eng.close()


if __name__ == "__main__":
    main()
