"""The Python API for embedding a model in an application (what `pocket infer` uses too).

    import pocket.infer as pi

    model = pi.load("model.int8.bin")           # mmap, validate, plan (compiles or loads kernels)
    x = model.preprocess(raw)                   # raw digits 0..16, a PNG path, a PIL image...
    x = model.preprocess(img, pixels=True)      # or 0..255 pixels, whatever the data's range
    pred = model.predict(x)                     # one sample (C, H, W) or a batch (N, C, H, W)
    pred.labels[0], pred.probs[0].max()         # '7', 0.98
    y = model.run(x)                            # raw outputs: a new array each call
    model.run(x, out=y)                         # ... or written into an array of yours

`Model.engine` is the underlying `Engine`; its `run(x)` returns a view into the engine's arena
that the next call overwrites (no copy, no allocation: the fastest path, for those who copy or
consume the result before the next call).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pocket.formats.sniff import check_file
from pocket.infer.engine import Engine, EngineError
from pocket.infer.inputs import (
    IMAGE_SUFFIXES,
    InputError,
    decode_image,
    load_inputs,
    normalize_columns,
    normalize_pixels,
    normalize_raw,
)


@dataclass
class Prediction:
    """What `Model.predict` returns, always with a batch axis (one row for one sample).

    Classification: `labels[i]` is sample i's best class name, `indices[i]` its index,
    `probs[i]` the probability of every class (softmax of the outputs unless the model ends in
    one). Regression: `values[i]` in the target's units (the trainer's standardization undone);
    `labels`, `indices` and `probs` are None. `raw` is the model's output, a copy of its own."""

    raw: np.ndarray
    labels: list[str] | None = None
    indices: np.ndarray | None = None
    probs: np.ndarray | None = None
    values: np.ndarray | None = None
    class_names: list[str] | None = field(default=None, repr=False)  # every class, by index

    def __len__(self) -> int:
        return int(self.raw.shape[0])

    def top(self, k: int = 3) -> list[list[tuple[str, float]]]:
        """The k most likely (label, probability) of every sample."""
        if self.probs is None:
            raise EngineError("top(): a regression model has no classes")
        names = self.class_names or [str(i) for i in range(self.probs.shape[1])]
        order = np.argsort(-self.probs, axis=1, kind="stable")[:, :max(1, k)]
        return [[(names[j], float(p[j])) for j in row] for p, row in zip(self.probs, order)]



def load(path: str | os.PathLike, *, threads: int | None = None, max_batch: int = 64,
         interpret_first: bool = False) -> Model:
    """Open a `.bin` model. `interpret_first` answers the first calls from the NumPy reference
    interpreter while Numba would still be starting (for short-lived processes)."""
    return Model(path, threads=threads, max_batch=max_batch, interpret_first=interpret_first)


