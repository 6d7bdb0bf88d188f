"""Dataset sources: parse a SRC string, load raw arrays, split, normalize.

Every source returns a `Raw` (raw pixel values or raw table cells, integer class ids or float
targets, and an official test set where the dataset has one). `load_dataset` then does the part
every source shares: stable test split, seeded validation split, `limit`, and normalization with
statistics from the training split only. What the device needs to redo the normalization goes into
`Dataset.preprocessing`, which travels in the exported model's metadata.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from pocket.errors import PocketError

# NOTE: the test split is drawn with this fixed seed, not the training seed, so changing --seed
# changes the validation split and the initialization but never which samples are held out.
TEST_SPLIT_SEED = 0x706F636B

SOURCES = ("digits", "mnist", "cifar10", "csv", "npz", "folder", "timeseries")
# [data] task: the trainer's two (the guess when absent), and the sequence tasks on top of them:
# "forecast" (timeseries:PATH, a regression of the next steps, data/timeseries.py) and
# "sequence-classification" (images read row by row as steps, or npz sequences (N, L, F)), and
# "embedding" (classes held out of training for open-set evaluation, data/openset.py).
TASKS = ("classification", "regression", "forecast", "sequence-classification", "embedding")
DATA_EXTRA = "pip install 'pocketnn[data]'"


class DataError(PocketError):
    """A dataset cannot be found, read or used as given."""

    def __init__(self, message: str):
        # The CLI prints one `Error:` line; wrapped library messages may carry newlines.
        super().__init__(" ".join(str(message).split()))


@dataclass
class Split:
    """One split, preprocessed and model-ready: x float32, y int64 ids or float32 targets."""

    x: np.ndarray  # (N, C, H, W) images or (N, F) tables
    y: np.ndarray  # (N,) int64 class ids; (N,) or (N, T) float32 regression targets
    baseline: np.ndarray | None = None  # forecast: the seasonal-naive forecast, like y

    def __len__(self) -> int:
        return int(self.y.shape[0])


@dataclass
class Dataset:
    name: str
    task: str  # "classification" | "regression"
    labels: list[str] | None  # class names in id order
    input_shape: tuple[int, ...]  # per sample, e.g. (1, 8, 8) or (F,)
    preprocessing: dict  # how a device turns a raw image / CSV row into x
    train: Split
    val: Split
    test: Split
    num_outputs: int  # classes, or regression targets


@dataclass
class Raw:
    """What a source reader hands back before splitting and normalization."""

    kind: str  # "image" (x (N, C, H, W) raw pixels) | "table" (x (N, F) raw values) |
    # "tokens" (x (N, L) integer ids, from an npz with a `vocab` entry)
    task: str
    x: np.ndarray
    y: np.ndarray
    labels: list[str] | None = None
    pixel_max: float = 1.0  # images only
    columns: list[str] | None = None  # tables only
    target_name: str | None = None  # tables only
    x_test: np.ndarray | None = None  # official test set, when the dataset has one
    y_test: np.ndarray | None = None


def load_dataset(
    src: str,
    *,
    target: str | None = None,
    task: str | None = None,
    val_fraction: float = 0.1,
    test_fraction: float = 0.2,
    cache_dir: str | None = None,
    seed: int = 0,
    limit: int | None = None,
    image_size: int | Sequence[int] | None = None,
    channels: int | None = None,
    test: str | None = None,
    validation: str | None = None,
    window: int | None = None,
    horizon: int | None = None,
    stride: int = 1,
    season: int | None = None,
    time_column: str | None = None,
    relative: bool = False,
    layout: str = "NLC",
    classes: Sequence | None = None,
    holdout: Sequence | None = None,
) -> Dataset:
    """Load SRC (`digits`, `mnist[:PATH]`, `cifar10[:PATH]`, `csv:PATH`, `npz:PATH`, `folder:PATH`).

    target: the CSV target column. task: "classification" | "regression" to override the guess.
    image_size: (H, W) or one int for `folder:`; channels: 1 or 3 for `folder:`.
    test, validation: a separate `csv:PATH` or `npz:PATH` for that split (same columns or
    sample shape as SRC); it replaces test_fraction / val_fraction.
    window, horizon, stride, season, time_column, relative, layout: `timeseries:PATH` (see
    data/timeseries.py).
    classes: keep only these classes (label names, or ids for sets labelled by number), their
    ids renumbered 0.. in this order (e.g. digits [5, 6, 7, 8, 9] -> labels "5".."9").
    holdout: the class names the `embedding` task keeps out of training (data/openset.py).
    """
    _check_args(task, val_fraction, test_fraction, seed, limit)
    kind, _, path = src.partition(":")
    kind = kind.strip().lower()
    path = os.path.expanduser(path) if path else None
    if kind not in SOURCES:
        raise DataError(f"unknown dataset source {src!r}; use one of: digits, mnist[:PATH], "
                        "cifar10[:PATH], csv:PATH, npz:PATH, folder:PATH, timeseries:PATH")
    if kind == "timeseries" or task == "forecast":
        if classes is not None:
            raise DataError("[data] classes selects classes of a classification set; a time "
                            "series has none (remove classes)")
        if kind != "timeseries" or not path:
            raise DataError("task = \"forecast\" reads a time series: give [data] source = "
                            "\"timeseries:PATH\" (a CSV with a time column and value columns)")
        from pocket.train.data.timeseries import load_timeseries
        return load_timeseries(path, task=task, target=target, time_column=time_column,
                               window=window, horizon=horizon, stride=stride, season=season,
                               relative=relative, layout=layout, val_fraction=val_fraction,
                               test_fraction=test_fraction, limit=limit)
    if task == "sequence-classification":
        data = load_dataset(src, target=target, task="classification", val_fraction=val_fraction,
                            test_fraction=test_fraction, cache_dir=cache_dir, seed=seed,
                            limit=limit, image_size=image_size, channels=channels, test=test,
                            validation=validation, classes=classes)
        return as_sequences(data)
    if kind in ("csv", "npz", "folder") and not path:
        raise DataError(f"dataset source {kind!r} needs a path, e.g. {kind}:data/my_{kind}")
    if kind == "digits" and path:
        raise DataError("the digits dataset is bundled and takes no path; use plain 'digits'")
    if task == "embedding" and (test or validation):
        raise DataError("task = \"embedding\" makes its own test split (the held-out classes); "
                        "remove [data] test and validation")
    raw = _read(kind, path, target=target, task="classification" if task == "embedding" else task,
                cache_dir=resolve_cache_dir(cache_dir),
                image_size=image_size, channels=channels)
    name = src if kind in ("csv", "npz", "folder") else kind
    seen = None
    if task == "embedding":
        from pocket.train.data.openset import split_classes
        raw, seen = split_classes(raw, holdout, name)
    if task is not None and raw.task != task:
        raise DataError(f"{name}: [data] task = {task!r}, but this is a {raw.task} set; remove "
                        "task (or use a source with the other kind of target)")
    if classes is not None:
        raw = select_classes(raw, classes, name)
    extra = {}
    for split, other in (("test", test), ("val", validation)):
        if other:
            extra[split] = _read_extra(other, raw, target=target, split=split)
    data = _finish(name, raw, val_fraction=val_fraction, test_fraction=test_fraction, seed=seed,
                   limit=limit, extra=extra)
    if seen is not None:
        data.num_outputs = seen  # the training head's classes
    return data


def select_classes(raw: Raw, classes: Sequence, name: str) -> Raw:
    """Only the samples of `classes` (matched by label text), relabelled 0.. in that order."""
    if raw.task != "classification" or raw.labels is None:
        raise DataError(f"{name}: [data] classes selects classes, but this is a {raw.task} set")
    want = [str(c) for c in classes]
    unknown = [c for c in want if c not in raw.labels]
    if unknown or not want:
        raise DataError(f"{name}: [data] classes {unknown or want} not among its labels "
                        f"{', '.join(raw.labels)}")
    remap = np.full(len(raw.labels), -1, np.int64)
    remap[[raw.labels.index(c) for c in want]] = np.arange(len(want))

    def pick(x, y):
        if x is None:
            return None, None
        new = remap[np.asarray(y, np.int64)]
        keep = new >= 0
        return x[keep], new[keep]

    x, y = pick(raw.x, raw.y)
    x_test, y_test = pick(raw.x_test, raw.y_test)
    return replace(raw, x=x, y=y, x_test=x_test, y_test=y_test, labels=want)


def _read_extra(src: str, main: Raw, *, target: str | None, split: str) -> tuple:
    """A separate test or validation source, made to line up with the main one: the same
    columns (reordered by name) or sample shape, class ids remapped to the main set's labels."""
    key = "test" if split == "test" else "validation"
    kind, _, path = src.partition(":")
    kind = kind.strip().lower()
    if kind not in ("csv", "npz") or not path:
        raise DataError(f"[data] {key} = {src!r}: give csv:PATH or npz:PATH")
    raw = _read(kind, os.path.expanduser(path), target=target, task=main.task)
    where = f"[data] {key} ({path})"
    x = raw.x
    if main.kind == "table" and main.columns and raw.columns:
        missing = [c for c in main.columns if c not in raw.columns]
        if missing:
            raise DataError(f"{where}: no column(s) {', '.join(map(repr, missing))} that the "
                            "training data has")
        x = x[:, [raw.columns.index(c) for c in main.columns]]
    if x.shape[1:] != main.x.shape[1:]:
        raise DataError(f"{where}: samples are {list(x.shape[1:])}, the training data's "
                        f"{list(main.x.shape[1:])}")
    y = raw.y
    if main.task == "classification":
        labels = main.labels or []
        unknown = [v for v in (raw.labels or []) if v not in labels]
        if unknown:
            raise DataError(f"{where}: class(es) {', '.join(map(repr, unknown[:5]))} do not occur "
                            "in the training data")
        y = np.asarray([labels.index(raw.labels[i]) for i in y], np.int64)
    check_finite(x, where, "x")
    check_finite(y, where, "y")
    return x, y


