"""Tracing of the state-space family: S4D -> `ssm`, GLU -> `glu`, SSMBlock -> its body + `add`."""

from __future__ import annotations

from pocket.formats import ops
from pocket.formats.ops_ssm import SSM_PARAMS
from pocket.train import nn_ssm
from pocket.train.trace import register_module, trace_module


def _p(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


@ops.register("trace", "ssm")
def _ssm(b, m, prefix, x):
    ins = [x, *(b.param(_p(prefix, k)) for k in SSM_PARAMS)]
    return b.node(prefix, "ssm", ins, bidirectional=bool(m.bidirectional))


@ops.register("trace", "glu")
def _glu(b, m, prefix, x):
    return b.node(prefix, "glu", [x], **m.ir_attrs())


@register_module(nn_ssm.SSMBlock)
def _block(b, m, prefix, x):
    y = x
    for name, child in m.named_children():
        if name != "add":
            y = trace_module(b, child, _p(prefix, name), y)
    return b.node(_p(prefix, "add"), "add", [x, y])
