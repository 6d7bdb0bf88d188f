"""State-space layers: `S4D` (alias `SSM`), `GLU`, and the residual `SSMBlock`.

Sequences are (N, L, H) (see formats/ops_ssm.py for why, and for the math).
"""

from __future__ import annotations

import math

import numpy as np

from pocket.train import functional_ssm as FS
from pocket.train import init, nn
from pocket.train.nn_seqattn import LayerNorm
from pocket.train.tensor import Parameter


class S4D(nn.Module):
    """Diagonal state-space layer (Gu, Gupta, Goel & Re 2022, "On the Parameterization and
    Initialization of Diagonal State Space Models"), ZOH-discretized, on (N, L, H).

    Per channel: S complex modes (a conjugate pair each, S4D's N = 2S) with S4D-Lin
    initialization A_n = -1/2 + i pi n, B = 1, C complex normal (variance 1), a learned step
    log dt ~ U(log dt_min, log dt_max), and a skip D ~ N(0, 1). `bidirectional` adds a second
    read-out C running backwards in time (A, B, dt shared), as S4's bidirectional layers do.
    """

    op = "ssm"

    def __init__(self, d_model: int, d_state: int = 32, bidirectional: bool = False,
                 dt_min: float = 1e-3, dt_max: float = 1e-1, rng=None):
        super().__init__()
        if d_model < 1 or d_state < 1:
            raise ValueError(f"S4D needs d_model >= 1 and d_state >= 1, got {d_model}, {d_state}")
        if not 0 < dt_min <= dt_max:
            raise ValueError(f"S4D needs 0 < dt_min <= dt_max, got {dt_min}, {dt_max}")
        self.d_model, self.d_state, self.bidirectional = d_model, d_state, bool(bidirectional)
        h, s, dirs = d_model, d_state, 2 if bidirectional else 1
        r = init._rng(rng)
        self.log_dt = Parameter(r.uniform(math.log(dt_min), math.log(dt_max), h).astype(np.float32))
        self.log_a_re = Parameter(np.full((h, s), math.log(0.5), np.float32))
        self.a_im = Parameter(np.tile(np.pi * np.arange(s, dtype=np.float32), (h, 1)))
        self.b_re = Parameter(init.ones((h, s)))
        self.b_im = Parameter(init.zeros((h, s)))
        self.c_re = Parameter(init.normal((dirs, h, s), math.sqrt(0.5), r))
        self.c_im = Parameter(init.normal((dirs, h, s), math.sqrt(0.5), r))
        self.d = Parameter(init.normal((h,), 1.0, r))

    def forward(self, x):
        return FS.ssm(x, self.log_dt, self.log_a_re, self.a_im, self.b_re, self.b_im,
                      self.c_re, self.c_im, self.d, self.bidirectional)

    def extra_repr(self) -> str:
        return f"{self.d_model}, d_state={self.d_state}, bidirectional={self.bidirectional}"


SSM = S4D


class GLU(nn.Module):
    """a * sigmoid(b) for the halves of x along `axis` (Dauphin et al. 2017)."""

    op = "glu"

    def __init__(self, axis: int = -1):
        super().__init__()
        self.axis = axis

    def forward(self, x):
        return FS.glu(x, self.axis)

    def ir_attrs(self) -> dict:
        return {"axis": int(self.axis)}


class SSMBlock(nn.Module):
    """x + dropout(mix(GELU(S4D(LayerNorm(x))))) on (N, L, H): the pre-norm residual block of
    S4/S4D. mix is `glu` (linear H -> 2H, then GLU, as S4's output layer) or `gelu` (linear
    H -> H)."""

    def __init__(self, d_model: int, d_state: int = 32, dropout: float = 0.0,
                 bidirectional: bool = False, mix: str = "glu", rng=None):
        super().__init__()
        if mix not in ("glu", "gelu"):
            raise ValueError(f"SSMBlock mix must be 'glu' or 'gelu', got {mix!r}")
        self.mix = mix
        self.norm = LayerNorm(d_model)
        self.ssm = S4D(d_model, d_state, bidirectional, rng=rng)
        self.act = nn.GELU()
        self.out = nn.Linear(d_model, 2 * d_model if mix == "glu" else d_model, rng=rng)
        self.glu = GLU(-1) if mix == "glu" else None
        self.drop = nn.Dropout(dropout) if dropout else None
        self.add = nn.Add()

    def body(self):
        return [m for m in (self.norm, self.ssm, self.act, self.out, self.glu, self.drop)
                if m is not None]

    def forward(self, x):
        y = x
        for m in self.body():
            y = m(y)
        return self.add(x, y)
