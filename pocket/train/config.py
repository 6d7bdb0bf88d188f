"""Training configuration: a TOML (or YAML) file, overridden by command-line flags, over defaults.

Every key is declared here with its default, so a typo is caught with a suggestion instead of
being silently ignored; every number is checked for being finite and sane at load time, so a
bad value fails before the data is read, not an epoch into the run.
"""

from __future__ import annotations

import copy
import decimal
import difflib
import math
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
    "run": {"name": None, "seed": 0, "out": None, "device": "auto", "calib_samples": 256,
            "tensorboard": None},
    "data": {"source": "digits", "target": None, "task": None, "val_fraction": 0.1,
             "test_fraction": 0.2, "augment": [], "limit": None, "image_size": None,
             "cache_dir": None, "prefetch": 2, "test": None, "validation": None,
             # timeseries:PATH (train/data/timeseries.py)
             "window": None, "horizon": None, "stride": 1, "season": None, "time_column": None,
             "relative": False, "layout": "NLC",
             # keep only these classes (label names or ids), renumbered in this order
             "classes": None,
             # task = "embedding": the class names kept out of training (data/openset.py)
             "holdout": None},
    "model": {"name": "cnn", "layers": None, "hidden": None, "channels": None, "dropout": 0.0,
              "batchnorm": True, "width": None},
    "train": {"epochs": 20, "batch_size": 64, "optimizer": "adamw", "lr": 3e-3, "momentum": 0.9,
              "nesterov": False, "weight_decay": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8,
              "schedule": "cosine", "warmup_epochs": 1, "step_size": 10, "gamma": 0.1,
              "clip_grad_norm": None, "label_smoothing": 0.0, "loss": None, "drop_last": True,
              "eval_batch_size": 256, "patience": 0, "min_delta": 0.0, "monitor": "auto",
              "keep": "best"},
    # task = "embedding" (train/nn_embed.py): the embedding's width, and the ArcFace loss's
    # scale s, margin m (radians) and easy_margin (Deng et al., 2019)
    "embedding": {"dim": 64, "s": 30.0, "m": 0.5, "easy_margin": False},
    "memory": {"precision": "fp32", "accumulation": 1, "checkpointing": 0,
               "fp16_activations": False, "budget": None, "loss_scale": 65536.0,
               "growth_interval": 2000},
    # Low-rank adapters (train/nn_lora.py): on when rank is set; `base` is the checkpoint a new
    # run starts from (its full weights are loaded, then frozen).
    "lora": {"rank": None, "alpha": None, "dropout": 0.0, "targets": ["linear"],
             "trainable": [], "base": None},
    # How `pocket export --int8` calibrates this run's checkpoints (its flags win).
    "export": {"calibration": "minmax", "percentile": 99.99, "int8_target": None,
               "sensitivity_samples": None},
}

CHOICES = {
    ("train", "optimizer"): ("sgd", "adam", "adamw"),
    ("train", "schedule"): ("cosine", "step", "constant"),
    ("train", "loss"): (None, "cross_entropy", "mse", "l1", "huber", "arcface", "softmax"),
    # NOTE: no bf16: NumPy and CuPy have no bfloat16 array type, so it cannot train (amp.py).
    ("memory", "precision"): ("fp32", "fp16"),
    ("data", "task"): (None, "classification", "regression", "forecast", "sequence-classification",
                       "embedding"),
    ("train", "monitor"): ("auto", "val_loss", "val_accuracy", "val_r2", "val_mae", "val_rmse",
                           "train_loss"),
    ("train", "keep"): ("best", "last"),
    ("export", "calibration"): ("minmax", "percentile", "mse", "entropy"),
    ("data", "layout"): ("NLC", "NCL"),
}

