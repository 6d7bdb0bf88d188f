"""Mixed precision with fp32 master weights and dynamic loss scaling.

Micikevicius et al., 2018 ("Mixed Precision Training"): the model computes in fp16 (half the
activation and weight bytes, fast tensor-core GEMMs on the GPU); the optimizer updates fp32
master copies of the weights, because an fp16 weight cannot absorb updates smaller than half
its ulp; the loss is multiplied by a scale before backward so small gradients do not flush to
zero in fp16, and the fp16 gradients are divided by it again in fp32. The ops need no change:
they compute in the dtype of their inputs.

Usage per optimizer step (what the trainer does):

    amp = MixedPrecision(model, "fp16"); scaler = LossScaler()
    opt = AdamW(amp.master_params())
    amp.before_step()                                   # masters -> fp16 model weights
    logits = model(Tensor(amp.cast_input(x)))
    loss = F.cross_entropy(F.astype(logits, np.float32), y)   # the loss in fp32
    scaler.scale_loss(loss).backward()
    if not scaler.update(amp.grads_to_master(scaler.scale)):  # True = skip this step
        opt.step()
    opt.zero_grad(); amp.zero_model_grads()

bf16 is refused: NumPy and CuPy have no bfloat16 array type. Emulating it (fp32 arrays with the
low 16 mantissa bits cut after every op) would need every op to round its output, i.e. a flag
threaded through all primitives, and would save no memory; fp16 with loss scaling gives the
memory saving bf16 is wanted for.
"""

from __future__ import annotations

import math

import numpy as np

from pocket.errors import PocketError
from pocket.train import backend
from pocket.train.tensor import Parameter, Tensor

PRECISIONS = ("fp32", "fp16", "bf16")


class PrecisionError(PocketError):
    """A precision this build or device cannot run."""


def _is_float(a) -> bool:
    return np.issubdtype(a.dtype, np.floating)


class MixedPrecision:
    """fp16 compute on the model, fp32 masters for the optimizer; "fp32" is a passthrough
    with the same interface, so the trainer has one code path.

    BN running statistics stay fp32 in fp16 mode: F.batchnorm reads them with astype(x.dtype)
    and writes momentum updates in their own dtype, and an fp16 running average would lose
    every update smaller than half its ulp (momentum 0.1 times a small change of the mean).
    """

    def __init__(self, model, precision: str = "fp32") -> None:
        if precision == "bf16":
            raise PrecisionError("bf16 needs a bfloat16 array type that NumPy/CuPy do not have; "
                                 "use --precision fp16")
        if precision not in ("fp32", "fp16"):
            raise PrecisionError(f"unknown precision {precision!r}; use fp32 or fp16")
        self.model = model
        self.precision = precision
        self.dtype = np.dtype(np.float16 if precision == "fp16" else np.float32)
        self._pairs: list[tuple[str, Parameter, Parameter]] = []  # (name, master, model param)
        self._fp32_params: list[tuple[str, Parameter]] = []  # kept fp32 on the model (BN)
        if precision == "fp16":
            kept = _norm_parameter_ids(model)
            for name, p in model.named_parameters():
                if id(p) in kept:
                    # NOTE: BN's gamma/beta stay fp32 (as in PyTorch's autocast): their
                    # gradients are sums over N*H*W and would be rounded to fp16 otherwise;
                    # F.batchnorm computes in the activations' dtype and sums in fp32.
                    self._fp32_params.append((name, p))
                    continue
                # the master lives where the weight lives: build this after model.to(device)
                master = Parameter(p.data.astype(np.float32), requires_grad=p.requires_grad)
                p.data = p.data.astype(np.float16) if _is_float(p.data) else p.data
                p.grad = None
                self._pairs.append((name, master, p))

    @property
    def enabled(self) -> bool:
        return self.precision == "fp16"

    def master_params(self) -> list[tuple[str, Parameter]]:
        """(name, parameter) pairs the optimizer should own: fp32 masters in fp16 mode (and
        the fp32 norm parameters themselves), the model's own parameters in fp32 mode (same
        names either way, in the model's order)."""
        if not self.enabled:
            return list(self.model.named_parameters())
        own = {name: master for name, master, _ in self._pairs}
        own.update(self._fp32_params)
        return [(name, own[name]) for name, _ in self.model.named_parameters()]

    def before_step(self) -> None:
        """Copy the (optimizer-updated) fp32 masters into the fp16 model weights."""
        for name, master, p in self._pairs:
            if backend.device_of(master.data) != backend.device_of(p.data):
                raise PrecisionError(f"fp32 master of {name} is on {backend.device_of(master.data)}"
                                     f" but the weight is on {backend.device_of(p.data)}: create "
                                     "MixedPrecision after moving the model to its device")
            p.data[...] = master.data  # casts to fp16 in place, no new array

    def cast_input(self, x):
        """A float input in the compute dtype (array or Tensor in, same kind out)."""
        if not self.enabled:
            return x
        if isinstance(x, Tensor):
            return Tensor(x.data.astype(self.dtype)) if _is_float(x.data) else x
        return x.astype(self.dtype) if _is_float(x) else x

    def grads_to_master(self, scale: float = 1.0, sync: bool = True):
        """Unscale the model's gradients into fp32 master gradients; reports whether any is
        non-finite: a bool, or with sync=False a device scalar (nonzero = non-finite) that the
        caller reads with its one host sync of the step.

        In fp16 mode the fp16 model gradients are dropped once copied (they are consumed). In
        fp32 mode the gradients are unscaled in place when scale != 1.
        """
        inv = 1.0 / float(scale)
        if not self.enabled:
            grads = [p.grad for p in self.model.parameters() if p.grad is not None]
            if inv != 1.0:
                for g in grads:
                    g *= inv
            return _finish(nonfinite_flag(grads), sync)
        grads = []
        for _, master, p in self._pairs:
            if p.grad is None:
                master.grad = None
                continue
            # NOTE: upcast before unscaling: grad/scale can be below fp16's smallest subnormal.
            g = p.grad.astype(np.float32)
            g *= inv
            master.grad = g
            grads.append(g)
            p.grad = None
        for _, p in self._fp32_params:
            if p.grad is not None:
                p.grad *= inv
                grads.append(p.grad)
        return _finish(nonfinite_flag(grads), sync)

    def zero_model_grads(self) -> None:
        for p in self.model.parameters():
            p.grad = None

    def zero_grad(self) -> None:
        self.zero_model_grads()
        for _, master, _ in self._pairs:
            master.grad = None

    def fp32_state_dict(self) -> dict[str, np.ndarray]:
        """The model's state dict with fp32 weights (the masters in fp16 mode)."""
        sd = self.model.state_dict()
        for name, master, _ in self._pairs:
            sd[name] = backend.to_numpy(master.data).copy()
        return {k: v.astype(np.float32) if v.dtype == np.float16 else v for k, v in sd.items()}

    def load_fp32_state_dict(self, sd: dict) -> None:
        """Load fp32 weights: into the model (cast to its dtype) and into the masters."""
        self.model.load_state_dict(sd)
        for name, master, _ in self._pairs:
            master.data[...] = backend.to_device(np.asarray(sd[name], np.float32),
                                                 backend.device_of(master.data))


