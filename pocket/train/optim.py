"""Optimizers as one general update rule with named special cases, schedules, clipping.

The rule, per parameter p with gradient g (PyTorch's conventions):
    coupled weight decay      d = g + wd * p
    momentum (SGD)            buf = mom * buf + (1 - dampening) * d;  d = d + mom * buf (Nesterov)
                              or d = buf
    adaptive (Adam)           m, v = EMA(d), EMA(d^2);  d = m_hat / (sqrt(v_hat) + eps)
    decoupled decay (AdamW)   p *= 1 - lr * wd
    p -= lr * d
Before each step a non-finite guard looks at every gradient; one NaN/inf skips the whole step
and the result names the parameters. `state_dict()` holds NumPy arrays and scalars only.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field

import numpy as np

from pocket.train import backend
from pocket.train.memory import get_tracker
from pocket.train.tensor import Parameter


@dataclass
class StepResult:
    """What `Optimizer.step` did; falsy when the step was skipped."""

    skipped: bool = False
    reason: str = ""
    nonfinite: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return not self.skipped


def _named(params) -> list[tuple[str, Parameter]]:
    if hasattr(params, "named_parameters"):
        return list(params.named_parameters())
    out = []
    for i, p in enumerate(params):
        out.append(p if isinstance(p, tuple) else (f"param{i}", p))
    return out


def _free_keys(keys: list) -> None:
    tracker = get_tracker()
    for k in keys:
        tracker.free("optimizer_state", k)


def _cpu_fused(x, g, m, v) -> bool:
    # kernels_optim: NumPy arrays of one float dtype and shape, contiguous (updated in place)
    return (type(x) is np.ndarray and type(g) is np.ndarray and x.dtype in (np.float32, np.float64)
            and g.dtype == x.dtype and g.shape == x.shape and x.flags.c_contiguous
            and g.flags.c_contiguous and m.flags.c_contiguous and v.flags.c_contiguous)


_kernels: list = []  # kernels_optim, imported on first use (it compiles with Numba)


class Optimizer:
    SLOTS: tuple = ()

    def __init__(self, params, lr: float, *, momentum: float = 0.0, dampening: float = 0.0,
                 nesterov: bool = False, weight_decay: float = 0.0, decoupled: bool = False,
                 adaptive: bool = False, betas: tuple = (0.9, 0.999), eps: float = 1e-8,
                 check_finite: bool = True):
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum needs momentum > 0 and dampening = 0")
        self.params = [(n, p) for n, p in _named(params) if p.requires_grad]
        self.lr = float(lr)
        self.hyper = dict(momentum=float(momentum), dampening=float(dampening),
                          nesterov=bool(nesterov), weight_decay=float(weight_decay),
                          decoupled=bool(decoupled), adaptive=bool(adaptive),
                          betas=[float(b) for b in betas], eps=float(eps))
        self.check_finite = check_finite
        self.step_count = 0
        self.state: dict[str, dict] = {}
        self._cpu_hyper: dict = {}  # kernels_optim's scalars for this step
        self._keys: list = []
        weakref.finalize(self, _free_keys, self._keys)

    # ---- state
    def _slot(self, name: str, p: Parameter, slot: str):
        st = self.state.setdefault(name, {})
        if slot not in st:
            st[slot] = backend.get_array_module(p.data).zeros_like(p.data)
            key = (id(self), name, slot)
            get_tracker().alloc("optimizer_state", key, st[slot].nbytes)
            self._keys.append(key)
        return st[slot]

    def zero_grad(self) -> None:
        for _, p in self.params:
            p.grad = None

    def nonfinite_params(self) -> list[str]:
        """Names of parameters whose gradient holds a NaN or inf (one sync when all finite)."""
        grads = [(n, p.grad) for n, p in self.params if p.grad is not None]
        if not grads:
            return []
        xp = backend.get_array_module(grads[0][1])
        # NOTE: one summed probe first; NaN/inf propagate through a sum, so the per-tensor
        # check only runs when something is wrong (or the sum itself overflowed).
        probe = sum(xp.sum(g, dtype=xp.float64) for _, g in grads)
        if math.isfinite(float(probe)):
            return []
        return [n for n, g in grads if not bool(xp.isfinite(g).all())]

    def step(self, nonfinite: bool | None = None) -> StepResult:
        """Update every parameter with a gradient, unless one gradient is non-finite.

        `nonfinite` is the caller's own device-side finite check, already read (the trainer
        reads it with the loss in its one host sync per step): given, the guard trusts it and
        looks at the gradients again only to name the bad ones."""
        if self.check_finite or nonfinite:
            bad = (self.nonfinite_params() if nonfinite is None or nonfinite else [])
            if nonfinite and not bad:
                bad = ["(a gradient that overflowed while being unscaled)"]
            if bad:
                return StepResult(True, f"non-finite gradient in {', '.join(bad)}; step skipped",
                                  bad)
        self.step_count += 1
        for name, p in self.params:
            if p.grad is not None:
                self._update(name, p, p.grad)
        return StepResult()

    def _update(self, name: str, p: Parameter, g) -> None:
        h, lr, x = self.hyper, self.lr, p.data
        xp = backend.get_array_module(x)
        wd = h["weight_decay"]
        if xp is not np and x.dtype in (np.float32, np.float64) and g.dtype == x.dtype:
            self._update_gpu(name, p, g)
            return
        if h["adaptive"]:
            m, v = self._slot(name, p, "exp_avg"), self._slot(name, p, "exp_avg_sq")
            b1, b2 = h["betas"]
            bc1, bc2 = 1 - b1**self.step_count, 1 - b2**self.step_count
            if _cpu_fused(x, g, m, v):
                if not _kernels:
                    from pocket.train import kernels_optim

                    _kernels.append(kernels_optim)
                K = _kernels[0]
                key = (x.dtype, self.step_count, lr)
                hp = self._cpu_hyper.get(key)
                if hp is None:  # once a step and dtype
                    self._cpu_hyper = {key: K.hyper(x.dtype, lr, wd, h["decoupled"], b1, b2,
                                                    h["eps"], self.step_count)}
                    hp = self._cpu_hyper[key]
                K.adam_step(x, g, m, v, hp, bool(wd) and not h["decoupled"])
                return
            if wd and h["decoupled"]:
                x *= 1 - lr * wd
            elif wd:
                g = g + wd * x
            m *= b1
            m += (1 - b1) * g
            v *= b2
            v += (1 - b2) * (g * g)
            denom = xp.sqrt(v / bc2)
            denom += h["eps"]
            x -= (lr / bc1) * (m / denom)
            return
        mom = h["momentum"]
        if wd and h["decoupled"]:
            x *= 1 - lr * wd
        elif wd:
            g = g + wd * x
        if mom:
            first = "momentum_buffer" not in self.state.get(name, {})
            buf = self._slot(name, p, "momentum_buffer")
            if first:
                buf[...] = g
            else:
                buf *= mom
                buf += (1 - h["dampening"]) * g
            g = g + mom * buf if h["nesterov"] else buf
        x -= lr * g

    def _update_gpu(self, name: str, p: Parameter, g) -> None:
        # One fused kernel per parameter reads p, g and the state once and writes them once
        # (the unfused update is ~8 passes and as many temporaries).
        h, x = self.hyper, p.data
        t = x.dtype.type
        g = backend.contiguous(g)
        n = np.int64(x.size)
        if h["adaptive"]:
            m, v = self._slot(name, p, "exp_avg"), self._slot(name, p, "exp_avg_sq")
            b1, b2 = h["betas"]
            backend.gpu_launch("adam_step", x.dtype, x.size, x, g, m, v, n, t(self.lr), t(b1),
                               t(b2), t(h["eps"]), t(h["weight_decay"]),
                               t(1 - b1**self.step_count), t(1 - b2**self.step_count),
                               np.int32(h["decoupled"]))
            return
        mom = h["momentum"]
        flags = (1 if h["nesterov"] else 0) | (4 if h["decoupled"] else 0) | (8 if mom else 0)
        if mom:
            if "momentum_buffer" not in self.state.get(name, {}):
                flags |= 2
            buf = self._slot(name, p, "momentum_buffer")
        else:
            buf = x  # not read without momentum; any valid pointer
        backend.gpu_launch("sgd_step", x.dtype, x.size, x, g, buf, n, t(self.lr),
                           t(h["weight_decay"]), t(mom), t(h["dampening"]), np.int32(flags))

    def state_dict(self) -> dict:
        return {
            "type": type(self).__name__,
            "lr": self.lr,
            "step": self.step_count,
            "hyper": dict(self.hyper),
            "state": {n: {k: backend.to_numpy(a).copy() for k, a in st.items()}
                      for n, st in self.state.items()},
        }

    def load_state_dict(self, sd: dict) -> None:
        params = dict(self.params)
        unknown = sorted(set(sd["state"]) - set(params))
        if unknown:
            raise ValueError(f"optimizer state for unknown parameters {unknown}")
        self.lr = float(sd["lr"])
        self.step_count = int(sd["step"])
        self.hyper.update(sd["hyper"])
        for name, slots in sd["state"].items():
            p = params[name]
            for slot, arr in slots.items():
                dst = self._slot(name, p, slot)
                if dst.shape != np.shape(arr):
                    raise ValueError(f"optimizer state {name}.{slot}: shape {np.shape(arr)} "
                                     f"does not fit {dst.shape}")
                dst[...] = backend.to_device(np.asarray(arr), backend.device_of(p.data))


class SGD(Optimizer):
    def __init__(self, params, lr: float, momentum: float = 0.0, nesterov: bool = False,
                 weight_decay: float = 0.0, dampening: float = 0.0, **kw):
        super().__init__(params, lr, momentum=momentum, nesterov=nesterov,
                         weight_decay=weight_decay, dampening=dampening, **kw)


class Adam(Optimizer):
    """Kingma & Ba, 2015; weight decay added to the gradient (L2)."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, **kw):
        super().__init__(params, lr, adaptive=True, betas=betas, eps=eps,
                         weight_decay=weight_decay, **kw)


