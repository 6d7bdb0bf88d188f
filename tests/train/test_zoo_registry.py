"""The extension points families use: register_model (with its own [model] options) and
register_layer (a layer-list kind), checked through the config and the builder."""

import numpy as np
import pytest

from pocket.train import config, models, nn


@pytest.fixture
def toy_model():
    @models.register_model("toy_wide_mlp", input_rank=1)
    def toy(input_shape, num_outputs, *, width_mult: float = 1.0, depth: int = 1, rng=None,
            **_):
        units = max(1, int(8 * width_mult))
        layers, w = [], input_shape[0]
        for _ in range(depth):
            layers += [nn.Linear(w, units, rng=rng), nn.ReLU()]
            w = units
        return nn.Sequential(*layers, nn.Linear(w, num_outputs, rng=rng))

    yield toy
    del models.ZOO["toy_wide_mlp"], models.INPUT_RANK["toy_wide_mlp"]


def test_model_options_reach_the_zoo_function(toy_model):
    cfg = config.merge({"model": {"name": "toy_wide_mlp", "width_mult": 2, "depth": 3}})
    assert cfg["model"]["width_mult"] == 2.0 and cfg["model"]["depth"] == 3
    m = models.build_model(cfg["model"], (5,), 3, np.random.default_rng(0))
    linears = [c for c in m.children() if isinstance(c, nn.Linear)]
    assert [lin.weight.shape for lin in linears] == [(16, 5), (16, 16), (16, 16), (3, 16)]


def test_an_option_of_another_model_is_refused(toy_model):
    with pytest.raises(config.ConfigError, match="unknown key 'width_mult' in \\[model\\]"):
        config.merge({"model": {"name": "cnn", "width_mult": 2}})
    with pytest.raises(config.ConfigError, match="depth must be an int"):
        config.merge({"model": {"name": "toy_wide_mlp", "depth": 1.5}})


def test_input_rank_is_checked(toy_model):
    with pytest.raises(models.ModelError, match="needs input of rank 1"):
        models.build_model({"name": "toy_wide_mlp"}, (1, 8, 8), 3, np.random.default_rng(0))


def test_register_layer_adds_a_layer_list_kind():
    @models.register_layer("toy_double", {"times"})
    def _double(spec, shape, num_outputs, last, rng):
        if spec.get("times", 2) < 1:
            raise ValueError("times must be at least 1")
        return nn.Sequential(*[nn.ReLU() for _ in range(spec.get("times", 2))]), shape

    try:
        m = models.from_layers((4,), 2, [{"type": "toy_double", "times": 3}, {"type": "linear"}])
        assert len(list(m.children())) == 2
        with pytest.raises(models.ModelError, match=r"layers\[0\] \(toy_double\): times must"):
            models.from_layers((4,), 2, [{"type": "toy_double", "times": 0}])
        with pytest.raises(models.ModelError, match="unknown key"):
            models.from_layers((4,), 2, [{"type": "toy_double", "twice": 1}])
    finally:
        del models._LAYER_KEYS["toy_double"], models._BUILDERS["toy_double"]


def test_register_module_makes_a_custom_module_traceable():
    from pocket.formats import reference
    from pocket.train import trace
    from pocket.train.tensor import Tensor

    class DoubleRelu(nn.Module):
        """relu(x) + relu(x), written as a user would: not a layer the tracer knows."""

        def __init__(self):
            super().__init__()
            self.act = nn.ReLU()

        def forward(self, x):
            y = self.act(x)
            return y + y

    model = nn.Sequential(nn.Linear(3, 4, rng=np.random.default_rng(1)), DoubleRelu())
    with pytest.raises(trace.TraceError, match="DoubleRelu"):
        trace.trace(model, (3,))

    @trace.register_module(DoubleRelu)
    def _double(b, m, prefix, x):
        y = trace.trace_module(b, m.act, f"{prefix}.act", x)
        return b.node(f"{prefix}.add", "add", [y, y])

    try:
        g, params = trace.trace(model, (3,))
        x = np.random.default_rng(2).standard_normal((5, 3)).astype(np.float32)
        want = model(Tensor(x)).data
        got = reference.run(g, params, {"input": x})["output"]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    finally:
        del trace._CONTAINERS[DoubleRelu]