# Keys whose default is None: the types a value may have.
OPTIONAL_TYPES: dict[tuple[str, str], tuple[type, ...]] = {
    ("run", "name"): (str,), ("run", "out"): (str,), ("run", "tensorboard"): (bool,),
    ("data", "target"): (str,), ("data", "task"): (str,), ("data", "limit"): (int,),
    ("data", "image_size"): (int, list), ("data", "cache_dir"): (str,),
    ("data", "test"): (str,), ("data", "validation"): (str,),
    ("data", "window"): (int,), ("data", "horizon"): (int,), ("data", "season"): (int,),
    ("data", "time_column"): (str,), ("data", "holdout"): (list,),
    ("model", "layers"): (list,), ("model", "hidden"): (list,), ("model", "channels"): (list,),
    ("model", "width"): (int,), ("train", "clip_grad_norm"): (float,), ("train", "loss"): (str,),
    ("memory", "budget"): (str, int), ("export", "int8_target"): (float,),
    ("export", "sensitivity_samples"): (int,),
    ("lora", "rank"): (int,), ("lora", "alpha"): (float,), ("lora", "base"): (str,),
    ("data", "classes"): (list,),
}

# Upper bounds past which a value is a typo, not a choice (lr = 1e30 trains to NaN in a step).
_AT_MOST = {("train", "lr"): 10.0, ("train", "weight_decay"): 1.0, ("train", "eps"): 1.0,
            ("train", "gamma"): 10.0, ("memory", "loss_scale"): 2.0**32,
            ("train", "batch_size"): 2**24, ("embedding", "s"): 1e3, ("embedding", "dim"): 2**16,
            ("embedding", "m"): 1.5, ("train", "eval_batch_size"): 2**24,
            ("memory", "accumulation"): 2**16, ("train", "epochs"): 10**6,
            ("memory", "checkpointing"): 4096, ("export", "percentile"): 100.0}
_MAX_DEPTH = 16
_TYPE_NAMES = {bool: "a bool (true/false)", int: "an int", float: "a float", str: "a str",
               list: "a list"}
_LAYER_POSITIVE = ("out", "kernel", "stride", "dilation", "groups")

_AT_LEAST_1 = (("train", "epochs"), ("train", "batch_size"), ("memory", "accumulation"),
               ("train", "eval_batch_size"), ("train", "step_size"), ("memory", "growth_interval"),
               ("data", "stride"), ("embedding", "dim"))
_AT_LEAST_0 = (("run", "seed"), ("run", "calib_samples"), ("data", "prefetch"),
               ("export", "percentile"),
               ("train", "warmup_epochs"), ("train", "weight_decay"), ("train", "eps"),
               ("memory", "checkpointing"), ("train", "patience"), ("train", "min_delta"),
               ("embedding", "m"))

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
# Flags that only say where and how to run, not what is trained: a resumed run may change them.
RUNTIME_FLAGS = ("device", "out")

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


def _model_options(values: dict) -> dict:
    """The named zoo model's own [model] keys and defaults (models.register_model)."""
    from pocket.train import models  # here: the config reads cheaply without the layer code

    name = values.get("name", DEFAULTS["model"]["name"])
    return models.model_options(name) if isinstance(name, str) else {}


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
        raise ConfigError(f"{where} must be {_TYPE_NAMES.get(type(default), 'a ' + type(default).__name__)}, "
                          f"got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where} must be a finite number, got {value!r}")
    return value


def _check_optional(where: str, types: tuple[type, ...], value: Any) -> Any:
    if value is None:
        return value
    if float in types and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    ok = any(isinstance(value, t) and not (t is not bool and isinstance(value, bool))
             for t in types)
    if not ok:
        shown = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types)
        raise ConfigError(f"{where} must be {shown}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where} must be a finite number, got {value!r}")
    return value


