"""The sequence-conv layers and the `tcn` zoo model: building from a config, layer lists, the
traced graph against the training model (through the reference interpreter), and errors."""

import numpy as np
import pytest

from pocket.formats import reference
from pocket.train import config, models, nn, trace
from pocket.train import functional as F
from pocket.train.models_seqconv import TemporalBlock, receptive_field, tcn
from pocket.train.tensor import Tensor


def _traced_matches(model, shape, n=3, seed=0):
    model.eval()
    x = np.random.default_rng(seed).standard_normal((n, *shape)).astype(np.float32)
    g, params = trace.trace(model, shape)
    got = reference.run(g, params, {"input": x})["output"]
    np.testing.assert_allclose(got, model(Tensor(x)).data, rtol=1e-5, atol=1e-5)
    return g


def test_tcn_from_config_traces_to_the_ir():
    cfg = config.merge({"model": {"name": "tcn", "channels": [4, 4, 6], "kernel": 2,
                                  "dropout": 0.1}})
    m = models.build_model(cfg["model"], (3, 13), 5, np.random.default_rng(0))
    blocks = [b for b in m if isinstance(b, TemporalBlock)]
    assert [b.dilation for b in blocks] == [1, 2, 4]
    assert [b.shortcut is not None for b in blocks] == [True, False, True]
    assert blocks[2].conv1.padding == (4, 0)
    g = _traced_matches(m, (3, 13))
    ops = [n.op for n in g.nodes]
    assert ops.count("conv1d") == 8 and ops.count("add") == 3
    assert ops[-2:] == ["global_avgpool1d", "linear"]
    assert g.validate()["output"].shape == ("N", 5)


def test_tcn_is_causal_before_the_head():
    m = tcn((2, 12), 1, channels=[3, 3], kernel=3, rng=np.random.default_rng(1)).eval()
    body = nn.Sequential(*list(m)[:2])
    x = np.random.default_rng(2).standard_normal((1, 2, 12))
    x2 = x.copy()
    x2[:, :, 9:] += 3.0
    y, y2 = body(Tensor(x)).data, body(Tensor(x2)).data
    np.testing.assert_array_equal(y[:, :, :9], y2[:, :, :9])
    assert receptive_field(3, 2) == 13


def test_tcn_learns_a_toy_sequence_task():
    # the class is whether the series rises or falls: a few Adam steps must fit it
    from pocket.train.optim import Adam

    rng = np.random.default_rng(3)
    n, length = 32, 16
    y = rng.integers(0, 2, n)
    slope = np.where(y == 1, 1.0, -1.0)[:, None] * np.linspace(0, 1, length)
    x = (slope + 0.1 * rng.standard_normal((n, length)))[:, None, :].astype(np.float32)
    m = tcn((1, length), 2, channels=[8, 8], rng=rng)
    opt = Adam(m.parameters(), lr=0.02)
    losses = []
    for _ in range(25):
        loss = F.cross_entropy(m(Tensor(x)), y)
        m.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.data))
    assert losses[-1] < 0.2 * losses[0]


def test_layer_list_kinds():
    layers = [{"type": "conv1d", "out": 4, "kernel": 3, "causal": True, "dilation": 2},
              {"type": "relu"},
              {"type": "conv1d", "out": 4, "kernel": 2, "padding": [1, 0], "groups": 2},
              {"type": "maxpool1d", "kernel": 2},
              {"type": "avgpool1d", "kernel": 3, "stride": 1, "padding": 1,
               "count_include_pad": False},
              {"type": "tcn_block", "out": 6, "kernel": 2, "dilation": 2},
              {"type": "global_maxpool1d"},
              {"type": "linear"}]
    m = models.from_layers((2, 9), 3, layers, np.random.default_rng(4))
    g = _traced_matches(m, (2, 9))
    assert g.validate()["output"].shape == ("N", 3)
    m2 = models.from_layers((2, 9), 3, [{"type": "conv1d", "out": 3, "stride": 2},
                                        {"type": "global_avgpool1d"}, {"type": "linear"}])
    _traced_matches(m2, (2, 9))


@pytest.mark.parametrize("layers,match", [
    ([{"type": "conv1d", "out": 2}], r"conv1d needs \(C, L\) input"),
    ([{"type": "conv1d", "out": 2, "kernel": 3, "padding": 1, "causal": True}],
     "either causal=True or a padding"),
    ([{"type": "conv1d", "out": 2, "kernel": 9}], "output would be empty"),
    ([{"type": "maxpool1d", "kernel": 2, "padding": 2}], "at most half the kernel"),
    ([{"type": "conv1d", "out": 2, "wings": 1}], "unknown key"),
])
def test_layer_list_errors(layers, match):
    shape = (3,) if "needs" in match else (2, 5)
    with pytest.raises(models.ModelError, match=match):
        models.from_layers(shape, 2, layers)


def test_tcn_errors():
    with pytest.raises(models.ModelError, match="needs input of rank 2"):
        models.build_model({"name": "tcn"}, (1, 8, 8), 3, np.random.default_rng(0))
    with pytest.raises(config.ConfigError, match="kernel must be an int"):
        config.merge({"model": {"name": "tcn", "kernel": 2.5}})
    with pytest.raises(models.ModelError, match="kernel must be a positive integer"):
        models.build_model({"name": "tcn", "kernel": 0}, (2, 8), 3, np.random.default_rng(0))


def test_nn_layers_validate_their_arguments():
    with pytest.raises(ValueError, match="not divisible by groups"):
        nn.Conv1d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match="non-negative integer"):
        nn.MaxPool1d(2.5)
    assert nn.Conv1d(2, 2, 3, padding=[2, 1]).out_length(5) == 6
    assert nn.AvgPool1d(3, 2, 1).out_length(7) == 4
