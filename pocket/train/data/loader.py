"""Batches over a Split: seeded shuffle, drop_last, augmentation, background prefetch.

Everything random in an epoch comes from SeedSequence((seed, epoch)), split into one stream for
the order and one for augmentation, so `epoch(e)` yields the same batches whenever it is called:
a resumed run replays epoch e exactly without having to store any RNG state.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import numpy as np

from pocket.train.data.augment import AUGMENTATIONS
from pocket.train.data.sources import DataError, Split

_DONE = object()


class _Failure:
    def __init__(self, exc: BaseException):
        self.exc = exc


class Loader:
    def __init__(self, split: Split, batch_size: int, *, shuffle: bool, drop_last: bool, seed: int,
                 augment: list[str] | None = None, prefetch: int = 2):
        if not isinstance(batch_size, int | np.integer) or batch_size < 1:
            raise DataError(f"batch size must be a positive integer, got {batch_size!r}")
        if not isinstance(seed, int | np.integer) or seed < 0:
            raise DataError(f"seed must be a non-negative integer, got {seed!r}")
        if prefetch < 0:
            raise DataError(f"prefetch must be 0 (off) or a positive queue size, got {prefetch}")
        augment = list(augment or [])
        unknown = [a for a in augment if a not in AUGMENTATIONS]
        if unknown:
            raise DataError(f"unknown augmentation {unknown}; use any of {sorted(AUGMENTATIONS)}")
        if augment and len(split.x.shape) != 4:
            raise DataError(f"augmentations {augment} need images (N, C, H, W), but x has shape "
                            f"{tuple(split.x.shape)}; remove them for tabular data")
        if split.x.shape[0] != split.y.shape[0]:
            raise DataError(f"split has {split.x.shape[0]} inputs but {split.y.shape[0]} targets")
        self.split = split
        self.batch_size = int(batch_size)
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = int(seed)
        self.augment = augment
        self.prefetch = int(prefetch)

    def __len__(self) -> int:
        n = self.split.x.shape[0]
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _batches(self, epoch: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        order_ss, augment_ss = np.random.SeedSequence((self.seed, epoch)).spawn(2)
        n, b = self.split.x.shape[0], self.batch_size
        order = np.random.default_rng(order_ss).permutation(n) if self.shuffle else np.arange(n)
        rng = np.random.default_rng(augment_ss)
        for i in range(len(self)):
            idx = order[i * b:(i + 1) * b]
            # Fancy indexing copies, so augmentations and callers never touch the split itself.
            x, y = self.split.x[idx], self.split.y[idx]
            for name in self.augment:
                x = AUGMENTATIONS[name](x, rng)
            yield np.ascontiguousarray(x, dtype=np.float32), np.ascontiguousarray(y)

    def epoch(self, epoch: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yield (x (B, ...) float32, y (B, ...)) batches of epoch `epoch`."""
        if not isinstance(epoch, int | np.integer) or epoch < 0:
            raise DataError(f"epoch must be a non-negative integer, got {epoch!r}")
        if self.prefetch == 0:
            yield from self._batches(epoch)
            return
        q: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()
        # daemon: a consumer that never finishes its epoch must not keep the interpreter alive.
        t = threading.Thread(target=_produce, args=(self._batches(epoch), q, stop), daemon=True,
                             name=f"pocket-loader-epoch{epoch}")
        t.start()
        try:
            while True:
                item = q.get()
                if item is _DONE:
                    return
                if isinstance(item, _Failure):
                    raise item.exc
                yield item
        finally:
            # Reached on exhaustion, on an error, and when the consumer stops early (close / GC).
            stop.set()
            while t.is_alive():
                try:
                    q.get_nowait()  # unblock a producer stuck on a full queue
                except queue.Empty:
                    pass
                t.join(0.01)


def _produce(batches: Iterator, q: queue.Queue, stop: threading.Event) -> None:
    try:
        for item in batches:
            if not _put(q, item, stop):
                return
        _put(q, _DONE, stop)
    except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which re-raises it
        _put(q, _Failure(exc), stop)


def _put(q: queue.Queue, item, stop: threading.Event) -> bool:
    while not stop.is_set():
        try:
            q.put(item, timeout=0.05)
            return True
        except queue.Full:
            continue
    return False
