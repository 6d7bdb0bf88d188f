"""How far onnxruntime's int8 kernels land from pocket's int8 arithmetic on this CPU, with its
default kernels and with session.x64quantprecision=1 (what `pocket compare` sets).

    python bench/ort_int8_precision.py                      # the edge zoo, 16 random inputs
    python bench/ort_int8_precision.py --models mobilenet_v3_small --samples 64

On x86 CPUs without AVX-512 VNNI onnxruntime's default u8s8 GEMM adds pairs of products in 16
bits with saturation (VPMADDUBSW), so a QDQ model's convs drift from the arithmetic its file
defines; with the setting it takes its exact u8u8 kernels there. VNNI and ARM machines read the
same in both columns. The reference side is pocket's engine on the same export's int8 `.bin`
(bit for bit with formats/reference.py). Per model: the largest difference as a share of the
engine's output range, and top-1 agreement. Models come from bench/edge.py's cache (built on
first use). Writes bench/results/NAME.{json,md} (`--out`, default ort_int8_precision).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import edge  # noqa: E402


def measure(name: str, samples: int) -> dict:
    import onnxruntime as ort

    from pocket.compare import exact_session_options
    from pocket.infer import Engine

    files = edge.build(name)
    shape = edge.ARCHS[name][0]
    x = np.random.default_rng(5).random((samples, *shape), dtype=np.float32)
    with Engine(files["int8.bin"], max_batch=samples) as eng:
        want = eng.run(x, copy=True)
    span = float(want.max() - want.min()) or 1.0
    row = {"model": name, "samples": samples}
    for label, opts in (("default", ort.SessionOptions()), ("exact", exact_session_options(ort))):
        sess = ort.InferenceSession(str(files["int8.onnx"]), opts, providers=["CPUExecutionProvider"])
        got = sess.run(None, {sess.get_inputs()[0].name: x})[0]
        row[label] = {"max_diff_of_range": float(np.abs(got - want).max() / span),
                      "top1_agreement": float(np.mean(got.argmax(1) == want.argmax(1)))}
    return row


def markdown(rows: list[dict], cpu: str) -> str:
    lines = [f"# onnxruntime int8 vs pocket's engine on the same export ({cpu})", "",
             "Largest difference as a share of the output range; top-1 agreement.", "",
             "| model | default: max diff | default: top-1 | x64quantprecision=1: max diff | "
             "x64quantprecision=1: top-1 |", "|---|---:|---:|---:|---:|"]
    for r in rows:
        d, e = r["default"], r["exact"]
        lines.append(f"| {r['model']} | {100 * d['max_diff_of_range']:.2f}% | "
                     f"{d['top1_agreement']:.3f} | {100 * e['max_diff_of_range']:.2f}% | "
                     f"{e['top1_agreement']:.3f} |")
    return "\n".join(lines) + "\n"


def _cpu() -> str:
    try:
        from llvmlite import binding

        feats = binding.get_host_cpu_features()
        isa = "AVX-512 VNNI" if feats.get("avx512vnni") else "AVX2" if feats.get("avx2") else "no AVX2"
    except ImportError:
        isa = "?"
    return f"{platform.machine()}, {isa}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(edge.ARCHS))
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--out", default="ort_int8_precision")
    args = ap.parse_args()
    rows = []
    for name in args.models.split(","):
        rows.append(measure(name, args.samples))
        d, e = rows[-1]["default"], rows[-1]["exact"]
        print(f"  {name}: default {100 * d['max_diff_of_range']:.2f}% top-1 {d['top1_agreement']:.3f}"
              f" | exact {100 * e['max_diff_of_range']:.2f}% top-1 {e['top1_agreement']:.3f}",
              file=sys.stderr, flush=True)
    cpu = _cpu()
    edge.RESULTS.mkdir(parents=True, exist_ok=True)
    (edge.RESULTS / f"{args.out}.json").write_text(json.dumps({"cpu": cpu, "rows": rows}, indent=1))
    (edge.RESULTS / f"{args.out}.md").write_text(markdown(rows, cpu))


if __name__ == "__main__":
    main()
