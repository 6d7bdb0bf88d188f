"""An embedding model through every stage: trained by the real trainer with ArcFace on the
digits with classes 7-9 held out -> checkpoint (the class head kept, resumable, never in the
graph; the open-set metrics and the EER threshold in the metadata) -> .bin fp32/int8 and ONNX ->
`compare` (per-sample cosine, retrieval agreement) -> `pocket infer --similarity`."""

from __future__ import annotations

import numpy as np
import pytest

from pocket.train.metrics_embed import KEYS

CONFIG = """
[run]
name = "emb"
out = "{out}"
[data]
source = "digits"
task = "embedding"
holdout = ["7", "8", "9"]
[model]
name = "mlp"
hidden = [32]
[embedding]
dim = 8
s = 16.0
m = 0.3
[train]
loss = "{loss}"
epochs = {epochs}
batch_size = 128
lr = 1e-2
schedule = "constant"
"""


def _train(root, name, epochs=2, loss="arcface", **overrides):
    from pocket.train.run import train_from_config

    cfg = root / f"{name}.toml"
    cfg.write_text(CONFIG.format(out=root / name, loss=loss, epochs=epochs))
    return train_from_config(str(cfg), overrides, quiet=True)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("embed")
    return root, _train(root, "arc")


def test_open_set_metrics_and_threshold(run):
    from pocket.formats.container import read_container

    root, result = run
    assert set(KEYS) <= set(result["test"]) and "loss" not in result["test"]  # unseen classes
    assert {f"val_{k}" for k in (*KEYS, "loss")} <= set(result["final"])
    with read_container(root / "arc" / "best.ckpt", expect_kind="checkpoint") as c:
        meta = c.graph.metadata
        assert "head.weight" in c.tensors and "optim/head.weight/exp_avg" in c.tensors
        assert not any(k.startswith("head") for k in c.graph.params)
        assert c.graph.nodes[-1].op == "l2norm"
    emb = meta["embedding"]
    assert emb["threshold"] == meta["metrics"]["test_eer_threshold"] == result["test"]["eer_threshold"]
    assert emb["trained_classes"] == [str(i) for i in range(7)]
    assert emb["heldout_classes"] == ["7", "8", "9"]


def test_resume_restores_the_head(run):
    from pocket.train.checkpoint import load_checkpoint

    root, _ = run
    _train(root, "half", epochs=1)
    from pocket.train.run import train_from_config

    train_from_config(None, {"resume": str(root / "half" / "last.ckpt"), "epochs": 2}, quiet=True)
    a = load_checkpoint(root / "arc" / "last.ckpt")
    b = load_checkpoint(root / "half" / "last.ckpt")
    assert set(a["state"]) == set(b["state"])
    for k in a["state"]:
        np.testing.assert_array_equal(a["state"][k], b["state"][k], err_msg=k)
    for k in a["optimizer"]["state"]:
        for slot, v in a["optimizer"]["state"][k].items():
            np.testing.assert_array_equal(v, b["optimizer"]["state"][k][slot])


def test_exports_match_the_training_model(run, tmp_path):
    pytest.importorskip("onnxruntime")
    from pocket.compare import compare
    from pocket.export.app import export

    root, _ = run
    ck = root / "arc" / "best.ckpt"
    paths = {}
    for name, kw in (("fp32.bin", {}), ("int8.bin", {"int8": True}), ("fp32.onnx", {}),
                     ("int8.onnx", {"int8": True})):
        paths[name] = str(tmp_path / name)
        export(ck, paths[name], **kw)
    fp32 = compare(str(ck), bin_path=paths["fp32.bin"], onnx_path=paths["fp32.onnx"])
    int8 = compare(str(ck), bin_path=paths["int8.bin"], onnx_path=paths["int8.onnx"])
    assert fp32["passed"] and int8["passed"], fp32["failures"] + int8["failures"]
    for p in fp32["pairs"]:
        assert p["metrics"]["cosine_min"] >= 0.9999 and p["gates"]["min_cosine"] == 0.9999
        assert p["metrics"]["retrieval_agreement"] >= 0.99
    for p in int8["pairs"][:2]:  # train vs bin, train vs onnx
        assert p["metrics"]["cosine_min"] >= 0.99
    assert fp32["engines"]["bin"]["retrieval_top1"] == pytest.approx(
        fp32["engines"]["train"]["retrieval_top1"])
    # the gate can fail: a cosine no export reaches
    strict = compare(str(ck), bin_path=paths["int8.bin"], min_cosine=0.999999)
    assert not strict["passed"] and "min_cosine" in strict["failures"][0]
    assert "retrieval agreement" in __import__("pocket.compare", fromlist=["render"]).render(int8)


def test_softmax_baseline_trains_too(tmp_path):
    result = _train(tmp_path, "sm", epochs=1, loss="softmax")
    assert 0.0 <= result["test"]["tar_far1e-2"] <= 1.0


def test_cli_similarity_on_digit_images_and_compare_gate(run, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    pil = pytest.importorskip("PIL.Image")
    from pocket.export.app import export
    from pocket.train.data.images import read_digits

    root, _ = run
    ck = root / "arc" / "best.ckpt"
    model = tmp_path / "m.bin"
    export(ck, model)
    raw = read_digits()
    for name, i in (("a", 0), ("b", 1)):
        idx = np.flatnonzero(raw.y == 8)[i]
        pil.fromarray((raw.x[idx, 0] * 255.0 / raw.pixel_max).round().astype(np.uint8)).save(
            tmp_path / f"{name}.png")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}

    def pocket(*args):
        return subprocess.run([sys.executable, "-m", "pocket.cli", *map(str, args)],
                              capture_output=True, text=True, env=env, cwd=tmp_path)

    r = pocket("infer", model, "a.png", "b.png", "--similarity", "--json")
    assert r.returncode == 0, r.stderr
    s = __import__("json").loads(r.stdout)["similarity"]
    from pocket.formats.container import read_container

    with read_container(model) as c:
        assert s["threshold"] == c.graph.metadata["embedding"]["threshold"]
    assert s["verdict"] == ("same" if s["cosine"] >= s["threshold"] else "different")
    export(ck, tmp_path / "q.bin", int8=True)
    r = pocket("compare", ck, "--bin", tmp_path / "q.bin", "--min-cosine", "0.999999")
    assert r.returncode == 1 and "min_cosine" in r.stdout
