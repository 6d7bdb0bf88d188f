"""Batch-1 latency of imported torchvision models against the same architectures built by pocket:
each of bench/onnx_models.py's six ONNX files (torchvision, random weights, opset 17) imported by
`pocket import`, and the zoo model (pocket.train.models) at the same config (width 1.0, 3x224x224,
1000 classes, random weights) traced and exported by `pocket export` to fp32 .bin.

    python bench/onnx_import_latency.py [--models resnet18,...] [--rounds 9] [--threads 1] [--int8]
                                        [--json]

`--int8` times the QDQ imports (onnx_models.py's quantize_static files) against pocket's own
int8 export of the zoo models (`pocket export --int8`, calibrated on random inputs).

Both engines live in one process and are timed in alternation, a round each (the median call of
a `--budget`-second block), so machine load hits both alike; the table gives the median over
rounds and the ratio import / zoo (the issue's target: at most 1.10). Where the ratio is over
1.10 the script prints both graphs' op counts (op with its fused activation): an op the import
left unfolded, or a fusion it missed, shows there. torch and torchvision are bench/dev
dependencies: without them the script says so and exits 0.

Writes DIR/latency[.int8].json (default DIR: bench/out/onnx_models, shared with onnx_models.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import onnx_models as om  # noqa: E402

ZOO = {"resnet18": "resnet18", "mobilenet_v2": "mobilenet_v2",
       "mobilenet_v3_small": "mobilenet_v3_small", "shufflenet_v2_x1_0": "shufflenet_v2",
       "squeezenet1_1": "squeezenet", "efficientnet_b0": "efficientnet_b0"}
TARGET = 1.10


def zoo_bin(name: str, out: Path, int8: bool = False) -> Path:
    """The zoo's architecture for torchvision model `name`, exported by pocket to .bin (int8:
    pocket's own quantization, calibrated on the checkpoint's random calibration set)."""
    path = out / f"{name}.zoo{'.int8' if int8 else ''}.bin"
    if path.exists():
        return path
    from pocket.export.app import export
    from pocket.train import models
    from pocket.train.checkpoint import save_checkpoint
    from pocket.train.trace import trace

    shape = (3, om.SIZE, om.SIZE)
    rng = np.random.default_rng(0)
    model = models.ZOO[ZOO[name]](shape, 1000, rng=rng)
    model.eval()
    graph, params = trace(model, shape, {"task": "classification"})
    for k in params:  # BN statistics away from the identity, so folding does real work
        if k.endswith("running_var"):
            params[k] = rng.uniform(0.5, 2.0, params[k].shape).astype(np.float32)
        elif k.endswith("running_mean"):
            params[k] = rng.normal(0, 0.1, params[k].shape).astype(np.float32)
    ckpt = out / f"{name}.zoo.ckpt"
    save_checkpoint(ckpt, graph=graph, state=params, optimizer_state={}, meta={},
                    calib_x=rng.standard_normal((16, *shape), dtype=np.float32))
    export(ckpt, path, fmt="bin", int8=int8)
    ckpt.unlink()
    return path


def imported_bin(name: str, out: Path, int8: bool = False) -> Path:
    """bench/onnx_models.py's ONNX file for `name` (int8: its QDQ version), imported."""
    from pocket.formats.container import write_container
    from pocket.importer.app import import_onnx

    src = out / f"{name}.onnx"
    if not src.exists():
        om.export_fp32(name, src)
    if int8:
        fp32, src = src, out / f"{name}.qdq.onnx"
        if not src.exists():
            om.export_qdq(fp32, src)
    path = out / f"{name}.import{'.int8' if int8 else ''}.bin"
    imp = import_onnx(src)
    write_container(path, kind="model", tensors=imp.params, graph=imp.graph, quant=imp.quant)
    return path


def op_counts(path: Path) -> Counter:
    from pocket.formats.container import read_container

    c = read_container(path, expect_kind="model")
    return Counter(f"{n.op}+{n.attrs['activation']}" if n.attrs.get("activation", "none") != "none"
                   else n.op for n in c.graph.nodes)


def _median_call(fn, x, budget: float) -> float:
    times = []
    stop = time.perf_counter() + budget
    while len(times) < 5 or time.perf_counter() < stop:
        t = time.perf_counter()
        fn(x)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure(name: str, out: Path, rounds: int, budget: float, threads: int,
            int8: bool = False) -> dict:
    from pocket.infer.engine import Engine

    paths = {"zoo": zoo_bin(name, out, int8), "import": imported_bin(name, out, int8)}
    engines = {k: Engine(p, threads=threads, max_batch=1) for k, p in paths.items()}
    x = om.inputs(1, 3)
    per: dict[str, list[float]] = {k: [] for k in engines}
    for e in engines.values():
        _median_call(e.run, x, budget)  # compile, warm caches
    for _ in range(rounds):
        for k, e in engines.items():
            per[k].append(_median_call(e.run, x, budget))
    for e in engines.values():
        e.close()
    med = {k: statistics.median(v) * 1e3 for k, v in per.items()}
    row = {"model": name, "zoo": ZOO[name], "int8": int8, "threads": threads,
           "zoo_ms": round(med["zoo"], 3),
           "import_ms": round(med["import"], 3), "ratio": round(med["import"] / med["zoo"], 3),
           "rounds_ms": {k: [round(s * 1e3, 3) for s in v] for k, v in per.items()}}
    row["passed"] = row["ratio"] <= TARGET
    if not row["passed"]:
        a, b = op_counts(paths["import"]), op_counts(paths["zoo"])
        row["ops_differ"] = {k: {"import": a.get(k, 0), "zoo": b.get(k, 0)}
                             for k in sorted(set(a) | set(b)) if a.get(k, 0) != b.get(k, 0)}
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(Path(__file__).parent / "out" / "onnx_models"))
    p.add_argument("--models", default=",".join(ZOO))
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--budget", type=float, default=0.3, help="Seconds per timed block.")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--int8", action="store_true",
                   help="The QDQ imports against pocket's own int8 exports of the zoo models.")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    try:
        import torch  # noqa: F401
        import torchvision  # noqa: F401
    except ImportError:
        print("torch and torchvision are not installed: nothing to build (pip install torch "
              "torchvision)", file=sys.stderr)
        return 0
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in a.models.split(","):
        rows.append(measure(name, out, a.rounds, a.budget, a.threads, a.int8))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    (out / f"latency{'.int8' if a.int8 else ''}.json").write_text(json.dumps(rows, indent=1))
    if a.json:
        print(json.dumps(rows))
        return 0
    kind = "int8, " if a.int8 else ""
    print(f"{'model':<20} {'zoo ms':>8} {'import ms':>10} {'ratio':>6}  ({kind}batch 1, "
          f"{a.threads} thread{'s' if a.threads > 1 else ''}, median of {a.rounds} rounds)")
    for r in rows:
        print(f"{r['model']:<20} {r['zoo_ms']:>8.2f} {r['import_ms']:>10.2f} {r['ratio']:>6.2f}"
              f"  {'ok' if r['passed'] else 'SLOWER'}")
        for op, n in r.get("ops_differ", {}).items():
            print(f"    {op:<28} import {n['import']:>3}  zoo {n['zoo']:>3}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
