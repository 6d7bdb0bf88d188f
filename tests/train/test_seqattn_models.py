"""Zoo `transformer` and `vit` and the sequence layer-list kinds: they build, trace to the
documented ops, and their fp32 .bin (engine) and ONNX (onnxruntime) match the training model
within 1e-4."""

import numpy as np
import pytest

from pocket.compare import exact_session_options
from pocket.train import models, trace
from pocket.train import nn_seqattn as NS
from pocket.train.models import ModelError
from pocket.train.tensor import Tensor, no_grad


def _exports_match(tmp_path, model, shape, x):
    from pocket.export.transforms import optimize
    from pocket.formats.container import write_container
    from pocket.infer.engine import Engine

    model.eval()
    with no_grad():
        want = model(Tensor(x)).data
    g, params = trace.trace(model, shape)
    g, params, _ = optimize(g, params)
    write_container(tmp_path / "m.bin", kind="model", tensors=params, graph=g)
    with Engine(tmp_path / "m.bin") as e:
        np.testing.assert_allclose(e.run(x), want, atol=1e-4, rtol=0)
        np.testing.assert_allclose(e.run(x[:1]), want[:1], atol=1e-4, rtol=0)
    ort = pytest.importorskip("onnxruntime")
    from pocket.export.onnx_export import to_onnx

    s = ort.InferenceSession(to_onnx(g, params).SerializeToString(), exact_session_options(ort),
                             providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(s.run(None, {"input": x})[0], want, atol=1e-4, rtol=0)
    return g


def test_vit_exports_match(tmp_path):
    rng = np.random.default_rng(0)
    m = models.ZOO["vit"]((1, 8, 8), 10, dim=16, depth=2, heads=2, rng=rng)
    g = _exports_match(tmp_path, m, (1, 8, 8), rng.standard_normal((3, 1, 8, 8)).astype(np.float32))
    ops = [n.op for n in g.nodes]
    assert ops[:3] == ["conv2d", "reshape", "transpose"] and ops.count("attention") == 2
    assert g.nodes[0].attrs["stride"] == [2, 2]


@pytest.mark.parametrize("kw", [{"vocab": 11}, {"causal": True, "positional": "sinusoidal"}])
def test_transformer_exports_match(tmp_path, kw):
    rng = np.random.default_rng(1)
    shape = (5,) if "vocab" in kw else (5, 3)
    m = models.ZOO["transformer"](shape, 4, dim=8, depth=2, heads=2, rng=rng, **kw)
    x = (rng.integers(0, 11, (3, 5)) if "vocab" in kw
         else rng.standard_normal((3, 5, 3)).astype(np.float32))
    g = _exports_match(tmp_path, m, shape, x)
    assert g.inputs["input"].dtype == ("i64" if "vocab" in kw else "f32")
    att = [n for n in g.nodes if n.op == "attention"]
    assert all(n.attrs["causal"] == bool(kw.get("causal")) for n in att)


def test_mha_traces_to_its_parts():
    g, _ = trace.trace(NS.MultiheadAttention(8, 2, causal=True), (3, 8))
    assert [n.op for n in g.nodes] == (["linear", "reshape", "transpose"] * 3
                                       + ["attention", "transpose", "reshape", "linear"])
    assert g.nodes[1].attrs["shape"] == [-1, 2, 4]
    assert g.nodes[9].attrs == {"causal": True, "scale": 0.5}


def test_layer_list(tmp_path):
    layers = [{"type": "linear", "out": 8}, {"type": "positional_encoding", "kind": "sinusoidal"},
              {"type": "transformer_block", "heads": 2, "mlp_ratio": 2.0},
              {"type": "attention", "heads": 4, "causal": True}, {"type": "layernorm"},
              {"type": "mean_pool"}, {"type": "linear"}]
    m = models.build_model({"layers": layers}, (6, 3), 5, np.random.default_rng(2))
    x = np.random.default_rng(3).standard_normal((2, 6, 3)).astype(np.float32)
    _exports_match(tmp_path, m, (6, 3), x)
    m = models.build_model({"layers": [{"type": "patch_embedding", "dim": 4, "patch": 2},
                                       {"type": "mean_pool"}, {"type": "linear"}]},
                           (1, 4, 6), 3, None)
    assert m(Tensor(np.zeros((2, 1, 4, 6), np.float32))).shape == (2, 3)
    m = models.build_model({"layers": [{"type": "embedding", "vocab": 5, "dim": 4},
                                       {"type": "mean_pool"}, {"type": "linear"}]}, (7,), 2, None)
    assert m(Tensor(np.zeros((2, 7), np.int64))).shape == (2, 2)


@pytest.mark.parametrize("name,shape,kw,msg", [
    ("vit", (1, 8, 8), {"patch": 3}, "must divide"),
    ("vit", (1, 8, 8), {"dim": 10, "heads": 4}, "divisible by heads"),
    ("transformer", (4,), {}, r"\(L, F\)"),
    ("transformer", (4, 2), {"vocab": 5}, r"\(L,\) token ids"),
    ("transformer", (4, 2), {"positional": "rope"}, "learned or sinusoidal"),
])
def test_model_option_errors(name, shape, kw, msg):
    with pytest.raises(ModelError, match=msg):
        models.ZOO[name](shape, 3, **kw)


def test_layer_list_errors():
    with pytest.raises(ModelError, match=r"layers\[0\] \(attention\): attention needs \(L, D\)"):
        models.build_model({"layers": [{"type": "attention"}]}, (1, 8, 8), 3, None)
    with pytest.raises(ModelError, match="patch 3 must divide"):
        models.build_model({"layers": [{"type": "patch_embedding", "dim": 4, "patch": 3}]},
                           (1, 8, 8), 3, None)
