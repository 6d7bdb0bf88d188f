"""Write a few images of the digits test split as 8-bit PNG files, named by their label.

Used by the main job to feed `pocket infer` real image files, decoded on the device with the
preprocessing stored in the model.
"""

import sys
from pathlib import Path

import numpy as np
from PIL import Image

from pocket.train.data import load_dataset


def main(out: str, count: int) -> None:
    ds = load_dataset("digits")
    pre = ds.preprocessing
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.png"):
        old.unlink()
    mean = np.asarray(pre["mean"], np.float32).reshape(-1, 1, 1)
    std = np.asarray(pre["std"], np.float32).reshape(-1, 1, 1)
    for i in range(count):
        x, y = ds.test.x[i], int(ds.test.y[i])
        raw = (x * std + mean) / pre["scale"]  # back to the dataset's 0..pixel_max units
        pixels = np.clip(np.rint(raw[0] / pre["pixel_max"] * 255), 0, 255).astype(np.uint8)
        Image.fromarray(pixels, mode="L").save(folder / f"test{i:02d}_label{y}.png")
    print(f"wrote {count} PNG files to {folder}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 6)
