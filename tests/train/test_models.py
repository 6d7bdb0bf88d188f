"""The model zoo and the declarative layer list: each model builds for its shapes, and its traced
graph run by the reference interpreter computes what the model computes in eval mode."""

from __future__ import annotations

import numpy as np
import pytest

from pocket.formats import reference
from pocket.train import backend, nn
from pocket.train.models import ModelError, build_model
from pocket.train.tensor import Tensor, no_grad
from pocket.train.trace import trace

# Every layer type of the layer list, on a (3, 12, 12) input.
EVERY_LAYER = [
    {"type": "conv2d", "out": 4, "kernel": 3, "padding": 1},        # (4, 12, 12)
    {"type": "batchnorm"},                                          # 2-D
    {"type": "leaky_relu", "alpha": 0.1},
    {"type": "residual", "out": 8, "stride": 2},                    # (8, 6, 6), projection
    {"type": "residual", "out": 8},                                 # identity shortcut
    {"type": "conv2d", "out": 8, "kernel": 3, "padding": 2, "dilation": 2, "groups": 2,
     "bias": False},                                                # (8, 6, 6)
    {"type": "maxpool2d", "kernel": 2},                             # (8, 3, 3)
    {"type": "gelu"},
    {"type": "avgpool2d", "kernel": 2, "stride": 1, "padding": 1,
     "count_include_pad": False},                                   # (8, 4, 4)
    {"type": "gelu", "approximate": "tanh"},
    {"type": "sigmoid"},
    {"type": "hardswish"},
    {"type": "global_avgpool"},                                     # (8, 1, 1)
    {"type": "flatten"},                                            # (8,)
    {"type": "linear", "out": 16},
    {"type": "batchnorm", "eps": 1e-3, "momentum": 0.2},            # 1-D
    {"type": "tanh"},
    {"type": "hardsigmoid"},
    {"type": "dropout", "p": 0.5},
    {"type": "relu"},
    {"type": "linear"},                                             # the head
    {"type": "softmax", "axis": -1},
]

# The sequence kinds (train/models_seqattn.py) on a (1, 8, 8) image; embedding (token ids,
# not a float image) is covered in test_seqattn_models.py.
SEQUENCE_LAYERS = [
    {"type": "patch_embedding", "dim": 8, "patch": 2},             # (16, 8)
    {"type": "positional_encoding", "kind": "learned"},
    {"type": "attention", "heads": 2, "causal": True},
    {"type": "transformer_block", "heads": 4, "mlp_ratio": 1.5, "dropout": 0.1},
    {"type": "layernorm", "eps": 1e-6},
    {"type": "linear", "out": 6},                                  # (16, 6)
    {"type": "mean_pool"},                                         # (6,)
    {"type": "linear"},
]

CASES = {
    "mlp": ({"name": "mlp", "hidden": [16, 8], "dropout": 0.2}, (1, 8, 8), 10),
    "mlp_flat": ({"name": "mlp"}, (20,), 3),
    "mlp_regressor": ({"name": "mlp_regressor", "hidden": [8]}, (10,), 1),
    "cnn_8x8": ({"name": "cnn", "channels": [4, 8], "hidden": [16], "dropout": 0.2},
                (1, 8, 8), 10),
    "cnn_28x28": ({"name": "cnn", "channels": [4, 4]}, (1, 28, 28), 10),
    "cnn_no_bn": ({"name": "cnn", "channels": [4], "batchnorm": False}, (3, 8, 8), 2),
    "vgg": ({"name": "vgg", "channels": [4, 4, 8, 8, 8, 8, 8, 8], "dropout": 0.1},
            (3, 32, 32), 10),
    "resnet": ({"name": "resnet", "channels": [4, 8, 8]}, (3, 32, 32), 10),
    "resnet_wide": ({"name": "resnet", "channels": [4, 8], "width": 2}, (3, 16, 16), 5),
    "layers": ({"layers": EVERY_LAYER}, (3, 12, 12), 5),
    "layers_seq": ({"layers": SEQUENCE_LAYERS}, (1, 8, 8), 4),
    "vit": ({"name": "vit", "dim": 8, "depth": 1, "heads": 2}, (3, 8, 8), 10),
    "transformer": ({"name": "transformer", "dim": 8, "depth": 1, "heads": 2}, (5, 3), 2),
}


def _randomize_buffers(model, rng) -> None:
    """Give BN running statistics non-trivial values so eval mode really uses them."""
    state = model.state_dict()
    for k, v in state.items():
        if k.endswith("running_mean"):
            state[k] = rng.normal(0, 0.5, v.shape).astype(v.dtype)
        elif k.endswith("running_var"):
            state[k] = rng.uniform(0.5, 2.0, v.shape).astype(v.dtype)
        elif k.endswith("weight") and v.ndim == 1:  # BN scale
            state[k] = rng.uniform(0.5, 1.5, v.shape).astype(v.dtype)
    model.load_state_dict(state)


