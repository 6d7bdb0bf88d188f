"""Every primitive's backward against float64 central finite differences, on odd shapes."""

import numpy as np
import pytest

from pocket.train import functional as F
from pocket.train.gradcheck import GradcheckError, gradcheck


def _arr(xp, rng, *shape, positive=False):
    a = rng.standard_normal(shape)
    if positive:
        a = np.abs(a) + 0.5
    return xp.asarray(a)


ELEMENTWISE = {
    "add": (lambda a, b: a + b, [(3, 1, 5), (4, 1)]),
    "sub": (lambda a, b: a - b, [(2, 3), (3,)]),
    "mul": (lambda a, b: a * b, [(2, 1, 3), (1, 4, 3)]),
    "div": (lambda a, b: a / b, [(3, 4), (4,)]),
    "pow": (lambda a: a**3, [(2, 5)]),
    "neg": (lambda a: -a, [(3,)]),
    "exp": (lambda a: a.exp(), [(2, 3)]),
    "rsub_scalar": (lambda a: 2.0 - a * 0.5, [(3, 2)]),
    "matmul": (lambda a, b: a @ b, [(3, 4), (4, 5)]),
    "matmul_batched": (lambda a, b: a @ b, [(2, 3, 4), (4, 2)]),
    "matvec": (lambda a, b: a @ b, [(3, 4), (4,)]),
    "sum_axis": (lambda a: a.sum(axis=1), [(2, 3, 4)]),
    "sum_keep": (lambda a: a.sum(axis=(0, 2), keepdims=True), [(2, 3, 4)]),
    "mean": (lambda a: a.mean(axis=-1), [(3, 5)]),
    "max": (lambda a: a.max(axis=1), [(3, 5)]),
    "max_all": (lambda a: a.max(), [(2, 3)]),
    "reshape": (lambda a: a.reshape(6, 2) * 1.5, [(3, 4)]),
    "transpose": (lambda a: a.transpose(2, 0, 1), [(2, 3, 4)]),
    "getitem_slice": (lambda a: a[1:, ::2], [(3, 5)]),
    "getitem_fancy": (lambda a: a[np.array([0, 2, 0])], [(3, 2)]),
    "concat": (lambda a, b: F.concat([a, b], axis=1), [(2, 3), (2, 1)]),
    "flatten": (lambda a: F.flatten(a), [(2, 3, 2)]),
    "relu": (lambda a: F.relu(a), [(4, 5)]),
    "leaky_relu": (lambda a: F.leaky_relu(a, 0.2), [(4, 5)]),
    "sigmoid": (lambda a: F.sigmoid(a * 4), [(3, 4)]),
    "tanh": (lambda a: F.tanh(a), [(3, 4)]),
    "gelu": (lambda a: F.gelu(a), [(3, 4)]),
    "gelu_tanh": (lambda a: F.gelu(a, approximate="tanh"), [(3, 4)]),
    "softmax": (lambda a: F.softmax(a, axis=1), [(3, 4)]),
    "log_softmax": (lambda a: F.log_softmax(a, axis=0), [(3, 4)]),
    "mse": (lambda a, b: F.mse_loss(a, b), [(3, 4), (3, 4)]),
    "l1": (lambda a, b: F.l1_loss(a, b), [(3, 4), (3, 4)]),
    "huber": (lambda a, b: F.huber_loss(a * 2, b, delta=0.7), [(3, 4), (3, 4)]),
    "global_avgpool": (lambda a: F.global_avgpool(a), [(2, 3, 3, 5)]),
    "linear": (lambda x, w, b: F.linear(x, w, b), [(3, 5), (4, 5), (4,)]),
    "linear_3d": (lambda x, w: F.linear(x, w), [(2, 3, 5), (4, 5)]),
}


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
def test_elementwise_and_shape_ops(xp, rng, name):
    fn, shapes = ELEMENTWISE[name]
    gradcheck(fn, [_arr(xp, rng, *s) for s in shapes])


def test_log_and_abs(xp, rng):
    gradcheck(lambda a: a.log(), [_arr(xp, rng, 3, 4, positive=True)])
    gradcheck(lambda a: a.abs(), [_arr(xp, rng, 3, 4, positive=True) * xp.asarray([1, -1, 1, -1])])