class AdamW(Optimizer):
    """Loshchilov & Hutter, 2019: weight decay decoupled from the adaptive step."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, **kw):
        super().__init__(params, lr, adaptive=True, decoupled=True, betas=betas, eps=eps,
                         weight_decay=weight_decay, **kw)


def clip_grad_norm(params, max_norm: float, eps: float = 1e-6, sync: bool = True):
    """Scale all gradients together so their global L2 norm is at most max_norm.

    Returns the norm before clipping (inf/NaN if a gradient is non-finite; then nothing is
    scaled and the optimizer's guard skips the step). With sync=False the norm stays on the
    device and the scaling is done there (factor min(1, max_norm / (norm + eps)), 1 for a
    non-finite norm), so the step does not wait on the host; the norm is returned as a device
    scalar."""
    grads = [p.grad for _, p in _named(params) if p.grad is not None]
    if not grads:
        return 0.0
    xp = backend.get_array_module(grads[0])
    sq = xp.sum(xp.square(grads[0], dtype=xp.float64))
    for g in grads[1:]:
        sq = sq + xp.sum(xp.square(g, dtype=xp.float64))
    if not sync:
        total = xp.sqrt(sq)
        factor = xp.where(xp.isfinite(total) & (total > max_norm), max_norm / (total + eps), 1.0)
        for g in grads:
            g *= factor.astype(g.dtype)
        return total
    total = math.sqrt(float(sq))
    if math.isfinite(total) and total > max_norm:
        scale = max_norm / (total + eps)
        for g in grads:
            g *= scale
    return total


class _Schedule:
    """Sets optimizer.lr from the step count; call `step()` after each optimizer step."""

    def __init__(self, optimizer: Optimizer, base_lr: float | None = None):
        self.optimizer = optimizer
        self.base_lr = float(optimizer.lr if base_lr is None else base_lr)
        self.last_step = 0
        optimizer.lr = self.lr_at(0)

    def lr_at(self, step: int) -> float:
        raise NotImplementedError

    def step(self) -> float:
        self.last_step += 1
        self.optimizer.lr = self.lr_at(self.last_step)
        return self.optimizer.lr

    def state_dict(self) -> dict:
        return {k: v for k, v in vars(self).items() if k != "optimizer"}

    def load_state_dict(self, sd: dict) -> None:
        vars(self).update(sd)
        self.optimizer.lr = self.lr_at(self.last_step)


class WarmupCosine(_Schedule):
    """Linear warmup from base_lr/warmup to base_lr, then cosine down to min_lr at total."""

    def __init__(self, optimizer: Optimizer, total_steps: int, warmup_steps: int = 0,
                 min_lr: float = 0.0, base_lr: float | None = None):
        self.total_steps, self.warmup_steps, self.min_lr = total_steps, warmup_steps, min_lr
        super().__init__(optimizer, base_lr)

    def lr_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.base_lr * (step + 1) / self.warmup_steps
        span = max(1, self.total_steps - self.warmup_steps)
        t = min(1.0, (step - self.warmup_steps) / span)
        return self.min_lr + (self.base_lr - self.min_lr) * 0.5 * (1 + math.cos(math.pi * t))


class StepDecay(_Schedule):
    """lr = base_lr * gamma ** (step // step_size)."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1,
                 base_lr: float | None = None):
        self.step_size, self.gamma = step_size, gamma
        super().__init__(optimizer, base_lr)

    def lr_at(self, step: int) -> float:
        return self.base_lr * self.gamma ** (step // self.step_size)
