"""hardswish and hardsigmoid through export and the engine: fusion into conv2d/linear, the fp32
engine (standalone and fused, with and without a fused maxpool) against the reference, ONNX
against onnxruntime, and an int8 export that the engine runs bit for bit like the reference."""

from __future__ import annotations

import numpy as np
import pytest
from export_models import Net, smooth_images
from test_export_app import run_ort, write_ckpt

from pocket.export import export
from pocket.export import transforms as T
from pocket.formats import reference
from pocket.formats.container import read_container, write_container


def _model(seed: int = 0):
    """conv->hardswish (fuses), conv->hardsigmoid->maxpool (fuses, pool fusable), a standalone
    hardswish after the pool, an int8-friendly conv->relu, linear->hardsigmoid (fuses)."""
    n = Net((2, 9, 7), seed)
    h = n.op("hardswish", n.conv(n.input, 6, name="c1"), name="hs1")
    h = n.op("maxpool2d", n.op("hardsigmoid", n.conv(h, 6, name="c2"), name="hsig2"),
             kernel=[2, 2])
    h = n.op("hardswish", h, name="hs_alone")
    h = n.op("relu", n.conv(h, 8, name="c3"), name="r3")
    h = n.op("flatten", h)
    h = n.op("hardsigmoid", n.linear(h, 10, name="fc1"), name="hsig_fc")
    out = n.linear(h, 4, name="head", out="logits")
    return n.graph([out]), n.params


def _inputs(n: int = 13) -> np.ndarray:
    # Wide enough that every kink (x = -3, 3) is crossed.
    return smooth_images(np.random.default_rng(5), n, (2, 9, 7)) * 3


def test_both_fuse_into_the_layer_before():
    graph, params = _model()
    g, p, count = T.fuse_activations(graph, params)
    assert count == 4
    acts = {n.name: n.attrs.get("activation") for n in g.nodes if n.op in ("conv2d", "linear")}
    assert acts == {"c1": "hardswish", "c2": "hardsigmoid", "c3": "relu",
                    "fc1": "hardsigmoid", "head": "none"}
    assert [n.name for n in g.nodes if n.op == "hardswish"] == ["hs_alone"]
    x = _inputs()
    # Fused, the reference rounds to float32 once after the activation instead of twice.
    np.testing.assert_allclose(reference.run(g, p, x)["logits"],
                               reference.run(graph, params, x)["logits"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("threads", [1, 2])
def test_engine_fp32_matches_the_reference(tmp_path, threads):
    from pocket.infer import Engine

    graph, params = T.optimize(*_model())[:2]
    assert {n.attrs.get("activation") for n in graph.nodes} >= {"hardswish", "hardsigmoid"}
    path = tmp_path / "m.bin"
    write_container(path, kind="model", tensors=params, graph=graph)
    x = _inputs()
    want = reference.run(graph, params, x)
    with Engine(path, threads=threads) as eng:
        got = eng.run(x, copy=True)
        for b in (1, 4):
            np.testing.assert_allclose(eng.run(x[:b], copy=True), want["logits"][:b],
                                       rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, want["logits"], rtol=1e-5, atol=1e-5)
    pre = reference.run(*_model(), x, keep_all=True)["c1:0"]
    assert pre.min() < -3 and pre.max() > 3  # both kinks were in play


def test_onnx_matches_onnxruntime(tmp_path):
    pytest.importorskip("onnx")
    from pocket.export.onnx_export import save, to_onnx

    graph, params = _model()
    fgraph, fparams = T.optimize(graph, params)[:2]
    x = _inputs()
    for g, p in ((graph, params), (fgraph, fparams)):
        model = to_onnx(g, p)
        kinds = [node.op_type for node in model.graph.node]
        assert "HardSwish" in kinds and "HardSigmoid" in kinds
        hs = next(node for node in model.graph.node if node.op_type == "HardSigmoid")
        assert {a.name: round(a.f, 7) for a in hs.attribute} == {"alpha": round(1 / 6, 7),
                                                                  "beta": 0.5}
        save(model, tmp_path / "m.onnx")
        np.testing.assert_allclose(run_ort(tmp_path / "m.onnx", x),
                                   reference.run(g, p, x)["logits"], rtol=1e-5, atol=1e-5)


def test_int8_export_runs_bit_exact(tmp_path):
    from pocket.infer import Engine

    graph, params = _model(seed=3)
    calib = _inputs(64)
    ckpt = write_ckpt(tmp_path / "m.ckpt", graph, params, calib)
    r = export(ckpt, tmp_path / "m.int8.bin", int8=True)
    reasons = {x["name"]: x["reason"] for x in r["layers_fp32"]}
    # A layer that fuses hardswish/hardsigmoid stays fp32 (their int8 policy); c3 (relu) and
    # the head go int8, the standalone hardswish runs f32 between dequantize and quantize.
    assert set(reasons) == {"c1", "c2", "fc1"}
    assert "'hardswish' has no int8 form" in reasons["c1"]
    with read_container(tmp_path / "m.int8.bin") as c:
        kinds = {n.name: "x_scale" in n.attrs for n in c.graph.nodes if n.op in ("conv2d",
                                                                                  "linear")}
        assert kinds == {"c1": False, "c2": False, "c3": True, "fc1": False, "head": True}
        x = _inputs(9)
        want = reference.run_container(c, x)["logits"]
    with Engine(tmp_path / "m.int8.bin") as eng:
        np.testing.assert_array_equal(eng.run(x, copy=True), want)
    pytest.importorskip("onnxruntime")
    export(ckpt, tmp_path / "m.int8.onnx", int8=True)
    np.testing.assert_allclose(run_ort(tmp_path / "m.int8.onnx", x), want, atol=1e-4)
