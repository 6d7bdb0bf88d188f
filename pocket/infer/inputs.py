"""Turn what a user points `pocket infer` at into model-ready batches.

- `.npy` / `.npz`: already preprocessed model inputs, (N, *input_shape) or one sample. The
  header is checked against the file's size before anything is allocated, and object
  (pickled) members are refused.
- image files, or folders of them: decoded with Pillow, converted to the model's channels,
  resized to `preprocessing.image_size`, then raw = pixels / 255 * pixel_max and
  x = (raw * scale - mean[c]) / std[c] (scale 1, mean 0, std 1, pixel_max 255 by default).
  A folder's images run in batches of `batch_size`.
- `.csv` with a header row (read by pocket.formats.csvio, as training reads it): the columns
  named in `preprocessing.columns`, each x = (v - mean[i]) / std[i].
- `-`: standard input, whichever of the above its bytes are (.npy, .npz, an image, CSV text).

Only regular files are opened (a FIFO or device would block the read forever), except `-`.
Every loader returns a list of Batch: `x` float32 (N, *input_shape) and a name per row.
"""

from __future__ import annotations

import io
import math
import os
import stat
import sys
import warnings
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pocket.errors import PocketError
from pocket.formats import csvio
from pocket.formats.sniff import looks_like_onnx


class InputError(PocketError):
    """An input file is missing, unreadable, or does not fit the model."""


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".pgm", ".ppm")
# first bytes -> an image Pillow reads (stdin has no file name to go by)
IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"BM", b"II*\x00",
               b"MM\x00*", b"P5", b"P6", b"P2", b"P3")
NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
STDIN = "-"
DEFAULT_BATCH = 64


@dataclass
class Batch:
    name: str  # the file (or "file:key" for an .npz member)
    x: np.ndarray  # (N, *input_shape) float32
    names: list[str]  # one per row of x


def _rows(name: str, x: np.ndarray) -> Batch:
    n = x.shape[0]
    return Batch(name, x, [name] if n == 1 else [f"{name}[{i}]" for i in range(n)])


def load_inputs(paths: list[str], input_shape: tuple[int, ...], preprocessing: dict | None = None,
                *, batch_size: int | None = None, stdin=None, sep: str | None = None
                ) -> list[Batch]:
    """paths -> one Batch per array file, image, CSV or `batch_size` images of a folder.

    `stdin` is the binary stream `-` reads (sys.stdin.buffer by default); `sep` the CSV
    separator (default: sniffed)."""
    pre = preprocessing or {}
    step = batch_size or DEFAULT_BATCH
    out: list[Batch] = []
    for p in paths:
        if p == STDIN:
            out += _load_stdin(stdin, input_shape, pre, sep)
            continue
        path = Path(p)
        kind = _kind(path)
        if kind == "dir":
            images = sorted(f for f in path.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES
                            and _kind(f) == "file")
            if not images:
                raise InputError(f"folder '{p}' holds no images ({', '.join(IMAGE_SUFFIXES)})")
            for i in range(0, len(images), step):
                chunk = images[i:i + step]
                x = np.stack([load_image(f, input_shape, pre) for f in chunk])
                out.append(Batch(str(path), x, [str(f) for f in chunk]))
        elif path.suffix.lower() == ".npy":
            with open(path, "rb") as f:
                out.append(_rows(str(path), _as_batch(str(path), read_npy(f, str(path)), input_shape)))
        elif path.suffix.lower() == ".npz":
            out += [_rows(k, _as_batch(k, a, input_shape)) for k, a in read_npz(path, str(path))]
        elif path.suffix.lower() == ".csv":
            out.append(_rows(str(path), load_csv(path, input_shape, pre, sep=sep)))
        elif path.suffix.lower() in IMAGE_SUFFIXES:
            out.append(_rows(str(path), load_image(path, input_shape, pre)[None]))
        else:
            raise InputError(f"input '{p}': unknown kind; give .npy, .npz, .csv, an image "
                             f"({', '.join(IMAGE_SUFFIXES)}), a folder of images or - (stdin)")
    return out


def _kind(path: Path) -> str:
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise InputError(f"input '{path}' does not exist") from None
    except OSError as e:
        raise InputError(f"input '{path}': {e.strerror or e}") from None
    if stat.S_ISDIR(mode):
        return "dir"
    if not stat.S_ISREG(mode):
        raise InputError(f"input '{path}' is not a regular file (a FIFO, device or socket); "
                         "give a file, or - and pipe it to standard input")
    return "file"