def _model_output(model, x) -> np.ndarray:
    model.eval()
    with no_grad():
        return backend.to_numpy(model(Tensor(x)).data)


@pytest.mark.parametrize("case", list(CASES))
def test_zoo_model_trace_matches_eval_output(case):
    cfg, shape, n_out = CASES[case]
    rng = np.random.default_rng(7)
    model = build_model({"name": None, **cfg}, shape, n_out, rng)
    _randomize_buffers(model, rng)
    x = rng.normal(0, 1, (3, *shape)).astype(np.float32)

    want = _model_output(model, x)
    assert want.shape == (3, n_out)
    graph, params = trace(model, shape, {"task": "classification"})
    assert graph.inputs["input"].shape == ("N", *shape)
    got = reference.run(graph, params, {"input": x})["output"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # Every parameter and BN statistic reaches the graph under its state_dict name.
    assert set(params) == {k for k in model.state_dict() if not k.endswith("num_batches_tracked")}


def test_every_layer_type_is_covered():
    from pocket.train.models import _BUILDERS, _LAYER_KEYS

    covered = {spec["type"] for spec in EVERY_LAYER + SEQUENCE_LAYERS} | {"embedding"}
    # every core kind here; a family's kinds (register_layer) here or in its own test files
    # (tests/train/test_ssm_models.py, the seqconv tests)
    assert set(_LAYER_KEYS) - set(_BUILDERS) <= covered <= set(_LAYER_KEYS)


def test_layer_list_head_takes_num_outputs_and_tracks_shapes():
    layers = [{"type": "conv2d", "out": 2, "kernel": 3, "stride": 2},
              {"type": "flatten"}, {"type": "linear"}]
    model = build_model({"layers": layers}, (1, 9, 7), 4, np.random.default_rng(0))
    # (9 - 3) // 2 + 1 = 4, (7 - 3) // 2 + 1 = 3 -> 2 * 4 * 3 = 24 features into the head
    assert model.state_dict()["2.weight"].shape in ((4, 24), (24, 4))
    assert _model_output(model, np.zeros((2, 1, 9, 7), np.float32)).shape == (2, 4)


def _model_error(model_cfg, shape=(1, 8, 8), n_out=3) -> str:
    with pytest.raises(ModelError) as e:
        build_model(model_cfg, shape, n_out, np.random.default_rng(0))
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_layer_list_errors_are_one_line_model_errors():
    msg = _model_error({"layers": [{"type": "conv"}]})
    assert "layers[0]" in msg and "'conv'" in msg and "did you mean 'conv2d'" in msg
    msg = _model_error({"layers": [{"type": "flatten"}, {"type": "linear", "outt": 3}]})
    assert "layers[1]" in msg and "outt" in msg and "bias, out" in msg
    msg = _model_error({"layers": [{"type": "linear", "out": 3}]})
    assert "layers[0]" in msg and "flatten" in msg
    msg = _model_error({"layers": [{"type": "flatten"}, {"type": "linear"},
                                   {"type": "linear", "out": 2}]})
    assert "layers[1]" in msg and "'out'" in msg
    msg = _model_error({"layers": [{"out": 3}]})
    assert "'type'" in msg
    msg = _model_error({"layers": [{"type": "conv2d", "out": 2, "kernel": 9}]})
    assert "empty" in msg
    msg = _model_error({"layers": [{"type": "dropout", "p": 2}]})
    assert "dropout" in msg and "[0, 1)" in msg
    msg = _model_error({"layers": 5})
    assert "list" in msg


def test_zoo_errors_are_one_line_model_errors():
    msg = _model_error({"name": "resnt"})
    assert "'resnt'" in msg and "did you mean 'resnet'" in msg
    msg = _model_error({"name": "cnn"}, shape=(10,))
    assert "image input" in msg and "mlp" in msg
    msg = _model_error({"name": "cnn", "channels": [2, 2, 2, 2]})
    assert "pooling stages" in msg
    msg = _model_error({"name": "mlp", "hidden": 16})
    assert "hidden" in msg and "list of positive integers" in msg
    msg = _model_error({"name": "mlp", "hidden": [0]})
    assert "hidden" in msg
    msg = _model_error({"name": "mlp", "dropout": 1.5})
    assert "dropout" in msg
    msg = _model_error({"name": "resnet", "width": "a"}, shape=(3, 8, 8))
    assert "width" in msg


def test_trace_refuses_unknown_layers():
    from pocket.train.trace import TraceError

    class Odd(nn.Module):
        def forward(self, x):
            return x

    with pytest.raises(TraceError, match="Odd"):
        trace(nn.Sequential(nn.Flatten(), Odd()), (4,))
