"""The state-space family: `ssm` (a diagonal state-space layer, S4D) and `glu`.

Layout: sequences are (N, L, H): batch, time, channels. Time-major per sample keeps every
per-step op (linear on the last axis, layernorm over the last axis, glu, add) acting on the
last axis, as in the Transformer family, so a stack of blocks is one layout end to end and a
model can be streamed a step at a time (infer/streaming.py) without transposes.

`ssm` inputs, per channel h of H and complex mode n of S (Gu et al. 2022, "On the
Parameterization and Initialization of Diagonal State Space Models"):

    x (N, L, H), log_dt (H,), log_a_re (H, S), a_im (H, S), b_re (H, S), b_im (H, S),
    c_re (D, H, S), c_im (D, H, S), d (H,)            D = 2 when bidirectional, else 1

    dt = exp(log_dt);  A = -exp(log_a_re) + i a_im;  B = b_re + i b_im;  C = c_re + i c_im
    ZOH: dA = exp(dt A),  dB = (dA - 1) / A * B
    forward:  s_t = dA s_{t-1} + dB x_t,  y_t = 2 Re(sum_n C[0] s_t) + d x_t   (s_{-1} = 0)
    bidirectional adds the same recurrence run backwards in time with C[1].

Each complex mode stands for a conjugate pair (hence 2 Re), so S complex modes are S4D's
state size N = 2S. The equivalent convolution: y = K * x + d x with
K_l = 2 Re(sum_n C dB dA^l) (reference_ssm.ssm_kernel).

`glu` (Dauphin et al. 2017): split x in two halves a, b along `axis`; a * sigmoid(b).

int8 policy: both stay f32 (INT8_F32): the recurrence accumulates over the whole sequence and
its poles sit close to the unit circle, where an int8 state would drift; glu is a gate whose
product is cheap in f32. The linears around them quantize as usual.
"""

from __future__ import annotations

from pocket.formats.opschema import INT8_F32, Attr, Op, Out, need, norm_axis

SSM_PARAMS = ("log_dt", "log_a_re", "a_im", "b_re", "b_im", "c_re", "c_im", "d")


def _infer_ssm(node, ins, where: str) -> Out:
    x = ins[0]
    need(x.dtype == "f32", where, f"ssm runs on f32, got {x.dtype}")
    need(len(x.shape) == 3, where, f"input must be 3-D (N, L, H), got {list(x.shape)}")
    h = x.shape[2]
    need(isinstance(h, int), where, "the channel dim must be a fixed integer")
    p = dict(zip(SSM_PARAMS, ins[1:]))
    for name, v in p.items():
        need(v.dtype == "f32", where, f"ssm param {name} must be f32, got {v.dtype}")
    need(tuple(p["log_dt"].shape) == (h,) and tuple(p["d"].shape) == (h,), where,
         f"log_dt and d must have shape [{h}], got {list(p['log_dt'].shape)} and "
         f"{list(p['d'].shape)}")
    hs = tuple(p["log_a_re"].shape)
    need(len(hs) == 2 and hs[0] == h and hs[1] >= 1, where,
         f"log_a_re must have shape [{h}, S], got {list(hs)}")
    for name in ("a_im", "b_re", "b_im"):
        need(tuple(p[name].shape) == hs, where,
             f"{name} must have shape {list(hs)}, got {list(p[name].shape)}")
    dirs = 2 if node.attrs.get("bidirectional", False) else 1
    for name in ("c_re", "c_im"):
        need(tuple(p[name].shape) == (dirs, *hs), where,
             f"{name} must have shape {[dirs, *hs]} (bidirectional="
             f"{str(dirs == 2).lower()}), got {list(p[name].shape)}")
    return [("f32", x.shape)]


def _infer_glu(node, ins, where: str) -> Out:
    x = ins[0]
    need(x.dtype == "f32", where, f"glu runs on f32, got {x.dtype}")
    ax = norm_axis(node.attrs["axis"], len(x.shape), where)
    need(ax != 0, where, "glu along the batch axis is not supported")
    size = x.shape[ax]
    need(isinstance(size, int) and size % 2 == 0, where,
         f"glu splits axis {ax} in halves: its size must be even, got {size}")
    shape = list(x.shape)
    shape[ax] = size // 2
    return [("f32", tuple(shape))]


ENTRIES = [
    Op("ssm", 9, 9, {"bidirectional": Attr("bool", False)}, _infer_ssm,
       "diagonal state-space layer (S4D, ZOH) over (N, L, H); see ops_ssm.py", int8=INT8_F32),
    Op("glu", 1, 1, {"axis": Attr("int", -1)}, _infer_glu,
       "a * sigmoid(b) for the halves a, b of x along axis", int8=INT8_F32),
]
