import math

import numpy as np
import pytest

from pocket.train import optim
from pocket.train.tensor import Parameter


def _params(xp, seed=0):
    rng = np.random.default_rng(seed)
    return [("a", Parameter(xp.asarray(rng.standard_normal((3, 2))))),
            ("b", Parameter(xp.asarray(rng.standard_normal(4))))]


def _grads(xp, step):
    rng = np.random.default_rng(100 + step)
    return [xp.asarray(rng.standard_normal((3, 2))), xp.asarray(rng.standard_normal(4))]


def _run(opt, params, xp, steps):
    for t in range(steps):
        for (_, p), g in zip(params, _grads(xp, t)):
            p.grad = g.copy()
        assert opt.step()


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_matches_the_written_out_rule(xp, nesterov):
    params = _params(xp)
    ref = [np.asarray(p.numpy(), copy=True) for _, p in params]
    opt = optim.SGD(params, lr=0.1, momentum=0.9, nesterov=nesterov, weight_decay=0.01)
    _run(opt, params, xp, 4)
    bufs = [None, None]
    for t in range(4):
        for i, g in enumerate(_grads(np, t)):
            d = g + 0.01 * ref[i]
            bufs[i] = d if bufs[i] is None else 0.9 * bufs[i] + d
            ref[i] = ref[i] - 0.1 * (d + 0.9 * bufs[i] if nesterov else bufs[i])
    for (_, p), r in zip(params, ref):
        np.testing.assert_allclose(p.numpy(), r, rtol=1e-12)


@pytest.mark.parametrize("cls,decoupled", [(optim.Adam, False), (optim.AdamW, True)])
def test_adam_family_matches_the_paper(xp, cls, decoupled):
    params = _params(xp)
    ref = [np.asarray(p.numpy(), copy=True) for _, p in params]
    opt = cls(params, lr=0.01, weight_decay=0.1)
    _run(opt, params, xp, 5)
    m, v = [0, 0], [0, 0]
    for t in range(5):
        for i, g in enumerate(_grads(np, t)):
            if decoupled:
                ref[i] = ref[i] * (1 - 0.01 * 0.1)
            else:
                g = g + 0.1 * ref[i]
            m[i] = 0.9 * m[i] + 0.1 * g
            v[i] = 0.999 * v[i] + 0.001 * g * g
            mh, vh = m[i] / (1 - 0.9 ** (t + 1)), v[i] / (1 - 0.999 ** (t + 1))
            ref[i] = ref[i] - 0.01 * mh / (np.sqrt(vh) + 1e-8)
    for (_, p), r in zip(params, ref):
        np.testing.assert_allclose(p.numpy(), r, rtol=1e-10)


def test_resume_from_state_dict_is_exact(xp):
    p1, p2 = _params(xp), _params(xp)
    o1 = optim.Adam(p1, lr=0.01)
    _run(o1, p1, xp, 3)
    o2 = optim.Adam(p2, lr=0.5)
    for (_, a), (_, b) in zip(p1, p2):
        b.data[...] = a.data
    o2.load_state_dict(o1.state_dict())
    for t in range(3, 6):
        for params, opt in ((p1, o1), (p2, o2)):
            for (_, p), g in zip(params, _grads(xp, t)):
                p.grad = g.copy()
            opt.step()
    for (_, a), (_, b) in zip(p1, p2):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_nonfinite_guard_skips_and_names_the_parameter(xp):
    params = _params(xp)
    before = [p.numpy().copy() for _, p in params]
    opt = optim.SGD(params, lr=0.1)
    params[0][1].grad = xp.zeros((3, 2))
    g = xp.zeros(4)
    g[2] = np.inf
    params[1][1].grad = g
    result = opt.step()
    assert not result and result.nonfinite == ["b"] and "b" in result.reason
    for (_, p), b in zip(params, before):
        np.testing.assert_array_equal(p.numpy(), b)
    assert opt.step_count == 0


