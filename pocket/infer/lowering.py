"""How each IR op becomes kernel calls: the engine's per-op preparation and builders.

A prepare function runs once at load: kernel-friendly views of the weights (never copies),
int8 constants, and the node's scratch size in the arena. A builder binds one node to the
arena views of one batch size and returns the calls to make, in order (partials of Numba
kernels or of NumPy's BLAS matmul with out=). See engine.py for the plan and the arena.
"""

from __future__ import annotations

import math
from functools import partial
from typing import TYPE_CHECKING

import numba
import numpy as np

from pocket.formats import ops
from pocket.formats.ir import Node
from pocket.infer import kernels_fma as kfma
from pocket.infer import kernels_fp32 as kf
from pocket.infer import kernels_int8 as ki
from pocket.infer import kernels_vnni as kv

if TYPE_CHECKING:
    from pocket.infer.engine import Engine

from pocket.infer.lowering_common import (
    _EMPTY_F32,
    _LINEAR_SKEW,
    F32_ROUTE_ROWS,
    _act_code,
    _aligned,
    _int8_consts,
    _pool_geom,
    _register_epi,
    _tile_cols,
    _vnni_cols_bytes,
    _vnni_rows_bytes,
)
from pocket.infer.lowering_conv import _b_conv2d, _prep_conv2d

# ... and an fp32 linear with at least this many rows runs on its GEMM too (the rows as its
# pixels); fewer rows take its dot-product kernel along K (one tile would be mostly junk).
FMA_LINEAR_ROWS = 16
# With AVX-512 VNNI (kernels_vnni), a linear with at least this many rows packs them for the
# channel x pixel tiles; fewer rows take the dot-product kernel along K.
VNNI_TILE_ROWS = 16
# The rows from which both of those routes run (see chained_linears).
CHAIN_ROWS = max(FMA_LINEAR_ROWS, VNNI_TILE_ROWS)
# A linear GEMM on several threads splits its rows (the GEMM's pixels) across them, one group
# a thread, where its weights are at most this many floats (kernels_fma.gemm_pixels). Each
# core then reads all the weights for its 32-64 columns: mlp fp32 at batch 64 on 2 threads,
# 128 x 256 weights: 22 -> 18-19 us; 256 x 784: 85 -> 115 us.
PIXEL_SPLIT_WEIGHTS = 1 << 16
# A linear from rows (not chained) on up to ROWS_COPIES threads transposes its input a block
# of K at a time in each thread, for its own channels (kernels_fma.gemm_rows): its scratch
# holds that many blocks. On one thread too: each block then goes from x in L2 to L1 and is
# read there, where transpose_in wrote all of x.T to L2 first (mlp fp32 at batch 64, its
# first linear: 160.5 -> ~156.5 us)
ROWS_COPIES = 4


def no_prep(eng: Engine, node: Node) -> dict:
    return {}


