"""Checkpoints: a pocket container of kind "checkpoint" (DESIGN §4).

Tensors: every state_dict entry under its own name (the traced graph's params are a subset),
optimizer slots under "optim/<param>/<slot>", the calibration set under "calib/x" and
"calib/y", and tensors the traced graph computes from the state (a LoRA layer's merged weight)
under "derived/<name>". Meta: the trainer state (epoch, step, RNG state, config, metric history), the
optimizer's scalars, the schedule and the loss scaler, so `--resume` continues exactly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pocket.errors import PocketError
from pocket.formats.container import read_container, write_container
from pocket.formats.errors import FormatError
from pocket.formats.ir import Graph

OPTIM_PREFIX = "optim/"
CALIB_PREFIX = "calib/"
DERIVED_PREFIX = "derived/"


class CheckpointError(PocketError):
    """A checkpoint does not fit the run that tries to resume from it."""


def save_checkpoint(path: str | Path, *, graph: Graph, state: dict[str, np.ndarray],
                    optimizer_state: dict, meta: dict, calib_x: np.ndarray | None = None,
                    calib_y: np.ndarray | None = None) -> int:
    """Write atomically; returns bytes written."""
    tensors: dict[str, np.ndarray] = {}
    for k, v in state.items():
        a = np.asarray(v)
        tensors[k] = a.astype(np.float32) if a.dtype.kind == "f" else a
    for pname, slots in optimizer_state.get("state", {}).items():
        for slot, arr in slots.items():
            tensors[f"{OPTIM_PREFIX}{pname}/{slot}"] = np.asarray(arr, np.float32)
    if calib_x is not None:
        tensors[CALIB_PREFIX + "x"] = np.ascontiguousarray(calib_x, np.float32)
    if calib_y is not None:
        y = np.asarray(calib_y)
        tensors[CALIB_PREFIX + "y"] = y.astype(np.int64 if y.dtype.kind in "iu" else np.float32)
    scalars = {k: v for k, v in optimizer_state.items() if k != "state"}
    meta = {**meta, "optimizer": scalars}
    return write_container(path, kind="checkpoint", tensors=tensors, graph=graph, meta=meta)


def load_checkpoint(path: str | Path) -> dict:
    """Read a checkpoint into plain NumPy copies (the file may be overwritten later)."""
    with read_container(path, expect_kind="checkpoint") as c:
        meta = c.meta
        if "trainer" not in meta or "config" not in meta:
            raise FormatError(f"{path}: meta: not a training checkpoint (no trainer state)")
        state, optim, calib, derived = {}, {}, {}, {}
        for name, arr in c.tensors.items():
            if name.startswith(DERIVED_PREFIX):
                derived[name] = np.array(arr)
            elif name.startswith(OPTIM_PREFIX):
                pname, _, slot = name[len(OPTIM_PREFIX):].rpartition("/")
                optim.setdefault(pname, {})[slot] = np.array(arr)
            elif name.startswith(CALIB_PREFIX):
                calib[name[len(CALIB_PREFIX):]] = np.array(arr)
            else:
                state[name] = np.array(arr)
        graph = c.graph
    optimizer_state = {**meta.get("optimizer", {}), "state": optim}
    return {"graph": graph, "state": state, "optimizer": optimizer_state, "meta": meta,
            "calib": calib, "derived": derived}


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def check_trainer_state(meta: dict, path: str | Path) -> dict:
    """The trainer state a resume reads, checked for shape before anything uses it: a
    hand-edited or foreign checkpoint is one clear error, not a TypeError mid-restore.
    Returns the saved config, validated as a config file would be."""
    from pocket.train.config import ConfigError, merge

    def bad(what: str) -> CheckpointError:
        return CheckpointError(f"{path}: trainer state is malformed ({what}); resume from "
                               "another checkpoint or start a new run")

    t, cfg = meta.get("trainer"), meta.get("config")
    if not isinstance(t, dict) or not isinstance(cfg, dict):
        raise bad("no trainer or config table")
    try:
        cfg = merge(cfg, "config")
    except ConfigError as e:
        raise bad(f"its config: {e}") from None
    for key in ("epoch", "step"):
        if not _is_count(t.get(key)):
            raise bad(f"{key} must be a non-negative int, got {t.get(key)!r}")
    if not _is_count(t.get("skipped_steps", 0)):
        raise bad("skipped_steps must be a non-negative int")
    for key in ("rng", "schedule", "scaler"):
        if not isinstance(t.get(key), dict):
            raise bad(f"{key} must be a table, got {type(t.get(key)).__name__}")
    for key, v in t["schedule"].items():
        if not isinstance(v, int | float) or isinstance(v, bool) or v != v:
            raise bad(f"schedule {key} must be a number, got {v!r}")
    best = t.get("best")
    if best is not None and not (
            isinstance(best, dict) and _is_count(best.get("epoch"))
            and 1 <= best["epoch"] <= t["epoch"] and isinstance(best.get("metric"), str)
            and isinstance(best.get("rank"), list) and best["rank"]
            and all(isinstance(r, int | float) and not isinstance(r, bool) for r in best["rank"])):
        raise bad(f"best must be a table with epoch, metric and rank, got {best!r}")
    stopped = t.get("stopped")
    if stopped is not None and not (isinstance(stopped, dict) and _is_count(stopped.get("epoch"))
                                    and isinstance(stopped.get("reason"), str)):
        raise bad(f"stopped must be a table with epoch and reason, got {stopped!r}")
    history = meta.get("history", [])
    if not isinstance(history, list) or not all(isinstance(h, dict) for h in history):
        raise bad("history must be a list of tables")
    if best is not None and len(history) < best["epoch"]:
        raise bad(f"history has {len(history)} rows but the best epoch is {best['epoch']}")
    return cfg
