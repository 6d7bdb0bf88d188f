"""The main job's closing summary, from the JSON each step wrote."""

import json
import sys
from pathlib import Path


def load(run: str, step: str) -> dict:
    return json.loads(Path(run, f"{step}.json").read_text())


def main(run: str, seconds: int) -> None:
    train = load(run, "summary")
    fp32, int8, onnx = load(run, "export-fp32"), load(run, "export-int8"), load(run, "export-onnx")
    lat8, lat32 = load(run, "infer-int8"), load(run, "infer-fp32")
    c32, c8 = load(run, "compare-fp32"), load(run, "compare-int8")

    def acc(c, engine):
        return c["engines"][engine].get("accuracy", float("nan")) * 100

    def agree(c, pair):
        for p in c["pairs"]:
            if p["pair"] == pair:
                return p["metrics"].get("top1_agreement", float("nan")) * 100, p["metrics"]["max_abs"]
        return float("nan"), float("nan")

    def ms(r):
        t = r.get("timing", {})
        return t.get("median_ms", float("nan"))

    kib = 1024
    print()
    print(f"pocket main job: digits CNN, {seconds}s end to end")
    print(f"  test accuracy   training model {acc(c32, 'train'):.2f}%   fp32 .bin "
          f"{acc(c32, 'bin'):.2f}%   int8 .bin {acc(c8, 'bin'):.2f}%   int8 ONNX {acc(c8, 'onnx'):.2f}%")
    print(f"  file size       fp32 .bin {fp32['size'] / kib:.1f} KiB   int8 .bin "
          f"{int8['size'] / kib:.1f} KiB ({int8['size'] / fp32['size']:.2f}x)   "
          f"int8 ONNX {onnx['size'] / kib:.1f} KiB")
    print(f"  latency (1 img) fp32 {ms(lat32):.3f} ms   int8 {ms(lat8):.3f} ms   (1 thread, median)")
    a32, e32 = agree(c32, "train vs bin")
    a8, _ = agree(c8, "train vs bin")
    ao, _ = agree(c8, "train vs onnx")
    print(f"  agreement       fp32 .bin {a32:.2f}% (max abs err {e32:.1e})   int8 .bin {a8:.2f}%   "
          f"int8 ONNX {ao:.2f}%")
    print(f"  trained in {train['seconds']:.0f}s; checkpoint {train['best_checkpoint']}")
    plot = Path(run, "plot.png")
    if plot.exists():
        print(f"  training curves {plot} (loss, metrics, lr, memory per epoch)")
    print("  compare gates: " + ("PASS" if c32["passed"] and c8["passed"] else "FAIL"))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
