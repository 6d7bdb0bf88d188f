import numpy as np
import pytest

from pocket.train import backend, nn, optim
from pocket.train import functional as F
from pocket.train.tensor import Tensor, no_grad


def test_mlp_learns_digits_to_95_percent():
    datasets = pytest.importorskip("sklearn.datasets")
    d = datasets.load_digits()
    x = (d.data / 16.0).astype(np.float32)
    y = d.target
    order = np.random.default_rng(0).permutation(len(y))
    x, y = x[order], y[order]
    xtr, ytr, xte, yte = x[:1400], y[:1400], x[1400:], y[1400:]
    backend.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = optim.Adam(model, lr=3e-3)
    rng = np.random.default_rng(1)
    for _epoch in range(15):
        perm = rng.permutation(len(ytr))
        for i in range(0, len(perm), 64):
            idx = perm[i:i + 64]
            loss = F.cross_entropy(model(Tensor(xtr[idx])), ytr[idx])
            model.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    with no_grad():
        acc = (model(Tensor(xte)).numpy().argmax(1) == yte).mean()
    assert acc >= 0.95, f"held-out accuracy {acc:.3f}"
    # NOTE: no wall-clock bound here: "< 10 s" failed at 11.3 s on two cores shared by seven
    # test runs while nothing was wrong. Training speed is measured by bench/, not asserted.


def test_small_cnn_fits_digits():
    datasets = pytest.importorskip("sklearn.datasets")
    d = datasets.load_digits()
    x = (d.data / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    y = d.target
    backend.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 16, 10))
    opt = optim.SGD(model, lr=0.1, momentum=0.9)
    rng = np.random.default_rng(0)
    for _epoch in range(3):
        perm = rng.permutation(1400)
        for i in range(0, 1400, 50):
            idx = perm[i:i + 50]
            loss = F.cross_entropy(model(Tensor(x[idx])), y[idx])
            model.zero_grad()
            loss.backward()
            opt.step()
    model.eval()
    with no_grad():
        acc = (model(Tensor(x[1400:])).numpy().argmax(1) == y[1400:]).mean()
    assert acc >= 0.9, f"held-out accuracy {acc:.3f}"