def _norm_parameter_ids(model) -> set[int]:
    from pocket.train.nn import _BatchNorm

    # spiking layers (nn_spiking) ask to stay fp32 through `keep_fp32`
    return {id(p) for m in model.modules()
            if isinstance(m, _BatchNorm) or getattr(m, "keep_fp32", False)
            for p in m.parameters()}


def nonfinite_flag(grads: list):
    """A device scalar that is non-finite iff some gradient holds a NaN or inf, without a host
    sync: the float64 sum of every gradient's float64 sum (a finite float64 sum of fp16/fp32
    values cannot overflow, and NaN/inf survive it). 0.0 (host) when there are no gradients."""
    if not grads:
        return 0.0
    xp = backend.get_array_module(grads[0])
    total = xp.sum(grads[0], dtype=xp.float64)
    for g in grads[1:]:
        total = total + xp.sum(g, dtype=xp.float64)
    return total


def _finish(flag, sync: bool):
    if not sync:
        return flag
    return not math.isfinite(float(flag))


class LossScaler:
    """Dynamic loss scaling: multiply the loss by `scale`; on a non-finite gradient halve the
    scale and skip the step; after `growth_interval` clean steps in a row double it.

    Disabled (fp32), the scale is 1 and `update` only reports whether to skip.
    """

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True) -> None:
        if growth_factor <= 1 or not 0 < backoff_factor < 1 or growth_interval < 1:
            raise ValueError("loss scaler needs growth_factor > 1, 0 < backoff_factor < 1 "
                             "and growth_interval >= 1")
        self.enabled = enabled
        self.scale = float(init_scale) if enabled else 1.0
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.clean_steps = 0

    def scale_loss(self, loss: Tensor) -> Tensor:
        return loss * self.scale if self.enabled else loss

    def update(self, found_nonfinite: bool) -> bool:
        """Adjust the scale after a backward; returns True when the step must be skipped."""
        if not self.enabled:
            return bool(found_nonfinite)
        if found_nonfinite:
            # NOTE: never below the smallest normal fp32 power of two: a scale of 0 would
            # silently zero every gradient instead of reporting the real problem.
            self.scale = max(self.scale * self.backoff_factor, 2.0**-126)
            self.clean_steps = 0
            return True
        self.clean_steps += 1
        if self.clean_steps >= self.growth_interval:
            self.scale = min(self.scale * self.growth_factor, 2.0**127)
            self.clean_steps = 0
        return False

    def state_dict(self) -> dict:
        return {"scale": self.scale, "clean_steps": self.clean_steps,
                "growth_factor": self.growth_factor, "backoff_factor": self.backoff_factor,
                "growth_interval": self.growth_interval, "enabled": self.enabled}

    def load_state_dict(self, sd: dict) -> None:
        self.scale = float(sd["scale"])
        self.clean_steps = int(sd["clean_steps"])
        self.growth_factor = float(sd.get("growth_factor", self.growth_factor))
        self.backoff_factor = float(sd.get("backoff_factor", self.backoff_factor))
        self.growth_interval = int(sd.get("growth_interval", self.growth_interval))
        self.enabled = bool(sd.get("enabled", self.enabled))
