"""Training configuration: a TOML file, overridden by command-line flags, over defaults.

Every key is declared here with its default, so a typo is caught with a suggestion instead of
being silently ignored.
"""

from __future__ import annotations

import copy
import decimal
import difflib
import re
import sys
from pathlib import Path
from typing import Any

from pocket.errors import PocketError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib


class ConfigError(PocketError):
    """The config file or a flag is wrong; the message says which key and what to do."""


# Section -> key -> default. None means "no default; optional".
DEFAULTS: dict[str, dict[str, Any]] = {
    "run": {"name": None, "seed": 0, "out": None, "device": "auto", "calib_samples": 256},
    "data": {"source": "digits", "target": None, "task": None, "val_fraction": 0.1,
             "test_fraction": 0.2, "augment": [], "limit": None, "image_size": None,
             "cache_dir": None, "prefetch": 2},
    "model": {"name": "cnn", "layers": None, "hidden": None, "channels": None, "dropout": 0.0,
              "batchnorm": True, "width": None},
    "train": {"epochs": 20, "batch_size": 64, "optimizer": "adamw", "lr": 3e-3, "momentum": 0.9,
              "nesterov": False, "weight_decay": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8,
              "schedule": "cosine", "warmup_epochs": 1, "step_size": 10, "gamma": 0.1,
              "clip_grad_norm": None, "label_smoothing": 0.0, "loss": None, "drop_last": True,
              "eval_batch_size": 256},
    "memory": {"precision": "fp32", "accumulation": 1, "checkpointing": 0,
               "fp16_activations": False, "budget": None, "loss_scale": 65536.0,
               "growth_interval": 2000},
}

CHOICES = {
    ("train", "optimizer"): ("sgd", "adam", "adamw"),
    ("train", "schedule"): ("cosine", "step", "constant"),
    ("train", "loss"): (None, "cross_entropy", "mse", "l1", "huber"),
    ("memory", "precision"): ("fp32", "fp16", "bf16"),
    ("data", "task"): (None, "classification", "regression"),
}

_AT_LEAST_1 = (("train", "epochs"), ("train", "batch_size"), ("memory", "accumulation"),
               ("train", "eval_batch_size"), ("train", "step_size"), ("memory", "growth_interval"))
_AT_LEAST_0 = (("run", "seed"), ("run", "calib_samples"), ("data", "prefetch"),
               ("train", "warmup_epochs"), ("train", "weight_decay"), ("train", "eps"),
               ("memory", "checkpointing"))

# Command-line flag -> (section, key)
FLAGS = {
    "data": ("data", "source"),
    "epochs": ("train", "epochs"),
    "batch_size": ("train", "batch_size"),
    "lr": ("train", "lr"),
    "device": ("run", "device"),
    "memory_budget": ("memory", "budget"),
    "precision": ("memory", "precision"),
    "out": ("run", "out"),
    "seed": ("run", "seed"),
}

_SIZE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
               "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20,
               "gib": 2**30, "tib": 2**40}


