"""The vision ops through export, the engine and onnxruntime, on one small graph that uses each:
conv2d+relu6 (an int8 layer clamping at quantize(6)), a depthwise conv+relu6, a squeeze-and-
excitation gate (global_avgpool -> conv1x1 -> relu -> conv1x1 -> hardsigmoid -> mul), a channel
shuffle and a channel split (slice) into two branches joined by concat, a clip with min != 0
(stays a node), conv+silu, and an int8 tail where shuffle and slice pass int8 through.

fp32: reference == engine (1e-5) == onnxruntime (1e-5), fused and unfused. int8: the engine bit
for bit like the reference, onnxruntime's QDQ within a few output steps.
"""

from __future__ import annotations

import numpy as np
import pytest
from export_models import Net, smooth_images
from test_export_app import run_ort, write_ckpt

from pocket.export import export
from pocket.export import transforms as T
from pocket.formats import reference
from pocket.formats.container import read_container, write_container

SHAPE = (3, 10, 9)


def _model(seed: int = 0):
    n = Net(SHAPE, seed)
    h = n.op("clip", n.conv(n.input, 8, name="c1"), name="r1", min=0.0, max=6.0)
    h = n.op("clip", n.conv(h, 8, groups=8, name="dw"), name="r2", min=0.0, max=6.0)
    s = n.op("global_avgpool", h, name="se_pool")
    s = n.op("relu", n.conv(s, 4, 1, padding=0, name="se_fc1"), name="se_relu")
    s = n.op("hardsigmoid", n.conv(s, 8, 1, padding=0, name="se_fc2"), name="se_gate")
    h = n.op("mul", h, s, name="se_mul")
    h = n.op("channel_shuffle", h, name="shuffle", groups=2)
    a = n.op("slice", h, name="split_a", axis=1, start=0, end=4)
    b = n.op("slice", h, name="split_b", axis=1, start=4, end=8)
    b = n.op("clip", n.conv(b, 4, 1, padding=0, name="c_b"), name="clip_b", min=-1.0, max=2.5)
    h = n.op("concat", a, b, name="cat", axis=1)
    h = n.op("silu", n.conv(h, 8, name="c3"), name="silu3")
    h = n.op("clip", n.conv(h, 8, name="c4"), name="r4", min=0.0, max=6.0)
    h = n.op("channel_shuffle", h, name="shuffle2", groups=4)
    h = n.op("slice", h, name="crop", axis=3, start=1, end=9)
    h = n.op("flatten", n.op("maxpool2d", h, name="pool", kernel=[2, 2]))
    h = n.op("clip", n.linear(h, 12, name="fc1"), name="r_fc1", min=0.0, max=4.0)
    h = n.op("silu", h, name="silu_fc")
    out = n.linear(h, 5, name="head", out="logits")
    return n.graph([out]), n.params


def _inputs(n: int = 11, seed: int = 5) -> np.ndarray:
    return smooth_images(np.random.default_rng(seed), n, SHAPE) * 2


FUSED = {"c1": "clip", "dw": "clip", "se_fc1": "relu", "se_fc2": "hardsigmoid", "c_b": "none",
         "c3": "silu", "c4": "clip", "fc1": "clip", "head": "none"}


def test_fusion_follows_the_registry():
    graph, params = _model()
    g, p, count = T.fuse_activations(graph, params)
    assert count == 7
    acts = {n.name: n.attrs.get("activation") for n in g.nodes if n.op in ("conv2d", "linear")}
    assert acts == FUSED
    assert next(n for n in g.nodes if n.name == "fc1").attrs["max"] == 4.0
    # clip with min -1 has nowhere to keep its min on the conv: it stays a node; silu after a
    # layer that already fused clip too
    assert [n.name for n in g.nodes if n.op in ("clip", "silu")] == ["clip_b", "silu_fc"]
    x = _inputs()
    np.testing.assert_allclose(reference.run(g, p, x)["logits"],
                               reference.run(graph, params, x)["logits"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("threads", [1, 2])
def test_engine_fp32_matches_the_reference(tmp_path, threads):
    from pocket.infer import Engine

    graph, params = _model()
    fgraph, fparams = T.optimize(graph, params)[:2]
    x = _inputs()
    for g, p in ((graph, params), (fgraph, fparams)):
        path = tmp_path / "m.bin"
        write_container(path, kind="model", tensors=p, graph=g)
        want = reference.run(g, p, x)["logits"]
        with Engine(path, threads=threads) as eng:
            for b in (1, 4, len(x)):
                np.testing.assert_allclose(eng.run(x[:b], copy=True), want[:b], rtol=1e-5,
                                           atol=1e-5)
    env = reference.run(graph, params, x, keep_all=True)
    assert env["c1:0"].max() > 6 and env["c_b:0"].min() < -1  # the clamps were in play


def test_onnx_matches_onnxruntime(tmp_path):
    pytest.importorskip("onnx")
    from pocket.export.onnx_export import save, to_onnx

    graph, params = _model()
    fgraph, fparams = T.optimize(graph, params)[:2]
    x = _inputs()
    for g, p in ((graph, params), (fgraph, fparams)):
        model = to_onnx(g, p)  # onnx.checker and strict shape inference inside
        kinds = {node.op_type for node in model.graph.node}
        assert {"Clip", "Sigmoid", "Mul", "Reshape", "Transpose", "Slice", "Concat"} <= kinds
        save(model, tmp_path / "m.onnx")
        np.testing.assert_allclose(run_ort(tmp_path / "m.onnx", x),
                                   reference.run(g, p, x)["logits"], rtol=1e-5, atol=1e-5)


def test_int8_export_runs_bit_exact(tmp_path):
    from pocket.infer import Engine

    graph, params = _model(seed=3)
    ckpt = write_ckpt(tmp_path / "m.ckpt", graph, params, _inputs(64, seed=6))
    r = export(ckpt, tmp_path / "m.int8.bin", int8=True, max_layer_error=10.0)
    reasons = {x["name"]: x["reason"] for x in r["layers_fp32"]}
    # hardsigmoid and silu have no int8 form; relu6/clip and relu fuse into int8 layers
    assert set(reasons) == {"se_fc2", "c3"}
    with read_container(tmp_path / "m.int8.bin") as c:
        nodes = {n.name: n for n in c.graph.nodes}
        int8 = {k for k, n in nodes.items() if "x_scale" in n.attrs}
        assert int8 == {"c1", "dw", "se_fc1", "c_b", "c4", "fc1", "head"}
        assert nodes["c1"].attrs["activation"] == "clip" and "y_scale" in nodes["c1"].attrs
        # c4's int8 output passes through shuffle, slice, maxpool and flatten into fc1
        for v in ("shuffle2", "crop"):
            assert c.graph.validate()[nodes[v].outputs[0]].dtype == "i8", v
        assert "y_scale" not in nodes["fc1"].attrs  # read by a silu: writes f32, clamped at 4
        x = _inputs(9, seed=8)
        env = reference.run_container(c, x, keep_all=True)
        want = env["logits"]
    with Engine(tmp_path / "m.int8.bin") as eng:
        np.testing.assert_array_equal(eng.run(x, copy=True), want)
    pytest.importorskip("onnxruntime")
    export(ckpt, tmp_path / "m.int8.onnx", int8=True, max_layer_error=10.0)
    got = run_ort(tmp_path / "m.int8.onnx", x)
    # onnxruntime requantizes in its own float arithmetic: a code may differ by one step
    np.testing.assert_allclose(got, want, atol=0.05 * np.abs(want).max())
    assert (got.argmax(1) == want.argmax(1)).mean() >= 0.99
