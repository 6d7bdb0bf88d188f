"""folder:PATH, one subfolder of image files per class, written here with Pillow."""

import numpy as np
import pytest

from pocket.train.data import DataError, load_dataset

Image = pytest.importorskip("PIL.Image")

COLOURS = {"cat": (200, 30, 10), "dog": (10, 180, 60), "fox": (40, 50, 220)}


def make_folder(root, n=5, size=(6, 4), gray_extra=0, odd_size=None):
    """Solid-colour PNGs, `size` (W, H) as Pillow takes it; optionally some grayscale ones."""
    for name, rgb in COLOURS.items():
        (root / name).mkdir(parents=True)
        for i in range(n):
            Image.new("RGB", size, rgb).save(root / name / f"{i}.png")
        for i in range(gray_extra):
            Image.new("L", size, 77).save(root / name / f"g{i}.png")
    if odd_size:
        Image.new("RGB", odd_size, COLOURS["dog"]).save(root / "dog" / "big.png")
    (root / "cat" / "notes.txt").write_text("not an image")
    return root


def raw_pixels(split, prep):
    m = np.array(prep["mean"])[:, None, None]
    s = np.array(prep["std"])[:, None, None]
    return (split.x * s + m) / prep["scale"]


def test_folder_rgb_labels_and_pixels(tmp_path):
    root = make_folder(tmp_path / "pets", odd_size=(12, 8))
    d = load_dataset(f"folder:{root}", test_fraction=0.2, val_fraction=0.0)
    assert d.labels == ["cat", "dog", "fox"] and d.num_outputs == 3
    assert d.input_shape == (3, 4, 6)  # (C, H, W) from the first image's 6x4
    assert d.preprocessing["image_size"] == [4, 6] and d.preprocessing["pixel_max"] == 255
    assert len(d.train) + len(d.test) == 16
    for split in (d.train, d.test):
        px = raw_pixels(split, d.preprocessing)
        for img, k in zip(px, split.y):
            want = np.array(COLOURS[d.labels[k]], float)[:, None, None]
            np.testing.assert_allclose(img, np.broadcast_to(want, img.shape), atol=1e-3)


def test_folder_grayscale_by_majority_and_argument(tmp_path):
    root = make_folder(tmp_path / "p", n=1, gray_extra=2)
    d = load_dataset(f"folder:{root}", test_fraction=0.0, val_fraction=0.0)
    assert d.preprocessing["channels"] == 1 and d.input_shape == (1, 4, 6)
    px = raw_pixels(d.train, d.preprocessing)
    # Pillow's RGB -> L: (299 R + 587 G + 114 B) / 1000
    allowed = [77] + [round((299 * r + 587 * g + 114 * b) / 1000) for r, g, b in COLOURS.values()]
    assert all(np.min(np.abs(allowed - np.round(v))) <= 1 for v in px[:, 0, 0, 0])
    rgb = load_dataset(f"folder:{root}", channels=3, test_fraction=0.0, val_fraction=0.0)
    assert rgb.input_shape == (3, 4, 6)


def test_folder_image_size_argument(tmp_path):
    root = make_folder(tmp_path / "p", n=2)
    d = load_dataset(f"folder:{root}", image_size=(10, 12), test_fraction=0.0)
    assert d.input_shape == (3, 10, 12) and d.train.x.shape[2:] == (10, 12)
    d = load_dataset(f"folder:{root}", image_size=5, test_fraction=0.0)
    assert d.input_shape == (3, 5, 5)


def test_folder_errors(tmp_path):
    root = make_folder(tmp_path / "p", n=2)
    (root / "dog" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    with pytest.raises(DataError, match=r"broken\.png: cannot decode"):
        load_dataset(f"folder:{root}")
    (root / "dog" / "broken.png").unlink()
    (root / "empty").mkdir()
    with pytest.raises(DataError, match=r"empty: no image files"):
        load_dataset(f"folder:{root}")
    one = tmp_path / "one"
    (one / "only").mkdir(parents=True)
    with pytest.raises(DataError, match="at least two"):
        load_dataset(f"folder:{one}")
    with pytest.raises(DataError, match="not a folder"):
        load_dataset(f"folder:{tmp_path / 'missing'}")
    with pytest.raises(DataError, match="channels"):
        load_dataset(f"folder:{root}", channels=2)
