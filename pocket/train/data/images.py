"""Image sources that need the [data] extra: the bundled digits set and image folders."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from pocket.train.data.sources import DATA_EXTRA, DataError, Raw

EXTENSIONS = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".ppm", ".pgm", ".tif", ".tiff"}
GRAY_MODES = {"1", "L", "LA", "I", "I;16", "F"}


def read_digits() -> Raw:
    """scikit-learn's bundled copy of the UCI handwritten digits: 1797 8x8 images, values 0..16."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise DataError(f"the digits dataset needs scikit-learn; {DATA_EXTRA}") from None
    d = load_digits()
    x = d.images.astype(np.uint8)[:, None]  # (1797, 8, 8) -> (1797, 1, 8, 8)
    return Raw(kind="image", task="classification", x=x, y=d.target.astype(np.int64),
               labels=[str(i) for i in range(10)], pixel_max=16.0)


def _pil():
    try:
        from PIL import Image
    except ImportError:
        raise DataError(f"image folders need Pillow; {DATA_EXTRA}") from None
    return Image


def read_folder(path: str, *, image_size: int | Sequence[int] | None = None,
                channels: int | None = None) -> Raw:
    """One subfolder per class (sorted names are the labels), image files inside.

    Images are resized to `image_size` (H, W), or else to the first image's size, and converted
    to grayscale or RGB: `channels` 1 or 3, or else whichever most images already are.
    """
    Image = _pil()
    if not os.path.isdir(path):
        raise DataError(f"folder:{path}: not a folder; give a folder with one subfolder per class")
    if channels not in (None, 1, 3):
        raise DataError(f"channels must be 1 (grayscale) or 3 (RGB), not {channels!r}")
    classes = sorted(e.name for e in os.scandir(path) if e.is_dir() and not e.name.startswith("."))
    if len(classes) < 2:
        raise DataError(f"{path}: found {len(classes)} class subfolders; a classifier needs at "
                        "least two, one subfolder of images per class")
    files, ids = [], []
    for k, name in enumerate(classes):
        found = sorted(os.path.join(path, name, f) for f in os.listdir(os.path.join(path, name))
                       if os.path.splitext(f)[1].lower() in EXTENSIONS and not f.startswith("."))
        if not found:
            raise DataError(f"{os.path.join(path, name)}: no image files ({', '.join(sorted(EXTENSIONS))})")
        files += found
        ids += [k] * len(found)
    # Pass 1 reads headers only (Pillow decodes lazily) to settle the common size and mode, so
    # pass 2 can decode straight into one preallocated array.
    heads = [_open(Image, f, decode=False) for f in files]
    if channels is None:
        gray = sum(mode in GRAY_MODES for mode, _ in heads)
        channels = 1 if 2 * gray > len(heads) else 3
    size = _size(image_size) if image_size is not None else heads[0][1]
    mode = "L" if channels == 1 else "RGB"
    x = np.empty((len(files), channels, size[0], size[1]), np.uint8)
    for i, f in enumerate(files):
        a = _open(Image, f, decode=True, mode=mode, size=size)
        x[i] = a[None] if a.ndim == 2 else a.transpose(2, 0, 1)
    return Raw(kind="image", task="classification", x=x, y=np.array(ids, np.int64),
               labels=classes, pixel_max=255.0)


def _open(Image, f: str, *, decode: bool, mode: str = "", size: tuple[int, int] = (0, 0)):
    """decode=False: (mode, (H, W)) from the header; True: (H, W[, 3]) uint8 pixels."""
    try:
        with Image.open(f) as im:
            if not decode:
                return im.mode, (im.height, im.width)
            im = im.convert(mode)
            if (im.height, im.width) != size:
                im = im.resize((size[1], size[0]), Image.Resampling.BILINEAR)
            return np.asarray(im, np.uint8)
    except Exception as e:  # noqa: BLE001 - Pillow raises many types for a bad file
        raise DataError(f"{f}: cannot decode image ({e}); fix or remove the file") from None


def _size(image_size: int | Sequence[int]) -> tuple[int, int]:
    hw = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    if len(hw) != 2 or not all(isinstance(v, int | np.integer) and v > 0 for v in hw):
        raise DataError(f"image_size must be a positive int or (height, width), not {image_size!r}")
    return int(hw[0]), int(hw[1])
