"""MNIST from its IDX files.

IDX format (http://yann.lecun.com/exdb/mnist/), all integers big-endian:
    bytes 0-1   zero
    byte  2     element type: 0x08 unsigned byte (the only one MNIST uses)
    byte  3     number of dimensions D
    4 * D       dimension sizes, uint32 each
    data        prod(dims) elements, row-major
so the label files start with magic 0x00000801 (D=1: N) and the image files with 0x00000803
(D=3: N, 28, 28). Files may be gzip-compressed (`.gz`), as they are distributed.
"""

from __future__ import annotations

import gzip
import os
import zlib

import numpy as np

from pocket.train.data.sources import DataError, Raw, download

# SHA-256 and sizes from TensorFlow Datasets' tensorflow_datasets/url_checksums/mnist.txt, which
# lists them for the storage.googleapis.com/cvdf-datasets mirror. The second mirror (the one
# torchvision uses) serves the same original files; a mirror whose bytes differ is rejected.
MIRRORS = ("https://storage.googleapis.com/cvdf-datasets/mnist/",
           "https://ossci-datasets.s3.amazonaws.com/mnist/")
FILES = {
    "train-images-idx3-ubyte": "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
    "train-labels-idx1-ubyte": "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    "t10k-images-idx3-ubyte": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "t10k-labels-idx1-ubyte": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
}
LABELS = [str(d) for d in range(10)]


def read_idx(path: str, ndim: int) -> np.ndarray:
    """Read one IDX file of unsigned bytes with `ndim` dimensions, trusting nothing."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"{path}: cannot read or decompress ({e}); download the file again") from None
    magic = 0x0800 | ndim
    if len(data) < 4 or int.from_bytes(data[:4], "big") != magic:
        got = data[:4].hex() if len(data) >= 4 else "too short"
        raise DataError(f"{path}: not an IDX file of {ndim}-D unsigned bytes (magic {got}, "
                        f"expected {magic:08x}); check the file name and download it again")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"{path}: truncated IDX header; download the file again")
    dims = tuple(int(d) for d in np.frombuffer(data, ">u4", ndim, 4))
    expected = header + int(np.prod(dims, dtype=np.int64))
    if len(data) != expected:
        raise DataError(f"{path}: size mismatch, header says {dims} = {expected} bytes but the file "
                        f"has {len(data)}; the file is truncated or corrupt, download it again")
    return np.frombuffer(data, np.uint8, offset=header).reshape(dims)


def _find(folder: str, base: str) -> str:
    # The files circulate as base, base.gz, and with '.idx' instead of '-idx' (e.g. on Kaggle).
    dotted = base.replace("-idx", ".idx")
    for name in (base, base + ".gz", dotted, dotted + ".gz"):
        p = os.path.join(folder, name)
        if os.path.isfile(p):
            return p
    raise DataError(f"{folder}: no {base} or {base}.gz; put the four MNIST IDX files there "
                    "or use plain 'mnist' to download them")


def read_mnist(path: str | None, cache_dir: str) -> Raw:
    if path is None:
        folder = os.path.join(cache_dir, "mnist")
        files = {base: download([m + base + ".gz" for m in MIRRORS],
                                os.path.join(folder, base + ".gz"), sha, "mnist:PATH")
                 for base, sha in FILES.items()}
    else:
        if not os.path.isdir(path):
            raise DataError(f"mnist:{path}: not a folder; give the folder holding the IDX files")
        files = {base: _find(path, base) for base in FILES}
    x_train = _images(files["train-images-idx3-ubyte"])
    y_train = _labels(files["train-labels-idx1-ubyte"], x_train)
    x_test = _images(files["t10k-images-idx3-ubyte"])
    y_test = _labels(files["t10k-labels-idx1-ubyte"], x_test)
    return Raw(kind="image", task="classification", x=x_train, y=y_train, labels=LABELS,
               pixel_max=255.0, x_test=x_test, y_test=y_test)


def _images(path: str) -> np.ndarray:
    x = read_idx(path, 3)
    if x.shape[0] == 0:
        raise DataError(f"{path}: holds no images")
    return x[:, None]  # (N, H, W) -> (N, 1, H, W)


def _labels(path: str, images: np.ndarray) -> np.ndarray:
    y = read_idx(path, 1)
    if y.shape[0] != images.shape[0]:
        raise DataError(f"{path}: {y.shape[0]} labels for {images.shape[0]} images; "
                        "the image and label files do not belong together")
    if y.size and y.max() > 9:
        raise DataError(f"{path}: label {int(y.max())} is not a digit 0-9; this is not MNIST")
    return y.astype(np.int64)
