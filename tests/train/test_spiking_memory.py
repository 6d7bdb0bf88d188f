"""The memory planner on a spiking model: T multiplies the activations, and the prediction for
T = 16 lands within 15% of a real training step's measured peak."""

from __future__ import annotations

import numpy as np

from pocket.train import models
from pocket.train.planner import plan_memory
from tests.train.test_planner import _measured_peak


def _snn(steps):
    return lambda: models.ZOO["snn"]((1, 8, 8), 10, steps=steps, hidden=[64],
                                     rng=np.random.default_rng(0))


def test_planner_predicts_the_spiking_peak_within_15_percent():
    batch = 16
    plans = {t: plan_memory(_snn(t), (1, 8, 8), 10, "classification", batch, 1 << 30,
                            device="cpu", optimizer="adamw") for t in (4, 16)}
    act4, act16 = (plans[t].breakdown["activations"] for t in (4, 16))
    assert 3.5 < act16 / act4 < 4.5  # the saved activations scale with T
    plan = plans[16]
    assert (plan.micro_batch, plan.checkpoint_segments) == (batch, 0)
    peak = _measured_peak(_snn(16), (1, 8, 8), batch, plan)
    assert peak <= plan.predicted_peak_bytes <= 1.15 * peak, (plan.describe(), peak)
