"""Open-set embeddings on the digits (issue 25, items 3-5): ArcFace against plain softmax on
the classes held out of training, and the exports' embeddings against the training model's.

    python bench/embed_openset.py                 # seeds 0 1 2, both example configs
    python bench/embed_openset.py --seeds 0 --epochs 5

Per seed and loss it trains examples/digits_embed_{arcface,softmax}.toml, reports the test
(held-out classes 6-9) verification and retrieval metrics, then exports the ArcFace model to
.bin and ONNX in fp32 and int8 and runs `pocket compare` on the test split: the least and mean
per-sample cosine to the training model, and nearest-neighbour agreement. Prints one JSON
object and writes bench/results/embed_openset.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "bench" / "results"
KEYS = ("tar_far1e-2", "tar_far1e-3", "auc", "eer", "eer_threshold", "top1", "map")


def main() -> None:
    from pocket.compare import compare
    from pocket.export.app import export
    from pocket.train.run import train_from_config

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--epochs", type=int)
    args = ap.parse_args()
    out = {"runs": [], "exports": []}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for loss in ("arcface", "softmax"):
                run_dir = Path(tmp) / f"{loss}_{seed}"
                flags = {"seed": seed, "out": str(run_dir),
                         **({"epochs": args.epochs} if args.epochs else {})}
                r = train_from_config(str(ROOT / "examples" / f"digits_embed_{loss}.toml"), flags,
                                      quiet=True)
                row = {"seed": seed, "loss": loss, "seconds": r["seconds"],
                       **{k: r["test"][k] for k in KEYS}}
                out["runs"].append(row)
                print(json.dumps(row), file=sys.stderr)
                if loss != "arcface":
                    continue
                ck = str(run_dir / "best.ckpt")
                for int8 in (False, True):
                    tag = "int8" if int8 else "fp32"
                    paths = {f: str(Path(tmp) / f"{seed}.{tag}.{f}") for f in ("bin", "onnx")}
                    for p in paths.values():
                        export(ck, p, int8=int8)
                    c = compare(ck, bin_path=paths["bin"], onnx_path=paths["onnx"])
                    for p in c["pairs"][:2]:
                        m = p["metrics"]
                        out["exports"].append({
                            "seed": seed, "precision": tag, "pair": p["pair"],
                            "cosine_min": m["cosine_min"], "cosine_mean": m["cosine_mean"],
                            "retrieval_agreement": m["retrieval_agreement"],
                            "passed": p["passed"]})
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "embed_openset.json").write_text(json.dumps(out, indent=2))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