CONV_CASES = [
    # (x shape, w shape, stride, padding, dilation, groups)
    ((1, 3, 5, 7), (4, 3, 3, 2), 1, 0, 1, 1),
    ((2, 2, 7, 6), (3, 2, 3, 3), 2, 1, 1, 1),
    ((1, 2, 7, 8), (2, 2, 3, 3), 1, 2, 2, 1),
    ((2, 4, 5, 5), (6, 2, 3, 3), (2, 1), (1, 0), 1, 2),
    ((1, 3, 6, 5), (3, 1, 3, 3), 1, 1, 1, 3),  # depthwise
    ((1, 3, 4, 4), (2, 3, 1, 1), 2, 0, 1, 1),  # 1x1, stride 2
]


@pytest.mark.parametrize("case", CONV_CASES, ids=[str(i) for i in range(len(CONV_CASES))])
def test_conv2d(xp, rng, case):
    xs, ws, s, p, d, g = case
    x, w, b = _arr(xp, rng, *xs), _arr(xp, rng, *ws), _arr(xp, rng, ws[0])
    gradcheck(lambda x, w, b: F.conv2d(x, w, b, s, p, d, g), [x, w, b])


@pytest.mark.parametrize("k,s,p,d", [(2, None, 0, 1), (3, 2, 1, 1), ((3, 2), (1, 2), (1, 0), 1),
                                     (2, 1, 0, 2)])
def test_maxpool2d(xp, rng, k, s, p, d):
    # distinct values so the max is unique and finite differences are well defined
    x = xp.asarray(rng.permutation(2 * 3 * 7 * 6).reshape(2, 3, 7, 6) * 0.1)
    gradcheck(lambda x: F.maxpool2d(x, k, s, p, d), [x], eps=1e-3)


@pytest.mark.parametrize("k,s,p,inc", [(2, None, 0, True), (3, 2, 1, True), (3, 2, 1, False),
                                       ((2, 3), (1, 2), (1, 1), True)])
def test_avgpool2d(xp, rng, k, s, p, inc):
    gradcheck(lambda x: F.avgpool2d(x, k, s, p, inc), [_arr(xp, rng, 1, 2, 7, 6)])


@pytest.mark.parametrize("shape", [(5, 3), (2, 3, 4, 5), (1, 2, 3, 3)])
def test_batchnorm_training(xp, rng, shape):
    c = shape[1]
    rm, rv = xp.zeros(c), xp.ones(c)
    gradcheck(lambda x, g, b: F.batchnorm(x, g, b, rm, rv, training=True),
              [_arr(xp, rng, *shape), _arr(xp, rng, c), _arr(xp, rng, c)])


def test_batchnorm_eval(xp, rng):
    rm, rv = _arr(xp, rng, 3), _arr(xp, rng, 3, positive=True)
    gradcheck(lambda x, g, b: F.batchnorm(x, g, b, rm, rv, training=False),
              [_arr(xp, rng, 2, 3, 2, 3), _arr(xp, rng, 3), _arr(xp, rng, 3)])


@pytest.mark.parametrize("ls,reduction", [(0.0, "mean"), (0.1, "mean"), (0.0, "sum"),
                                          (0.2, "none")])
def test_cross_entropy(xp, rng, ls, reduction):
    t = xp.asarray([0, 3, 1])
    gradcheck(lambda x: F.cross_entropy(x, t, label_smoothing=ls, reduction=reduction),
              [_arr(xp, rng, 3, 4)])


def test_dropout_gradient_is_the_mask(xp, rng):
    from pocket.train import backend

    def fn(x):
        return F.dropout(x, 0.3, training=True, rng=np.random.default_rng(7))

    gradcheck(fn, [_arr(xp, rng, 4, 5)])
    assert backend is not None


def test_gradcheck_catches_a_wrong_backward(xp, rng):
    from pocket.train.tensor import primitive

    def fwd(ctx, x):
        ctx.save(x)
        return x * x

    def bwd(ctx, gy):
        return (gy * ctx.saved[0],)  # wrong: should be 2 * x * gy

    square = primitive("bad_square", fwd, bwd)
    with pytest.raises(GradcheckError, match="analytic"):
        gradcheck(square, [_arr(xp, rng, 3)])
