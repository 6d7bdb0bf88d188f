"""Memory budget planner: pick micro-batch, accumulation, checkpointing and precision so a
training step's peak stays under a budget.

What a step holds at its peak (an upper bound: the activation peak and the full gradients are
added although the backward frees the first while it fills the second):

    parameters       exact: parameter bytes (+ the fp16 model copy in fp16 mode)
    gradients        exact: one per parameter (fp32 masters + fp16 model grads in fp16 mode)
    optimizer_state  exact: slots x parameter bytes (SGD momentum 1, Adam/AdamW 2)
    activations      measured: the tracker's activation peak of a real forward+backward at
                     micro-batches 2 and 4, fitted as slope * batch + intercept (activation
                     bytes are linear in the batch), plus a 10% margin
    temporaries      on the GPU estimated: the im2col columns of the largest convolution
                     (chunked by `conv.CONV_WORKSPACE_BYTES`); on the CPU measured with the
                     activations (the peak of the two together, minus the activation peak),
                     at most that estimate

Search order: the largest micro-batch dividing the batch, trying no saver, then checkpointing
(about sqrt(children) segments), then fp16 saved activations as well, then fp16 precision (only
on the GPU and when allowed: NumPy has no fast fp16 GEMM and the CPU conv kernels no fp16);
then the next smaller micro-batch. Savers come before accumulation because a smaller
micro-batch also changes what BatchNorm normalizes over, and costs GPU throughput.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from pocket.errors import PocketError
from pocket.train import backend, conv, nn
from pocket.train import functional as F
from pocket.train.memory import CATEGORIES, format_bytes, tracking
from pocket.train.recompute import checkpoint_sequential
from pocket.train.tensor import Tensor, no_grad, saved_activations_fp16

OPTIMIZER_SLOTS = {"sgd": 1, "adam": 2, "adamw": 2}
MARGIN = 0.10
PROBE_BATCHES = (2, 4)


class BudgetError(PocketError):
    """The memory budget cannot fit even one sample with every saver on."""


@dataclass
class Plan:
    micro_batch: int
    accumulation: int
    checkpoint_segments: int
    precision: str
    fp16_activations: bool
    predicted_peak_bytes: int
    budget_bytes: int
    breakdown: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)

    def describe(self) -> str:
        """The decision and its arithmetic as a small table."""
        ck = f"{self.checkpoint_segments} segments" if self.checkpoint_segments > 1 else "off"
        rows = [
            f"memory plan for a budget of {format_bytes(self.budget_bytes)}:",
            f"  micro-batch {self.micro_batch} x {self.accumulation} accumulation steps, "
            f"checkpointing {ck}, precision {self.precision}, fp16 saved activations "
            f"{'on' if self.fp16_activations else 'off'}",
            f"  {'category':<16} {'predicted':>12}",
        ]
        for c in CATEGORIES:
            rows.append(f"  {c:<16} {format_bytes(self.breakdown.get(c, 0)):>12}")
        rows.append(f"  {'total':<16} {format_bytes(self.predicted_peak_bytes):>12}")
        rows += [f"  note: {n}" for n in self.notes]
        return "\n".join(rows)


def _loss(out: Tensor, task: str, num_outputs: int, n: int, xp) -> Tensor:
    out = F.astype(out, np.float32) if out.dtype != np.float32 else out
    if task == "regression":
        return F.mse_loss(out, Tensor(xp.zeros(out.shape, np.float32)))
    return F.cross_entropy(out, xp.arange(n) % num_outputs)


def forward_backward(model, x: Tensor, task: str, num_outputs: int, *,
                     checkpoint_segments: int = 0, fp16_activations: bool = False,
                     weight: float = 1.0) -> Tensor:
    """One forward + loss + backward of `loss * weight` with the given savers (the planner's
    probe, on synthetic targets; also a micro-step for benchmarks). Returns the loss."""
    with saved_activations_fp16(fp16_activations):
        out = (checkpoint_sequential(model, x, checkpoint_segments)
               if checkpoint_segments > 1 else model(x))
        loss = _loss(out, task, num_outputs, x.shape[0], backend.get_array_module(x.data))
        (loss * weight if weight != 1.0 else loss).backward()
    return loss


def _conv_columns(model, input_shape) -> int:
    """Per-sample im2col elements of the widest convolution, from a batch-1 walk of the
    layers (a composite layer such as a residual block is charged its input's size for all
    its convolutions, an overestimate)."""
    worst = 0

    def visit(m, x):
        nonlocal worst
        convs = [c for c in m.modules() if isinstance(c, nn.Conv2d)]
        if isinstance(m, nn.Sequential):
            for child in m.children():
                x = visit(child, x)
            return x
        if convs:
            # im2col columns are C*kh*kw x (output pixels); a spiking block's (N, T, C, H, W)
            # input is T images a sample
            h, w = x.shape[-2], x.shape[-1]
            images = x.data.size // (x.shape[0] * x.shape[-3] * h * w)
            worst = max([worst] + [images * conv.conv_out_hw(h, w, c) * c.in_channels
                                   * math.prod(c.kernel_size) for c in convs])
        return m(x)

    with no_grad():
        visit(model, Tensor(np.zeros((1,) + tuple(input_shape), np.float32)))
    return worst


def _workspace(columns: int, micro_batch: int, itemsize: int, device) -> int:
    # NOTE: conv chunks the batch so its columns stay under CONV_WORKSPACE_BYTES (unless one
    # sample alone is bigger); the gradient columns of the backward are the same size again.
    cap = conv.CONV_WORKSPACE_BYTES["cpu" if device.kind == "cpu" else "cuda"]
    per_sample = columns * itemsize
    return 2 * max(per_sample, min(cap, per_sample * micro_batch))


class _Probe:
    """Measured activation peaks of one model, per saver setting, fitted linearly."""

    def __init__(self, build_model, input_shape, num_outputs, task, device):
        self.build, self.shape, self.k, self.task = build_model, input_shape, num_outputs, task
        self.device = device
        self.fits: dict = {}

    def activation_bytes(self, batch: int, segments: int, fp16_act: bool) -> int:
        return self._fit(batch, segments, fp16_act)[0]

    def work_bytes(self, batch: int, segments: int, fp16_act: bool) -> int:
        """The peak of activations + temporaries together (at most the sum of their peaks)."""
        return self._fit(batch, segments, fp16_act)[1]

    def _fit(self, batch: int, segments: int, fp16_act: bool) -> tuple[int, int]:
        key = (segments, fp16_act)
        if key not in self.fits:
            peaks = [self._measure(b, segments, fp16_act) for b in PROBE_BATCHES]
            (b0, b1) = PROBE_BATCHES
            lines = []
            for p0, p1 in zip(*peaks):
                slope = max(0.0, (p1 - p0) / (b1 - b0))
                lines.append((slope, max(0.0, p0 - slope * b0)))
            self.fits[key] = lines
        return tuple(int(slope * batch + intercept) for slope, intercept in self.fits[key])

    def _measure(self, batch: int, segments: int, fp16_act: bool) -> tuple[int, int]:
        with tracking() as tracker:
            model = self.build().to(self.device)
            model.train()
            xp = self.device.xp
            x = Tensor(xp.asarray(np.random.default_rng(0).standard_normal(
                (batch,) + tuple(self.shape)).astype(np.float32)))
            state = backend.get_rng_state()
            forward_backward(model, x, self.task, self.k, checkpoint_segments=segments,
                             fp16_activations=fp16_act)
            backend.set_rng_state(state)  # planning must not shift the run's random stream
            return tracker.peak["activations"], tracker.work_peak


def plan_memory(build_model: Callable[[], nn.Module], input_shape: tuple, num_outputs: int,
                task: str, batch_size: int, budget_bytes: int, *, device="cpu",
                optimizer: str = "adamw", allow_fp16: bool = True) -> Plan:
    """The cheapest setting (see the module docstring for the order) whose predicted peak
    fits `budget_bytes`; raises BudgetError naming the minimum budget when none does."""
    device = backend.get_device(device)
    with tracking():  # a throwaway copy: its parameters must not count in the run's tracker
        model = build_model()
        param_bytes = sum(p.data.size * 4 for p in model.parameters())
        grad_bytes = sum(p.data.size * 4 for p in model.parameters() if p.requires_grad)
        children = len(list(model.children())) if isinstance(model, nn.Sequential) else 0
        model.train()
        columns = _conv_columns(model, input_shape)
        del model
    slots = OPTIMIZER_SLOTS.get(str(optimizer).lower(), 2)
    segments = max(2, round(math.sqrt(children))) if children >= 4 else 0
    notes = []
    if not segments:
        notes.append("checkpointing needs a Sequential of at least 4 layers; not available")
    fp16_ok = allow_fp16 and device.kind == "cuda"
    probe = _Probe(build_model, input_shape, num_outputs, task, device)

    def predict(mb: int, seg: int, fp16_act: bool, precision: str) -> tuple[int, dict]:
        act = probe.activation_bytes(mb, seg, fp16_act)
        if precision == "fp16":
            act //= 2  # every float activation is fp16 already; fp16 saving changes nothing
        half = precision == "fp16"
        temporaries = _workspace(columns, mb, 2 if half else 4, device)
        if device.kind == "cpu":
            # NOTE: on the CPU the tracker sees the conv workspace, so what the step adds to its
            # activation peak is measured (the workspace lives while part of the activations
            # are freed); the estimate stays the cap, since the chunks stop growing at it
            temporaries = min(temporaries, max(0, probe.work_bytes(mb, seg, fp16_act)
                                                - probe.activation_bytes(mb, seg, fp16_act)))
        bd = {
            "parameters": param_bytes + (param_bytes // 2 if half else 0),
            "gradients": grad_bytes + (grad_bytes // 2 if half else 0),
            "optimizer_state": slots * grad_bytes,
            "activations": int(act * (1 + MARGIN)),
            "temporaries": temporaries,
        }
        return sum(bd.values()), bd

    settings = [(0, False, "fp32")]
    if segments:
        settings.append((segments, False, "fp32"))
    settings.append((segments, True, "fp32"))
    if fp16_ok:
        settings.append((segments, False, "fp16"))
    divisors = [d for d in range(batch_size, 0, -1) if batch_size % d == 0]
    for mb in divisors:
        for seg, fp16_act, precision in settings:
            total, bd = predict(mb, seg, fp16_act, precision)
            if total <= budget_bytes:
                if mb < batch_size:
                    notes.append(f"batch {batch_size} runs as {batch_size // mb} micro-batches "
                                 f"of {mb}; BatchNorm sees {mb} samples at a time")
                notes.append("activations measured at micro-batches 2 and 4 and extrapolated "
                             f"(+{MARGIN:.0%}); conv workspace "
                             + ("measured with them" if device.kind == "cpu" else "estimated"))
                return Plan(mb, batch_size // mb, seg if seg > 1 else 0, precision, fp16_act,
                            total, budget_bytes, bd, notes)
    total, bd = min((predict(1, *st) for st in settings), key=lambda r: r[0])
    parts = ", ".join(f"{c.replace('_', ' ')} {format_bytes(v)}" for c, v in bd.items() if v)
    raise BudgetError(f"budget {format_bytes(budget_bytes)} is too small: the model needs at "
                      f"least {format_bytes(total)} ({parts}) at micro-batch 1 with every "
                      "memory saver on; raise --memory-budget")
