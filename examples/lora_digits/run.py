"""The LoRA example end to end (README "LoRA fine-tuning"): pretrain an MLP on the bundled digits
0-4, adapt it with LoRA to the digits 5-9, and report test accuracy on 5-9 with the number and
fraction of parameters trained, beside the same MLP trained from scratch on 5-9 (every
parameter trained). Then export the adapted model and check the engine agrees.

    python examples/lora_digits/run.py [--out runs] [--json]

Run from the repository root (the configs name their run folders under runs/).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs", help="folder for the three run folders")
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    args = ap.parse_args()

    from pocket.export.app import export
    from pocket.infer import Engine
    from pocket.train.config import load_config
    from pocket.train.data import load_dataset
    from pocket.train.trainer import Trainer

    out = Path(args.out)

    def train(name: str, cfg: dict) -> dict:
        cfg = copy.deepcopy(cfg)
        cfg["run"]["out"] = str(out / name)
        print(f"== {name}", file=sys.stderr)
        return Trainer(cfg, quiet=True).fit(force=True)

    base_cfg = load_config(HERE / "base.toml")
    base = train("lora_digits_base", base_cfg)
    adapt_cfg = load_config(HERE / "adapt.toml")
    adapt_cfg["lora"]["base"] = base["last_checkpoint"]
    adapt = train("lora_digits_adapt", adapt_cfg)
    scratch_cfg = copy.deepcopy(adapt_cfg)
    scratch_cfg["lora"] = {**scratch_cfg["lora"], "rank": None, "base": None,
                           "alpha": None, "dropout": 0.0, "targets": ["linear"]}
    scratch_cfg["train"]["lr"] = base_cfg["train"]["lr"]
    scratch = train("lora_digits_scratch", scratch_cfg)

    model = export(adapt["last_checkpoint"], out / "lora_digits_adapt" / "model.bin")
    test = load_dataset("digits", seed=adapt_cfg["run"]["seed"],
                        classes=adapt_cfg["data"]["classes"]).test
    with Engine(model["output"]) as eng:
        engine_acc = float((eng.run(test.x).argmax(axis=1) == test.y).mean())

    t = adapt["trainable"]
    report = {
        "base_test_accuracy_0_4": base["test"]["accuracy"],
        "lora_test_accuracy_5_9": adapt["test"]["accuracy"],
        "lora_engine_test_accuracy_5_9": engine_acc,
        "lora_trainable_parameters": t["trainable"],
        "parameters": t["parameters"],
        "lora_trainable_fraction": t["fraction"],
        "lora_gradient_and_optimizer_bytes": t["gradient_bytes"] + t["optimizer_state_bytes"],
        "full_gradient_and_optimizer_bytes": (t["full_gradient_bytes"]
                                              + t["full_optimizer_state_bytes"]),
        "scratch_test_accuracy_5_9": scratch["test"]["accuracy"],
        "scratch_trainable_parameters": scratch["trainable"]["trainable"],
        "test_samples_5_9": int(len(test)),
    }
    if args.json:
        print(json.dumps(report))
        return
    print(f"base MLP, digits 0-4:           test accuracy {report['base_test_accuracy_0_4']:.2%}")
    print(f"LoRA-adapted to digits 5-9:     test accuracy {report['lora_test_accuracy_5_9']:.2%} "
          f"(engine {engine_acc:.2%}, {len(test)} test samples), trained "
          f"{t['trainable']:,} of {t['parameters']:,} parameters ({t['fraction']:.2%})")
    print(f"same MLP from scratch on 5-9:   test accuracy "
          f"{report['scratch_test_accuracy_5_9']:.2%}, trained all "
          f"{report['scratch_trainable_parameters']:,} parameters")
    print(f"gradients + optimizer state: {report['lora_gradient_and_optimizer_bytes']:,} B "
          f"with LoRA, {report['full_gradient_and_optimizer_bytes']:,} B for full fine-tuning")


if __name__ == "__main__":
    main()
