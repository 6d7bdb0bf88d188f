"""How a LoRA adapter traces: one plain `linear` whose weight is W + (alpha / r) B A.

The merged weight is computed at trace time and stored in the checkpoint as a derived tensor
(checkpoint.DERIVED_PREFIX), so export, the engine and ONNX see the base model's graph and
never learn that adapters existed.
"""

from __future__ import annotations

from pocket.train.checkpoint import DERIVED_PREFIX
from pocket.train.nn_lora import LoRALinear
from pocket.train.trace import _p, register_module


@register_module(LoRALinear)
def _lora_linear(b, m, prefix, x):
    ins = [x, b.derived(DERIVED_PREFIX + _p(prefix, "weight"), m.merged_weight())]
    if m.bias is not None:
        ins.append(b.param(_p(prefix, "bias")))
    return b.node(prefix, "linear", ins)
