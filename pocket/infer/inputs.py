"""Turn what a user points `pocket infer` at into model-ready batches.

- `.npy` / `.npz`: already preprocessed model inputs, (N, *input_shape) or one sample.
- image files, or folders of them: decoded with Pillow, converted to the model's channels,
  resized to `preprocessing.image_size`, then raw = pixels / 255 * pixel_max and
  x = (raw * scale - mean[c]) / std[c] (scale 1, mean 0, std 1, pixel_max 255 by default).
- `.csv` with a header row: the columns named in `preprocessing.columns`, each
  x = (v - mean[i]) / std[i].

Every loader returns a list of (name, batch) pairs; `batch` is float32 (N, *input_shape).
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np

from pocket.errors import PocketError


class InputError(PocketError):
    """An input file is missing, unreadable, or does not fit the model."""


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".pgm", ".ppm")


def load_inputs(paths: list[str], input_shape: tuple[int, ...], preprocessing: dict | None = None
                ) -> list[tuple[str, np.ndarray]]:
    """paths -> [(name, x (N, *input_shape) float32)], one entry per array file, image or CSV."""
    pre = preprocessing or {}
    out: list[tuple[str, np.ndarray]] = []
    for p in paths:
        path = Path(p)
        if not path.exists():
            raise InputError(f"input '{p}' does not exist")
        if path.is_dir():
            images = sorted(f for f in path.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
            if not images:
                raise InputError(f"folder '{p}' holds no images ({', '.join(IMAGE_SUFFIXES)})")
            out += [(str(f), load_image(f, input_shape, pre)[None]) for f in images]
        elif path.suffix.lower() in (".npy", ".npz"):
            out += load_arrays(path, input_shape)
        elif path.suffix.lower() == ".csv":
            out.append((str(path), load_csv(path, input_shape, pre)))
        elif path.suffix.lower() in IMAGE_SUFFIXES:
            out.append((str(path), load_image(path, input_shape, pre)[None]))
        else:
            raise InputError(f"input '{p}': unknown kind; give .npy, .npz, .csv, an image "
                             f"({', '.join(IMAGE_SUFFIXES)}) or a folder of images")
    return out


def _as_batch(name: str, a: np.ndarray, input_shape: tuple[int, ...]) -> np.ndarray:
    if tuple(a.shape) == tuple(input_shape):
        a = a[None]
    if tuple(a.shape[1:]) != tuple(input_shape):
        raise InputError(f"'{name}' has shape {tuple(a.shape)}; the model takes "
                         f"(N, {', '.join(map(str, input_shape))}) or one sample {tuple(input_shape)}")
    if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise InputError(f"'{name}' holds {a.dtype} values; expected numbers")
    return np.ascontiguousarray(a, np.float32)


def load_arrays(path: Path, input_shape: tuple[int, ...]) -> list[tuple[str, np.ndarray]]:
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read '{path}': {e}") from None
    if isinstance(data, np.ndarray):
        return [(str(path), _as_batch(str(path), data, input_shape))]
    with data:
        keys = list(data.keys())
        if not keys:
            raise InputError(f"'{path}' holds no arrays")
        # NOTE: a training-style npz carries labels too; take 'x' when present, else every array.
        keys = ["x"] if "x" in keys else keys
        return [(f"{path}:{k}", _as_batch(f"{path}:{k}", data[k], input_shape)) for k in keys]


def _per_channel(pre: dict, key: str, default: float, n: int, what: str) -> np.ndarray:
    v = pre.get(key)
    if v is None:
        return np.full(n, default, np.float64)
    v = np.asarray(v, np.float64).reshape(-1)
    if v.size == 1:
        return np.full(n, v[0])
    if v.size != n:
        raise InputError(f"preprocessing.{key} has {v.size} values but the model takes {n} {what}")
    return v


def load_image(path: Path, input_shape: tuple[int, ...], pre: dict) -> np.ndarray:
    """One image file -> (C, H, W) float32 per the model's preprocessing."""
    try:
        from PIL import Image
    except ImportError:
        raise InputError("reading images needs Pillow: pip install 'pocketnn[data]'") from None
    if len(input_shape) != 3:
        raise InputError(f"'{path}' is an image but the model takes inputs of shape "
                         f"{tuple(input_shape)}, not (C, H, W)")
    c, h, w = input_shape
    if c not in (1, 3):
        raise InputError(f"the model takes {c} channels; images give 1 (grey) or 3 (RGB)")
    size = pre.get("image_size") or [h, w]
    if list(size) != [h, w]:
        raise InputError(f"preprocessing.image_size {list(size)} differs from the model's "
                         f"input {h}x{w}")
    try:
        with Image.open(path) as im:
            im = im.convert("L" if c == 1 else "RGB")
            if im.size != (w, h):
                im = im.resize((w, h), Image.Resampling.BILINEAR)
            pixels = np.asarray(im, np.float64)
    except OSError as e:
        raise InputError(f"cannot read image '{path}': {e}") from None
    pixels = pixels.reshape(h, w, c).transpose(2, 0, 1)
    raw = pixels / 255.0 * float(pre.get("pixel_max", 255.0))
    mean = _per_channel(pre, "mean", 0.0, c, "channels").reshape(c, 1, 1)
    std = _per_channel(pre, "std", 1.0, c, "channels").reshape(c, 1, 1)
    return ((raw * float(pre.get("scale", 1.0)) - mean) / std).astype(np.float32)


def load_csv(path: Path, input_shape: tuple[int, ...], pre: dict) -> np.ndarray:
    """A CSV with a header row -> (N, F) float32 from the columns the model was trained on."""
    columns = pre.get("columns")
    if len(input_shape) != 1:
        raise InputError(f"'{path}' is a CSV but the model takes inputs of shape {tuple(input_shape)}")
    if columns is None:
        raise InputError("the model's metadata names no CSV columns (preprocessing.columns); "
                         "pass an .npy array instead")
    if len(columns) != input_shape[0]:
        raise InputError(f"preprocessing.columns names {len(columns)} columns but the model "
                         f"takes {input_shape[0]} features")
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read '{path}': {e}") from None
    if len(rows) < 2:
        raise InputError(f"'{path}' needs a header row and at least one data row")
    header = [h.strip() for h in rows[0]]
    missing = [c for c in columns if c not in header]
    if missing:
        raise InputError(f"'{path}' has no column(s) {', '.join(map(repr, missing))}; "
                         f"it has {', '.join(header)}")
    idx = [header.index(c) for c in columns]
    x = np.empty((len(rows) - 1, len(columns)), np.float64)
    for r, row in enumerate(rows[1:]):
        for j, i in enumerate(idx):
            try:
                x[r, j] = float(row[i])
            except (ValueError, IndexError):
                raise InputError(f"'{path}' line {r + 2}, column '{columns[j]}': "
                                 f"not a number") from None
    mean = _per_channel(pre, "mean", 0.0, len(columns), "columns")
    std = _per_channel(pre, "std", 1.0, len(columns), "columns")
    return ((x - mean) / std).astype(np.float32)


def display_name(path: str) -> str:
    return os.path.basename(path) or path
