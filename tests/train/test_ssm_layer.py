"""The state-space layer in training: convolution form == recurrence (float64), gradchecks,
the layers, and tracing."""

from __future__ import annotations

import numpy as np
import pytest
from ssm_params import ssm_params

from pocket.formats.ops_ssm import SSM_PARAMS
from pocket.formats.reference_ssm import ssm_kernel
from pocket.train import functional_ssm as FS
from pocket.train import nn
from pocket.train.gradcheck import gradcheck
from pocket.train.trace import trace


def naive_scan(x, p, bidirectional):
    """The recurrence written out per element, independent of reference_ssm's vectorization."""
    n, length, h = x.shape
    s = p["log_a_re"].shape[1]
    y = np.zeros((n, length, h))
    for b in range(n):
        for c in range(h):
            for k in range(s):
                a = -np.exp(p["log_a_re"][c, k]) + 1j * p["a_im"][c, k]
                dt = np.exp(p["log_dt"][c])
                da = np.exp(dt * a)
                db = (da - 1) / a * (p["b_re"][c, k] + 1j * p["b_im"][c, k])
                for d, order in enumerate([range(length), range(length - 1, -1, -1)]
                                          [:1 + bidirectional]):
                    cc = p["c_re"][d, c, k] + 1j * p["c_im"][d, c, k]
                    state = 0j
                    for t in order:
                        state = da * state + db * x[b, t, c]
                        y[b, t, c] += 2 * (cc * state).real
            y[b, :, c] += p["d"][c] * x[b, :, c]
    return y


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("shape", [(2, 7, 3, 4), (1, 1, 1, 1), (3, 16, 2, 5)])
def test_convolution_equals_recurrence(shape, bidirectional):
    n, length, h, s = shape
    rng = np.random.default_rng(sum(shape))
    p = ssm_params(rng, h, s, bidirectional)
    x = rng.normal(size=(n, length, h))
    conv = FS.ssm(x, *(p[k] for k in SSM_PARAMS), bidirectional=bidirectional).numpy()
    assert conv.dtype == np.float64
    np.testing.assert_allclose(conv, naive_scan(x, p, bidirectional), rtol=0, atol=1e-6)


def test_kernel_is_the_impulse_response():
    rng = np.random.default_rng(1)
    p = ssm_params(rng, 3, 4)
    x = np.zeros((1, 9, 3))
    x[0, 0] = 1.0
    k = ssm_kernel(p, 9)[0]  # (H, L)
    k[:, 0] += p["d"]
    np.testing.assert_allclose(naive_scan(x, p, False)[0].T, k, atol=1e-12)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_ssm_gradcheck(bidirectional):
    rng = np.random.default_rng(2)
    p = ssm_params(rng, 3, 2, bidirectional)
    x = rng.normal(size=(2, 5, 3))
    gradcheck(lambda *t: FS.ssm(*t, bidirectional=bidirectional), [x, *(p[k] for k in SSM_PARAMS)])


def test_float32_forward_is_close_to_float64():
    rng = np.random.default_rng(3)
    p = ssm_params(rng, 4, 3)
    x = rng.normal(size=(2, 20, 4))
    y64 = FS.ssm(x, *(p[k] for k in SSM_PARAMS)).numpy()
    y32 = FS.ssm(x.astype(np.float32), *(p[k].astype(np.float32) for k in SSM_PARAMS)).numpy()
    assert y32.dtype == np.float32
    np.testing.assert_allclose(y32, y64, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("axis", [-1, 1])
def test_glu_gradcheck_and_value(axis):
    rng = np.random.default_rng(4)
    x = rng.normal(size=(2, 4, 6))
    gradcheck(lambda t: FS.glu(t, axis), [x])
    a, b = np.split(x, 2, axis=axis)
    np.testing.assert_allclose(FS.glu(x, axis).numpy(), a / (1 + np.exp(-b)), rtol=1e-12)
    with pytest.raises(ValueError, match="odd"):
        FS.glu(rng.normal(size=(2, 3, 5)), -1)


def test_s4d_init_and_trace():
    layer = nn.S4D(6, 4, bidirectional=True, rng=np.random.default_rng(0))
    # S4D-Lin: A_n = -1/2 + i pi n
    np.testing.assert_allclose(-np.exp(layer.log_a_re.numpy()), -0.5)
    np.testing.assert_allclose(layer.a_im.numpy()[2], np.pi * np.arange(4), rtol=1e-6)
    dt = np.exp(layer.log_dt.numpy())
    assert dt.min() >= 1e-3 - 1e-9 and dt.max() <= 0.1 + 1e-9
    assert layer.c_re.shape == (2, 6, 4)
    y = layer(np.ones((2, 5, 6), np.float32))
    assert y.shape == (2, 5, 6) and y.dtype == np.float32
    g, params = trace(nn.Sequential(layer, nn.GLU()), (5, 6))
    assert [n.op for n in g.nodes] == ["ssm", "glu"]
    assert g.nodes[0].attrs == {"bidirectional": True}
    assert g.validate()["output"].shape == ("N", 5, 3)
    assert set(params) == {f"0.{k}" for k in SSM_PARAMS}


def test_s4d_learns_a_delay():
    """A few Adam steps on y_t = x_{t-2}: the loss must drop (the layer is trainable at all)."""
    from pocket.train import optim

    rng = np.random.default_rng(5)
    layer = nn.S4D(1, 8, rng=rng)
    opt = optim.Adam(layer.parameters(), lr=0.05)
    x = rng.normal(size=(8, 24, 1)).astype(np.float32)
    target = np.zeros_like(x)
    target[:, 2:] = x[:, :-2]
    from pocket.train import functional as F

    losses = []
    for _ in range(60):
        loss = F.mse_loss(layer(x), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.3 * losses[0]


def test_fft_length_and_doubling_powers():
    """The FFT size fits a linear convolution; the kernel's powers ez**l (by doubling) match
    exp(l z) computed directly, for lengths that are and are not powers of two."""
    assert [FS.fft_length(n) for n in (1, 2, 3, 104, 128, 129)] == [1, 4, 8, 256, 256, 512]
    rng = np.random.default_rng(5)
    z = -np.abs(rng.standard_normal((3, 4))) * 0.1 + 1j * rng.standard_normal((3, 4))
    for length in (1, 2, 7, 16, 104):
        want = np.exp(z[:, :, None] * np.arange(length))
        got = FS._doubling_powers(np, np.exp(z), length)
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)
