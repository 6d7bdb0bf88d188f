"""LoRA fine-tuning from a config: the [lora] section applied to a model, and the base
checkpoint a new LoRA run starts from.

A run's checkpoints hold the full weights (the frozen base and the adapters), never a
reference to the base file: export, compare and `--resume` need nothing but the checkpoint.
The base file is read once, when a new run starts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pocket.train.nn import Module
from pocket.train.nn_lora import LoRAError, apply_lora

ADAPTER_KEYS = ("lora_A", "lora_B")


def enabled(cfg: dict) -> bool:
    return (cfg.get("lora") or {}).get("rank") is not None


def apply_config(model: Module, cfg: dict, rng=None) -> list[str]:
    """Wrap the layers the config's [lora] targets pick (none when LoRA is off); returns their
    names."""
    if not enabled(cfg):
        return []
    lo = cfg["lora"]
    return apply_lora(model, lo["rank"], lo["alpha"], lo["dropout"], lo["targets"], rng,
                      lo["trainable"])


def is_adapter(key: str) -> bool:
    return key.rpartition(".")[2] in ADAPTER_KEYS


def merged_state(state: dict, lora_cfg: dict) -> dict:
    """A LoRA run's state with each adapter folded into its weight (W + alpha/r B A), the
    adapters dropped: what a further LoRA run starts from."""
    rank = int(lora_cfg["rank"])
    scale = float(lora_cfg["alpha"] if lora_cfg.get("alpha") is not None else rank) / rank
    out = {k: v for k, v in state.items() if not is_adapter(k)}
    for key, a in state.items():
        if key.endswith(".lora_A") or key == "lora_A":
            prefix = key[: -len("lora_A")]
            w = out[prefix + "weight"].astype(np.float64)
            b = state[prefix + "lora_B"].astype(np.float64)
            out[prefix + "weight"] = (w + scale * (b @ a.astype(np.float64))).astype(np.float32)
    return out


def base_state(path: str | Path, cfg: dict, model_state: dict) -> dict:
    """The weights of the base checkpoint `path`, checked against this run's model: the same
    [model] and, key by key, the same shapes. `model_state` is the adapted model's state dict."""
    from pocket.formats.errors import FormatError
    from pocket.train.checkpoint import load_checkpoint

    p = Path(path)
    if not p.is_file():
        raise LoRAError(f"[lora] base {path}: no such checkpoint; train the base model first "
                        "(e.g. pocket train its config) and point base at RUN/best.ckpt")
    try:
        ck = load_checkpoint(p)
    except FormatError as e:
        raise LoRAError(f"[lora] base {path}: not a pocket training checkpoint ({e})") from None
    base_cfg = ck["meta"].get("config") or {}
    state = ck["state"]
    if enabled(base_cfg):  # a LoRA run as the base: its adapters become part of the weights
        state = merged_state(state, base_cfg["lora"])
    base_model, model = base_cfg.get("model") or {}, cfg["model"]
    for key in ("name", "layers"):
        if base_model.get(key) != model.get(key):
            raise LoRAError(f"[lora] base {path} is another architecture: its [model] {key} is "
                            f"{base_model.get(key)!r}, this config's is {model.get(key)!r}; "
                            "give [model] as the base run had it")
    want = {k: v for k, v in model_state.items() if not is_adapter(k)}
    missing, unexpected = sorted(set(want) - set(state)), sorted(set(state) - set(want))
    if missing or unexpected:
        raise LoRAError(f"[lora] base {path} is another architecture: missing "
                        f"{missing[:4] or 'none'}, unexpected {unexpected[:4] or 'none'}; give "
                        "[model] as the base run had it")
    for k, v in want.items():
        if np.shape(state[k]) != np.shape(v):
            raise LoRAError(f"[lora] base {path} is another architecture: {k} has shape "
                            f"{list(np.shape(state[k]))}, this model's is {list(np.shape(v))}; "
                            "give [model] as the base run had it (and as many outputs: as many "
                            "[data] classes)")
    return {k: state[k] for k in want}