def _load_stdin(stream, input_shape: tuple[int, ...], pre: dict, sep: str | None) -> list[Batch]:
    stream = stream if stream is not None else sys.stdin.buffer
    if getattr(stream, "isatty", lambda: False)():
        raise InputError("input '-' reads standard input, which is a terminal; pipe a file in: "
                         "pocket infer MODEL - < x.npy")
    data = stream.read()
    name = "<stdin>"
    if not data:
        raise InputError("standard input is empty; pipe an .npy, .npz, image or CSV into '-'")
    if data.startswith(NPY_MAGIC):
        return [_rows(name, _as_batch(name, read_npy(io.BytesIO(data), name), input_shape))]
    if data.startswith(ZIP_MAGIC):
        return [_rows(k, _as_batch(k, a, input_shape)) for k, a in read_npz(io.BytesIO(data), name)]
    if looks_like_onnx(data[:4096], len(data)):
        raise InputError("standard input holds an ONNX model, not an input; give the model as "
                         "MODEL and the inputs after it")
    if data.startswith(IMAGE_MAGIC) or (data[:4] == b"RIFF" and data[8:12] == b"WEBP"):
        return [_rows(name, load_image(io.BytesIO(data), input_shape, pre, name=name)[None])]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError("standard input is neither .npy, .npz, an image nor UTF-8 CSV text") from None
    return [_rows(name, load_csv(text, input_shape, pre, name=name, sep=sep))]


def _as_batch(name: str, a: np.ndarray, input_shape: tuple[int, ...]) -> np.ndarray:
    if tuple(a.shape) == tuple(input_shape):
        a = a[None]
    if tuple(a.shape[1:]) != tuple(input_shape):
        raise InputError(f"'{name}' has shape {tuple(a.shape)}; the model takes "
                         f"(N, {', '.join(map(str, input_shape))}) or one sample {tuple(input_shape)}")
    if a.shape[0] == 0:
        raise InputError(f"'{name}' holds no samples (shape {tuple(a.shape)}); give at least one")
    if a.dtype.kind not in "biuf":
        raise InputError(f"'{name}' holds {a.dtype} values; expected real numbers")
    return np.ascontiguousarray(a, np.float32)


# --------------------------------------------------------------------------- arrays

def _array_header(f, name: str, size: int) -> tuple[tuple[int, ...], np.dtype]:
    """Read an .npy header from f and check that `size` bytes (header included) can hold the
    array it announces, so a forged shape costs nothing."""
    start = f.tell()
    try:
        if f.read(6) != NPY_MAGIC:
            raise InputError(f"'{name}' is not a NumPy .npy array (a pickle or other data); "
                             "save arrays with np.save / np.savez")
        major, minor = f.read(2)
        if (major, minor) == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(f)
        elif (major, minor) == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise InputError(f"'{name}': .npy format version {major}.{minor} is not supported; "
                             "save it with np.save")
    except (ValueError, EOFError, SyntaxError) as e:
        raise InputError(f"'{name}': not a readable .npy array ({e})") from None
    if dtype.hasobject:
        raise InputError(f"'{name}' holds Python objects (a pickled array), which pocket never "
                         "loads; save numeric arrays")
    need = math.prod(shape) * dtype.itemsize
    have = size - (f.tell() - start)
    if need > have:
        raise InputError(f"'{name}': the header announces shape {tuple(shape)} {dtype} "
                         f"({need:,} bytes) but only {max(have, 0):,} bytes follow; the file is "
                         "truncated or corrupt")
    return tuple(shape), dtype


def read_npy(f, name: str) -> np.ndarray:
    """An .npy stream -> the array, its header checked first (see _array_header)."""
    start = f.tell()
    size = f.seek(0, os.SEEK_END) - start
    f.seek(start)
    if size == 0:
        raise InputError(f"'{name}' is empty (0 bytes); give an array saved with np.save")
    _array_header(f, name, size)
    f.seek(start)
    try:
        return np.lib.format.read_array(f, allow_pickle=False)
    except (ValueError, EOFError, OSError) as e:
        raise InputError(f"'{name}': not a readable .npy array ({e})") from None


def read_npz(source, name: str) -> list[tuple[str, np.ndarray]]:
    """An .npz file or stream -> [(name:key, array)]: `x` when present (a training-style npz
    carries labels too), else every array."""
    try:
        with zipfile.ZipFile(source) as zf:
            members = {i.filename.removesuffix(".npy"): i for i in zf.infolist() if not i.is_dir()}
            if not members:
                raise InputError(f"'{name}' holds no arrays")
            keys = ["x"] if "x" in members else list(members)
            out = []
            for k in keys:
                info = members[k]
                with zf.open(info) as m:
                    _array_header(m, f"{name}:{k}", info.file_size)
                with zf.open(info) as m:
                    out.append((f"{name}:{k}", np.lib.format.read_array(m, allow_pickle=False)))
            return out
    except InputError:
        raise
    except FileNotFoundError:
        raise InputError(f"input '{name}' does not exist") from None
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, NotImplementedError) as e:
        raise InputError(f"'{name}' is not a readable .npz archive ({e}); save arrays with "
                         "np.savez") from None


# --------------------------------------------------------------------------- images, CSV

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


def normalize_pixels(pixels: np.ndarray, pre: dict) -> np.ndarray:
    """pixels (..., C, H, W) in 0..255 -> the model's input, per its stored preprocessing."""
    return normalize_raw(pixels / 255.0 * float(pre.get("pixel_max", 255.0)), pre)


