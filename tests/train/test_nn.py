import numpy as np
import pytest

from pocket.train import backend, nn
from pocket.train.nn import StateDictError
from pocket.train.tensor import Tensor


def small_net(seed=0):
    rng = np.random.default_rng(seed)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, rng=rng), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 3 * 3, 5, rng=rng))


def test_names_in_registration_order():
    m = small_net()
    assert [n for n, _ in m.named_parameters()] == [
        "0.weight", "0.bias", "1.weight", "1.bias", "5.weight", "5.bias"]
    assert [n for n, _ in m.named_buffers()] == [
        "1.running_mean", "1.running_var", "1.num_batches_tracked"]
    ops = [mod.op for _, mod in m.named_modules()]
    assert ops == [None, "conv2d", "batchnorm", "relu", "maxpool2d", "flatten", "linear"]
    conv = m[0]
    assert (conv.stride, conv.padding, conv.dilation, conv.groups) == ((1, 1), (1, 1), (1, 1), 1)


def test_state_dict_round_trip_and_strict_errors():
    a, b = small_net(0), small_net(1)
    x = Tensor(np.random.default_rng(2).standard_normal((2, 1, 6, 6)).astype(np.float32))
    a(x)  # moves the running stats
    b.load_state_dict(a.state_dict())
    a.eval()
    b.eval()
    np.testing.assert_array_equal(a(x).numpy(), b(x).numpy())
    assert int(b[1].num_batches_tracked) == 1
    sd = a.state_dict()
    sd["extra"] = np.zeros(1)
    del sd["0.bias"]
    with pytest.raises(StateDictError, match=r"missing \['0.bias'\].*unexpected \['extra'\]"):
        b.load_state_dict(sd)
    sd = a.state_dict()
    sd["5.weight"] = np.zeros((5, 7), np.float32)
    with pytest.raises(StateDictError, match="5.weight"):
        b.load_state_dict(sd)


def test_train_eval_switches_batchnorm_and_dropout():
    m = nn.Sequential(nn.BatchNorm1d(3), nn.Dropout(0.5))
    x = Tensor(np.random.default_rng(0).standard_normal((8, 3)).astype(np.float32))
    m.eval()
    assert not m[0].training and not m[1].training
    np.testing.assert_allclose(m(x).numpy(), x.numpy() / np.sqrt(1 + 1e-5), rtol=1e-6)


def test_residual_block_shapes_and_projection():
    rng = np.random.default_rng(0)
    same = nn.ResidualBlock(4, 4, rng=rng)
    down = nn.ResidualBlock(4, 8, stride=2, rng=rng)
    assert same.shortcut is None and down.shortcut is not None
    x = Tensor(rng.standard_normal((2, 4, 7, 7)).astype(np.float32), requires_grad=True)
    y = down(same(x))
    assert y.shape == (2, 8, 4, 4)
    y.sum().backward()
    assert all(p.grad is not None for p in down.parameters())
    assert (y.numpy() >= 0).all()


def test_init_is_reproducible_and_has_the_right_scale():
    from pocket.train import init

    a = init.kaiming_normal((256, 128, 3, 3), np.random.default_rng(5))
    b = init.kaiming_normal((256, 128, 3, 3), np.random.default_rng(5))
    np.testing.assert_array_equal(a, b)
    assert abs(a.std() - np.sqrt(2 / (128 * 9))) < 1e-3
    u = init.xavier_uniform((300, 200), np.random.default_rng(0))
    assert abs(u.max() - np.sqrt(6 / 500)) < 1e-3
    backend.manual_seed(3)
    s = backend.get_rng_state()
    c = nn.Linear(4, 3)
    backend.set_rng_state(s)
    d = nn.Linear(4, 3)
    np.testing.assert_array_equal(c.weight.numpy(), d.weight.numpy())


def test_to_cpu_keeps_values():
    m = small_net()
    w = m[0].weight.numpy().copy()
    m.to("cpu")
    np.testing.assert_array_equal(m[0].weight.numpy(), w)
