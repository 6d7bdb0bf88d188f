"""The engine's l2norm kernel against a naive NumPy twin and the reference."""

from __future__ import annotations

import numpy as np
import pytest
from models import FakeContainer

from pocket.formats import reference as ref
from pocket.formats.ir import Graph, Node, ValueInfo
from pocket.infer import Engine
from pocket.infer import kernels_embed as ke


def naive_l2norm(x, axis, eps):
    # one row at a time, written as the definition: x_i / max(sqrt(sum_j x_j^2), eps)
    x = np.moveaxis(np.asarray(x, np.float64), axis, -1)
    out = np.empty_like(x)
    for idx in np.ndindex(x.shape[:-1]):
        row = x[idx]
        out[idx] = row / max(np.sqrt(sum(v * v for v in row)), eps)
    return np.moveaxis(out, -1, axis).astype(np.float32)


@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 7, 1), (2, 5, 3)])
def test_kernel_matches_naive_twin(shape):
    rng = np.random.default_rng(sum(shape))
    x = rng.normal(size=shape).astype(np.float32)
    x[0, :, 0] = 0.0  # an all-zero row stays zero, no NaN
    out = np.empty_like(x)
    ke.l2norm(out, x, 1e-12)
    np.testing.assert_allclose(out, naive_l2norm(x, 1, 1e-12), rtol=1e-6, atol=1e-7)
    assert np.all(out[0, :, 0] == 0)


@pytest.mark.parametrize("axis,shape", [(-1, (5,)), (1, (4, 3)), (2, (2, 3))])
def test_engine_matches_reference(axis, shape):
    rng = np.random.default_rng(len(shape) + axis)
    g = Graph({"x": ValueInfo("f32", ("N", *shape))}, ["y"],
              [Node("n", "l2norm", ["x"], ["y"], {"axis": axis, "eps": 0.5})], {}, {})
    g.validate()
    x = rng.normal(size=(3, *shape)).astype(np.float32)
    x[1] *= 0.01  # norm under eps: divided by eps
    want = ref.run(g, {}, x)["y"]
    np.testing.assert_allclose(want, naive_l2norm(x, axis, 0.5), rtol=1e-6, atol=1e-7)
    with Engine(FakeContainer(g, {}), max_batch=4) as eng:
        got = eng.run(x, copy=True)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
