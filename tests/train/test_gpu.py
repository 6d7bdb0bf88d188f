"""GPU paths: regression tests for the defects of issue 20, run under the CuPy stand-in in CI
(tests/gpu_sim) and on real CuPy where a GPU is present."""

import math

import numpy as np
import pytest

from pocket.train import backend, conv, gpu_kernels, optim
from pocket.train import functional as F
from pocket.train.amp import MixedPrecision
from pocket.train.config import load_config
from pocket.train.tensor import Tensor
from tests import gpu_sim

pytestmark = pytest.mark.gpu

VGG_SMALL = [8, 8, 8, 8, 8, 8, 8, 8]  # the vgg code path with few channels, so CPU runs it


def _trainer(tmp_path, *, device="cuda", precision="fp32", accumulation=1, batch=64, n=160,
             hw=8, model="vgg", optimizer="adamw", dropout=0.0, clip=None, budget=None):
    from pocket.train.trainer import Trainer

    rng = np.random.default_rng(0)
    data = tmp_path / "data.npz"
    np.savez(data, x=rng.standard_normal((n, 3, hw, hw)).astype(np.float32),
             y=rng.integers(0, 10, n))
    lines = [
        "[run]", f'device = "{device}"', f'out = "{tmp_path / "run"}"',
        "[data]", f'source = "npz:{data}"', "val_fraction = 0.1", "test_fraction = 0.1",
        "prefetch = 0",
        "[model]", f'name = "{model}"', f"channels = {VGG_SMALL}", f"dropout = {dropout}",
        "[train]", f"batch_size = {batch}", f'optimizer = "{optimizer}"', "epochs = 1",
        *([f"clip_grad_norm = {clip}"] if clip else []),
        "[memory]", f'precision = "{precision}"', f"accumulation = {accumulation}",
        *([f'budget = "{budget}"'] if budget else []),
    ]
    cfg_path = tmp_path / "exp.toml"
    cfg_path.write_text("\n".join(lines) + "\n")
    return Trainer(load_config(cfg_path, {}), quiet=True)


def _batch(trainer):
    return next(iter(trainer.train_loader.epoch(0)))


def _sim_only(xp=None):
    if not gpu_sim.is_sim(xp or backend.get_device("cuda").xp):
        pytest.skip("counts host syncs: needs the CuPy stand-in")


# ----------------------------------------------------------------------------- fp16 on cuda


def test_fp16_trainer_on_cuda_steps_with_masters_on_the_device(tmp_path):
    # the construction order of `pocket train --precision fp16 --device cuda`
    tr = _trainer(tmp_path, precision="fp16")
    xp = tr.device.xp
    xb, yb = _batch(tr)
    for _ in range(2):
        loss, _ = tr.train_step(xb, yb)
        assert math.isfinite(loss)
    assert tr.optimizer.step_count == 2
    for _, master in tr.amp.master_params():
        assert isinstance(master.data, xp.ndarray) and master.data.dtype == np.float32
    for st in tr.optimizer.state.values():
        assert all(isinstance(a, xp.ndarray) for a in st.values())
    conv_w = tr.model[0].weight
    assert conv_w.data.dtype == np.float16 and isinstance(conv_w.data, xp.ndarray)


def test_fp16_masters_made_before_the_move_are_a_clear_error(tmp_path):
    from pocket.train import models
    from pocket.train.amp import PrecisionError

    m = models.mlp((1, 4, 4), 3, hidden=[8], rng=np.random.default_rng(0))
    amp = MixedPrecision(m, "fp16")
    m.to("cuda")
    with pytest.raises(PrecisionError, match="after moving the model"):
        amp.before_step()


def test_full_fp16_run_on_cuda_writes_checkpoints(tmp_path):
    tr = _trainer(tmp_path, precision="fp16", n=96, batch=32)
    result = tr.fit()
    assert result["device"] == "cuda:0" and result["precision"] == "fp16"
    assert (tmp_path / "run" / "best.ckpt").exists()


# ----------------------------------------------------------------------------- host syncs


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("accumulation", [1, 4])
def test_a_vgg_step_at_batch_64_waits_on_the_host_once(tmp_path, precision, accumulation):
    tr = _trainer(tmp_path, precision=precision, accumulation=accumulation)
    _sim_only(tr.device.xp)
    xb, yb = _batch(tr)
    assert len(xb) == 64
    for _ in range(2):  # the first step creates the optimizer state; both count
        with gpu_sim.counting(trace=True) as c:
            tr.train_step(xb, yb)
        assert c.syncs <= 1, "\n".join(c.sync_sites)
    assert tr.optimizer.step_count == 2