def _depth(v: Any, limit: int) -> int:
    """Nesting depth of lists/dicts, counted without recursion (a 5000-deep file is refused,
    not a RecursionError); stops counting past `limit`."""
    deepest, stack = 0, [(v, 0)]
    while stack:
        item, d = stack.pop()
        deepest = max(deepest, d)
        if deepest > limit:
            return deepest
        if isinstance(item, dict):
            stack.extend((x, d + 1) for x in item.values())
        elif isinstance(item, list | tuple):
            stack.extend((x, d + 1) for x in item)
    return deepest


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_layers(where: str, layers: list, name: str = "[model] layers") -> None:
    """The numbers in a layer list, named the way the config names them; a block's branches
    (nested layer lists, `[]` the identity) are checked the same way."""
    if not layers and name == "[model] layers":
        raise ConfigError(f"{where}: [model] layers must list at least one layer (or remove it "
                          "and choose a [model] name)")
    if not isinstance(layers, list):
        raise ConfigError(f"{where}: {name} must be a list of tables like {{type = \"relu\"}}")
    for i, spec in enumerate(layers):
        if not isinstance(spec, dict):
            raise ConfigError(f"{where}: {name}[{i}] must be a table like "
                              "{type = \"relu\"}")
        at = f"{where}: {name}[{i}] ({spec.get('type', '?')})"
        branches = spec.get("branches")
        if branches is not None:
            if not isinstance(branches, list) or not all(isinstance(b, list) for b in branches):
                raise ConfigError(f"{at}: branches must be a list of layer lists, like "
                                  "[[{type = \"relu\"}], []]")
            for j, branch in enumerate(branches):
                _check_layers(where, branch, f"{name}[{i}] (block) branches[{j}]")
        for key in _LAYER_POSITIVE:
            if key not in spec:
                continue
            v = spec[key]
            parts = v if isinstance(v, list) and len(v) == 2 else [v]
            if not all(_is_int(n) and n >= 1 for n in parts):
                raise ConfigError(f"{at}: {key} must be a positive int (or two), got {v!r}")
        if "padding" in spec:
            v = spec["padding"]
            parts = v if isinstance(v, list) and len(v) == 2 else [v]
            if not all(_is_int(n) and n >= 0 for n in parts):
                raise ConfigError(f"{at}: padding must be a non-negative int (or two), got {v!r}")
        if "eps" in spec and not (isinstance(spec["eps"], int | float) and not isinstance(
                spec["eps"], bool) and math.isfinite(spec["eps"]) and 0 < spec["eps"] <= 1):
            raise ConfigError(f"{at}: eps must be a number in (0, 1], got {spec['eps']!r}")
        for key, lo, hi in (("momentum", 0.0, 1.0), ("p", 0.0, 1.0), ("alpha", 0.0, 1e3)):
            if key in spec:
                v = spec[key]
                if not (isinstance(v, int | float) and not isinstance(v, bool)
                        and math.isfinite(v) and lo <= v <= hi):
                    raise ConfigError(f"{at}: {key} must be a number in [{lo:g}, {hi:g}], "
                                      f"got {v!r}")


def _check_image_size(where: str, v: Any) -> None:
    parts = v if isinstance(v, list) else [v]
    if v is not None and not (len(parts) in (1, 2) and all(_is_int(n) and 1 <= n <= 8192
                                                           for n in parts)):
        raise ConfigError(f"{where}: [data] image_size must be an int or [height, width] "
                          f"between 1 and 8192, got {v!r}")


def _check_lora(where: str, lo: dict) -> None:
    if lo["rank"] is None:
        set_ = [k for k in lo if k != "rank" and lo[k] != DEFAULTS["lora"][k]]
        if set_:
            raise ConfigError(f"{where}: [lora] {set_[0]} is set but [lora] rank is not; give "
                              "rank (e.g. rank = 8) to train low-rank adapters")
        return
    if lo["rank"] < 1 or lo["rank"] > 4096:
        raise ConfigError(f"{where}: [lora] rank must be a positive int (at most 4096), got "
                          f"{lo['rank']}")
    if lo["alpha"] is not None and not 0 < lo["alpha"] <= 1e6:
        raise ConfigError(f"{where}: [lora] alpha must be a positive number, got {lo['alpha']}")
    if not 0 <= lo["dropout"] < 1:
        raise ConfigError(f"{where}: [lora] dropout must be in [0, 1), got {lo['dropout']}")
    targets = lo["targets"]
    if not targets or not all(isinstance(t, str) and t for t in targets):
        raise ConfigError(f"{where}: [lora] targets must list layer names or kinds, like "
                          f"[\"linear\"] or [\"attention\"], got {targets!r}")
    if not all(isinstance(t, str) and t for t in lo["trainable"]):
        raise ConfigError(f"{where}: [lora] trainable must list layer names, like [\"head\"], "
                          f"got {lo['trainable']!r}")