def as_sequences(data: Dataset) -> Dataset:
    """A classification set as sequences: images (C, H, W) read row by row, H steps of C*W
    features each (`preprocessing["sequence"] = "rows"`); (L, F) samples pass as they are."""
    shape = data.input_shape
    if len(shape) == 3:
        c, h, w = shape
        for split in (data.train, data.val, data.test):
            split.x = np.ascontiguousarray(split.x.transpose(0, 2, 1, 3).reshape(len(split.x), h, c * w))
        data.input_shape = (h, c * w)
        data.preprocessing = {**data.preprocessing, "sequence": "rows"}
    elif len(shape) != 2:
        raise DataError(f"{data.name}: sequence-classification needs images (C, H, W) or "
                        f"sequences (L, F), got samples of shape {list(shape)}")
    return data


def _check_args(task, val_fraction, test_fraction, seed, limit) -> None:
    if task not in (None, *TASKS):
        raise DataError(f"task must be one of {', '.join(TASKS)}, not {task!r}")
    for name, f in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if not 0.0 <= f < 1.0:
            raise DataError(f"{name} must be in [0, 1), got {f}")
    if limit is not None and limit < 1:
        raise DataError(f"limit must be a positive number of samples per split, got {limit}")
    if not isinstance(seed, int | np.integer) or seed < 0:
        raise DataError(f"seed must be a non-negative integer, got {seed!r}")