def parse_size(text: str | int) -> int:
    """'4GiB', '512MB', '1.5G', 1000000 -> bytes."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text <= 0:
            raise ConfigError(f"memory size must be positive, got {text}")
        return text
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _SIZE_UNITS:
        raise ConfigError(f"cannot read memory size {text!r}; write it like 4GiB, 512MiB or 2GB")
    # NOTE: decimal, not float: float("8.2") * 10**6 is 8199999.999..., one byte short.
    value = int(decimal.Decimal(m.group(1)) * _SIZE_UNITS[unit])
    if value <= 0:
        raise ConfigError(f"memory size must be positive, got {text!r}")
    return value


def format_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _suggest(word: str, options) -> str:
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else f"; known: {', '.join(options)}"


def _check_type(where: str, default: Any, value: Any) -> Any:
    if default is None or value is None:
        return value
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif isinstance(default, str):
        ok = isinstance(value, str)
    elif isinstance(default, list):
        ok = isinstance(value, list)
    else:
        ok = True
    if not ok:
        raise ConfigError(f"{where} must be a {type(default).__name__}, got {value!r}")
    return value


def merge(raw: dict, where: str = "config") -> dict:
    """Check a raw config dict against DEFAULTS and return the complete config."""
    cfg = copy.deepcopy(DEFAULTS)
    for section, values in raw.items():
        if section not in DEFAULTS:
            raise ConfigError(f"{where}: unknown section [{section}]{_suggest(section, DEFAULTS)}")
        if not isinstance(values, dict):
            raise ConfigError(f"{where}: [{section}] must be a table of keys")
        for key, value in values.items():
            if key not in DEFAULTS[section]:
                raise ConfigError(f"{where}: unknown key '{key}' in [{section}]"
                                  f"{_suggest(key, DEFAULTS[section])}")
            cfg[section][key] = _check_type(f"{where}: [{section}] {key}",
                                            DEFAULTS[section][key], value)
    for (section, key), choices in CHOICES.items():
        if cfg[section][key] not in choices:
            shown = ", ".join(c for c in choices if c)
            raise ConfigError(f"{where}: [{section}] {key} = {cfg[section][key]!r} is not one of "
                              f"{shown}")
    for section, key in _AT_LEAST_1:
        if cfg[section][key] < 1:
            raise ConfigError(f"{where}: [{section}] {key} must be at least 1")
    for section, key in _AT_LEAST_0:
        if cfg[section][key] < 0:
            raise ConfigError(f"{where}: [{section}] {key} must not be negative")
    tr = cfg["train"]
    for key in ("lr", "gamma", "clip_grad_norm"):
        if tr[key] is not None and tr[key] <= 0:
            raise ConfigError(f"{where}: [train] {key} must be positive")
    if cfg["memory"]["loss_scale"] <= 0:
        raise ConfigError(f"{where}: [memory] loss_scale must be positive")
    for key in ("momentum", "label_smoothing"):
        if not 0 <= tr[key] < 1:
            raise ConfigError(f"{where}: [train] {key} must be in [0, 1), got {tr[key]}")
    betas = tr["betas"]
    if len(betas) != 2 or not all(isinstance(b, int | float) and not isinstance(b, bool)
                                  and 0 <= b < 1 for b in betas):
        raise ConfigError(f"{where}: [train] betas must be two numbers in [0, 1), got {betas!r}")
    if tr["optimizer"] == "sgd" and tr["nesterov"] and tr["momentum"] == 0:
        raise ConfigError(f"{where}: [train] nesterov needs momentum > 0")
    if cfg["train"]["batch_size"] % cfg["memory"]["accumulation"]:
        raise ConfigError(f"{where}: [train] batch_size {cfg['train']['batch_size']} must be a "
                          f"multiple of [memory] accumulation {cfg['memory']['accumulation']}")
    if cfg["memory"]["budget"] is not None:
        try:
            parse_size(cfg["memory"]["budget"])
        except ConfigError as e:
            raise ConfigError(f"{where}: [memory] budget: {e}") from None
    return cfg


def load_config(path: str | Path | None, overrides: dict | None = None) -> dict:
    """Read a TOML config, apply flag overrides, validate. `path` None means defaults."""
    raw: dict = {}
    name = None
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"{p}: config file not found; see examples/ for configs")
        try:
            raw = tomllib.loads(p.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"{p}: not valid TOML: {e}") from None
        name = p.stem
    cfg = merge(raw, str(path) if path else "config")
    for flag, value in (overrides or {}).items():
        if value is None:
            continue
        if flag not in FLAGS:
            raise ConfigError(f"unknown option '{flag}'{_suggest(flag, FLAGS)}")
        section, key = FLAGS[flag]
        cfg[section][key] = value
    cfg = merge(cfg, "flags")
    if cfg["run"]["name"] is None:
        cfg["run"]["name"] = name or "run"
    return cfg