def test_clipping_and_sgd_stay_on_the_device(tmp_path):
    tr = _trainer(tmp_path, optimizer="sgd", clip=1.0)
    _sim_only(tr.device.xp)
    xb, yb = _batch(tr)
    with gpu_sim.counting(trace=True) as c:
        tr.train_step(xb, yb)
    assert c.syncs <= 1, "\n".join(c.sync_sites)


def test_device_clipping_matches_the_host_one():
    xp = backend.get_device("cuda").xp
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(s) for s in ((3, 4), (5,))]
    for max_norm in (0.5, 100.0):
        ps = [Tensor(xp.asarray(g), requires_grad=True) for g in grads]
        for p, g in zip(ps, grads):
            p.grad = xp.asarray(g)
        total = optim.clip_grad_norm(ps, max_norm, sync=False)
        norm = math.sqrt(sum((g**2).sum() for g in grads))
        assert math.isclose(float(total), norm, rel_tol=1e-12)
        factor = min(1.0, max_norm / (norm + 1e-6))
        for p, g in zip(ps, grads):
            np.testing.assert_allclose(backend.to_numpy(p.grad), g * factor, rtol=1e-12)


def test_a_nonfinite_gradient_skips_the_step_and_backs_off_the_scale(tmp_path):
    tr = _trainer(tmp_path, precision="fp16")
    xb, yb = _batch(tr)
    before = {n: backend.to_numpy(p.data).copy() for n, p in tr.amp.master_params()}
    scale = tr.scaler.scale
    xb = xb.copy()
    xb[0, 0, 0, 0] = np.inf
    tr.train_step(xb, yb)
    assert tr.skipped_steps == 1 and tr.scaler.scale == scale / 2
    for n, p in tr.amp.master_params():
        np.testing.assert_array_equal(backend.to_numpy(p.data), before[n])


# ----------------------------------------------------------------------------- devices


def test_cuda_1_is_honoured_for_every_allocation_and_the_pool_cap(tmp_path):
    xp = backend.get_device("cuda").xp
    if not gpu_sim.is_sim(xp) and xp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two CUDA devices")
    try:
        tr = _trainer(tmp_path, device="cuda:1", budget="1GiB", precision="fp16")
        xb, yb = _batch(tr)
        tr.train_step(xb, yb)
        assert str(tr.device) == "cuda:1"
        for _, p in tr.amp.master_params():
            assert p.data.device.id == 1
        for p in tr.model.parameters():
            assert p.data.device.id == 1
        for st in tr.optimizer.state.values():
            assert all(a.device.id == 1 for a in st.values())
        assert backend.gpu_pool_stats(backend.get_device("cuda:1"))["limit_bytes"] == (
            backend.gpu_pool_limit(1 << 30))
        assert backend.gpu_pool_stats(backend.get_device("cuda:0"))["limit_bytes"] == 0
    finally:
        backend.cap_gpu_pool(None, backend.get_device("cuda:1"))
        backend.use_device(backend.get_device("cuda:0"))


def test_pool_cap_leaves_room_for_context_and_workspaces():
    budget = 4 << 30
    limit = backend.gpu_pool_limit(budget)
    assert limit + backend.GPU_CONTEXT_RESERVE + backend.GPU_LIBRARY_RESERVE < budget
    assert backend.gpu_pool_limit(1 << 30) > 0


# ----------------------------------------------------------------------------- ops


def test_gelu_keeps_fp16_on_the_gpu():
    xp = backend.get_device("cuda").xp
    x = np.linspace(-4, 4, 33).astype(np.float16)
    t = Tensor(xp.asarray(x), requires_grad=True)
    y = F.gelu(t)
    assert y.dtype == np.float16
    want = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64)])
    np.testing.assert_allclose(y.numpy().astype(np.float64), want, atol=4e-3, rtol=2e-3)
    y.sum().backward()
    assert t.grad.dtype == np.float16


