"""Checkpoints: a pocket container of kind "checkpoint" (DESIGN §4).

Tensors: every state_dict entry under its own name (the traced graph's params are a subset),
optimizer slots under "optim/<param>/<slot>", the calibration set under "calib/x" and
"calib/y". Meta: the trainer state (epoch, step, RNG state, config, metric history), the
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
        state, optim, calib = {}, {}, {}
        for name, arr in c.tensors.items():
            if name.startswith(OPTIM_PREFIX):
                pname, _, slot = name[len(OPTIM_PREFIX):].rpartition("/")
                optim.setdefault(pname, {})[slot] = np.array(arr)
            elif name.startswith(CALIB_PREFIX):
                calib[name[len(CALIB_PREFIX):]] = np.array(arr)
            else:
                state[name] = np.array(arr)
        graph = c.graph
    optimizer_state = {**meta.get("optimizer", {}), "state": optim}
    return {"graph": graph, "state": state, "optimizer": optimizer_state, "meta": meta,
            "calib": calib}
