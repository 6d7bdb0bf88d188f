"""The executable meaning of every IR op: a naive NumPy interpreter, fp32 and int8.

This is the oracle. Every engine kernel and every exporter transform (BatchNorm folding,
activation fusion, quantization) is tested against it, so it is written to be obviously right,
not fast, and shares no code with `pocket.infer`. Standard library + NumPy only.

Conventions:
- Float ops compute in float64 and round to float32 once per op, so the oracle is at least as
  accurate as any kernel it judges.
- int8 conv2d/linear compute (x_q - x_zp) * w_q in int64 and check that the accumulator fits
  int32 (the format promises exact int32 accumulation), then follow `pocket.formats.quant`
  step for step. A padded int8 input equals x_zp, so it contributes zero to the sum.

Each op is `fn(attrs, *inputs, w_scale=None) -> array`, registered as the op's "reference" in
`pocket.formats.ops`; `run` dispatches through the registry.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from pocket.formats import ops
from pocket.formats import quant as q
from pocket.formats.errors import FormatError
from pocket.formats.ir import Graph

# --------------------------------------------------------------------------- activations
# NOTE: NaN semantics. A NaN entering relu (standalone or fused into conv2d/linear) comes out
# as NaN, as in NumPy, PyTorch and onnxruntime: relu is written `0 if x < 0 else x`, and a NaN
# compares false. Every other activation propagates NaN by its arithmetic, and every engine
# route must match this.

_erf = np.frompyfunc(math.erf, 1, 1)


def _gelu64(x: np.ndarray, approximate: str = "none") -> np.ndarray:
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(np.float64))


def _f64(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float64)


def _f32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x).astype(np.float32)


def _elementwise(name: str):
    """Decorator: fn64(x float64, attrs) -> float64 becomes op `name`, fn(attrs, x) -> float32,
    registered as its reference; `fn.f64` is the float64 form a fused layer applies."""

    def deco(fn64):
        def op(a, x, **_):
            return _f32(fn64(_f64(x), a))

        op.f64 = fn64
        op.__name__ = op.__qualname__ = name
        op.__doc__ = fn64.__doc__
        return ops.register("reference", name)(op)

    return deco


@_elementwise("relu")
def relu(x, a):
    return np.where(x < 0.0, 0.0, x)


@_elementwise("leaky_relu")
def leaky_relu(x, a):
    return np.where(x >= 0, x, a.get("alpha", 0.01) * x)


@_elementwise("sigmoid")
def sigmoid(x, a):
    with np.errstate(over="ignore"):  # exp(-x) = inf for x < -709 gives 0, as it should
        return 1.0 / (1.0 + np.exp(-x))


@_elementwise("tanh")
def tanh(x, a):
    return np.tanh(x)


@_elementwise("gelu")
def gelu(x, a):
    return _gelu64(x, a.get("approximate", "none"))


@_elementwise("hardswish")
def hardswish(x, a):
    return x * np.clip(x + 3.0, 0.0, 6.0) / 6.0


@_elementwise("hardsigmoid")
def hardsigmoid(x, a):
    return np.clip(x + 3.0, 0.0, 6.0) / 6.0


def _activate64(x: np.ndarray, a: Mapping[str, Any]) -> np.ndarray:
    """x float64 -> float64 through the fused activation of conv2d/linear attrs `a`."""
    act = a.get("activation", "none")
    return x if act == "none" else ops.impl("reference", act).f64(x, a)


@ops.register("reference", "softmax")
def softmax(a, x, **_):
    x = _f64(x)
    e = np.exp(x - x.max(axis=a.get("axis", -1), keepdims=True))
    return _f32(e / e.sum(axis=a.get("axis", -1), keepdims=True))


# --------------------------------------------------------------------------- int8 helpers


def _is_int8(a: Mapping[str, Any]) -> bool:
    return a.get("x_scale") is not None


def _int8_epilogue(a, acc: np.ndarray, w_scale) -> np.ndarray:
    """acc (N, O, ...) integers (int64, or float64 holding them exactly) -> int8 (requantized)
    or float32, per pocket.formats.quant."""
    if w_scale is None:
        raise FormatError("an int8 conv2d/linear needs the weight's per-channel scales")
    if acc.min(initial=0) < q.INT32_MIN or acc.max(initial=0) > q.INT32_MAX:
        raise FormatError("int8 accumulator overflows int32")
    # NOTE: a float64 integer rounds to float32 (requantize's first step) as its int32 does
    acc = acc if acc.dtype == np.float64 else acc.astype(np.int32)
    act = a.get("activation", "none")  # none, or one that fuses into int8 (ops.int8_fuses)
    if a.get("y_scale") is not None:
        m = q.requant_multiplier(a["x_scale"], w_scale, a["y_scale"])
        hi = (int(q.quantize(np.float32(a.get("max", 6.0)), a["y_scale"], a["y_zero_point"]))
              if act == "clip" else q.QMAX)  # a fused clip has min 0, like relu
        return q.requantize(acc, m, a["y_zero_point"], act != "none", axis=1, hi=hi)
    m = q.requant_multiplier(a["x_scale"], w_scale, None)
    shape = (1, -1) + (1,) * (acc.ndim - 2)
    y = (acc.astype(np.float64) * m.reshape(shape)).astype(np.float32)
    return y if act == "none" else _f32(_activate64(_f64(y), a))


# --------------------------------------------------------------------------- linear and conv


# NOTE: the int8 dot products are summed by BLAS in floating point rather than in int64 (NumPy
# has no integer BLAS; 10x slower), exactly: every product and partial sum is an integer, and a
# float holds each exactly, in any order, while they stay within its integers. float64's reach
# 2**53 (|x - x_zp| <= 255, |w| <= 128: up to 2**37 terms); float32's 2**24, and a product is at
# most 32640, so a float32 GEMM over at most EXACT_F32_TERMS terms is exact whatever order or
# FMA its BLAS uses (1.5-2x float64's speed, half its bytes); longer sums add such blocks in
# float64.
EXACT_F32_TERMS = 2**24 // (255 * 128)


def _matmul_exact(wg: np.ndarray, col: np.ndarray, out: np.ndarray) -> None:
    """out (..., O, P) = wg (..., O, K) @ col (..., K, P), float32 arrays holding int8-sized
    integers: exact (see EXACT_F32_TERMS), in float32 GEMMs of K blocks summed in float64.
    out: float64, or float32 when K <= EXACT_F32_TERMS."""
    k = wg.shape[-1]
    if k <= EXACT_F32_TERMS:
        np.matmul(wg, col, out=out) if out.dtype == np.float32 else np.copyto(out, wg @ col)
        return
    out[...] = 0.0
    for k0 in range(0, k, EXACT_F32_TERMS):
        out += np.matmul(wg[..., k0:k0 + EXACT_F32_TERMS], col[..., k0:k0 + EXACT_F32_TERMS, :])


def _exact_sums(acc: np.ndarray, b: np.ndarray | None, channel_shape) -> np.ndarray:
    """_matmul_exact's sums plus an int32 bias, float64: exact (integers far below 2**53)."""
    if b is None:
        return acc.astype(np.float64, copy=False)
    return np.add(acc, b.astype(np.float64).reshape(channel_shape), dtype=np.float64)