class Model:
    """One loaded model: preprocessing, running and decoding its outputs. See the module doc."""

    def __init__(self, path: str | os.PathLike, *, threads: int | None = None, max_batch: int = 64,
                 interpret_first: bool = False):
        check_file(path, "model file")
        self.path = os.fspath(path)
        self.engine = Engine(path, threads=threads, max_batch=max_batch,
                             interpret_first=interpret_first)

    # ---- what the model says about itself

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.engine.input_shape

    @property
    def labels(self) -> list[str] | None:
        return self.engine.labels

    @property
    def task(self) -> str:
        return self.engine.task or "classification"

    @property
    def preprocessing(self) -> dict:
        return self.engine.preprocessing

    @property
    def metadata(self) -> dict:
        return self.engine.metadata

    # ---- preprocessing

    def preprocess(self, x, *, pixels: bool = False) -> np.ndarray:
        """Raw data -> model-ready float32, with the preprocessing stored in the model.

        - a path (str or Path) to an image, a CSV, an .npy/.npz or a folder: read as
          `pocket infer` reads it -> a batch (N, *input_shape);
        - a PIL image -> one sample;
        - image models, a NumPy array of one sample (C, H, W) or a batch (N, C, H, W); grey
          models also take (H, W), (N, H, W) and flat (H*W,) / (N, H*W) rows (scikit-learn's
          digits). Values are in the training data's own units, 0..pixel_max (0..16 for the
          digits set, 0..255 for MNIST and CIFAR-10), or with pixels=True 0..255 image
          pixels (as decoded from an image file) whatever the training data's range was;
        - table models, raw feature values (F,) or (N, F) in the model's column order, or a
          dict {column: value or values} by name.
        One sample in gives one sample out; a batch gives a batch."""
        pre = self.preprocessing
        shape = tuple(self.input_shape)
        if isinstance(x, str | Path):
            batches = load_inputs([str(x)], shape, pre, batch_size=self.engine.max_batch)
            return np.concatenate([b.x for b in batches])
        if type(x).__module__.startswith("PIL."):
            c, h, w = shape if len(shape) == 3 else (0, 0, 0)
            if len(shape) != 3:
                raise InputError(f"an image was given but the model takes inputs of shape {shape}")
            return normalize_pixels(decode_image(x, c, h, w, "<PIL image>"), pre)
        if isinstance(x, dict):
            return self._columns(x)
        a = np.asarray(x)
        if a.dtype.kind not in "biuf":
            raise InputError(f"preprocess() takes numbers, got an array of {a.dtype}")
        if len(shape) == 1:
            if pixels:
                raise InputError("pixels=True is for image models; this one takes table rows")
            if a.ndim not in (1, 2) or a.shape[-1] != shape[0]:
                raise InputError(f"the model takes {shape[0]} features: give (F,) or (N, F), "
                                 f"got {a.shape}")
            return normalize_columns(a, pre)
        one, batch = self._image_layout(a)
        if pixels:
            out = normalize_pixels(batch.astype(np.float64), pre)
        else:
            out = normalize_raw(batch, pre)
        return out[0] if one else out

    def _image_layout(self, a: np.ndarray) -> tuple[bool, np.ndarray]:
        """a -> (one sample?, a as (N, C, H, W))."""
        shape = tuple(self.input_shape)
        c, h, w = shape if len(shape) == 3 else (None, None, None)
        if a.shape == shape:
            return True, a[None]
        if a.shape[1:] == shape:
            return False, a
        if c == 1 and a.shape == (h, w):
            return True, a[None, None]
        if c == 1 and a.ndim == 3 and a.shape[1:] == (h, w):
            return False, a[:, None]
        size = int(np.prod(shape))
        if a.ndim in (1, 2) and a.shape[-1] == size:
            return a.ndim == 1, a.reshape(-1, *shape)
        raise InputError(f"preprocess(): an array of shape {a.shape} does not fit the model's "
                         f"input {shape}; give one sample {shape} or a batch (N, *{shape})")

    def _columns(self, row: dict) -> np.ndarray:
        columns = self.preprocessing.get("columns")
        if not columns:
            raise InputError("the model names no columns (preprocessing.columns); give an array")
        missing = [c for c in columns if c not in row]
        if missing:
            raise InputError(f"missing column(s) {', '.join(map(repr, missing))}; the model "
                             f"takes {', '.join(columns)}")
        a = np.stack([np.asarray(row[c], np.float64) for c in columns], axis=-1)
        return normalize_columns(a, self.preprocessing)

    # ---- running

    def _batch(self, x) -> tuple[bool, np.ndarray]:
        if isinstance(x, str | Path) or type(x).__module__.startswith("PIL."):
            x = self.preprocess(x)
        a = np.asarray(x)
        shape = tuple(self.input_shape)
        if a.shape == shape:
            return True, np.ascontiguousarray(a[None], self.engine.input_dtype)
        if a.ndim != len(shape) + 1 or a.shape[1:] != shape:
            raise InputError(f"the model takes one sample {shape} or a batch (N, *{shape}), got "
                             f"{a.shape}; preprocess() turns raw data into that")
        return False, np.ascontiguousarray(a, self.engine.input_dtype)

    def run(self, x, *, out: np.ndarray | None = None) -> np.ndarray:
        """Model-ready x, one sample or a batch -> the raw output, as a new array (one sample:
        without the batch axis), or written into `out` (same shape, float32) and returned."""
        one, a = self._batch(x)
        y = self.engine.run(a)  # a view of the arena: copied out below, before any other call
        if one:
            y = y[0]
        if out is None:
            return y.copy()
        if not isinstance(out, np.ndarray) or out.shape != y.shape or out.dtype != y.dtype:
            raise EngineError(f"out must be a {y.dtype} array of shape {y.shape}, got "
                              f"{getattr(out, 'dtype', type(out).__name__)} "
                              f"{getattr(out, 'shape', '')}")
        np.copyto(out, y)
        return out

    def predict(self, x) -> Prediction:
        """Model-ready x (or a path / PIL image, preprocessed first) -> Prediction."""
        _, a = self._batch(x)
        y = np.array(self.engine.run(a), copy=True)
        return decode(y, self)

    # ---- lifetime

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def decode(y: np.ndarray, model: Model | Engine) -> Prediction:
    """Raw outputs (N, ...) -> Prediction, with the labels and target scaling in the model."""
    eng = model.engine if isinstance(model, Model) else model
    flat = y.reshape(y.shape[0], -1)
    if (eng.task or "classification") != "classification":
        # The trainer standardizes regression targets and records how, with the preprocessing.
        target = eng.metadata.get("target") or eng.preprocessing.get("target") or {}
        values = flat.astype(np.float64) * np.asarray(target.get("std", 1.0), np.float64) \
            + np.asarray(target.get("mean", 0.0), np.float64)
        return Prediction(raw=y, values=values)
    probs = flat.astype(np.float64) if _ends_in_softmax(eng) else softmax(flat)
    names = eng.labels or [str(i) for i in range(probs.shape[1])]
    idx = probs.argmax(axis=1)
    labels = [names[j] if j < len(names) else str(j) for j in idx]
    return Prediction(raw=y, labels=labels, indices=idx, probs=probs, class_names=list(names))


def softmax(z: np.ndarray) -> np.ndarray:
    # z (N, K) -> (N, K) float64, rows summing to 1
    z = z.astype(np.float64)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _ends_in_softmax(eng: Engine) -> bool:
    out = eng.output_names[0]
    return any(n.op == "softmax" and n.outputs[0] == out for n in eng.graph.nodes)


__all__ = ["IMAGE_SUFFIXES", "Model", "Prediction", "decode", "load", "softmax"]
