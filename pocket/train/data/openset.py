"""The open-set split of the `embedding` task: whole classes held out of training.

An embedding is judged on classes it never saw (a face model meets new faces): the held-out
classes' samples form the test split, and the training and validation splits hold only the
other classes. Class ids are renumbered so the seen classes are 0..K-1 (the training head's
rows) and the held-out ones K.. after them; `labels` keeps every name in that order. Where the
source has an official test set, training reads the seen classes of its training part and the
test split is the held-out classes of its test part.
"""

from __future__ import annotations

import math

import numpy as np

from pocket.train.data.sources import DataError, Raw


def split_classes(raw: Raw, holdout, name: str) -> tuple[Raw, int]:
    """(raw with x/y the seen classes and x_test/y_test the held-out ones, K seen)."""
    if raw.task != "classification" or raw.labels is None:
        raise DataError(f"{name}: task = \"embedding\" needs class labels (digits, mnist, "
                        "cifar10, a folder of images, or a classification csv/npz)")
    labels = list(raw.labels)
    if holdout is None:  # the last 40% of the classes
        held = labels[len(labels) - max(1, math.ceil(0.4 * len(labels))):]
    else:
        held = [str(h) for h in holdout]
        unknown = [h for h in held if h not in labels]
        if unknown:
            raise DataError(f"[data] holdout: no class {', '.join(map(repr, unknown))} in {name}; "
                            f"its classes are {', '.join(labels)}")
    seen = [c for c in labels if c not in held]
    if len(seen) < 2 or len(held) < 2:
        raise DataError(f"[data] holdout: {name} has {len(labels)} classes; hold out at least 2 "
                        "and keep at least 2 for training")
    order = seen + held
    remap = np.array([order.index(c) for c in labels], np.int64)
    k = len(seen)
    x, y = raw.x, remap[raw.y]
    if raw.x_test is not None:
        yt = remap[raw.y_test]
        x_test, y_test = raw.x_test[yt >= k], yt[yt >= k]
    else:
        x_test, y_test = x[y >= k], y[y >= k]
    keep = y < k
    out = Raw(kind=raw.kind, task="embedding", x=x[keep], y=y[keep], labels=order,
              pixel_max=raw.pixel_max, columns=raw.columns, target_name=raw.target_name,
              x_test=x_test, y_test=y_test)
    return out, k
