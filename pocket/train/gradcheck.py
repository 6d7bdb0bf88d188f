"""Float64 central finite differences against autograd, over every input element."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pocket.train import backend
from pocket.train.tensor import Tensor, no_grad


@dataclass
class GradcheckReport:
    ok: bool
    worst_input: int  # which input holds the worst element
    worst_index: tuple  # its index
    analytic: float
    numeric: float
    abs_err: float

    def __str__(self) -> str:
        verdict = "ok" if self.ok else "MISMATCH"
        return (f"gradcheck {verdict}: worst at input {self.worst_input} index "
                f"{self.worst_index}: analytic {self.analytic:.8g} vs numeric "
                f"{self.numeric:.8g} (abs err {self.abs_err:.3g})")


class GradcheckError(AssertionError):
    pass


def gradcheck(fn, inputs, eps: float = 1e-6, atol: float = 1e-6, rtol: float = 1e-4,
              seed: int = 0, raise_on_fail: bool = True) -> GradcheckReport:
    """Check d fn / d inputs: fn(*tensors) -> Tensor; inputs are arrays or Tensors.

    The output is reduced with fixed random weights (so every output element matters) and
    compared with (f(x+eps) - f(x-eps)) / 2eps for each element of each floating input.
    Non-float inputs (integer targets) are passed through without a gradient.
    """
    arrays = [i.data if isinstance(i, Tensor) else i for i in inputs]
    xp = backend.get_array_module(arrays[0])
    floats = [xp.issubdtype(a.dtype, xp.floating) for a in arrays]
    arrays = [a.astype(np.float64) if f else a for a, f in zip(arrays, floats)]
    tensors = [Tensor(a.copy(), requires_grad=f) for a, f in zip(arrays, floats)]
    out = fn(*tensors)
    w = backend.to_device(np.random.default_rng(seed).standard_normal(out.shape),
                          backend.device_of(out.data))
    (out * Tensor(w)).sum().backward()

    def f(values) -> float:
        with no_grad():
            y = fn(*[Tensor(v) for v in values])
        return float((y.data * w).sum())

    worst = GradcheckReport(True, -1, (), 0.0, 0.0, 0.0)
    worst_ratio = -1.0
    for k, is_float in enumerate(floats):
        if not is_float:
            continue
        a = arrays[k]
        ga = tensors[k].grad
        ga = backend.to_numpy(ga) if ga is not None else np.zeros(a.shape)
        for idx in np.ndindex(a.shape):
            orig = a[idx].item()
            a[idx] = orig + eps
            fp = f(arrays)
            a[idx] = orig - eps
            fm = f(arrays)
            a[idx] = orig
            num = (fp - fm) / (2 * eps)
            err = abs(num - ga[idx])
            ratio = err / (atol + rtol * abs(num))
            if ratio > worst_ratio:
                worst_ratio = ratio
                worst = GradcheckReport(bool(ratio <= 1), k, idx, float(ga[idx]), num, err)
    if raise_on_fail and not worst.ok:
        raise GradcheckError(str(worst))
    return worst
