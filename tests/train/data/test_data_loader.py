"""Loader: (seed, epoch) determinism, drop_last, prefetch thread, augmentations."""

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from pocket.train.data import DataError, Loader, Split
from pocket.train.data.augment import random_crop, random_flip


def image_split(n=37, c=2, h=6, w=7):
    # every sample distinct and not left-right symmetric, so flips and crops are detectable
    x = np.arange(n * c * h * w, dtype=np.float32).reshape(n, c, h, w) + 1
    return Split(x, np.arange(n, dtype=np.int64))


def collect(loader, epoch):
    return list(loader.epoch(epoch))


def loader_threads():
    return [t for t in threading.enumerate() if t.name.startswith("pocket-loader")]


@pytest.mark.parametrize("drop_last, n_batches, last", [(True, 3, 10), (False, 4, 7)])
def test_batches_cover_split(drop_last, n_batches, last):
    split = image_split()
    ld = Loader(split, 10, shuffle=True, drop_last=drop_last, seed=3)
    batches = collect(ld, 0)
    assert len(ld) == n_batches == len(batches)
    assert batches[-1][0].shape[0] == last
    ids = np.concatenate([y for _, y in batches])
    assert len(set(ids.tolist())) == len(ids) == (30 if drop_last else 37)
    assert not np.array_equal(ids, np.sort(ids))  # actually shuffled
    for x, y in batches:
        assert x.dtype == np.float32 and x.flags.c_contiguous
        np.testing.assert_array_equal(x, split.x[y])  # inputs stay paired with their targets


def test_no_shuffle_is_in_order_and_tabular_ok():
    split = Split(np.random.default_rng(0).normal(size=(9, 3)), np.arange(9.0).astype(np.float32))
    batches = collect(Loader(split, 4, shuffle=False, drop_last=False, seed=0), 0)
    np.testing.assert_array_equal(np.concatenate([y for _, y in batches]), np.arange(9))
    assert all(x.dtype == np.float32 for x, _ in batches)  # float64 input is cast


def test_epoch_replays_exactly():
    split = image_split()
    kw = dict(shuffle=True, drop_last=False, seed=11, augment=["crop", "flip"])
    a = Loader(split, 8, **kw)
    b = Loader(split, 8, prefetch=0, **kw)  # a fresh loader, as after a resume, without a thread
    for e in (0, 5):
        for (xa, ya), (xb, yb) in zip(collect(a, e), collect(b, e), strict=True):
            np.testing.assert_array_equal(xa, xb)
            np.testing.assert_array_equal(ya, yb)
    ya0 = np.concatenate([y for _, y in collect(a, 0)])
    ya1 = np.concatenate([y for _, y in collect(a, 1)])
    yc0 = np.concatenate([y for _, y in collect(Loader(split, 8, **{**kw, "seed": 12}), 0)])
    assert not np.array_equal(ya0, ya1) and not np.array_equal(ya0, yc0)


def test_split_is_never_modified():
    split = image_split()
    before = split.x.copy()
    for x, _ in Loader(split, 5, shuffle=False, drop_last=False, seed=0, augment=["flip", "crop"]).epoch(0):
        x += 1000
    np.testing.assert_array_equal(split.x, before)


def test_flip_augmentation():
    split = image_split(n=64)
    ld = Loader(split, 16, shuffle=False, drop_last=False, seed=1, augment=["flip"])
    flipped = 0
    for x, y in ld.epoch(0):
        for xi, i in zip(x, y):
            orig = split.x[i]
            if np.array_equal(xi, orig[..., ::-1]):
                flipped += 1
            else:
                np.testing.assert_array_equal(xi, orig)
    assert 16 <= flipped <= 48  # p = 0.5 over 64 samples


def test_crop_augmentation_is_a_window_of_the_padded_image():
    split = image_split(n=40, h=5, w=6)
    ld = Loader(split, 16, shuffle=True, drop_last=False, seed=2, augment=["crop"])
    offsets = set()
    for x, y in ld.epoch(3):
        for xi, i in zip(x, y):
            padded = np.zeros((2, 5 + 8, 6 + 8), np.float32)
            padded[:, 4:9, 4:10] = split.x[i]
            hits = [(dy, dx) for dy in range(9) for dx in range(9)
                    if np.array_equal(padded[:, dy:dy + 5, dx:dx + 6], xi)]
            assert hits, "crop is not a shifted window of the zero-padded image"
            offsets.add(hits[0])
    assert len(offsets) > 10  # offsets are random per sample


def test_augment_functions_direct():
    x = image_split(n=8).x
    rng = np.random.default_rng(0)
    assert random_crop(x, rng).shape == x.shape and random_flip(x, rng).shape == x.shape
    # pad 0 crop is the identity
    np.testing.assert_array_equal(random_crop(x, rng, pad=0), x)


@pytest.mark.parametrize("kw, needle", [
    (dict(batch_size=0), "batch size"),
    (dict(augment=["rotate"]), "unknown augmentation"),
    (dict(seed=-1), "seed"),
    (dict(prefetch=-1), "prefetch"),
])
def test_loader_argument_errors(kw, needle):
    args = dict(batch_size=4, shuffle=True, drop_last=False, seed=0) | kw
    with pytest.raises(DataError, match=needle):
        Loader(image_split(), args.pop("batch_size"), **args)


def test_augment_needs_images():
    with pytest.raises(DataError, match="need images"):
        Loader(Split(np.zeros((4, 3), np.float32), np.zeros(4)), 2, shuffle=False, drop_last=False,
               seed=0, augment=["flip"])


class ExplodingX:
    """Array stand-in that fails on the third batch, as a broken disk read would."""

    def __init__(self, x):
        self.x, self.shape, self.calls = x, x.shape, 0

    def __getitem__(self, idx):
        self.calls += 1
        if self.calls == 3:
            raise OSError("disk went away")
        return self.x[idx]


def test_prefetch_propagates_exceptions_and_stops_thread():
    split = image_split()
    bad = Split(ExplodingX(split.x), split.y)
    got = []
    with pytest.raises(OSError, match="disk went away"):
        for batch in Loader(bad, 5, shuffle=True, drop_last=False, seed=0, prefetch=2).epoch(0):
            got.append(batch)
    assert len(got) == 2
    assert not loader_threads()


def test_early_stop_ends_the_thread():
    ld = Loader(image_split(n=400), 2, shuffle=True, drop_last=False, seed=0, prefetch=3)
    it = ld.epoch(0)
    next(it)
    assert loader_threads()
    it.close()
    assert not loader_threads()
    for _ in ld.epoch(1):
        break  # a plain `break` drops the generator; CPython closes it at once
    assert not loader_threads()


def test_abandoned_epoch_does_not_block_interpreter_exit():
    code = textwrap.dedent("""
        import numpy as np
        from pocket.train.data import Loader, Split
        split = Split(np.zeros((1000, 1, 4, 4), np.float32), np.zeros(1000, np.int64))
        keep = Loader(split, 1, shuffle=True, drop_last=False, seed=0, prefetch=1).epoch(0)
        next(keep)
        print("ok")
    """)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, env=env)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
