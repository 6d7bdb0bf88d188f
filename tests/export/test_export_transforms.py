"""Every transform keeps the graph's meaning: outputs before and after, through the reference."""

import numpy as np
import pytest
from export_models import Net, residual_cnn, smooth_images

from pocket.export import transforms as T
from pocket.formats import reference


def _run(graph, params, x):
    return reference.run(graph, params, x)


def _ops(graph):
    return [n.op for n in graph.nodes]


def test_fold_batchnorm_is_exact_after_every_conv():
    n = Net((3, 9, 7), seed=1)
    h = n.input
    for i, (o, stride, groups) in enumerate([(6, 1, 1), (6, 2, 3), (12, 1, 1)]):
        h = n.bn(n.conv(h, o, stride=stride, groups=groups, bias=i != 1, name=f"c{i}"),
                 name=f"bn{i}")
    h = n.bn(n.linear(n.op("flatten", h), 5, name="fc"), name="bn_fc")
    graph, params = n.graph([h]), n.params
    x = smooth_images(np.random.default_rng(0), 16, (3, 9, 7))

    g2, p2, count = T.fold_batchnorm(graph, params)

    assert count == 4 and "batchnorm" not in _ops(g2)
    assert g2.outputs == graph.outputs
    want, got = _run(graph, params, x)[h], _run(g2, p2, x)[h]
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    assert np.abs(want).max() > 0.5  # the check is not vacuous


def test_fold_keeps_batchnorm_it_cannot_fold():
    n = Net((4, 5, 5))
    a = n.conv(n.input, 4, name="c")
    bn_shared = n.bn(a, name="bn_shared")            # conv output also read by the add
    summed = n.op("add", a, bn_shared)
    alone = n.bn(n.input, name="bn_input")           # no producer to fold into
    after_act = n.bn(n.conv(n.input, 4, name="c2", activation="relu"), name="bn_act")
    graph = n.graph([summed, alone, after_act])
    g2, p2, count = T.fold_batchnorm(graph, n.params)
    assert count == 0 and _ops(g2).count("batchnorm") == 3
    x = np.random.default_rng(1).normal(size=(2, 4, 5, 5)).astype(np.float32)
    for o in graph.outputs:
        np.testing.assert_array_equal(_run(g2, p2, x)[o], _run(graph, n.params, x)[o])


def test_fold_leaves_tied_weights_alone():
    n = Net((4, 5, 5))
    a = n.conv(n.input, 4, name="c")
    n.op("conv2d", n.input, "c.weight", name="twin", stride=[1, 1], padding=[1, 1])
    graph = n.graph([n.bn(a, name="bn"), "twin:0"])
    g2, p2, count = T.fold_batchnorm(graph, n.params)
    assert count == 1
    assert np.array_equal(p2["c.weight"], n.params["c.weight"])
    x = np.random.default_rng(2).normal(size=(2, 4, 5, 5)).astype(np.float32)
    want, got = _run(graph, n.params, x), _run(g2, p2, x)
    for o in graph.outputs:
        np.testing.assert_allclose(got[o], want[o], atol=1e-5)


@pytest.mark.parametrize("act,attrs", [("relu", {}), ("leaky_relu", {"alpha": 0.2}),
                                       ("sigmoid", {}), ("tanh", {}), ("gelu", {})])
def test_fuse_activation(act, attrs):
    n = Net((3, 6, 6))
    h = n.op(act, n.conv(n.input, 5, name="c"), **attrs)
    h = n.op(act, n.linear(n.op("flatten", h), 7, name="fc"), **attrs)
    graph = n.graph([h])
    g2, p2, count = T.fuse_activations(graph, n.params)
    assert count == 2 and _ops(g2) == ["conv2d", "flatten", "linear"]
    assert g2.nodes[0].attrs["activation"] == act and g2.outputs == [h]
    x = np.random.default_rng(3).normal(size=(4, 3, 6, 6)).astype(np.float32)
    np.testing.assert_allclose(_run(g2, p2, x)[h], _run(graph, n.params, x)[h], atol=1e-6)


def test_fuse_skips_shared_outputs_and_tanh_gelu():
    n = Net((3, 6, 6))
    a = n.conv(n.input, 3, name="c")
    r = n.op("relu", a)
    s = n.op("add", a, r)                            # pre-activation value is needed too
    g = n.op("gelu", n.conv(n.input, 3, name="c2"), approximate="tanh")
    graph = n.graph([s, g])
    g2, _, count = T.fuse_activations(graph, n.params)
    assert count == 0 and _ops(g2) == _ops(graph)


def test_drop_dropout_rewires_and_keeps_output_names():
    n = Net((6,))
    h = n.op("dropout", n.linear(n.input, 4, name="fc"), p=0.3)
    out = n.op("dropout", n.op("relu", h), p=0.3, out="y")
    kept = n.op("dropout", n.input, p=0.1, out="x_out")   # graph input straight to an output
    graph = n.graph([out, kept])
    g2, p2, count = T.drop_dropout(graph, n.params)
    assert count == 2 and _ops(g2) == ["linear", "relu", "dropout"]
    assert g2.outputs == ["y", "x_out"]
    x = np.random.default_rng(4).normal(size=(3, 6)).astype(np.float32)
    for o in ("y", "x_out"):
        np.testing.assert_array_equal(_run(g2, p2, x)[o], _run(graph, n.params, x)[o])


def test_remove_dead():
    n = Net((6,))
    out = n.linear(n.input, 4, name="used")
    n.linear(n.input, 4, name="unused")
    graph = n.graph([out])
    graph.params["orphan"] = graph.params["used.bias"]
    params = {**n.params, "orphan": n.params["used.bias"]}
    g2, p2, count = T.remove_dead(graph, params)
    assert count == 4  # one node, its two params, the orphan
    assert set(p2) == set(g2.params) == {"used.weight", "used.bias"}


def test_optimize_residual_cnn():
    graph, params = residual_cnn(seed=5)
    x = smooth_images(np.random.default_rng(5), 32, (1, 8, 8))
    g2, p2, applied = T.optimize(graph, params)
    assert applied == ["dropped 2 dropout", "folded 5 batchnorm", "fused 4 activations",
                       "removed 20 dead nodes/params"]
    assert _ops(g2) == ["conv2d", "conv2d", "conv2d", "add", "relu", "maxpool2d", "conv2d",
                        "global_avgpool", "flatten", "linear", "linear"]
    assert set(p2) == set(g2.params) and len(p2) == 12
    np.testing.assert_allclose(_run(g2, p2, x)["logits"], _run(graph, params, x)["logits"],
                               atol=1e-5, rtol=1e-5)
    # The input graph is untouched.
    assert _ops(graph).count("batchnorm") == 5