def _read(kind: str, path: str | None, **kw) -> Raw:
    # Readers import lazily: each module imports this one for Raw/DataError/download.
    if kind == "digits":
        from pocket.train.data.images import read_digits
        return read_digits()
    if kind == "mnist":
        from pocket.train.data.mnist import read_mnist
        return read_mnist(path, kw["cache_dir"])
    if kind == "cifar10":
        from pocket.train.data.cifar import read_cifar10
        return read_cifar10(path, kw["cache_dir"])
    if kind == "csv":
        from pocket.train.data.tabular import read_csv
        return read_csv(path, target=kw["target"], task=kw["task"])
    if kind == "npz":
        from pocket.train.data.tabular import read_npz
        return read_npz(path, task=kw["task"])
    from pocket.train.data.images import read_folder
    return read_folder(path, image_size=kw["image_size"], channels=kw["channels"])


# ---- splitting -------------------------------------------------------------------------------

def split_indices(y: np.ndarray, fraction: float, rng: np.random.Generator,
                  stratify: bool) -> tuple[np.ndarray, np.ndarray]:
    """Hold out `fraction` of the samples: returns (kept, held_out) index arrays, both shuffled.

    Stratified: each class contributes its share, rounded so the total is round(N * fraction);
    the leftover units go to the classes with the largest fractional share (ties at random).
    """
    n = int(y.shape[0])
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    n_out = int(round(n * fraction))
    if fraction > 0 and n_out == 0 and n > 1:
        n_out = 1  # a requested split should not come back empty just because N is small
    if not stratify:
        perm = rng.permutation(n)
        return perm[n_out:], perm[:n_out]
    classes, inv = np.unique(y, return_inverse=True)
    counts = np.bincount(inv, minlength=len(classes))
    exact = counts * (n_out / n)
    take = np.floor(exact).astype(np.int64)
    leftover = n_out - int(take.sum())
    order = np.lexsort((rng.random(len(classes)), -(exact - take)))
    take[order[:leftover]] += 1
    held = [rng.permutation(np.flatnonzero(inv == k))[: take[k]] for k in range(len(classes))]
    held_out = rng.permutation(np.concatenate(held)) if held else np.zeros(0, np.int64)
    mask = np.ones(n, bool)
    mask[held_out] = False
    kept = rng.permutation(np.flatnonzero(mask))
    return kept, held_out


