"""int8 linears over (N, L, in) through export (issue 24): quantized like the 2-D ones (the
leading dims as rows), the engine bit for bit like the reference, the ONNX QDQ form checked
by onnx.checker and run by onnxruntime (with its integer QGemm kernels) against the reference."""

from __future__ import annotations

import numpy as np
import pytest
from export_models import Net
from test_export_app import run_ort, write_ckpt

from pocket.export import export
from pocket.formats import reference
from pocket.formats.container import read_container

L, F = 7, 5


def _model(seed: int = 0):
    """(N, 7, 5) -> linear+relu -> linear+clip (relu6) -> layernorm -> linear+gelu (stays fp32:
    gelu has no int8 form) -> linear without bias -> flatten -> head: linears over (N, L, in)
    with every int8 fusion, an fp32 one among them, and a 2-D head."""
    n = Net((L, F), seed)
    h = n.op("relu", n.linear(n.input, 16, name="fc1"), name="r1")
    h = n.op("clip", n.linear(h, 16, name="fc2"), name="relu6", min=0.0, max=6.0)
    ln_w, ln_b = n.param("ln.weight", np.ones(16)), n.param("ln.bias", np.zeros(16))
    h = n.op("layernorm", h, ln_w, ln_b, name="ln", eps=1e-5)
    h = n.op("gelu", n.linear(h, 12, name="fc3"), name="g3")
    h = n.linear(h, 8, name="fc4", bias=False)
    out = n.linear(n.op("flatten", h), 3, name="head", out="logits")
    return n.graph([out]), n.params


def _inputs(n: int, seed: int = 5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.linspace(0, 1, L, dtype=np.float32)[None, :, None]
    return (np.sin(6 * t + rng.uniform(0, 6, (n, 1, F))) + 0.2 * rng.standard_normal((n, L, F))
            ).astype(np.float32)


@pytest.fixture(scope="module")
def seq_ckpt(tmp_path_factory):
    graph, params = _model()
    return write_ckpt(tmp_path_factory.mktemp("seq") / "m.ckpt", graph, params, _inputs(96)), graph, params


def test_linears_over_rows_go_int8_and_run_bit_exact(seq_ckpt, tmp_path):
    from pocket.infer import Engine

    ckpt, graph, params = seq_ckpt
    r = export(ckpt, tmp_path / "m.int8.bin", int8=True)
    assert {x["name"]: x["reason"] for x in r["layers_fp32"]} == {
        "fc3": "fused activation 'gelu' has no int8 form (only relu and clip fuse into int8)"}
    with read_container(tmp_path / "m.int8.bin") as c:
        kinds = {n.name: "x_scale" in n.attrs for n in c.graph.nodes if n.op == "linear"}
        assert kinds == {"fc1": True, "fc2": True, "fc3": False, "fc4": True, "head": True}
        # fc1 writes int8 codes straight into fc2 (int8 result), fc2 f32 for the layernorm
        attrs = {n.name: n.attrs for n in c.graph.nodes}
        assert "y_scale" in attrs["fc1"] and "y_scale" not in attrs["fc2"]
        x = _inputs(3, seed=9)
        want = {n: reference.run_container(c, x[:n])["logits"] for n in (1, 3)}
    fp32 = reference.run(graph, params, x)["logits"]
    assert np.abs(want[3] - fp32).max() <= 0.05 * np.abs(fp32).max()
    for max_batch in (1, 3, 64):
        with Engine(tmp_path / "m.int8.bin", max_batch=max_batch) as eng:
            for n in (1, 3):
                np.testing.assert_array_equal(eng.run(x[:n], copy=True), want[n])
            assert "linear_rows" not in {r["route"] for r in eng.routes() if r["node"] != "fc3"}


def test_onnx_int8_rows_run_in_onnxruntime(seq_ckpt, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    import onnx

    ckpt, _, _ = seq_ckpt
    export(ckpt, tmp_path / "m.int8.bin", int8=True)
    r = export(ckpt, tmp_path / "m.int8.onnx", int8=True)  # onnx.checker inside
    x = _inputs(11, seed=3)
    with read_container(tmp_path / "m.int8.bin") as c:
        want = reference.run_container(c, x)["logits"]
    got = run_ort(r["output"], x)
    # the two int8 paths differ only in requantization rounding (onnxruntime requantizes in
    # float32), far below the int8 error
    assert np.abs(got - want).max() <= 0.02 * np.abs(want).max()
    assert np.mean(got.argmax(1) == want.argmax(1)) >= 0.9
    # (default options: the kernels onnxruntime fuses by default; with x64quantprecision it
    # keeps the 3-D linears' MatMul unfused on x86 without VNNI)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    opts.optimized_model_filepath = str(tmp_path / "opt.onnx")
    ort.InferenceSession(r["output"], opts, providers=["CPUExecutionProvider"])
    # fc1, fc4 over the rows and the head: integer QGemm kernels. fc2 (f32 result, then its
    # fused relu6) stays DequantizeLinear + float Gemm, as a 2-D int8 linear with an f32
    # result and a fused activation does (onnxruntime 1.32 fuses DQ -> Gemm -> Q, or a Gemm
    # whose f32 result nothing follows)
    names = {n.name: n.op_type for n in onnx.load(tmp_path / "opt.onnx").graph.node}
    assert [k for k, v in names.items() if v == "QGemm"] == ["fc1", "fc4", "head"], names
