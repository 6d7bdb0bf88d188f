"""A LoRA run exports as its base model's graph: the adapters are merged into plain linear
weights (W + alpha/r B A), and the fp32 `.bin` (engine) and ONNX (onnxruntime) match the
training model, adapters and all, within 1e-4 on the test split. Both an MLP with adapters on
every linear layer and a small ViT with adapters on its attention projections."""

from __future__ import annotations

import numpy as np
import pytest

from pocket.compare import exact_session_options

ort = pytest.importorskip("onnxruntime")

CONFIG = """\
[run]
seed = 0
tensorboard = false
[data]
source = "digits"
limit = 96
[model]
{model}
[lora]
rank = 2
alpha = 8.0
targets = [{targets}]
[train]
epochs = 1
batch_size = 32
lr = 3e-2
weight_decay = 0.0
keep = "last"
"""

CASES = {
    "mlp": ('name = "mlp"\nhidden = [16]', '"linear"'),
    "vit": ('name = "vit"\npatch = 4\ndim = 8\ndepth = 1\nheads = 2\nmlp_ratio = 1.0',
            '"attention"'),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_lora_exports_merged_and_matches_the_training_model(tmp_path, case):
    from pocket.compare import _run_training, _training_model
    from pocket.export.app import export
    from pocket.infer import Engine
    from pocket.train import models
    from pocket.train.checkpoint import load_checkpoint
    from pocket.train.data import load_dataset
    from pocket.train.run import train_from_config
    from pocket.train.trace import trace

    model_text, targets = CASES[case]
    (tmp_path / "cfg.toml").write_text(CONFIG.format(model=model_text, targets=targets))
    r = train_from_config(str(tmp_path / "cfg.toml"), {"out": str(tmp_path / "run")},
                          quiet=True)
    ckpt = r["last_checkpoint"]
    ck = load_checkpoint(ckpt)
    adapted = sorted({k.rpartition(".")[0] for k in ck["state"] if k.endswith(".lora_B")})
    assert adapted and all(".attn." in k for k in adapted) == (case == "vit")
    # the merge must matter, or the test could not tell merged from base weights
    assert max(np.abs(ck["state"][f"{k}.lora_B"]).max() for k in adapted) > 1e-3

    # the same graph as the base model: ops and attrs node by node, plain linear, no adapters
    cfg = ck["meta"]["config"]
    plain = models.build_model(cfg["model"], (1, 8, 8), 10, np.random.default_rng(0)).eval()
    base_graph, _ = trace(plain, (1, 8, 8))
    assert [(n.op, n.attrs) for n in ck["graph"].nodes] == \
        [(n.op, n.attrs) for n in base_graph.nodes]
    assert not any("lora" in p for p in ck["graph"].params)

    x = load_dataset("digits", seed=0, limit=96).test.x
    model, _ = _training_model(ckpt)
    want = _run_training(model, x)
    export(ckpt, tmp_path / "m.bin")
    export(ckpt, tmp_path / "m.onnx")
    with Engine(tmp_path / "m.bin", max_batch=len(x)) as eng:
        np.testing.assert_allclose(eng.run(x), want, rtol=1e-4, atol=1e-4)
    s = ort.InferenceSession(str(tmp_path / "m.onnx"), exact_session_options(ort),
                             providers=["CPUExecutionProvider"])
    got = s.run(None, {s.get_inputs()[0].name: x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
