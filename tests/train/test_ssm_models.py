"""The `ssm` zoo model and the state-space layer kinds: they build, and their traced graph run by
the reference interpreter (and the engine, whole and streamed) computes what the model does."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from pocket.formats import reference
from pocket.train import backend
from pocket.train.models import ModelError, build_model
from pocket.train.tensor import Tensor, no_grad
from pocket.train.trace import trace

sys.path.insert(0, str(Path(__file__).parents[1] / "infer"))
from models import FakeContainer  # noqa: E402

LAYERS = [{"type": "ssm", "d_state": 3}, {"type": "ssm_block", "d_state": 2, "mix": "gelu"},
          {"type": "ssm_block", "dropout": 0.1, "bidirectional": True}, {"type": "glu"},
          {"type": "flatten"}, {"type": "linear"}]


def _eval(model, x):
    model.eval()
    with no_grad():
        return backend.to_numpy(model(Tensor(x)).data)


@pytest.mark.parametrize("cfg", [
    {"name": "ssm", "d_model": 6, "d_state": 3, "depth": 2, "dropout": 0.1},
    {"name": "ssm", "d_model": 4, "d_state": 2, "depth": 1, "bidirectional": True, "mix": "gelu"},
    {"layers": LAYERS},
])
def test_traced_graph_matches_the_model(cfg):
    rng = np.random.default_rng(3)
    shape = (7, 4)
    model = build_model({"name": None, **cfg}, shape, 5, rng)
    x = rng.normal(size=(3, *shape)).astype(np.float32)
    want = _eval(model, x)
    assert want.shape == (3, 5)
    g, params = trace(model, shape)
    np.testing.assert_allclose(reference.run(g, params, x)["output"], want, rtol=1e-4, atol=1e-5)
    assert set(params) == set(model.state_dict())


def test_layer_kinds_check_their_input():
    with pytest.raises(ModelError, match="needs a sequence input"):
        build_model({"layers": [{"type": "ssm"}]}, (1, 8, 8), 3, np.random.default_rng(0))
    with pytest.raises(ModelError, match="glu halves axis -1"):
        build_model({"layers": [{"type": "glu"}]}, (4, 3), 3, np.random.default_rng(0))
    with pytest.raises(ModelError, match="needs input of rank 2"):
        build_model({"name": "ssm"}, (1, 8, 8), 3, np.random.default_rng(0))


def test_a_trained_block_stack_streams_in_the_engine():
    """nn layers -> trace -> engine: the whole sequence and the streamed one equal the model."""
    from pocket.infer import Engine
    from pocket.train import nn

    rng = np.random.default_rng(4)
    model = nn.Sequential(nn.Linear(3, 6, rng=rng), nn.SSMBlock(6, 4, rng=rng),
                          nn.SSMBlock(6, 4, mix="gelu", rng=rng), nn.Linear(6, 2, rng=rng))
    x = rng.normal(size=(2, 10, 3)).astype(np.float32)
    want = _eval(model, x)
    g, params = trace(model, (10, 3))
    with Engine(FakeContainer(g, params)) as eng:
        np.testing.assert_allclose(eng.run(x), want, rtol=1e-4, atol=1e-5)
        with eng.stream(2) as s:
            got = np.concatenate([s(x[:, t:t + 2]) for t in range(0, 10, 2)], axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
