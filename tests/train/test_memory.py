import numpy as np

from pocket.train import functional as F
from pocket.train import nn, optim
from pocket.train.memory import get_tracker, reset_tracker
from pocket.train.tensor import Tensor


def test_categories_are_exact_and_activations_drop_to_zero():
    tracker = reset_tracker()
    rng = np.random.default_rng(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, rng=rng), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 4 * 4, 10, rng=rng))
    n_params = sum(p.data.nbytes for p in model.parameters())
    assert tracker.live["parameters"] == n_params
    opt = optim.SGD(model, lr=0.1, momentum=0.9)
    x = Tensor(rng.standard_normal((4, 3, 8, 8)).astype(np.float32))
    loss = F.cross_entropy(model(x), np.array([1, 2, 3, 4]))
    assert tracker.live["activations"] > 0
    loss.backward()
    assert tracker.live["activations"] == 0
    assert tracker.peak["activations"] > 0
    assert tracker.live["gradients"] == n_params
    opt.step()
    assert tracker.live["optimizer_state"] == n_params
    model.zero_grad()
    assert tracker.live["gradients"] == 0
    rep = tracker.report()
    assert rep["parameters"]["live"] == n_params and "activations" in rep["table"]


def test_an_array_saved_twice_counts_once():
    tracker = get_tracker()
    before = tracker.live["activations"]
    x = Tensor(np.ones((10, 10), np.float32), requires_grad=True)
    h = F.relu(x)
    y = h * h  # mul saves h's array for both sides
    assert tracker.live["activations"] - before == 400
    y.sum().backward()
    assert tracker.live["activations"] == before


def test_graph_dropped_without_backward_frees_its_activations():
    tracker = get_tracker()
    before = tracker.live["activations"]
    x = Tensor(np.ones((50, 50), np.float32), requires_grad=True)
    y = F.tanh(F.relu(x))
    assert tracker.live["activations"] > before
    del y
    assert tracker.live["activations"] == before
