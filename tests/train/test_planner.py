"""The planner's promise, checked by running a real training step with each plan: the
tracker's measured total peak stays under the budget."""

import re

import numpy as np
import pytest

from pocket.errors import PocketError
from pocket.train import functional as F
from pocket.train import models, optim
from pocket.train.memory import tracking
from pocket.train.planner import BudgetError, plan_memory
from pocket.train.recompute import checkpoint_sequential
from pocket.train.tensor import Tensor, saved_activations_fp16

MiB = 1 << 20


def _digits_cnn():
    return models.cnn((1, 8, 8), 10, rng=np.random.default_rng(0))


def _vgg16():
    return models.vgg((3, 16, 16), 10, channels=[16, 16, 32, 32, 64, 64, 64, 64],
                      rng=np.random.default_rng(0))


def _measured_peak(build, shape, batch, plan) -> int:
    """Two AdamW steps (the second with optimizer state alive) run as the plan says."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch,) + shape).astype(np.float32)
    y = rng.integers(0, 10, batch)
    with tracking() as tracker:
        model = build()
        opt = optim.AdamW(model, lr=1e-3)
        mb = plan.micro_batch
        for _ in range(2):
            for i in range(plan.accumulation):
                xs = Tensor(x[i * mb:(i + 1) * mb])
                with saved_activations_fp16(plan.fp16_activations):
                    out = checkpoint_sequential(model, xs, plan.checkpoint_segments)
                    loss = F.cross_entropy(out, y[i * mb:(i + 1) * mb])
                    (loss * (1.0 / plan.accumulation)).backward()
                del out, loss
            assert opt.step()
            opt.zero_grad()
        return tracker.total_peak


# generous, then budgets where (today) checkpointing, fp16 saved activations and
# accumulation get picked
CASES = [
    (_digits_cnn, (1, 8, 8), 16, [1 << 30, 3 * MiB, 1.9 * MiB]),
    (_vgg16, (3, 16, 16), 16, [1 << 30, 5 * MiB, 3.7 * MiB]),
]


@pytest.mark.parametrize("build,shape,batch,budgets", CASES, ids=["digits_cnn", "vgg16px"])
def test_measured_peak_stays_under_budget(build, shape, batch, budgets):
    plans = []
    for budget in budgets:
        plan = plan_memory(build, shape, 10, "classification", batch, int(budget), device="cpu",
                           optimizer="adamw")
        assert plan.predicted_peak_bytes <= budget
        assert plan.micro_batch * plan.accumulation == batch
        assert sum(plan.breakdown.values()) == plan.predicted_peak_bytes
        peak = _measured_peak(build, shape, batch, plan)
        assert peak <= budget, (plan.describe(), peak)
        # conv workspace included (the tracker counts it under temporaries)
        assert peak <= plan.predicted_peak_bytes
        plans.append(plan)
    first, last = plans[0], plans[-1]
    assert (first.micro_batch, first.checkpoint_segments, first.fp16_activations) == (
        batch, 0, False)
    assert (last.micro_batch < batch or last.checkpoint_segments or last.fp16_activations)
    assert "micro-batch" in last.describe() and "total" in last.describe()


def test_too_small_budget_names_the_minimum():
    with pytest.raises(BudgetError) as e:
        plan_memory(_digits_cnn, (1, 8, 8), 10, "classification", 64, MiB, device="cpu")
    assert isinstance(e.value, PocketError)
    msg = str(e.value)
    assert msg.startswith("budget 1.0 MiB is too small") and "raise --memory-budget" in msg
    need = float(re.search(r"needs at least ([0-9.]+) MiB", msg).group(1))
    # the stated minimum is a budget that works
    plan = plan_memory(_digits_cnn, (1, 8, 8), 10, "classification", 64,
                       int((need + 0.05) * MiB), device="cpu")
    assert plan.micro_batch == 1 or plan.accumulation > 1


def test_optimizer_slots_and_regression_task():
    sgd = plan_memory(_digits_cnn, (1, 8, 8), 10, "regression", 8, 1 << 30, device="cpu",
                      optimizer="sgd")
    adam = plan_memory(_digits_cnn, (1, 8, 8), 10, "regression", 8, 1 << 30, device="cpu")
    n = sum(p.data.nbytes for p in _digits_cnn().parameters())
    assert sgd.breakdown["parameters"] == sgd.breakdown["gradients"] == n
    assert sgd.breakdown["optimizer_state"] == n
    assert adam.breakdown["optimizer_state"] == 2 * n
    assert sgd.precision == "fp32"  # CPU plans never pick fp16 compute
