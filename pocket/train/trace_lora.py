"""How a LoRA adapter traces: one plain `linear` whose weight is W + (alpha / r) B A.

The merged weight is computed at trace time and stored in the checkpoint as a derived tensor
(checkpoint.DERIVED_PREFIX), so export, the engine and ONNX see the base model's graph and
never learn that adapters existed.
"""

from __future__ import annotations

import numpy as np

from pocket.train.checkpoint import DERIVED_PREFIX
from pocket.train.nn_lora import LoRALinear
from pocket.train.trace import TraceError, _p, register_check, register_module


@register_module(LoRALinear)
def _lora_linear(b, m, prefix, x):
    w, a, up = (b.state[_p(prefix, n)].astype(np.float64) for n in ("weight", "lora_A", "lora_B"))
    ins = [x, b.derived(DERIVED_PREFIX + _p(prefix, "weight"), w + m.scaling * (up @ a))]
    if m.bias is not None:
        ins.append(b.param(_p(prefix, "bias")))
    return b.node(prefix, "linear", ins)


@register_check
def _every_adapter_traced(model, b) -> None:
    # a parent whose tracer reads its child's weight itself would export the base weight
    for name, m in model.named_modules():
        if isinstance(m, LoRALinear) and DERIVED_PREFIX + _p(name, "weight") not in b.params:
            raise TraceError(f"the LoRA adapter on '{name}' is not in the traced graph: its "
                             "parent layer traces that weight itself; leave the layer out of "
                             "[lora] targets")