def test_clip_grad_norm(xp):
    params = _params(xp)
    params[0][1].grad = xp.full((3, 2), 3.0)
    params[1][1].grad = xp.full(4, 4.0)
    total = optim.clip_grad_norm(params, 1.0)
    assert math.isclose(total, math.sqrt(6 * 9 + 4 * 16))
    after = math.sqrt(sum(float((p.grad**2).sum()) for _, p in params))
    assert math.isclose(after, 1.0, rel_tol=1e-5)


def test_schedules_and_their_state():
    opt = optim.SGD([Parameter(np.zeros(1))], lr=1.0)
    sched = optim.WarmupCosine(opt, total_steps=10, warmup_steps=2, min_lr=0.1)
    lrs = [opt.lr] + [sched.step() for _ in range(10)]
    assert lrs[0] == 0.5 and lrs[1] == 1.0 and lrs[2] == 1.0
    assert math.isclose(lrs[6], 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 4 / 8)))
    assert math.isclose(lrs[10], 0.1)
    opt2 = optim.SGD([Parameter(np.zeros(1))], lr=1.0)
    s2 = optim.WarmupCosine(opt2, total_steps=10)
    s2.load_state_dict(sched.state_dict())
    assert opt2.lr == opt.lr
    step = optim.StepDecay(optim.SGD([Parameter(np.zeros(1))], lr=1.0), step_size=3, gamma=0.5)
    assert [step.step() for _ in range(6)] == [1.0, 1.0, 0.5, 0.5, 0.5, 0.25]


def _adam_naive(x, g, m, v, lr, wd, decoupled, b1, b2, eps, step):
    # the NumPy rule (optim's fallback), one ufunc at a time: kernels_optim.adam_step's twin
    bc1, bc2 = 1 - b1**step, 1 - b2**step
    if wd and decoupled:
        x *= 1 - lr * wd
    elif wd:
        g = g + wd * x
    m *= b1
    m += (1 - b1) * g
    v *= b2
    v += (1 - b2) * (g * g)
    denom = np.sqrt(v / bc2)
    denom += eps
    x -= (lr / bc1) * (m / denom)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("cls", "wd"), [(optim.AdamW, 0.1), (optim.Adam, 0.1), (optim.Adam, 0.0)])
@pytest.mark.parametrize("shape", [(1,), (3, 5), (2, 1, 7)])
def test_fused_cpu_adam_gives_the_numpy_rules_bits(dtype, cls, wd, shape):
    rng = np.random.default_rng(9)
    x0 = rng.standard_normal(shape).astype(dtype)
    p = Parameter(x0.copy())
    opt = cls([("p", p)], lr=0.03, weight_decay=wd)
    x, m, v = x0.copy(), np.zeros_like(x0), np.zeros_like(x0)
    for step in range(1, 5):
        g = (rng.standard_normal(shape) * 10.0**step).astype(dtype)
        p.grad = g.copy()
        assert opt.step()
        _adam_naive(x, g, m, v, 0.03, wd, cls is optim.AdamW, 0.9, 0.999, 1e-8, step)
        np.testing.assert_array_equal(p.data, x)
        np.testing.assert_array_equal(opt.state["p"]["exp_avg"], m)
        np.testing.assert_array_equal(opt.state["p"]["exp_avg_sq"], v)


def test_adam_on_a_strided_gradient_matches_a_contiguous_one():
    rng = np.random.default_rng(10)
    x = rng.standard_normal((4, 3))
    p, q = Parameter(x.copy()), Parameter(x.copy())
    g = rng.standard_normal((3, 4))
    a, b = optim.AdamW([("p", p)], lr=0.1), optim.AdamW([("p", q)], lr=0.1)
    p.grad, q.grad = g.T, np.ascontiguousarray(g.T)  # the first one is not contiguous
    a.step()
    b.step()
    np.testing.assert_array_equal(p.data, q.data)
