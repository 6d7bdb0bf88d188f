"""LayerNorm, Embedding, batched matmul and attention: float64 gradcheck on odd shapes, and
torch.nn.functional on identical inputs (skipped without torch)."""

import numpy as np
import pytest

from pocket.train import functional as F
from pocket.train import functional_seqattn as FS
from pocket.train import nn_seqattn as NS
from pocket.train.gradcheck import gradcheck
from pocket.train.tensor import Tensor


def _arr(xp, rng, *shape):
    return xp.asarray(rng.standard_normal(shape))


@pytest.mark.parametrize("shape,axis", [((3, 5), -1), ((2, 3, 4), -1), ((2, 3, 2), -2)])
def test_layer_norm_gradcheck(xp, rng, shape, axis):
    norm = shape[axis % len(shape):]
    gradcheck(lambda x, w, b: FS.layer_norm(x, w, b, axis, 1e-5),
              [_arr(xp, rng, *shape), _arr(xp, rng, *norm), _arr(xp, rng, *norm)])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shapes", [((2, 3, 4, 5), (2, 3, 4, 5), (2, 3, 4, 5)),
                                    ((1, 1, 3, 2), (1, 1, 5, 2), (1, 1, 5, 3))])
def test_attention_gradcheck(xp, rng, causal, shapes):
    gradcheck(lambda q, k, v: FS.attention(q, k, v, causal=causal),
              [_arr(xp, rng, *s) for s in shapes])


def test_attention_dropout_gradient(xp, rng):
    # the same seed gives the same mask in every call gradcheck makes
    def fn(q, k, v):
        return FS.attention(q, k, v, dropout_p=0.4, rng=np.random.default_rng(7))

    gradcheck(fn, [_arr(xp, rng, 1, 2, 3, 4) for _ in range(3)])


def test_embedding_gradcheck_accumulates_repeats(xp, rng):
    ids = np.array([[0, 2, 2], [4, 0, 1]])
    gradcheck(lambda w: FS.embedding(ids, w), [_arr(xp, rng, 5, 3)])
    w = Tensor(np.ones((5, 2)), requires_grad=True)
    FS.embedding(ids, w).sum().backward()
    np.testing.assert_array_equal(w.grad[:, 0], [2, 1, 2, 0, 1])


def test_embedding_ids_are_checked():
    w = np.zeros((4, 2))
    with pytest.raises(ValueError, match="outside"):
        FS.embedding(np.array([1, 4]), w)
    with pytest.raises(ValueError, match="outside"):
        FS.embedding(np.array([-1]), w)
    with pytest.raises(ValueError, match="whole numbers"):
        FS.embedding(np.array([0.5]), w)
    out = FS.embedding(np.array([[3.0, 1.0]], np.float32), np.arange(8.0).reshape(4, 2))
    np.testing.assert_array_equal(out.data, [[[6, 7], [2, 3]]])


def test_batched_matmul_broadcasts(xp, rng):
    gradcheck(lambda a, b: F.matmul(a, b), [_arr(xp, rng, 2, 1, 3, 4), _arr(xp, rng, 3, 4, 2)])


def test_layers_shapes_and_modes(rng):
    x = Tensor(rng.standard_normal((2, 5, 8)).astype(np.float32))
    block = NS.TransformerEncoderBlock(8, 2, mlp_ratio=2, dropout=0.1,
                                       rng=np.random.default_rng(0))
    assert block(x).shape == (2, 5, 8)
    block.eval()
    a, b = block(x).data, block(x).data
    np.testing.assert_array_equal(a, b)  # no dropout in eval
    assert NS.PatchEmbedding(3, 6, 2)(Tensor(np.zeros((2, 3, 4, 6), np.float32))).shape == (2, 6, 6)
    assert NS.SequenceMeanPool(8)(x).shape == (2, 8)
    pe = NS.SinusoidalPositionalEncoding(5, 8)(x).data - x.data
    # PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...) (Vaswani et al. 3.5)
    want = [[np.sin(p / 10000 ** (j / 8)) if j % 2 == 0 else np.cos(p / 10000 ** ((j - 1) / 8))
             for j in range(8)] for p in range(5)]
    np.testing.assert_allclose(pe, np.broadcast_to(want, pe.shape), atol=1e-6)
    with pytest.raises(ValueError, match="divisible"):
        NS.MultiheadAttention(6, 4)


def test_causal_attention_ignores_the_future(rng):
    q, k, v = (rng.standard_normal((1, 2, 4, 3)) for _ in range(3))
    out = FS.attention(q, k, v, causal=True).data
    v2 = v.copy()
    v2[..., 3, :] += 10.0  # only the last query may see the last key
    out2 = FS.attention(q, k, v2, causal=True).data
    np.testing.assert_array_equal(out[..., :3, :], out2[..., :3, :])
    assert not np.allclose(out[..., 3, :], out2[..., 3, :])


# ---------------------------------------------------------------- torch on identical inputs

def _torch():
    return pytest.importorskip("torch")


@pytest.mark.parametrize("shape,axis", [((2, 7, 6), -1), ((3, 4, 5), -2)])
def test_layer_norm_matches_torch(rng, shape, axis):
    torch = _torch()
    x = rng.standard_normal(shape) * 3 + 1
    norm = shape[axis % len(shape):]
    w, b = rng.standard_normal(norm), rng.standard_normal(norm)
    gy = rng.standard_normal(shape)
    ts = [torch.tensor(a, requires_grad=True) for a in (x, w, b)]
    ty = torch.nn.functional.layer_norm(ts[0], norm, ts[1], ts[2], 1e-5)
    ty.backward(torch.tensor(gy))
    ps = [Tensor(a, requires_grad=True) for a in (x, w, b)]
    y = FS.layer_norm(*ps, axis, 1e-5)
    y.backward(gy)
    np.testing.assert_allclose(y.data, ty.detach().numpy(), atol=1e-6, rtol=0)
    for p, t in zip(ps, ts):
        np.testing.assert_allclose(p.grad, t.grad.numpy(), atol=1e-6, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_torch(rng, causal):
    torch = _torch()
    q, k, v = (rng.standard_normal((2, 3, 5, 4)) for _ in range(3))
    gy = rng.standard_normal((2, 3, 5, 4))
    ts = [torch.tensor(a, requires_grad=True) for a in (q, k, v)]
    ty = torch.nn.functional.scaled_dot_product_attention(*ts, is_causal=causal)
    ty.backward(torch.tensor(gy))
    ps = [Tensor(a, requires_grad=True) for a in (q, k, v)]
    y = FS.attention(*ps, causal=causal)
    y.backward(gy)
    np.testing.assert_allclose(y.data, ty.detach().numpy(), atol=1e-6, rtol=0)
    for p, t in zip(ps, ts):
        np.testing.assert_allclose(p.grad, t.grad.numpy(), atol=1e-6, rtol=0)
