"""nn.Block and the layer-list kind `block`: forward against the same sums written by hand,
float64 gradients, the traced graph run by the reference interpreter, shape tracking through
nested branches, and the errors a config can cause."""

from __future__ import annotations

import numpy as np
import pytest

from pocket.formats import reference
from pocket.train import config, nn
from pocket.train.gradcheck import gradcheck
from pocket.train.models import ModelError, from_layers
from pocket.train.tensor import Tensor, no_grad
from pocket.train.trace import trace


def _x(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _eval_matches_trace(model, shape, seed=0, n=3):
    model.eval()
    x = _x((n, *shape), seed)
    with no_grad():
        want = model(Tensor(x)).data
    g, params = trace(model, shape)
    got = reference.run(g, params, {"input": x})["output"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    return g


def test_nn_block_is_the_lazy_attribute():
    from pocket.train.nn_block import Block
    assert nn.Block is Block
    with pytest.raises(AttributeError):
        nn.NoSuchLayer  # noqa: B018


@pytest.mark.parametrize("merge", ["add", "concat", "mul"])
def test_forward_is_the_merge_of_the_branches(merge):
    x = _x((2, 3, 4, 5))
    blk = nn.Block([[nn.Sigmoid()], [], [nn.Tanh(), nn.ReLU()]], merge, nn.LeakyReLU(0.1))
    a, b, c = 1 / (1 + np.exp(-x)), x, np.maximum(np.tanh(x), 0)
    pre = {"add": a + b + c, "mul": a * b * c, "concat": np.concatenate([a, b, c], 1)}[merge]
    want = np.where(pre > 0, pre, 0.1 * pre)
    np.testing.assert_allclose(blk(Tensor(x)).data, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("merge", ["add", "concat", "mul"])
def test_gradients_through_every_merge(merge):
    blk = nn.Block([[nn.Sigmoid()], [], [nn.Tanh()]], merge, nn.Tanh())
    gradcheck(lambda t: blk(t), [_x((2, 3, 2, 3), 1, np.float64)])


def test_broadcast_mul_gradient():
    # Squeeze-and-excitation's shape: (N, C, H, W) * (N, C, 1, 1).
    blk = nn.Block([[], [nn.GlobalAvgPool2d(), nn.Sigmoid()]], "mul")
    gradcheck(lambda t: blk(t), [_x((2, 3, 4, 3), 2, np.float64)])


def test_block_rejects_bad_arguments():
    with pytest.raises(ValueError, match="merge must be one of add, concat, mul"):
        nn.Block([[], []], "sub")
    with pytest.raises(ValueError, match="at least two branches"):
        nn.Block([[nn.ReLU()]], "add")


def test_a_python_block_traces_like_it_computes():
    rng = np.random.default_rng(3)
    fire = nn.Sequential(
        nn.Conv2d(3, 4, 1, rng=rng), nn.ReLU(),
        nn.Block([[nn.Conv2d(4, 5, 1, rng=rng), nn.ReLU()],
                  [nn.Conv2d(4, 6, 3, padding=1, rng=rng), nn.ReLU()]], "concat"))
    res = nn.Block([[nn.Conv2d(11, 11, 3, padding=1, rng=rng), nn.BatchNorm2d(11)], []], "add",
                   nn.ReLU())
    model = nn.Sequential(fire, res, nn.GlobalAvgPool2d(), nn.Flatten(), nn.Linear(11, 2, rng=rng))
    g = _eval_matches_trace(model, (3, 5, 6))
    ops = [n.op for n in g.nodes]
    assert ops.count("concat") == 1 and ops.count("add") == 1
    cat = next(n for n in g.nodes if n.op == "concat")
    assert cat.name == "0.2.concat" and cat.attrs == {"axis": 1} and len(cat.inputs) == 2
    add = next(n for n in g.nodes if n.op == "add")
    assert add.inputs[1] == cat.outputs[0]  # the empty branch is the block's input itself
    assert "1.branch0.0.weight" in g.params


# --------------------------------------------------------------------------- the layer list

INVERTED_RESIDUAL = {"type": "block", "merge": "add", "activation": "relu", "branches": [
    [{"type": "conv2d", "out": 12, "kernel": 1, "bias": False}, {"type": "batchnorm"},
     {"type": "relu"},
     {"type": "conv2d", "out": 12, "kernel": 3, "padding": 1, "groups": 12, "bias": False},
     {"type": "batchnorm"}, {"type": "relu"},
     {"type": "conv2d", "out": 4, "kernel": 1, "bias": False}, {"type": "batchnorm"}],
    [],
]}
FIRE = {"type": "block", "merge": "concat", "branches": [
    [{"type": "conv2d", "out": 3, "kernel": 1}, {"type": "relu"}],
    [{"type": "conv2d", "out": 5, "kernel": 3, "padding": 1}, {"type": "relu"}],
]}


def test_layer_list_blocks_track_shapes_and_trace():
    layers = [{"type": "conv2d", "out": 4, "kernel": 3, "padding": 1}, INVERTED_RESIDUAL, FIRE,
              # A block inside a branch, merged with a pooled branch.
              {"type": "block", "merge": "add", "branches": [
                  [FIRE, {"type": "maxpool2d", "kernel": 2}],
                  [{"type": "avgpool2d", "kernel": 2}]]},
              {"type": "flatten"}, {"type": "linear"}]
    model = from_layers((2, 6, 8), 3, layers, np.random.default_rng(0))
    assert isinstance(model[1], nn.Block) and isinstance(model[1].act, nn.ReLU)
    assert model[5].weight.shape == (3, 8 * 3 * 4)
    g = _eval_matches_trace(model, (2, 6, 8))
    assert [n.op for n in g.nodes].count("concat") == 2


@pytest.mark.parametrize("layers, match", [
    ([{"type": "block", "merge": "add", "branches": [
        [{"type": "conv2d", "out": 5, "kernel": 1}], []]}],
     r"layers\[0\] \(block\): branches\[0\] gives \[5, 4, 4\], branches\[1\] gives "
     r"\[2, 4, 4\]: these shapes cannot be merged by add"),
    ([{"type": "block", "merge": "concat", "branches": [
        [{"type": "maxpool2d", "kernel": 2}], []]}],
     r"branches\[0\] gives \[2, 2, 2\] but branches\[1\] gives \[2, 4, 4\]: concat"),
    ([{"type": "block", "merge": "mul", "branches": [[{"type": "flatten"}], []]}],
     r"different ranks"),
    ([{"type": "block", "merge": "sub", "branches": [[], []]}], r"merge must be one of"),
    ([{"type": "block", "branches": [[]]}], r"at least two layer lists"),
    ([{"type": "block", "branches": [[], []], "activation": "softmax"}],
     r"activation 'softmax' is not one; choose one of .*relu"),
    # An error inside a branch names where it is.
    ([{"type": "block", "branches": [[{"type": "relu"}, {"type": "conv2d", "kernel": 1}],
                                     []]}],
     r"layers\[0\] \(block\) branches\[0\]\[1\] \(conv2d\): give 'out'"),
    ([{"type": "block", "branches": [[{"type": "reluu"}], []]}],
     r"branches\[0\]\[0\]: unknown layer type 'reluu'; did you mean 'relu'"),
])
def test_block_errors_name_the_branch(layers, match):
    with pytest.raises(ModelError, match=match):
        from_layers((2, 4, 4), 3, layers, np.random.default_rng(0))


def test_config_checks_nested_layer_lists():
    cfg = config.merge({"model": {"layers": [INVERTED_RESIDUAL, FIRE, {"type": "flatten"},
                                             {"type": "linear"}]}})
    assert cfg["model"]["layers"][0]["branches"][1] == []
    bad = {"type": "block", "branches": [[{"type": "conv2d", "out": 0}], []]}
    with pytest.raises(config.ConfigError,
                       match=r"layers\[0\] \(block\) branches\[0\]\[0\] \(conv2d\): out must"):
        config.merge({"model": {"layers": [bad]}})
    with pytest.raises(config.ConfigError, match=r"branches must be a list of layer lists"):
        config.merge({"model": {"layers": [{"type": "block", "branches": [{"type": "relu"}]}]}})


def test_a_toml_block_config_round_trips(tmp_path):
    p = tmp_path / "m.toml"
    p.write_text('[model]\nlayers = [\n'
                 '  {type = "conv2d", out = 4, kernel = 1},\n'
                 '  {type = "block", merge = "add", branches = [\n'
                 '    [{type = "conv2d", out = 4, kernel = 3, padding = 1}, {type = "relu"}],\n'
                 '    [],\n'
                 '  ]},\n'
                 '  {type = "flatten"}, {type = "linear"},\n'
                 ']\n')
    cfg = config.load_config(p)
    model = from_layers((1, 8, 8), 10, cfg["model"]["layers"], np.random.default_rng(0))
    _eval_matches_trace(model, (1, 8, 8))
