"""Tables from CSV files and arrays from NPZ files (NPZ images too: 4-D x)."""

from __future__ import annotations

import math
import os
import zipfile

import numpy as np

from pocket.formats import csvio
from pocket.train.data.sources import DataError, Raw, check_finite, encode_classes

MISSING = {"", "nan", "na", "n/a", "null", "none", "?"}
# NOTE: an integer target with at most this many distinct values (and at least two rows per
# value on average) is read as class ids; anything else numeric is a regression target.
MAX_GUESSED_CLASSES = 20


def read_csv(path: str, *, target: str | None, task: str | None) -> Raw:
    try:
        table = csvio.read_table(path)
    except csvio.CsvError as e:
        raise DataError(str(e)) from None
    header, rows, lines = table.header, table.rows, table.lines
    if not header:
        raise DataError(f"{path}: empty file; a CSV needs a header row and data rows")
    dupes = sorted({h for h in header if header.count(h) > 1})
    if dupes:
        raise DataError(f"{path}: duplicate column names {dupes}; give every column a unique name")
    if target is None or target not in header:
        what = "no target column given" if target is None else f"no column {target!r}"
        raise DataError(f"{path}: {what}; set the target to one of: {', '.join(header)}")
    if not rows:
        raise DataError(f"{path}: header but no data rows")
    for row, line in zip(rows, lines):
        if len(row) != len(header):
            raise DataError(f"{path}: line {line} has {len(row)} fields, the header has {len(header)}")
    cols = {name: [r[i].strip() for r in rows] for i, name in enumerate(header)}
    for name, cells in cols.items():
        for cell, line in zip(cells, lines):
            if cell.lower() in MISSING:
                raise DataError(f"{path}: empty or NaN value at line {line}, column {name!r}; "
                                "fill it in or drop that row")
    features = [h for h in header if h != target]
    if not features:
        raise DataError(f"{path}: only the target column {target!r}; add feature columns")
    x = np.stack([_numeric(path, name, cols[name], lines) for name in features], axis=1)
    y, labels, task = _target(path, target, cols[target], lines, task)
    return Raw(kind="table", task=task, x=x, y=y, labels=labels, columns=features, target_name=target)


def _numeric(path: str, name: str, cells: list[str], lines: list[int]) -> np.ndarray:
    out = np.empty(len(cells), np.float64)
    for i, (cell, line) in enumerate(zip(cells, lines)):
        try:
            v = float(cell)
        except ValueError:
            raise DataError(f"{path}: column {name!r} is not numeric ({cell!r} at line {line}); "
                            "encode it as numbers or drop the column") from None
        if not math.isfinite(v):
            raise DataError(f"{path}: {cell!r} at line {line}, column {name!r} is not finite; "
                            "fill in a real value or drop that row")
        out[i] = v
    return out


def _target(path: str, name: str, cells: list[str], lines: list[int], task: str | None):
    try:
        values = np.array([float(c) for c in cells])
    except ValueError:
        values = None
    if values is None:  # text labels
        if task == "regression":
            raise DataError(f"{path}: target {name!r} is not numeric, so it cannot be a regression "
                            "target; use task 'classification' or another column")
        y, labels = encode_classes(np.array(cells))
        return y, labels, "classification"
    if not np.isfinite(values).all():
        line = lines[int(np.flatnonzero(~np.isfinite(values))[0])]
        raise DataError(f"{path}: target {name!r} is not finite at line {line}; fix or drop that row")
    if task is None:
        integral = bool(np.all(values == np.round(values)))
        n_distinct = len(np.unique(values))
        few = n_distinct <= MAX_GUESSED_CLASSES and 2 * n_distinct <= len(values)
        task = "classification" if integral and few else "regression"
    if task == "classification":
        y, labels = encode_classes(values)
        return y, labels, task
    return values.astype(np.float32), None, task