def _finish(name: str, raw: Raw, *, val_fraction: float, test_fraction: float, seed: int,
            limit: int | None, extra: dict | None = None) -> Dataset:
    check_finite(raw.x, name, "x")
    check_finite(raw.y, name, "y")
    if raw.x_test is not None:
        check_finite(raw.x_test, name, "x_test")
        check_finite(raw.y_test, name, "y_test")
    stratify = raw.task in ("classification", "embedding")
    x, y = raw.x, raw.y
    extra = extra or {}
    if "test" in extra:
        x_test, y_test = extra["test"]
    elif raw.x_test is None:
        keep, test = split_indices(y, test_fraction, np.random.default_rng(TEST_SPLIT_SEED), stratify)
        x_test, y_test = x[test], y[test]
        x, y = x[keep], y[keep]
    else:
        x_test, y_test = raw.x_test, raw.y_test
    if "val" in extra:
        keep, val = np.arange(len(y)), None
        x_val, y_val = extra["val"]
    else:
        keep, val = split_indices(y, val_fraction, np.random.default_rng(seed), stratify)
        x_val, y_val = x[val], y[val]
    parts = {"train": (x[keep], y[keep]), "val": (x_val, y_val), "test": (x_test, y_test)}
    if limit is not None:
        parts = {k: (a[:limit], b[:limit]) for k, (a, b) in parts.items()}
    if parts["train"][1].shape[0] == 0:
        raise DataError(f"{name}: no training samples left after the validation/test split; "
                        "add data or lower val_fraction/test_fraction")
    if raw.kind == "image":
        prep, norm_x = image_preprocessing(parts["train"][0], raw.pixel_max)
    elif raw.kind == "tokens":  # ids stay whole numbers (float32 like every Split's x)
        prep, norm_x = {"layout": "tokens"}, lambda a: a.astype(np.float32)
    else:
        prep, norm_x = table_preprocessing(parts["train"][0], raw.columns)
    norm_y = _class_ids
    if raw.task == "regression":
        prep["target"], norm_y = target_preprocessing(parts["train"][1], raw.target_name or "y")
    splits = {k: Split(np.ascontiguousarray(norm_x(a)), np.ascontiguousarray(norm_y(b)))
              for k, (a, b) in parts.items()}
    y_train = splits["train"].y
    num_outputs = len(raw.labels) if raw.labels is not None else (
        1 if y_train.ndim == 1 else int(y_train.shape[1]))
    return Dataset(name=name, task=raw.task, labels=raw.labels, input_shape=tuple(raw.x.shape[1:]),
                   preprocessing=prep, num_outputs=num_outputs, **splits)