def _prep_linear(eng: Engine, node: Node) -> dict:
    w = eng._params[node.inputs[1]]
    if "x_scale" in node.attrs and kv.AVAILABLE and w.shape[1] <= kv.MAX_K:
        o, k = w.shape
        dot_rows = min(eng.max_batch, VNNI_TILE_ROWS - 1) if k % 4 == 0 else eng.max_batch
        scratch = sum(_vnni_rows_bytes(dot_rows, o, k))
        if eng.max_batch >= VNNI_TILE_ROWS and k % 4 == 0:
            scratch = max(scratch, sum(_vnni_cols_bytes(eng.max_batch, o, k)))
        return {"w": w, "kind": "vnni", "scratch_bytes": scratch, **_int8_consts(eng, node, w)}
    if "x_scale" in node.attrs:
        o, k = w.shape
        kc = -(-k // ki.EXACT_K)
        # float32 route scratch: weights, input rows, kc partial sums
        sizes = (o * k * 4, eng.max_batch * k * 4, kc * eng.max_batch * o * 4)
        scratch = sum(map(_aligned, sizes)) if eng.max_batch >= F32_ROUTE_ROWS else 0
        return {"w": w, "kc": kc, "sizes": sizes, "scratch_bytes": scratch,
                **_int8_consts(eng, node, w)}
    b = eng._params[node.inputs[2]] if len(node.inputs) > 2 else _EMPTY_F32
    d = {"wf": w, "wT": w.T, "b": b}
    if kfma.AVAILABLE and eng.max_batch >= FMA_LINEAR_ROWS:
        o, k = w.shape
        cols = kfma.tile_cols(eng.max_batch)
        d["copies"] = min(ROWS_COPIES, numba.config.NUMBA_NUM_THREADS)
        d["rows_at"] = _aligned(max(k, d["copies"] * kfma.rows_block(cols, k)) * cols * 4)
        d["scratch_bytes"] = d["rows_at"] + _aligned(o * (cols + _LINEAR_SKEW) * 4)
    return d


PREPARE = {"linear": _prep_linear, "conv2d": _prep_conv2d}


def _chain_route(eng: Engine, step: int) -> str | None:
    """'fma' or 'vnni' where linear `step` runs, from CHAIN_ROWS rows on, as a GEMM with its
    rows as the columns of a packed operand (kernels_fma on AVX-512, kernels_vnni's tiles)."""
    node, d = eng.graph.nodes[step], eng._prep[step]
    if node.op != "linear" or eng.max_batch < CHAIN_ROWS:
        return None
    if "wf" in d and "scratch_bytes" in d:
        return "fma"
    if d.get("kind") == "vnni" and d["w"].shape[1] % 4 == 0:
        return "vnni"
    return None


def chained_linears(eng: Engine) -> dict[int, tuple[int, int]]:
    """{step: (next step, bytes)} for each linear whose only reader is a linear on the same
    route (an int8 one with an int8 result): from CHAIN_ROWS rows on, it leaves its result in
    the next one's packed layout, (O, Mc) float32 or (O/4, Mp) words of four int8 codes, in its
    own buffer (bytes at max_batch), and the next one reads it there. This saves a transposing
    copy and a transpose back (mlp fp32 batch 64: ~20 of 225 us). The IR is unchanged."""
    readers = eng.readers()
    chained = {}
    for step, node in enumerate(eng.graph.nodes):
        route, out = _chain_route(eng, step), node.outputs[0]
        nxt = readers.get(out, [])
        if route is None or out in eng.graph.outputs or len(nxt) != 1 or _chain_route(eng, nxt[0]) != route:
            continue
        o = eng._params[node.inputs[1]].shape[0]
        if route == "fma":
            chained[step] = (nxt[0], o * kfma.tile_cols(eng.max_batch) * 4)
        elif eng._prep[step]["to_int8"]:
            chained[step] = (nxt[0], o * _tile_cols(eng.max_batch))
    return chained


def _chained_input(eng: Engine, step: int, n: int) -> bool:
    """Whether linear `step` at batch n reads its input in its packed layout."""
    return n >= CHAIN_ROWS and any(nxt == step for nxt, _ in eng._chained.values())


def _b_linear(eng: Engine, step: int, node: Node, n: int) -> list:
    d, a = eng._prep[step], node.attrs
    x, y = eng._view(node.inputs[0], n), eng._view(node.outputs[0], n)
    if d.get("kind") == "vnni":
        return _b_linear_vnni(eng, step, node, x, y, n)
    if "w" in d:  # int8
        epi = (d["bias_adj"], d["m"], d["to_int8"], d["y_zp"], d["lo"], d["relu"])
        w = d["w"]
        o, k = w.shape
        if n < F32_ROUTE_ROWS:
            return [partial(ki.gemm_q, y.reshape(n, o, 1), x.reshape(n, 1, k), w, epi[0], epi[1], 1,
                            *epi[2:])]
        at = [0, _aligned(d["sizes"][0]), _aligned(d["sizes"][0]) + _aligned(d["sizes"][1])]
        wf = eng._scratch(step, np.float32, (o, k), at[0])
        xf = eng._scratch(step, np.float32, (n, k), at[1])
        yf = eng._scratch(step, np.float32, (d["kc"], n, o), at[2])
        calls = [partial(np.copyto, wf, w), partial(np.copyto, xf, x.reshape(n, k))]
        for c in range(d["kc"]):
            k0, k1 = c * ki.EXACT_K, min(k, (c + 1) * ki.EXACT_K)
            calls.append(partial(np.matmul, xf[:, k0:k1], wf[:, k0:k1].T, out=yf[c]))
        return [*calls, partial(ki.requant_rows, y.reshape(n, o), yf, *epi)]
    if "scratch_bytes" in d and n >= FMA_LINEAR_ROWS:
        w = d["wf"]
        o, k = w.shape
        cols = kfma.tile_cols(n)
        parts = min(eng._threads, -(-cols // kfma.TILE_P))
        offs = kfma.row_offsets(k, cols)
        calls, own = [], None  # own: a copy of x.T for each thread (kernels_fma.gemm_rows)
        if _chained_input(eng, step, n):  # the previous linear left x.T here
            xt = eng._packed(node.inputs[0], np.float32, (k, cols))
        elif eng._threads == 1 or (eng._threads <= d["copies"] and eng._parallel(4 * o * cols * k)):
            own = eng._scratch(step, np.float32, (eng._threads, kfma.rows_block(cols, k), cols))
        else:
            xt = eng._scratch(step, np.float32, (k, cols))
            calls.append(partial(kfma.transpose_in, xt, x.reshape(n, k), parts))

        def gemm(c, ldc, b, epi):
            if own is not None:
                return partial(kfma.gemm_rows, c, w, x.reshape(n, k), own, offs, o, cols, ldc, b, epi)
            if parts > 1 and o * k <= PIXEL_SPLIT_WEIGHTS:
                return partial(kfma.gemm_pixels, c, w, xt, offs, o, cols, k, ldc, b, epi, parts)
            return partial(kfma.gemm, c, w, xt, offs, 1, o, cols, 0, 0, k, 0, ldc, b, epi)

        if step in eng._chained and n >= CHAIN_ROWS:  # y.T, for the next linear
            yt = eng._packed(node.outputs[0], np.float32, (o, cols))
            act = _act_code(a)
            epi = _register_epi(d["b"], act)
            if epi is not None:
                # bias and ReLU on the GEMM's tiles in registers; the columns past the rows
                # get act(bias) or the sums of finite inputs: finite, and the next GEMM's
                # results there are never read
                return [*calls, gemm(yt, cols, d["b"], epi)]
            return [*calls, gemm(yt, cols, _EMPTY_F32, 0),
                    partial(kf.bias_act_cols, yt, n, d["b"], act, a["alpha"])]
        ldc = cols + _LINEAR_SKEW
        c = eng._scratch(step, np.float32, (o, ldc), d["rows_at"])
        g = gemm(c, ldc, _EMPTY_F32, 0)
        if g.func is kfma.gemm:  # the GEMM and its epilogue in one call
            return [*calls, partial(kfma.gemm_t, y, c, w, xt, offs, o, cols, k, ldc, d["b"],
                                    _act_code(a), a["alpha"])]
        return [*calls, g, partial(kfma.bias_act_t, y, c, d["b"], _act_code(a), a["alpha"])]
    if kfma.AVAILABLE:
        act = _act_code(a)
        epi = _register_epi(d["b"], act)
        if epi is not None:  # the epilogue on the sums in registers
            return [partial(kfma.gemv, y, x.reshape(n, -1), d["wf"], d["b"], epi)]
        return [partial(kfma.gemv, y, x.reshape(n, -1), d["wf"], _EMPTY_F32, 0),
                partial(kf.bias_act_rows, y, y, d["b"], act, a["alpha"])]
    return [partial(np.matmul, x, d["wT"], out=y),
            partial(kf.bias_act_rows, y, y, d["b"], _act_code(a), a["alpha"])]


def _b_linear_vnni(eng: Engine, step: int, node: Node, x, y, n: int) -> list:
    d = eng._prep[step]
    w = d["w"]
    o, k = w.shape
    epi = (d["bias_u8"], d["m"], d["to_int8"], d["y_zp"], d["lo"], d["relu"])
    x8 = x.reshape(n, k).view(np.uint8)
    if n < VNNI_TILE_ROWS or k % 4:
        xu_bytes = _vnni_rows_bytes(n, o, k)[0]
        xu = eng._scratch(step, np.uint8, (n, (k // 64 + 1) * 64))
        c = eng._scratch(step, np.int32, (n, o), xu_bytes)
        return [partial(kv.pack_rows, xu, x8), partial(kv.gemm_rows, c, xu, w),
                partial(ki.requant_rows, y.reshape(n, o), c[None], *epi)]
    mp = _tile_cols(n)
    calls = []
    if _chained_input(eng, step, n):  # the previous linear left its codes packed here
        xp = eng._packed(node.inputs[0], np.uint32, (k // 4, mp))
    else:
        xp = eng._scratch(step, np.uint32, (k // 4, mp))
        calls.append(partial(kv.pack_rows_t, xp, x8.view(np.uint32)))
    c = eng._scratch(step, np.int32, (o, mp + _LINEAR_SKEW), _vnni_cols_bytes(n, o, k)[0])
    calls.append(partial(kv.gemm_cols, c, w, xp))
    if step in eng._chained and n >= CHAIN_ROWS:  # packed for the next linear
        xq = eng._packed(node.outputs[0], np.uint32, (o // 4, mp))
        return [*calls, partial(kv.requant_cols_pack, xq, c, c.view(np.float32), n, *epi[:2], *epi[3:])]
    return [*calls, partial(kv.requant_cols_t, y.reshape(n, o), c, c.view(np.float32), *epi)]


def _b_unary(eng: Engine, step: int, node: Node, n: int) -> list:
    a = node.attrs
    code = kf.ACT["gelu_tanh" if a.get("approximate") == "tanh" else node.op]
    x, y = eng._view(node.inputs[0], n), eng._view(node.outputs[0], n)
    return [partial(kf.unary, y.reshape(-1), x.reshape(-1), code, a.get("alpha", 0.0))]


def _b_maxpool2d(eng, step, node, n):
    x, y = eng._view(node.inputs[0], n), eng._view(node.outputs[0], n)
    return [partial(kf.maxpool2d, y, x, *_pool_geom(node.attrs))]


def _b_avgpool2d(eng, step, node, n):
    x, y = eng._view(node.inputs[0], n), eng._view(node.outputs[0], n)
    return [partial(kf.avgpool2d, y, x, *_pool_geom(node.attrs), node.attrs["count_include_pad"])]


def _b_global_avgpool(eng, step, node, n):
    x, y = eng._view(node.inputs[0], n), eng._view(node.outputs[0], n)
    return [partial(kf.global_avgpool, y.reshape(n, -1), x.reshape(n, x.shape[1], -1))]


def _b_batchnorm(eng, step, node, n):
    x, y = eng._view(node.inputs[0], n), eng._view(node.outputs[0], n)
    params = [eng._params[v] for v in node.inputs[1:]]
    return [partial(kf.batchnorm, y.reshape(n, y.shape[1], -1), x.reshape(n, x.shape[1], -1),
                    *params, node.attrs["eps"])]


def _b_alias(eng, step, node, n):
    return []


def _b_add(eng, step, node, n):
    a, b = (eng._view(v, n) for v in node.inputs)
    y = eng._view(node.outputs[0], n)
    if a.shape == b.shape == y.shape:
        return [partial(kf.add, y.reshape(-1), a.reshape(-1), b.reshape(-1))]
    return [partial(np.add, a, b, out=y)]


def _b_concat(eng, step, node, n):
    y = eng._view(node.outputs[0], n)
    axis = node.attrs["axis"] % y.ndim
    rows = math.prod(y.shape[:axis])
    y2 = y.reshape(rows, -1)
    calls, start = [], 0
    for v in node.inputs:
        x2 = eng._view(v, n).reshape(rows, -1)
        calls.append(partial(kf.copy_cols, y2, x2, start))
        start += x2.shape[1]
    return calls


def _b_softmax(eng, step, node, n):
    x, y = eng._view(node.inputs[0], n), eng._view(node.outputs[0], n)
    axis = node.attrs["axis"] % x.ndim
    shape = (math.prod(x.shape[:axis]), x.shape[axis], math.prod(x.shape[axis + 1:]))
    return [partial(kf.softmax, y.reshape(shape), x.reshape(shape))]


def _b_quantize(eng, step, node, n):
    x, y = eng._view(node.inputs[0], n), eng._view(node.outputs[0], n)
    a = node.attrs
    kernel = ki.quantize if node.op == "quantize" else ki.dequantize
    return [partial(kernel, y.reshape(-1), x.reshape(-1), a["scale"], a["zero_point"])]


BUILDERS = ops.register_table("engine", {
    **dict.fromkeys(ops.activations(), _b_unary),  # kernels_fp32.unary on the op's ACT code
    "linear": _b_linear, "conv2d": _b_conv2d, "batchnorm": _b_batchnorm,
    "maxpool2d": _b_maxpool2d, "avgpool2d": _b_avgpool2d,
    "global_avgpool": _b_global_avgpool, "flatten": _b_alias, "reshape": _b_alias,
    "dropout": _b_alias, "add": _b_add, "concat": _b_concat, "softmax": _b_softmax,
    "quantize": _b_quantize, "dequantize": _b_quantize,
})
