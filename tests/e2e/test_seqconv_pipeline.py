"""A `tcn` trained for a few steps on a toy sequence task -> checkpoint -> export (fp32 and
int8, .bin and .onnx) -> the engine and onnxruntime -> `compare` against the training model."""

import numpy as np
import pytest

pytest.importorskip("onnxruntime")


def _waves(n, length, rng):
    # three classes of noisy (sin, cos) pairs at different frequencies
    y = rng.integers(0, 3, n)
    t = np.arange(length)
    arg = 2 * np.pi * np.array([0.08, 0.2, 0.35])[y][:, None] * t + rng.uniform(0, 6.3, (n, 1))
    x = np.stack([np.sin(arg), 0.5 * np.cos(arg)], 1) + 0.3 * rng.standard_normal((n, 2, length))
    return x.astype(np.float32), y


@pytest.fixture(scope="module")
def tcn_ckpt(tmp_path_factory):
    from pocket.train import config, models, trace
    from pocket.train import functional as F
    from pocket.train.checkpoint import save_checkpoint
    from pocket.train.optim import Adam
    from pocket.train.tensor import Tensor

    rng = np.random.default_rng(0)
    x, y = _waves(160, 24, rng)
    cfg = config.merge({"model": {"name": "tcn", "channels": [12, 12], "dropout": 0.1}})
    model = models.build_model(cfg["model"], (2, 24), 3, rng)
    opt = Adam(model.parameters(), lr=0.01)
    for _ in range(30):
        i = rng.integers(0, len(x), 32)
        loss = F.cross_entropy(model(Tensor(x[i])), y[i])
        model.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    graph, _ = trace.trace(model, (2, 24), {"task": "classification",
                                            "labels": ["slow", "mid", "fast"]})
    path = tmp_path_factory.mktemp("tcn") / "tcn.ckpt"
    save_checkpoint(path, graph=graph, state=model.state_dict(), optimizer_state={},
                    # what compare reads of the trainer's meta (no resume from this one)
                    meta={"config": cfg, "trainer": {"epoch": 1, "step": 30},
                          "dataset": {"input_shape": [2, 24], "task": "classification"}},
                    calib_x=x[:64], calib_y=y[:64])
    xt, yt = _waves(96, 24, np.random.default_rng(1))
    np.save(path.parent / "x.npy", xt)
    return path, xt, yt


def test_tcn_exports_and_compares(tcn_ckpt):
    from pocket.compare import compare
    from pocket.export.app import export

    ckpt, xt, yt = tcn_ckpt
    out = ckpt.parent
    for name, int8 in (("m.bin", False), ("m.onnx", False), ("q.bin", True), ("q.onnx", True)):
        rep = export(ckpt, out / name, int8=int8)
        if int8:
            assert all(r["int8"] for r in rep["layers"] if r["op"] == "conv1d"), rep["layers"]
            assert rep["size"] < rep["fp32_size"] or name.endswith(".onnx")  # QDQ constants weigh in
    fp = compare(str(ckpt), bin_path=str(out / "m.bin"), onnx_path=str(out / "m.onnx"),
                 inputs_path=str(out / "x.npy"))
    assert fp["passed"], fp["failures"]
    assert all(p["metrics"]["max_abs"] < 1e-4 for p in fp["pairs"])
    q = compare(str(ckpt), bin_path=str(out / "q.bin"), onnx_path=str(out / "q.onnx"),
                inputs_path=str(out / "x.npy"))
    assert q["passed"], q["failures"]

    from pocket.infer import Engine

    with Engine(out / "m.bin") as eng, Engine(out / "q.bin") as eng8:
        acc = float((eng.run(xt).argmax(1) == yt).mean())
        acc8 = float((eng8.run(xt).argmax(1) == yt).mean())
    assert acc >= 0.8 and acc8 >= acc - 0.05, (acc, acc8)