def _class_ids(y: np.ndarray) -> np.ndarray:
    return y.astype(np.int64)


# ---- normalization ---------------------------------------------------------------------------

def _moments(x: np.ndarray, scale: float = 1.0, chunk: int = 4096) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and population std of x * scale, in float64.

    x (N, K, ...) -> mean, std (K,): reduced over every axis but 1 (channels or columns).
    uint8 pixels use exact integer sums (fast on CIFAR-sized arrays). Anything else takes two
    chunked passes (mean, then squared deviations), so a large offset does not cancel the
    variance and no full float64 copy is ever made.
    """
    k = x.shape[1]
    count = x.size // k if k else 0
    if count == 0:
        return np.zeros(k), np.ones(k)
    axes = (0, *range(2, x.ndim))
    if x.dtype == np.uint8:
        total = x.sum(axis=axes, dtype=np.int64)
        sq = sum(np.square(x[i:i + chunk], dtype=np.uint16).sum(axis=axes, dtype=np.int64)
                 for i in range(0, x.shape[0], chunk))
        mean = total * (scale / count)
        # integer sums are exact, so E[x^2] - E[x]^2 loses nothing here
        var = np.array([(count * int(q) - int(t) ** 2) / count**2 for t, q in zip(total, sq)]) * scale**2
    else:
        def chunks():
            for i in range(0, x.shape[0], chunk):
                yield x[i:i + chunk].astype(np.float64) * scale

        mean = sum(part.sum(axis=axes) for part in chunks()) / count
        shape = (1, k) + (1,) * (x.ndim - 2)
        var = sum(np.square(part - mean.reshape(shape)).sum(axis=axes) for part in chunks()) / count
    std = np.sqrt(var)
    # NOTE: a constant channel/column would divide by zero; std 1 leaves it centred at 0.
    std[std < 1e-12] = 1.0
    return mean, std


def image_preprocessing(x_train: np.ndarray, pixel_max: float
                        ) -> tuple[dict, Callable[[np.ndarray], np.ndarray]]:
    # x_train (N, C, H, W) raw pixels -> preprocessing dict and x -> (x * scale - mean) / std
    scale = 1.0 / float(pixel_max)
    mean, std = _moments(x_train, scale)
    prep = {"layout": "NCHW", "channels": int(x_train.shape[1]),
            "image_size": [int(x_train.shape[2]), int(x_train.shape[3])],
            "pixel_max": float(pixel_max), "scale": scale,
            "mean": [float(v) for v in mean], "std": [float(v) for v in std]}
    m = mean.astype(np.float32)[:, None, None]
    s = std.astype(np.float32)[:, None, None]

    def apply(x: np.ndarray) -> np.ndarray:
        # in place, to keep one float32 copy of the split and no float64 temporaries
        out = x.astype(np.float32)
        out *= np.float32(scale)
        out -= m
        out /= s
        return out

    return prep, apply


def table_preprocessing(x_train: np.ndarray, columns: list[str] | None
                        ) -> tuple[dict, Callable[[np.ndarray], np.ndarray]]:
    # x_train (N, F) raw values -> preprocessing dict and x -> (x - mean) / std
    mean, std = _moments(x_train)
    names = columns or [f"f{i}" for i in range(x_train.shape[1])]
    prep = {"layout": "NC", "columns": list(names),
            "mean": [float(v) for v in mean], "std": [float(v) for v in std]}
    return prep, lambda x: ((x.astype(np.float64) - mean) / std).astype(np.float32)


def target_preprocessing(y_train: np.ndarray, name: str
                         ) -> tuple[dict, Callable[[np.ndarray], np.ndarray]]:
    # y (N,) or (N, T) -> standardized float32; the device reports out * std + mean
    mean, std = _moments(y_train.reshape(y_train.shape[0], -1))
    if y_train.ndim == 1:
        info = {"name": name, "mean": float(mean[0]), "std": float(std[0])}
        return info, lambda y: ((y.astype(np.float64) - mean[0]) / std[0]).astype(np.float32)
    info = {"name": name, "mean": [float(v) for v in mean], "std": [float(v) for v in std]}
    return info, lambda y: ((y.astype(np.float64) - mean) / std).astype(np.float32)


def check_finite(a: np.ndarray | None, where: str, what: str) -> None:
    if a is None or not np.issubdtype(a.dtype, np.floating):
        return
    bad = ~np.isfinite(a)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise DataError(f"{where}: {what} holds NaN or inf (first at index {first}); "
                        "clean or drop those samples")


def encode_classes(values: np.ndarray, labels: list[str] | None = None
                   ) -> tuple[np.ndarray, list[str]]:
    """Map class values to ids 0..K-1 in sorted order; names print integers without '.0'."""
    uniq, ids = np.unique(values, return_inverse=True)
    if labels is None:
        labels = [_label_text(v) for v in uniq]
    return ids.astype(np.int64).reshape(-1), labels


def _label_text(v) -> str:
    if isinstance(v, float | np.floating) and float(v).is_integer():
        return str(int(v))
    return str(v)


# ---- downloads -------------------------------------------------------------------------------

def resolve_cache_dir(cache_dir: str | None) -> str:
    if cache_dir:
        return os.path.expanduser(cache_dir)
    return os.environ.get("POCKET_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "pocket")


def _fetch(url: str, dest: str) -> None:
    """Stream `url` into the file `dest`. Tests replace this to stay offline."""
    with urllib.request.urlopen(url, timeout=60) as resp, open(dest, "wb") as f:
        shutil.copyfileobj(resp, f, length=1 << 20)


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def download(urls: Sequence[str], dest: str, sha256: str, hint: str) -> str:
    """Make `dest` a verified copy of the file at one of `urls` (mirrors, tried in order).

    A cached file is re-hashed on every use, so a corrupted cache is replaced, never trusted.
    The download goes to a temporary file in the same folder and is renamed only once its
    SHA-256 matches; anything else is deleted.
    """
    if os.path.exists(dest):
        if sha256_of(dest) == sha256:
            return dest
        print(f"pocket: cached {dest} has the wrong SHA-256; downloading it again", file=sys.stderr)
        os.remove(dest)
    folder = os.path.dirname(dest) or "."
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create the cache folder {folder} ({e}); "
                        "set POCKET_CACHE or cache_dir to a writable folder") from None
    problems = []
    for url in urls:
        fd, part = tempfile.mkstemp(prefix=os.path.basename(dest) + ".", suffix=".part", dir=folder)
        os.close(fd)
        try:
            print(f"pocket: downloading {url} -> {dest}", file=sys.stderr)
            _fetch(url, part)
            got = sha256_of(part)
            if got == sha256:
                os.replace(part, dest)
                return dest
            problems.append(f"{url} has SHA-256 {got}, expected {sha256}")
        except Exception as e:  # noqa: BLE001 - any network/IO failure means: try the next mirror
            problems.append(f"{url}: {e}")
        finally:
            if os.path.exists(part):
                os.remove(part)
    raise DataError(f"could not download {os.path.basename(dest)} ({'; '.join(problems)}); "
                    f"check the network, or download it yourself and use {hint}")