def merge(raw: dict, where: str = "config") -> dict:
    """Check a raw config dict against DEFAULTS and return the complete config."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: a config is a table of sections like [train], got "
                          f"{type(raw).__name__}")
    if _depth(raw, _MAX_DEPTH) > _MAX_DEPTH:
        raise ConfigError(f"{where}: nested more than {_MAX_DEPTH} levels deep; a config has "
                          "sections of keys, and layers of one table each")
    cfg = copy.deepcopy(DEFAULTS)
    for section, values in raw.items():
        if section not in DEFAULTS:
            raise ConfigError(f"{where}: unknown section [{section}]"
                              f"{_suggest(str(section), DEFAULTS)}")
        if not isinstance(values, dict):
            raise ConfigError(f"{where}: [{section}] must be a table of keys")
        own = _model_options(values) if section == "model" else {}
        for key, value in values.items():
            if key in own:
                cfg[section][key] = _check_type(f"{where}: [model] {key}", own[key], value)
                continue
            if key not in DEFAULTS[section]:
                raise ConfigError(f"{where}: unknown key '{key}' in [{section}]"
                                  f"{_suggest(str(key), {**DEFAULTS[section], **own})}")
            if (section, key) in OPTIONAL_TYPES:
                value = _check_optional(f"{where}: [{section}] {key}",
                                        OPTIONAL_TYPES[section, key], value)
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
    for (section, key), hi in _AT_MOST.items():
        v = cfg[section][key]
        if v is not None and v > hi:
            raise ConfigError(f"{where}: [{section}] {key} = {v!r} is far outside any sane range; "
                              f"it must be at most {hi:g}")
    tr = cfg["train"]
    for key in ("lr", "gamma", "clip_grad_norm"):
        if tr[key] is not None and tr[key] <= 0:
            raise ConfigError(f"{where}: [train] {key} must be positive")
    if cfg["embedding"]["s"] <= 0:
        raise ConfigError(f"{where}: [embedding] s must be positive")
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
    if cfg["model"]["layers"] is not None:
        _check_layers(where, cfg["model"]["layers"])
    _check_image_size(where, cfg["data"]["image_size"])
    _check_lora(where, cfg["lora"])
    classes = cfg["data"]["classes"]
    if classes is not None and not (classes and all(
            isinstance(c, str) or _is_int(c) for c in classes)
            and len({str(c) for c in classes}) == len(classes)):
        raise ConfigError(f"{where}: [data] classes must be a non-empty list of distinct class "
                          f"names or ids, like [5, 6, 7], got {classes!r}")
    if not all(isinstance(a, str) for a in cfg["data"]["augment"]):
        raise ConfigError(f"{where}: [data] augment must be a list of names like \"flip\"")
    return cfg


YAML_EXTRA = "pip install 'pocketnn[yaml]'"


def _yaml_loader():
    try:
        import yaml
    except ImportError:
        raise ConfigError(f"reading a YAML config needs PyYAML: {YAML_EXTRA} (or write the "
                          "config as TOML)") from None

    class Loader(yaml.SafeLoader):
        pass

    # NOTE: YAML 1.1 (PyYAML) reads 3e-3 as a string (it wants 3.0e-3); TOML and people read
    # it as a float, so the float rule here is YAML 1.2's.
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                    |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                    |[-+]?\.(?:inf|Inf|INF)
                    |\.(?:nan|NaN|NAN))$""", re.X),
        list("-+0123456789."))
    return yaml, Loader


def read_config_file(p: Path) -> dict:
    """The raw dict of a TOML file, or of a YAML file (.yaml/.yml) with the same schema."""
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{p}: not valid TOML: not UTF-8 text ({e})") from None
    if p.suffix.lower() in (".yaml", ".yml"):
        yaml, loader = _yaml_loader()
        try:
            raw = yaml.load(text, Loader=loader)  # noqa: S506 - a SafeLoader subclass
        except yaml.YAMLError as e:
            raise ConfigError(f"{p}: not valid YAML: {' '.join(str(e).split())}") from None
        except RecursionError:
            raise ConfigError(f"{p}: nested more than {_MAX_DEPTH} levels deep") from None
        return {} if raw is None else raw
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: not valid TOML: {e}") from None
    except RecursionError:
        raise ConfigError(f"{p}: nested more than {_MAX_DEPTH} levels deep; a config has "
                          "sections of keys, and layers of one table each") from None


def load_config(path: str | Path | None, overrides: dict | None = None) -> dict:
    """Read a TOML or YAML config, apply flag overrides, validate. `path` None means defaults."""
    raw: dict = {}
    name = None
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"{p}: config file not found; see examples/ for configs")
        raw = read_config_file(p)
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