def normalize_raw(raw: np.ndarray, pre: dict) -> np.ndarray:
    """raw (..., C, H, W) in the training data's units (0..pixel_max) -> the model's input."""
    c = raw.shape[-3]
    mean = _per_channel(pre, "mean", 0.0, c, "channels").reshape(c, 1, 1)
    std = _per_channel(pre, "std", 1.0, c, "channels").reshape(c, 1, 1)
    return ((np.asarray(raw, np.float64) * float(pre.get("scale", 1.0)) - mean) / std
            ).astype(np.float32)


def normalize_columns(values: np.ndarray, pre: dict) -> np.ndarray:
    """values (..., F) raw table features -> (v - mean) / std, per the stored preprocessing."""
    f = values.shape[-1]
    mean = _per_channel(pre, "mean", 0.0, f, "columns")
    std = _per_channel(pre, "std", 1.0, f, "columns")
    return ((np.asarray(values, np.float64) - mean) / std).astype(np.float32)


def _image_shape(name: str, input_shape: tuple[int, ...], pre: dict) -> tuple[int, int, int]:
    if len(input_shape) != 3:
        raise InputError(f"'{name}' is an image but the model takes inputs of shape "
                         f"{tuple(input_shape)}, not (C, H, W)")
    c, h, w = input_shape
    if c not in (1, 3):
        raise InputError(f"the model takes {c} channels; images give 1 (grey) or 3 (RGB)")
    size = pre.get("image_size") or [h, w]
    if list(size) != [h, w]:
        raise InputError(f"preprocessing.image_size {list(size)} differs from the model's "
                         f"input {h}x{w}")
    return c, h, w


def decode_image(source, c: int, h: int, w: int, name: str):
    """An image file, stream or PIL image -> pixels (C, H, W) float64 in 0..255."""
    try:
        from PIL import Image
    except ImportError:
        raise InputError("reading images needs Pillow: pip install 'pocketnn[images]'") from None
    try:
        with warnings.catch_warnings():
            # NOTE: Pillow only warns between its pixel limit and twice that; one rule for both
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            opened = None if isinstance(source, Image.Image) else Image.open(source)
            try:
                im = (opened or source).convert("L" if c == 1 else "RGB")
                if im.size != (w, h):
                    im = im.resize((w, h), Image.Resampling.BILINEAR)
                pixels = np.asarray(im, np.float64)
            finally:
                if opened is not None:
                    opened.close()
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise InputError(f"image '{name}' is too large for Pillow's pixel limit ({e}); scale it "
                         "down first") from None
    except Exception as e:  # noqa: BLE001 - Pillow's decoders raise many types on bad data
        raise InputError(f"cannot read image '{name}': {e}") from None
    return pixels.reshape(h, w, c).transpose(2, 0, 1)


def load_image(source, input_shape: tuple[int, ...], pre: dict, *, name: str | None = None
               ) -> np.ndarray:
    """One image (path, stream or PIL image) -> (C, H, W) float32 per the model's preprocessing."""
    name = name or str(source)
    c, h, w = _image_shape(name, input_shape, pre)
    return normalize_pixels(decode_image(source, c, h, w, name), pre)


def load_csv(source, input_shape: tuple[int, ...], pre: dict, *, name: str | None = None,
             sep: str | None = None) -> np.ndarray:
    """A CSV (path or text) with a header row -> (N, F) float32 from the model's columns."""
    name = name or str(source)
    columns = pre.get("columns")
    if len(input_shape) != 1:
        raise InputError(f"'{name}' is a CSV but the model takes inputs of shape {tuple(input_shape)}")
    if columns is None:
        raise InputError("the model's metadata names no CSV columns (preprocessing.columns); "
                         "pass an .npy array instead")
    if len(columns) != input_shape[0]:
        raise InputError(f"preprocessing.columns names {len(columns)} columns but the model "
                         f"takes {input_shape[0]} features")
    try:
        table = (csvio.read_table(source, name=name, delimiter=sep) if isinstance(source, Path)
                 else csvio.read_text(source, name=name, delimiter=sep))
    except csvio.CsvError as e:
        raise InputError(str(e)) from None
    if not table.rows:
        raise InputError(f"'{name}' needs a header row and at least one data row")
    missing = [c for c in columns if c not in table.header]
    if missing:
        raise InputError(f"'{name}' has no column(s) {', '.join(map(repr, missing))}; "
                         f"it has {', '.join(table.header)}")
    idx = [table.header.index(c) for c in columns]
    x = np.empty((len(table.rows), len(columns)), np.float64)
    for r, (row, line) in enumerate(zip(table.rows, table.lines)):
        for j, i in enumerate(idx):
            try:
                x[r, j] = float(row[i])
            except (ValueError, IndexError):
                raise InputError(f"'{name}' line {line}, column '{columns[j]}': "
                                 f"not a number") from None
    return normalize_columns(x, pre)


def display_name(path: str) -> str:
    return os.path.basename(path) or path
