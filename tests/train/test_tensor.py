import numpy as np
import pytest

from pocket.train import backend
from pocket.train import functional as F
from pocket.train.memory import get_tracker
from pocket.train.tensor import Tensor, no_grad


def test_smoke_backward_of_a_polynomial(xp):
    x = Tensor(xp.asarray([1.0, -2.0, 3.0]), requires_grad=True)
    y = (x * x * 3.0 + x * 2.0 - 1.0).sum()
    y.backward()
    np.testing.assert_allclose(backend.to_numpy(x.grad), [8.0, -10.0, 20.0])


def test_gradients_accumulate_with_plus_equals(xp):
    x = Tensor(xp.asarray([2.0]), requires_grad=True)
    (x * 3.0).sum().backward()
    (x * x).sum().backward()
    np.testing.assert_allclose(backend.to_numpy(x.grad), [3.0 + 4.0])


def test_diamond_graph_sums_both_paths(xp):
    x = Tensor(xp.asarray([1.5, -0.5]), requires_grad=True)
    a = x * 2.0
    b = a * a  # uses a twice
    c = a.exp()
    (b + c).sum().backward()
    av = 2 * np.array([1.5, -0.5])
    np.testing.assert_allclose(backend.to_numpy(x.grad), (2 * av + np.exp(av)) * 2)


def test_deep_chain_does_not_recurse(xp):
    x = Tensor(xp.asarray([1.0]), requires_grad=True)
    y = x
    for _ in range(5000):
        y = y * 1.0
    y.sum().backward()
    np.testing.assert_allclose(backend.to_numpy(x.grad), [1.0])


def test_broadcast_gradients_reduce_to_input_shape(xp):
    a = Tensor(xp.ones((3, 1, 4)), requires_grad=True)
    b = Tensor(xp.ones((2, 1)), requires_grad=True)
    (a * b).sum().backward()
    assert a.grad.shape == (3, 1, 4) and float(a.grad[0, 0, 0]) == 2.0
    assert b.grad.shape == (2, 1) and float(b.grad[0, 0]) == 12.0


def test_no_grad_records_nothing(xp):
    x = Tensor(xp.ones(3), requires_grad=True)
    with no_grad():
        y = F.relu(x * 2.0)
    assert y.node is None and not y.requires_grad


def test_saved_arrays_are_freed_after_backward(xp):
    x = Tensor(xp.asarray(np.random.default_rng(0).standard_normal((4, 5))), requires_grad=True)
    h = F.relu(x)
    out = (F.tanh(h) * h).sum()
    nodes = [h.node, out.node]
    assert h.saved_arrays()  # relu keeps its output
    out.backward()
    assert all(n.saved is None for n in nodes)
    assert get_tracker().live["activations"] == 0
    with pytest.raises(RuntimeError, match="already freed"):
        out.backward()


def test_retain_graph_allows_a_second_backward(xp):
    x = Tensor(xp.asarray([3.0]), requires_grad=True)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(backend.to_numpy(x.grad), [12.0])


def test_float32_is_kept_through_scalar_ops(xp):
    x = Tensor(xp.ones(3, dtype=np.float32), requires_grad=True)
    y = (x * 0.5 + 1.0) / 3.0
    assert y.dtype == np.float32
    y.sum().backward()
    assert x.grad.dtype == np.float32


def test_tensor_api_names(xp):
    t = Tensor(xp.arange(24, dtype=np.float64).reshape(2, 3, 4))
    assert t.shape == (2, 3, 4) and t.ndim == 3 and t.dtype == np.float64
    assert t.reshape(6, 4).shape == (6, 4)
    assert t.transpose(2, 0, 1).shape == (4, 2, 3)
    assert t.T.shape == (4, 3, 2)
    assert t[1, :, ::2].shape == (3, 2)
    assert float(t.max().item()) == 23.0
    assert float(t.mean().item()) == 11.5
    assert t.astype(np.float32).dtype == np.float32
    assert isinstance(t.numpy(), np.ndarray)
    assert t.detach().node is None