def read_npz(path: str, *, task: str | None) -> Raw:
    """Arrays x, y and optionally x_test, y_test, labels (str), columns (str); no pickle."""
    try:
        # NOTE: our own open: np.load leaks its file handle when the zip directory is corrupt.
        with open(path, "rb") as f, np.load(f, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        # NOTE: np.load hands back the raw bytes of a member that is not an .npy (a pickle
        # stored as x.npy, say) instead of refusing it.
        odd = sorted(k for k, v in arrays.items() if not isinstance(v, np.ndarray))
        if odd:
            raise ValueError(f"member(s) {', '.join(odd)} are not .npy arrays")
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        # ValueError is also what an object (pickled) array raises with allow_pickle=False.
        raise DataError(f"{path}: cannot read as an NPZ of plain arrays ({e}); "
                        "save numeric arrays with np.savez") from None
    for key in ("x", "y"):
        if key not in arrays:
            raise DataError(f"{path}: no array {key!r} (found {sorted(arrays)}); "
                            "save with np.savez(path, x=..., y=...)")
    if ("x_test" in arrays) != ("y_test" in arrays):
        raise DataError(f"{path}: x_test and y_test must come together")
    x, y = arrays["x"], arrays["y"]
    x_test, y_test = arrays.get("x_test"), arrays.get("y_test")
    for a, b, what in ((x, y, ""), (x_test, y_test, "_test")):
        if a is None:
            continue
        if a.shape[0] != b.shape[0] or a.shape[0] == 0:
            raise DataError(f"{path}: x{what} has {a.shape[0]} samples and y{what} {b.shape[0]}; "
                            "they must match and be non-empty")
        for arr, name in ((a, "x" + what), (b, "y" + what)):
            if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool
                    or (name.startswith("y") and arr.dtype.kind == "U")):
                raise DataError(f"{path}: array {name!r} has dtype {arr.dtype}; use numbers")
            if np.issubdtype(arr.dtype, np.floating):
                check_finite(arr, path, name)
    x, x_test = _layout(path, x), (None if x_test is None else _layout(path, x_test))
    if x_test is not None and x_test.shape[1:] != x.shape[1:]:
        raise DataError(f"{path}: x_test samples are {x_test.shape[1:]}, x samples {x.shape[1:]}")
    labels = [str(s) for s in arrays["labels"]] if "labels" in arrays else None
    y_all = y if y_test is None else np.concatenate([y, y_test])
    if task is None:
        task = "classification" if (y.dtype.kind in "iubU" and y.ndim == 1) or labels else "regression"
    if task == "classification":
        if y.ndim != 1 or y.dtype.kind not in "iubU":
            raise DataError(f"{path}: classification needs y as 1-D integer class ids or strings, "
                            f"got {y.dtype} {y.shape}")
        if labels is not None:
            if y_all.dtype.kind == "U" or y_all.min() < 0 or y_all.max() >= len(labels):
                raise DataError(f"{path}: y must be ids 0..{len(labels) - 1} to match 'labels'")
            ids = y_all.astype(np.int64)
        else:
            ids, labels = encode_classes(y_all)
        y, y_test = ids[: len(y)], (None if y_test is None else ids[len(y):])
    else:
        if y.dtype.kind not in "iuf":
            raise DataError(f"{path}: regression needs numeric y, got {y.dtype}")
        y = y.astype(np.float32)
        y_test = None if y_test is None else y_test.astype(np.float32)
    common = dict(task=task, x=x, y=y, labels=labels, x_test=x_test, y_test=y_test)
    if x.ndim == 4:
        return Raw(kind="image", pixel_max=_pixel_max(x), **common)
    if "vocab" in arrays:  # x holds token ids (N, L) for an embedding: never standardized
        vocab = int(np.asarray(arrays["vocab"]).reshape(-1)[0])
        x_all = x if x_test is None else np.concatenate([x, x_test])
        if x.ndim != 2 or x.dtype.kind not in "iu" or x_all.min() < 0 or x_all.max() >= vocab:
            raise DataError(f"{path}: with 'vocab' ({vocab}), x must be (N, L) integer token ids "
                            f"in [0, {vocab})")
        return Raw(kind="tokens", **common)
    columns = [str(c) for c in arrays["columns"]] if "columns" in arrays else None
    if columns is not None and len(columns) != x.shape[1]:
        raise DataError(f"{path}: {len(columns)} names in 'columns' for {x.shape[1]} features")
    return Raw(kind="table", columns=columns, target_name="y", **common)


def _layout(path: str, x: np.ndarray) -> np.ndarray:
    if x.dtype == bool:
        x = x.astype(np.uint8)
    if x.ndim == 2:
        return x
    if x.ndim == 3:
        return x[:, None]  # (N, H, W) grayscale -> (N, 1, H, W)
    if x.ndim == 4:
        # NOTE: NCHW is expected; a channels-last array (N, H, W, 1|3|4) is transposed, since a
        # 1-, 3- or 4-pixel-tall image with many channels is far less likely than NHWC data.
        if x.shape[3] in (1, 3, 4) and x.shape[1] not in (1, 3, 4):
            return np.ascontiguousarray(x.transpose(0, 3, 1, 2))
        return x
    raise DataError(f"{os.path.basename(path)}: x has shape {x.shape}; use (N, F) features or "
                    "(N, C, H, W) images")


def _pixel_max(x: np.ndarray) -> float:
    if x.dtype == np.uint8:
        return 255.0
    top = float(x.max()) if x.size else 1.0
    if top <= 1.0:
        return 1.0
    return 255.0 if top <= 255.0 else top
