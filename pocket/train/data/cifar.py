"""CIFAR-10 from its binary version (cifar-10-binary.tar.gz), never the pickled Python version.

Each batch file (cifar-10-batches-bin/data_batch_{1..5}.bin, test_batch.bin) is a run of
3073-byte records: 1 label byte (0-9), then 3072 pixel bytes, the 32x32 red plane, then green,
then blue, each row-major, i.e. already CHW. https://www.cs.toronto.edu/~kriz/cifar.html
"""

from __future__ import annotations

import os
import tarfile
import zlib

import numpy as np

from pocket.train.data.sources import DataError, Raw, download

# SHA-256 and size (170052171 bytes) from TensorFlow Datasets'
# tensorflow_datasets/url_checksums/cifar10.txt, which downloads this same binary archive.
URL = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
SHA256 = "c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd"
ARCHIVE = "cifar-10-binary.tar.gz"
FOLDER = "cifar-10-batches-bin"
TRAIN = [f"data_batch_{i}.bin" for i in range(1, 6)]
TEST = ["test_batch.bin"]
LABELS = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
RECORD = 1 + 3 * 32 * 32


def parse_records(data: bytes, where: str) -> tuple[np.ndarray, np.ndarray]:
    # data: n * 3073 bytes -> x (n, 3, 32, 32) uint8, y (n,) int64
    if len(data) == 0 or len(data) % RECORD:
        raise DataError(f"{where}: {len(data)} bytes is not a whole number of {RECORD}-byte records "
                        "(truncated record); download the CIFAR-10 binary archive again")
    rec = np.frombuffer(data, np.uint8).reshape(-1, RECORD)
    y = rec[:, 0].astype(np.int64)
    if y.max() > 9:
        raise DataError(f"{where}: label {int(y.max())} is outside 0-9; this is not a CIFAR-10 batch")
    return rec[:, 1:].reshape(-1, 3, 32, 32), y


def _from_folder(folder: str) -> dict[str, bytes]:
    out = {}
    for name in TRAIN + TEST:
        p = os.path.join(folder, name)
        try:
            with open(p, "rb") as f:
                out[name] = f.read()
        except FileNotFoundError:
            raise DataError(f"{p}: file not found; the folder needs {', '.join(TRAIN + TEST)}") from None
        except OSError as e:
            raise DataError(f"{p}: cannot read ({e})") from None
    return out


def _from_archive(path: str) -> dict[str, bytes]:
    # Members are read in memory rather than extracted: no files written, no path traversal.
    out = {}
    try:
        with tarfile.open(path, "r:*") as tar:
            for member in tar:
                base = os.path.basename(member.name)
                if member.isfile() and base in TRAIN + TEST:
                    out[base] = tar.extractfile(member).read()
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
        raise DataError(f"{path}: corrupt or truncated archive ({e}); download it again") from None
    missing = [n for n in TRAIN + TEST if n not in out]
    if missing:
        raise DataError(f"{path}: archive lacks {', '.join(missing)}; "
                        f"use the binary version {ARCHIVE}, not the Python or MATLAB one")
    return out


def read_cifar10(path: str | None, cache_dir: str) -> Raw:
    if path is None:
        origin = download([URL], os.path.join(cache_dir, "cifar10", ARCHIVE), SHA256, "cifar10:PATH")
    elif os.path.isfile(path):
        origin = path
    elif os.path.isdir(os.path.join(path, FOLDER)):
        origin = os.path.join(path, FOLDER)
    elif os.path.isfile(os.path.join(path, ARCHIVE)):
        origin = os.path.join(path, ARCHIVE)
    elif os.path.isdir(path):
        origin = path
    else:
        raise DataError(f"cifar10:{path}: no such file or folder; give {ARCHIVE} or the folder "
                        f"holding {FOLDER}/")
    files = _from_folder(origin) if os.path.isdir(origin) else _from_archive(origin)
    train = [parse_records(files[n], os.path.join(origin, n)) for n in TRAIN]
    x_test, y_test = parse_records(files[TEST[0]], os.path.join(origin, TEST[0]))
    return Raw(kind="image", task="classification",
               x=np.concatenate([x for x, _ in train]), y=np.concatenate([y for _, y in train]),
               labels=LABELS, pixel_max=255.0, x_test=x_test, y_test=y_test)