@ops.register("reference", "linear")
def linear(a, x, w, b=None, *, w_scale=None):
    """x (N, ..., K), w (O, K), b (O,) -> (N, ..., O)."""
    if _is_int8(a):
        # the leading dims as rows (N * ..., K): the epilogue's channels are then axis 1
        rows = np.subtract(x.reshape(-1, x.shape[-1]), a["x_zero_point"], dtype=np.float32)
        acc = np.empty((len(rows), w.shape[0]))
        _matmul_exact(w.astype(np.float32), rows.T, acc.T)
        acc = _exact_sums(acc, b, (1, -1))
        return _int8_epilogue(a, acc, w_scale).reshape(*x.shape[:-1], w.shape[0])
    y = _f64(x) @ _f64(w).T
    if b is not None:
        y = y + _f64(b)
    return _f32(_activate64(y, a))


def _pad(x: np.ndarray, ph: int, pw: int, value) -> np.ndarray:
    return np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=value)


def _out_size(size: int, k: int, s: int, p: int, d: int = 1) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


CONV_CHUNK_BYTES = 4 << 20


def _conv(x: np.ndarray, w: np.ndarray, stride, padding, dilation, groups: int) -> np.ndarray:
    """x (N, C, H, W), w (O, C/g, kh, kw) float64 -> (N, O, Ho, Wo) float64; float32 x and w
    holding int8-sized integers (x - x_zp, w_q) -> their exact sums (_matmul_exact).

    Cross-correlation as one matrix product per chunk of images: the zero-padded input viewed
    (no copy) as cols[n, g, c, i, j, oh, ow] = xp[n, g*cg + c, oh*sh + i*dh, ow*sw + j*dw],
    then, for each group g, w[g] (O/g, cg*kh*kw) @ cols[n, g] (cg*kh*kw, Ho*Wo).
    """
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    ho, wo = _out_size(h, kh, sh, ph, dh), _out_size(wd, kw, sw, pw, dw)
    xp = np.ascontiguousarray(_pad(x, ph, pw, 0))
    s0, s1, s2, s3 = xp.strides
    cols = np.lib.stride_tricks.as_strided(
        xp, (n, groups, cg, kh, kw, ho, wo),
        (s0, cg * s1, s1, dh * s2, dw * s3, sh * s2, sw * s3), writeable=False)
    k = cg * kh * kw
    wg = w.reshape(groups, o // groups, k)
    exact32 = x.dtype == np.float32 and k <= EXACT_F32_TERMS  # the sums fit float32 exactly
    out = np.empty((n, groups, o // groups, ho * wo), np.float32 if exact32 else np.float64)
    # NOTE: the columns of a chunk are kh*kw times its input; chunks of ~4 MiB stay in cache
    # for the product, 1.5-2x faster on a 224x224 model than large chunks. Every product is
    # one image and group, whatever the chunk, so the sums do not depend on it.
    step = max(1, (CONV_CHUNK_BYTES) // max(1, groups * k * ho * wo * x.itemsize))
    for b0 in range(0, n, step):
        col = cols[b0:b0 + step].reshape(-1, groups, k, ho * wo)
        if x.dtype == np.float32:
            _matmul_exact(wg, col, out[b0:b0 + step])
        else:
            np.matmul(wg, col, out=out[b0:b0 + step])
    return out.reshape(n, o, ho, wo)


# NOTE: conv2d runs a batch this many bytes of float64 output at a time: its sums, bias,
# activation and rounding then pass over arrays that stay in cache, where whole-batch
# temporaries (400 MB for ResNet-18's stem over 64 images) cost more in page faults than the
# arithmetic. Every output element is computed alone, so the chunks do not change it.
CONV_OUT_CHUNK_BYTES = 8 << 20


@ops.register("reference", "conv2d")
def conv2d(a, x, w, b=None, *, w_scale=None):
    """x (N, C, H, W), w (O, C/groups, kh, kw), b (O,) -> (N, O, Ho, Wo)."""
    geom = (a.get("stride", [1, 1]), a.get("padding", [0, 0]), a.get("dilation", [1, 1]),
            a.get("groups", 1))
    int8 = _is_int8(a)
    wk = w.astype(np.float32) if int8 else _f64(w)
    out = None
    for b0, xb in _image_chunks(x, w.shape[0], geom):
        if int8:
            # NOTE: shifting by x_zp before padding with 0 is exactly "padded x_q equals x_zp".
            xs = np.subtract(xb, a["x_zero_point"], dtype=np.float32)
            y = _int8_epilogue(a, _exact_sums(_conv(xs, wk, *geom), b, (1, -1, 1, 1)), w_scale)
        else:
            y = _conv(_f64(xb), wk, *geom)
            if b is not None:
                y += _f64(b).reshape(1, -1, 1, 1)
            y = _f32(_activate64(y, a))
        if out is None:
            out = np.empty((len(x), *y.shape[1:]), y.dtype)
        out[b0:b0 + len(y)] = y
    return out


def _image_chunks(x: np.ndarray, o: int, geom):
    """(first image, x[first:first + step]) over x, step images of CONV_OUT_CHUNK_BYTES of
    float64 output (o channels)."""
    stride, padding, dilation, _ = geom
    n, _, h, wd = x.shape
    per_image = 8 * o * max(1, (h + 2 * padding[0]) // stride[0]) * max(
        1, (wd + 2 * padding[1]) // stride[1])
    step = max(1, CONV_OUT_CHUNK_BYTES // per_image)
    for b0 in range(0, max(n, 1), step):
        yield b0, x[b0:b0 + step]


@ops.register("reference", "batchnorm")
def batchnorm(a, x, gamma, beta, mean, var, **_):
    """x (N, C) or (N, C, H, W); per-channel params (C,) broadcast over axis 1."""
    shape = (1, -1) + (1,) * (x.ndim - 2)
    inv = 1.0 / np.sqrt(_f64(var) + a.get("eps", 1e-5))
    y = (_f64(x) - _f64(mean).reshape(shape)) * (inv * _f64(gamma)).reshape(shape)
    return _f32(y + _f64(beta).reshape(shape))


# --------------------------------------------------------------------------- pooling


def _windows(x: np.ndarray, a, pad_value):
    """Yield the strided slice of the padded input under each kernel tap (floor mode)."""
    kh, kw = a["kernel"]
    sh, sw = a.get("stride") or a["kernel"]
    ph, pw = a.get("padding", [0, 0])
    ho, wo = _out_size(x.shape[2], kh, sh, ph), _out_size(x.shape[3], kw, sw, pw)
    xp = _pad(x, ph, pw, pad_value)
    for i in range(kh):
        for j in range(kw):
            yield xp[:, :, i:i + sh * (ho - 1) + 1:sh, j:j + sw * (wo - 1) + 1:sw]


@ops.register("reference", "maxpool2d")
def maxpool2d(a, x, **_):
    """x (N, C, H, W) f32 or i8 -> (N, C, Ho, Wo); padding never wins (-inf, or -128 for i8)."""
    pad = -128 if x.dtype == np.int8 else -np.inf
    # a left fold over the taps, as maximum.reduce over them stacked, without the stack
    taps = _windows(x, a, pad)
    out = np.array(next(taps))
    for tap in taps:
        np.maximum(out, tap, out=out)
    return out.astype(x.dtype, copy=False)


@ops.register("reference", "avgpool2d")
def avgpool2d(a, x, **_):
    """x (N, C, H, W) -> (N, C, Ho, Wo); count_include_pad picks the divisor."""
    total = sum(_windows(_f64(x), a, 0.0))
    if a.get("count_include_pad", True):
        count = a["kernel"][0] * a["kernel"][1]
    else:
        count = sum(_windows(np.ones((1, 1) + x.shape[2:]), a, 0.0))
    return _f32(total / count)


@ops.register("reference", "global_avgpool")
def global_avgpool(a, x, **_):
    """x (N, C, H, W) -> (N, C, 1, 1)."""
    return _f32(_f64(x).mean(axis=(2, 3), keepdims=True))


# --------------------------------------------------------------------------- shape and misc


@ops.register("reference", "flatten")
def flatten(a, x, **_):
    return x.reshape(x.shape[0], -1)


@ops.register("reference", "reshape")
def reshape(a, x, **_):
    return x.reshape((x.shape[0], *a["shape"]))


@ops.register("reference", "dropout")
def dropout(a, x, **_):
    return x


@ops.register("reference", "add")
def add(a, x, y, **_):
    return _f32(_f64(x) + _f64(y))


@ops.register("reference", "concat")
def concat(a, *xs, **_):
    return np.concatenate(xs, axis=a.get("axis", 1))


@ops.register("reference", "quantize")
def quantize(a, x, **_):
    return q.quantize(x, a["scale"], a["zero_point"])


@ops.register("reference", "dequantize")
def dequantize(a, x, **_):
    return q.dequantize(x, a["scale"], a["zero_point"])


@ops.register("reference", "lut")
def lut(a, x, table, **_):
    return table[x.astype(np.int16) + 128]


_NP_DTYPES = {"f32": np.float32, "f16": np.float16, "i8": np.int8, "u8": np.uint8,
              "i32": np.int32, "i64": np.int64}


# --------------------------------------------------------------------------- the interpreter


def run(
    graph: Graph,
    params: Mapping[str, np.ndarray],
    inputs: Mapping[str, np.ndarray] | np.ndarray,
    quant: Mapping[str, dict | None] | None = None,
    *,
    keep_all: bool = False,
    known: Mapping[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Run `graph` node by node; return {output name: array} (every value with keep_all).

    params: constant tensors by name; quant: {weight name: {"scale": [...], ...}} for the int8
    weights of int8 conv2d/linear nodes (the container's `quant(name)`). known: values the
    caller computed already for these inputs (an identical upstream of another graph): a node
    whose outputs are all known is not run.
    """
    graph.validate()
    if not isinstance(inputs, Mapping):
        if len(graph.inputs) != 1:
            raise FormatError(f"graph has {len(graph.inputs)} inputs; pass a dict by name")
        inputs = {next(iter(graph.inputs)): inputs}
    env: dict[str, np.ndarray] = {}
    for name, info in graph.inputs.items():
        if name not in inputs:
            raise FormatError(f"missing graph input '{name}'")
        x = np.asarray(inputs[name])
        if x.dtype != _NP_DTYPES[info.dtype]:
            raise FormatError(f"input '{name}' must be {info.dtype}, got {x.dtype}")
        env[name] = x
    for name in graph.params:
        if name not in params:
            raise FormatError(f"missing param '{name}'")
        env[name] = np.asarray(params[name])
    for node in graph.nodes:
        if known is not None and all(o in known for o in node.outputs):
            env.update((o, known[o]) for o in node.outputs)
            continue
        kw = {}
        # an int8 layer, or an op with a weight-only int8 weight (lif: int8 weight, f32 input)
        weight_i8 = len(node.inputs) > 1 and env[node.inputs[1]].dtype == np.int8
        if (ops.OPS[node.op].int8 == ops.INT8_LAYER and _is_int8(node.attrs)) or weight_i8:
            qp = (quant or {}).get(node.inputs[1])
            kw["w_scale"] = None if qp is None else np.asarray(qp["scale"], np.float32)
        fn = ops.impl("reference", node.op)
        env[node.outputs[0]] = fn(node.attrs, *(env[i] for i in node.inputs), **kw)
    if keep_all:
        return env
    return {o: env[o] for o in graph.outputs}


def run_container(container, x: Mapping[str, np.ndarray] | np.ndarray, *,
                  keep_all: bool = False) -> dict[str, np.ndarray]:
    """Run a loaded model container (see `pocket.formats.container.read_container`) on x."""
    graph = container.graph
    if graph is None:
        raise FormatError("container holds no graph")
    quant = {name: container.quant(name) for name in graph.params}
    return run(graph, container.tensors, x, quant, keep_all=keep_all)


# The vision family (clip, silu, mul, channel_shuffle, slice); the activations by name here too.
# Op families' references register themselves on import (they read the helpers above).
from pocket.formats import (  # noqa: E402, F401
    reference_embed,
    reference_seqattn,
    reference_seqconv,
    reference_spiking,
    reference_ssm,
)
from pocket.formats.reference_vision import clip, silu  # noqa: E402, F401
