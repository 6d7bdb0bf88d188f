"""fp16 storage of saved activations against the plain fp32 run as the oracle."""

import numpy as np

from pocket.train import backend, models
from pocket.train import functional as F
from pocket.train.memory import reset_tracker
from pocket.train.tensor import Tensor, saved_activations_fp16, set_saved_activations_fp16


def _step(fp16: bool):
    rng = np.random.default_rng(0)
    model = models.cnn((3, 16, 16), 10, channels=[8, 16], rng=rng)
    x = Tensor(rng.standard_normal((16, 3, 16, 16)).astype(np.float32))
    y = rng.integers(0, 10, 16)
    tracker = reset_tracker()
    with saved_activations_fp16(fp16):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
    return (loss.item(), {n: p.grad for n, p in model.named_parameters()},
            tracker.peak["activations"], tracker.live["activations"])


def test_same_loss_close_gradients_half_the_bytes():
    loss32, g32, peak32, _ = _step(False)
    loss16, g16, peak16, live16 = _step(True)
    assert loss16 == loss32  # the forward itself is untouched
    for name, g in g32.items():
        assert g16[name].dtype == np.float32
        err = np.abs(g16[name] - g).max() / np.abs(g).max()
        assert err < 5e-3, name  # fp16 keeps ~11 bits: relative rounding 2**-11
    # int32 maxpool indices stay as they are, so a bit more than half remains
    assert 0.45 * peak32 <= peak16 <= 0.6 * peak32, (peak32, peak16)
    assert live16 == 0


def test_masks_ints_and_parameters_are_not_converted():
    x = Tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), requires_grad=True)
    w = models.nn.Linear(4, 2, rng=np.random.default_rng(0))
    with saved_activations_fp16(True):
        h = F.relu(x)
        out = w(h)
        ce = F.cross_entropy(out, np.array([0, 1, 1]))
        i64 = Tensor(np.arange(3, dtype=np.float64), requires_grad=True) * 2.0
    assert h.node._saved[0].dtype == np.float16
    assert out.node._saved[1] is w.weight.data  # the parameter, not a copy
    assert ce.node._saved[1].dtype == np.int64
    assert i64.node._saved[0].dtype == np.float64
    assert h.node.saved[0].dtype == np.float32


def test_shared_activation_is_stored_once():
    tracker = reset_tracker()
    x = Tensor(np.ones((10, 10), np.float32), requires_grad=True)
    with saved_activations_fp16(True):
        h = F.relu(x)
        y = h * h  # relu and both sides of mul keep the same array
    assert tracker.live["activations"] == 200  # one float16 copy
    y.sum().backward()
    assert tracker.live["activations"] == 0
    np.testing.assert_array_equal(x.grad, 2 * np.ones((10, 10)))


def test_setter_returns_previous_value():
    assert set_saved_activations_fp16(True) is False
    assert set_saved_activations_fp16(False) is True


def test_any_array_module(xp):
    x = Tensor(xp.linspace(-1, 1, 12, dtype=xp.float32).reshape(3, 4), requires_grad=True)
    with saved_activations_fp16(True):
        F.sum(F.relu(x) * 3.0).backward()
    expect = (np.linspace(-1, 1, 12) > 0).reshape(3, 4) * 3.0
    np.testing.assert_array_equal(backend.to_numpy(x.grad), expect)