def test_erf_kernel_against_math_erf():
    xp = backend.get_device("cuda").xp
    x = np.linspace(-3, 3, 25)
    for dt, tol in ((np.float64, 1e-12), (np.float32, 1e-6)):
        got = backend.to_numpy(backend.erf(xp.asarray(x.astype(dt))))
        assert got.dtype == dt
        np.testing.assert_allclose(got, [math.erf(v) for v in x.astype(dt)], atol=tol)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_maxpool_propagates_nan_in_every_window_position(xp, dtype):
    x = np.arange(32, dtype=dtype).reshape(1, 2, 4, 4)
    x[0, 0, 0, 1] = np.nan   # second tap of window (0, 0)
    x[0, 0, 3, 3] = np.nan   # last tap of window (1, 1)
    x[0, 1, :2, :2] = np.nan  # a window of NaN only (was -inf on the GPU)
    out = F.maxpool2d(Tensor(xp.asarray(x)), 2).numpy()
    nan = np.isnan(out)
    assert nan[0, 0, 0, 0] and nan[0, 0, 1, 1] and nan[0, 1, 0, 0]
    assert not nan[0, 0, 0, 1] and out[0, 0, 0, 1] == 7 and out[0, 1, 1, 1] == 31


def test_getitem_backward_accumulates_repeated_indices_with_add_at():
    xp = backend.get_device("cuda").xp
    t = Tensor(xp.asarray(np.arange(4.0)), requires_grad=True)
    t[xp.asarray([0, 0, 2])].sum().backward()
    np.testing.assert_array_equal(backend.to_numpy(t.grad), [2.0, 0.0, 1.0, 0.0])


def test_conv_weight_gradient_sums_chunks_in_fp32(monkeypatch):
    xp = backend.get_device("cuda").xp
    monkeypatch.setitem(conv.CONV_WORKSPACE_BYTES, "cuda", 1)  # one sample per chunk
    n = 2100  # an fp16 running sum of ones stops at 2048; 2100 is exact in fp16
    x = Tensor(xp.ones((n, 1, 1, 1), np.float16))
    w = Tensor(xp.ones((1, 1, 1, 1), np.float16), requires_grad=True)
    b = Tensor(xp.zeros((1,), np.float16), requires_grad=True)
    F.conv2d(x, w, b).sum().backward()
    assert w.grad.dtype == np.float16
    assert float(w.grad.reshape(-1)[0]) == n and float(b.grad[0]) == n


def test_batchnorm_parameter_gradients_stay_fp32_under_fp16(xp):
    from pocket.train import nn

    model = nn.Sequential(nn.Conv2d(1, 2, 1, rng=np.random.default_rng(0)), nn.BatchNorm2d(2))
    if xp is not np:
        model.to("cuda")
    amp = MixedPrecision(model, "fp16")
    amp.before_step()
    bn = model[1]
    assert bn.weight.dtype == np.float32 and model[0].weight.dtype == np.float16
    # gy = 1/1024 on every element: gbeta is the exact count / 1024 in fp32 (1536 elements
    # sum to 1.5; an fp16 gradient of the scaled loss, 1536*64 = 98304, overflows 65504)
    x = Tensor(amp.cast_input(xp.asarray(np.random.default_rng(1).standard_normal(
        (24, 1, 8, 8)).astype(np.float32))))
    out = model(x)
    assert out.dtype == np.float16
    (F.astype(out, np.float32).sum() * 64.0 / 1024.0).backward()
    assert bn.bias.grad.dtype == np.float32
    np.testing.assert_allclose(backend.to_numpy(bn.bias.grad), [96.0, 96.0], rtol=1e-6)
    assert not amp.grads_to_master(64.0)
    names = [n for n, _ in amp.master_params()]
    assert names == [n for n, _ in model.named_parameters()]


# ----------------------------------------------------------------------------- dropout RNG


def test_splitmix64_twin_matches_the_published_sequence():
    # splitmix64 from state 0: the first outputs of Vigna's reference implementation
    got = gpu_kernels.splitmix64(np.array([0, 0x9E3779B97F4A7C15], np.uint64))
    assert [int(v) for v in got] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4]


