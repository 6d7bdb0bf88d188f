"""conv1d, pool1d and global pooling over time in train: float64 gradcheck on odd shapes, and
the same numbers as torch.nn.functional in float64 (forward and gradients) where torch is."""

import numpy as np
import pytest

from pocket.train import functional_seqconv as F1
from pocket.train.gradcheck import gradcheck
from pocket.train.tensor import Tensor


def _arr(xp, rng, *shape):
    return xp.asarray(rng.standard_normal(shape))


CONV1D = [
    # (x shape, w shape, stride, padding, dilation, groups)
    ((1, 3, 7), (4, 3, 3), 1, 0, 1, 1),
    ((2, 2, 9), (3, 2, 3), 2, 1, 1, 1),
    ((1, 2, 8), (2, 2, 3), 1, [4, 0], 2, 1),  # causal, dilated
    ((2, 4, 6), (6, 2, 2), 1, [1, 2], 1, 2),  # asymmetric, grouped
    ((1, 3, 5), (3, 1, 3), 1, [2, 0], 1, 3),  # depthwise causal
    ((2, 3, 4), (2, 3, 1), 3, 0, 1, 1),  # 1x1, stride 3
]


@pytest.mark.parametrize("case", CONV1D, ids=[str(i) for i in range(len(CONV1D))])
def test_conv1d_gradcheck(xp, rng, case):
    xs, ws, s, p, d, g = case
    x, w, b = _arr(xp, rng, *xs), _arr(xp, rng, *ws), _arr(xp, rng, ws[0])
    gradcheck(lambda x, w, b: F1.conv1d(x, w, b, s, p, d, g), [x, w, b])


def test_conv1d_without_bias_and_pad1d(rng):
    gradcheck(lambda x, w: F1.conv1d(x, w, None, 1, [3, 1]), [_arr(np, rng, 1, 2, 5),
                                                              _arr(np, rng, 3, 2, 2)])
    gradcheck(lambda x: F1.pad1d(x, 2, 1) * 1.5, [_arr(np, rng, 2, 3, 4)])


@pytest.mark.parametrize("k,s,p", [(2, None, 0), (3, 2, 1), (3, 1, 0)])
def test_maxpool1d_gradcheck(xp, rng, k, s, p):
    # distinct values so the max is unique and finite differences are well defined
    x = xp.asarray(rng.permutation(2 * 3 * 9).reshape(2, 3, 9) * 0.1)
    gradcheck(lambda x: F1.maxpool1d(x, k, s, p), [x], eps=1e-3)


@pytest.mark.parametrize("k,s,p,inc", [(2, None, 0, True), (3, 2, 1, True), (3, 2, 1, False)])
def test_avgpool1d_gradcheck(xp, rng, k, s, p, inc):
    gradcheck(lambda x: F1.avgpool1d(x, k, s, p, inc), [_arr(xp, rng, 2, 2, 8)])


def test_global_pools_gradcheck(xp, rng):
    gradcheck(lambda x: F1.global_avgpool1d(x), [_arr(xp, rng, 2, 3, 5)])
    x = xp.asarray(rng.permutation(2 * 3 * 5).reshape(2, 3, 5) * 0.1)
    gradcheck(lambda x: F1.global_maxpool1d(x), [x], eps=1e-3)


def test_bad_shapes_are_clear(rng):
    with pytest.raises(ValueError, match=r"conv1d wants x \(N, C, L\)"):
        F1.conv1d(np.zeros((2, 3)), np.zeros((1, 3, 1)))
    with pytest.raises(ValueError, match=r"padding must be an int or \[left, right\]"):
        F1.conv1d(np.zeros((1, 3, 4)), np.zeros((1, 3, 1)), padding=[1, 2, 3])
    with pytest.raises(ValueError, match="does not fit weight"):
        F1.conv1d(np.zeros((1, 3, 4)), np.zeros((1, 2, 1)))


# --------------------------------------------------------------------------- against torch


def _torch():
    return pytest.importorskip("torch")


def _vs_torch(ours, theirs, arrays, atol=1e-6):
    """Forward and every input's gradient (under the same random output weights) in float64."""
    torch = _torch()
    ts = [Tensor(a.copy(), requires_grad=True) for a in arrays]
    y = ours(*ts)
    gw = np.random.default_rng(5).standard_normal(y.shape)
    (y * Tensor(gw)).sum().backward()
    tt = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]
    yt = theirs(*tt)
    (yt * torch.tensor(gw)).sum().backward()
    np.testing.assert_allclose(y.data, yt.detach().numpy(), rtol=0, atol=atol)
    for t, u in zip(ts, tt):
        np.testing.assert_allclose(t.grad, u.grad.numpy(), rtol=0, atol=atol)


@pytest.mark.parametrize("case", CONV1D, ids=[str(i) for i in range(len(CONV1D))])
def test_conv1d_matches_torch(rng, case):
    torch = _torch()
    xs, ws, s, p, d, g = case
    left, right = F1.pads1d(p)

    def theirs(x, w, b):
        return torch.nn.functional.conv1d(torch.nn.functional.pad(x, (left, right)), w, b, s, 0,
                                          d, g)

    _vs_torch(lambda x, w, b: F1.conv1d(x, w, b, s, p, d, g), theirs,
              [rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0])])


def test_causal_conv1d_layer_matches_torch_and_is_causal(rng):
    torch = _torch()
    from pocket.train import nn

    m = nn.Conv1d(3, 4, 3, dilation=2, causal=True, rng=rng)
    x = rng.standard_normal((2, 3, 10))
    w, b = m.weight.data.astype(np.float64), m.bias.data.astype(np.float64)
    want = torch.nn.functional.conv1d(torch.nn.functional.pad(torch.tensor(x), (4, 0)),
                                      torch.tensor(w), torch.tensor(b), dilation=2).numpy()
    got = F1.conv1d(Tensor(x), Tensor(w), Tensor(b), m.stride, m.padding, m.dilation).data
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    # a change at step 6 moves no output before step 6
    x2 = x.copy()
    x2[:, :, 6] += 1.0
    got2 = F1.conv1d(Tensor(x2), Tensor(w), Tensor(b), m.stride, m.padding, m.dilation).data
    np.testing.assert_array_equal(got2[:, :, :6], got[:, :, :6])
    assert np.abs(got2[:, :, 6] - got[:, :, 6]).max() > 0


@pytest.mark.parametrize("k,s,p", [(2, None, 0), (3, 2, 1), (4, 3, 2)])
def test_maxpool1d_matches_torch(rng, k, s, p):
    torch = _torch()
    x = rng.permutation(2 * 3 * 11).reshape(2, 3, 11) * 0.1
    _vs_torch(lambda x: F1.maxpool1d(x, k, s, p),
              lambda x: torch.nn.functional.max_pool1d(x, k, s, p), [x])


@pytest.mark.parametrize("k,s,p,inc", [(2, None, 0, True), (3, 2, 1, True), (3, 2, 1, False),
                                       (5, 1, 2, False)])
def test_avgpool1d_matches_torch(rng, k, s, p, inc):
    torch = _torch()
    _vs_torch(lambda x: F1.avgpool1d(x, k, s, p, inc),
              lambda x: torch.nn.functional.avg_pool1d(x, k, s, p, count_include_pad=inc),
              [rng.standard_normal((2, 3, 11))])


def test_global_pools_match_torch(rng):
    _torch()
    _vs_torch(F1.global_avgpool1d, lambda x: x.mean(dim=2), [rng.standard_normal((2, 3, 7))])
    x = rng.permutation(2 * 3 * 7).reshape(2, 3, 7) * 0.1
    _vs_torch(F1.global_maxpool1d, lambda x: x.amax(dim=2), [x])