def test_gpu_dropout_makes_no_generator_and_is_reproducible():
    xp = backend.get_device("cuda").xp
    x = Tensor(xp.ones((400, 50), np.float32))
    backend.manual_seed(3)
    with gpu_sim.counting(trace=True) as c:
        a = F.dropout(x, 0.25, training=True)
    a = a.numpy()
    if gpu_sim.is_sim(xp):
        from tests.gpu_sim import fake_cupy

        assert fake_cupy._Generator.created == 0 and c.syncs == 0, c.sync_sites
    backend.manual_seed(3)
    b = F.dropout(x, 0.25, training=True).numpy()
    np.testing.assert_array_equal(a, b)
    assert set(np.unique(a)) == {0.0, np.float32(1 / 0.75)}
    assert abs((a == 0).mean() - 0.25) < 0.01


# ----------------------------------------------------------------------------- extras


@pytest.mark.parametrize("runtime,driver,cc,want", [
    (13000, 13000, "61", "pocketnn[gpu]'"),         # a GTX 1060 with the CUDA 13 wheel
    (13000, 12080, "89", "pocketnn[gpu]'"),         # a CUDA 12 driver with the CUDA 13 wheel
    (12080, 11080, "86", "update the NVIDIA driver"),
    (12080, 12080, "52", ""),                        # a GTX 750 Ti with the CUDA 12 wheel: fine
    (13000, 13000, "90", ""),
])
def test_train_names_the_extra_that_drives_the_card(monkeypatch, runtime, driver, cc, want):
    xp = backend.get_device("cuda").xp
    _sim_only(xp)
    monkeypatch.setattr(xp.cuda.runtime, "runtimeGetVersion", lambda: runtime)
    monkeypatch.setattr(xp.cuda.runtime, "driverGetVersion", lambda: driver)
    monkeypatch.setattr(type(xp.cuda.Device(0)), "compute_capability", property(lambda s: cc))
    hint = backend.cupy_build_mismatch(0)
    if not want:
        assert hint == "" and backend.get_device("cuda").kind == "cuda"
        return
    assert want in hint
    from pocket.errors import PocketError

    with pytest.raises(PocketError, match="pip install|update the NVIDIA driver"):
        backend.get_device("cuda")


# ----------------------------------------------------------------------------- memory


def test_gpu_peak_is_measured_per_category_into_metrics_and_summary(tmp_path):
    import json

    tr = _trainer(tmp_path, n=96, batch=32)
    result = tr.fit()
    m = result["gpu_memory"]
    assert m["peak_bytes"] > 0
    cats = m["at_peak"]
    assert cats["parameters"] > 0 and cats["activations"] > 0
    assert m["peak_bytes"] >= sum(cats.values())
    rows = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["gpu_peak_bytes"] == m["peak_bytes"]
    from pocket.train.run import render

    assert "GPU peak (pool, measured)" in render(result)


def test_gpu_peak_sees_a_temporary_the_end_of_step_numbers_miss():
    xp = backend.get_device("cuda").xp
    peak = backend.GpuPeak(backend.get_device("cuda"))
    try:
        base = peak.live
        tmp = xp.empty(1 << 20, np.uint8)
        del tmp
        assert peak.live == base and peak.peak >= base + (1 << 20)
    finally:
        peak.close()


def test_to_device_copies_between_cards():
    xp = backend.get_device("cuda").xp
    if not gpu_sim.is_sim(xp) and xp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two CUDA devices")
    a = backend.to_device(np.arange(3.0), "cuda:0")
    b = backend.to_device(a, "cuda:1")
    assert a.device.id == 0 and b.device.id == 1
    assert backend.to_device(b, "cuda:1") is b
    np.testing.assert_array_equal(backend.to_numpy(b), [0.0, 1.0, 2.0])


def test_pocket_train_fp16_on_cuda_through_the_cli(tmp_path):
    # the command itself, in-process: flags -> config -> Trainer -> fit
    import json

    from click.testing import CliRunner

    from pocket.cli import main

    tr_dir = tmp_path / "cfg"
    tr_dir.mkdir()
    _trainer(tr_dir, n=96, batch=32)  # writes exp.toml and the data
    out = tmp_path / "run"
    res = CliRunner().invoke(main, ["train", str(tr_dir / "exp.toml"), "--device", "cuda",
                                    "--precision", "fp16", "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout.strip().splitlines()[-1])
    assert r["device"] == "cuda:0" and r["precision"] == "fp16" and r["gpu_memory"]["peak_bytes"]
    assert (out / "best.ckpt").exists()
