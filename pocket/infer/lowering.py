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

import numpy as np

from pocket.formats import quant as qm
from pocket.formats.errors import FormatError
from pocket.formats.ir import Node
from pocket.infer import kernels_fma as kfma
from pocket.infer import kernels_fp32 as kf
from pocket.infer import kernels_int8 as ki
from pocket.infer import kernels_vnni as kv
from pocket.infer import kernels_winograd as kwg

if TYPE_CHECKING:
    from pocket.infer.engine import Engine

from pocket.infer.engine import ALIGN

SCRATCH_BYTES = 8 << 20  # im2col + GEMM result per chunk: a few MiB, in cache, few GEMM calls
# An int8 conv/linear with at least this many output rows (batch x pixels) per weight runs as
# float32 BLAS GEMMs on the int8 codes (exact, see kernels_int8.requant_sum): BLAS sgemm is 3-4x
# faster than a vectorized int8 dot in Numba, and converting the weights each call costs one
# pass over them, which this many rows amortize. Below it, the int8 dot kernel (gemm_q).
F32_ROUTE_ROWS = 16
# fp32 3x3 stride-1 convs with at least this many input channels run as Winograd F(2x2, 3x3)
# (kernels_winograd): its 16 GEMMs do 2.25x fewer multiply-adds, which outweighs the
# transforms from about 64 channels on (32 was a little slower, measured at batch 1 and 64;
# with kernels_fma's transforms, cnn_mnist fp32 batch 64 at 32 went 4.82 -> 4.59 ms on one
# thread but 2.57 -> 2.74 ms on two).
WINOGRAD_MIN_C = 64
# ... and at least this many tiles (2x2 outputs) a call: with fewer (batch 1 on maps of 8x8 and
# less) the per-call filter transform and short loops cost more than the GEMM saves (cnn_cifar
# fp32 batch 1: 3.6 ms at 64, 4.2 ms at 16, 4.0 ms at 512).
WINOGRAD_MIN_TILES = 64
# With AVX-512 (kernels_fma), an fp32 conv's GEMM result and inputs per chunk: small enough to
# stay in L2 between the GEMM and its epilogue.
FMA_SCRATCH_BYTES = 2 << 20
# With AVX-512 VNNI, an int8 conv's packed inputs and int32 sums per chunk, per thread: the
# sums stay in L2 for the epilogue (cnn_cifar int8 at batch 64, one thread: 50.9 ms at 8 MiB,
# 48.5 at 1; two threads: 28.2 at 8 MiB, 28.6 at 2, 30.1 at 1, the calls too short to split)
VNNI_SCRATCH_BYTES = 1 << 20
# ... and a stride-1 conv reads its padded images in place unless the pitch's junk columns
# (the padding, and the last partial tile of each image) cost more than im2col would: the
# copy costs about as much as this many multiply-adds per column element (measured: ~0.2 ns
# against ~0.012 ns a multiply-add), shared by the output channels.
FMA_IM2COL_MACS = 17
# ... and on two or more threads an im2col conv with this many columns a chunk (batch 1 on
# 6x6 to 11x11 maps) runs its GEMM as two over the halves of K, then adds them: split by
# output channels, each core read the im2col rows the other core had written, and the 8x8
# layers of cnn_cifar fp32 at batch 1 ran 15-20% slower after im2col than alone (whole
# model, 2 threads: ~2% faster). 4x4 maps gained nothing; one thread lost the add (1.5%).
FMA_KSPLIT_COLS = (32, 128)
# ... and an fp32 linear with at least this many rows runs on its GEMM too (the rows as its
# pixels); fewer rows take its dot-product kernel along K (one tile would be mostly junk).
FMA_LINEAR_ROWS = 16
# its result's rows are this many floats longer than the tiles: at 64 columns (256 bytes)
# apart, the transposing epilogue's 256 reads per row fell in a few L1 sets (6x slower)
_LINEAR_SKEW = 16
# Winograd's U (16, O*C) has rows this many floats longer: at O*C a multiple of 1024 its 16
# rows fall in one L1 set, and the filter transform, which writes all 16 per filter, ran 10x
# slower
_U_SKEW = 16
# ... and so do V (16, C*cols) and M (16, O*cols) on AVX-512 (kernels_fma's transforms): their
# transforms write (read) all 16 rows at once, and at C*cols a multiple of 1024 these fell in
# one L1 set too (the input transform ran 1.4-4x slower)
_VM_SKEW = 16
# With AVX-512 VNNI (kernels_vnni), a linear with at least this many rows packs them for the
# channel x pixel tiles; fewer rows take the dot-product kernel along K.
VNNI_TILE_ROWS = 16
# The rows from which both of those routes run (see chained_linears).
CHAIN_ROWS = max(FMA_LINEAR_ROWS, VNNI_TILE_ROWS)
# ... and a stride-1 conv whose output is at most this wide packs its columns at a pitch of Wo
# (no junk columns) rather than Wp: on 4x4 and 8x8 maps the junk (33%, 20%) cost the GEMM
# more than packing by a pixel table costs (cnn_cifar int8 at batch 1: 1021 -> 940 us)
VNNI_PITCH_MAX_WO = 8
# conv routes whose epilogue can write a following maxpool's output (int8: only on its float32
# route, i.e. groups 1 and enough rows; the builders check)
POOL_FUSING_KINDS = ("int8", "im2col", "gemm", "gemm_pitch", "vnni", "winograd", "fma_pitch", "fma_cols")


# --------------------------------------------------------------------------- per-op preparation


def no_prep(eng: Engine, node: Node) -> dict:
    return {}


_EMPTY_F32 = np.zeros(0, np.float32)


def _act_code(a: dict) -> int:
    return kf.ACT[a.get("activation", "none")]


def _int8_consts(eng: Engine, node: Node, w: np.ndarray) -> dict:
    a = node.attrs
    qp = eng._container.quant(node.inputs[1])
    o = w.shape[0]
    if qp is None or len(qp.get("scale", [])) != o or qp.get("axis", 0) not in (0, None):
        raise FormatError(f"node '{node.name}': int8 weight '{node.inputs[1]}' needs {o} "
                          "per-output-channel scales (axis 0) in the container")
    w_scale = np.asarray(qp["scale"], np.float32)
    wsum = ki.weight_sums(w.reshape(o, -1))
    b = eng._params[node.inputs[2]] if len(node.inputs) > 2 else np.zeros(o, np.int32)
    to_int8 = a.get("y_scale") is not None
    relu = a.get("activation", "none") == "relu"
    y_zp = a["y_zero_point"] if to_int8 else 0
    return {
        # NOTE: int64, so b_q - x_zp * wsum never wraps, whatever the weights.
        "bias_adj": b.astype(np.int64) - np.int64(a["x_zero_point"]) * wsum.astype(np.int64),
        # the VNNI kernels read x_q + 128 as unsigned bytes: the shift folds in like x_zp
        "bias_u8": b.astype(np.int64) - np.int64(a["x_zero_point"] + 128) * wsum.astype(np.int64),
        "m": qm.requant_multiplier(a["x_scale"], w_scale, a.get("y_scale")),
        "to_int8": to_int8, "y_zp": float(y_zp), "lo": float(y_zp if relu else qm.QMIN), "relu": relu,
    }


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def _im2col(col, xs, geom, pad, rb: int, cb: int) -> partial:
    """The im2col call for images xs: kernels_fp32.im2col_same where the conv keeps the map's
    size at stride 1 (its mask made here, once a bind), else im2col."""
    kh, kw, sh, sw, ph, pw, dh, dw = geom
    h, w = xs.shape[2:]
    if (sh, sw) == (1, 1) and 2 * ph == dh * (kh - 1) and 2 * pw == dw * (kw - 1):
        valid = kf.same_valid(h, w, kh, kw, ph, pw, dh, dw)
        return partial(kf.im2col_same, col, xs, valid, kh, kw, ph, pw, dh, dw, pad, rb, cb)
    return partial(kf.im2col, col, xs, *geom, pad, rb, cb)


def _tile_cols(rows: int) -> int:
    """Columns of a VNNI packed operand: rows rounded up to whole vectors of 16 pixels."""
    return -(-rows // kv.COL_ALIGN) * kv.COL_ALIGN


def _vnni_rows_bytes(n: int, o: int, k: int) -> tuple[int, int]:
    """Scratch of the VNNI dot route for n rows: xu (n, Kp) u8 (Kp > K: room for the masked
    tail chunk) and c (n, O) i32."""
    return _aligned(n * (k // 64 + 1) * 64), _aligned(n * o * 4)


def _vnni_cols_bytes(rows: int, o: int, k: int) -> tuple[int, int]:
    """Scratch of the VNNI tile route for `rows` pixels: xp (K/4, Mp) u32 and c (O, Mp) i32
    (a linear's rows skewed, see requant_cols_t)."""
    mp = _tile_cols(rows)
    return _aligned(k * mp), _aligned(o * (mp + _LINEAR_SKEW) * 4)


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
        d["scratch_bytes"] = _aligned(k * cols * 4) + _aligned(o * (cols + _LINEAR_SKEW) * 4)
    return d


def _conv_geometry(eng: Engine, node: Node) -> dict:
    a = node.attrs
    x_shape = eng._sample[node.inputs[0]]
    w = eng._params[node.inputs[1]]
    o, cg, kh, kw = w.shape
    c, h, wd = x_shape
    (sh, sw), (ph, pw), (dh, dw) = a["stride"], a["padding"], a["dilation"]
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    return {"w": w, "o": o, "k": c * kh * kw, "p": ho * wo, "geom": (kh, kw, sh, sw, ph, pw, dh, dw),
            "groups": a["groups"]}


def _pitch_geometry(eng: Engine, node: Node, geom: tuple) -> dict:
    """Where a conv's packed inputs put its output pixels: stride 1 at a pitch of Wp, the
    padded width, so that each packed row is one contiguous run of the padded images (junk
    columns ow >= Wo included, see kernels_vnni.pack_cols); otherwise at a pitch of Wo (and
    the VNNI route takes Wo for narrow maps too, see VNNI_PITCH_MAX_WO).

    At stride 1 the padded rows are W + pw wide, not W + 2pw: each row's pw pad columns come
    first, and a window running off a row's right end reads the next row's (or the next
    plane's) first pw columns, which are padding too; so the pitch has pw fewer junk columns
    (a 3x3 conv on 14x14 maps: 1 in 15 columns junk, not 2 in 16)."""
    c, h, w = eng._sample[node.inputs[0]]
    kh, kw, sh, sw, ph, pw, dh, dw = geom
    hp = h + 2 * ph
    ho, wo = (hp - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    wp = w + pw if (sh, sw) == (1, 1) else w + 2 * pw
    pitch = wp if (sh, sw) == (1, 1) else wo
    # padded: elements of one padded image; slack: junk reads past the last one
    return {"hp": hp, "wp": wp, "ho": ho, "wo": wo, "pitch": pitch, "pix": ho * pitch, "padded": c * hp * wp,
            "slack": (kw - 1) * dw + 1}


def _prep_conv2d(eng: Engine, node: Node) -> dict:
    d = _conv_geometry(eng, node)
    w, o, k, p, g = d["w"], d["o"], d["k"], d["p"], d["groups"]
    kh, kw, sh, sw, ph, pw = d["geom"][:6]
    if "x_scale" in node.attrs and kv.AVAILABLE and g == 1 and k <= kv.MAX_K:
        d.update(_int8_consts(eng, node, w))
        d["w2"] = w.reshape(o, k)
        d["kind"] = "vnni"
        d.update(_pitch_geometry(eng, node, d["geom"]))
        ho, wo = d["ho"], d["wo"]
        if wo <= VNNI_PITCH_MAX_WO:
            d["pitch"], d["pix"] = wo, d["p"]
        flat = (sh, sw) == (1, 1) and d["pitch"] == d["wp"]  # one run per image: no table
        d["poffs"] = np.zeros(0, np.int64) if flat else kv.pixel_offsets(ho, wo, sh, sw, d["wp"])
        per_image = (k + 4 * o) * d["pix"] + d["padded"]
        d["chunk"] = max(1, min(eng.max_batch, VNNI_SCRATCH_BYTES * eng._threads // per_image))
        d["k4"] = -(-k // 4)
        # K % 4 != 0 (a first layer): the weights padded to whole 4-byte groups, per call
        d["wpad_bytes"] = _aligned(o * d["k4"] * 4) if k % 4 else 0
        d["scratch_bytes"] = (sum(_vnni_cols_bytes(d["chunk"] * d["pix"], o, 4 * d["k4"]))
                              + _aligned(d["chunk"] * d["padded"]) + _aligned(d["slack"]) + d["wpad_bytes"])
        c = eng._sample[node.inputs[0]][0]
        # in place where the packed columns would be at the pitch of Wp too; on narrow maps
        # (packed at Wo) each image's pixels in whole vectors cost more than packing saves:
        # cnn_cifar int8 at batch 64 ran 48.1 ms with those packed, 52.1 in place
        if flat and c % 4 == 0:
            d["quad"] = q = _prep_quad(d, c, eng.max_batch, VNNI_SCRATCH_BYTES * eng._threads)
            d["scratch_bytes"] = max(d["scratch_bytes"], q["scratch_bytes"])
        return d
    if "x_scale" in node.attrs:
        d.update(_int8_consts(eng, node, w))
        d["w2"] = w.reshape(o, k // g)
        d["kind"] = "int8"
        d["kc"] = -(-k // ki.EXACT_K)
        # float32 route (groups == 1): weights (O, K) f32 once, then per image col (K, P) f32
        # and kc partial sums (O, P) f32; it also covers the int8 im2row route's (P, K) i8.
        d["w_bytes"] = _aligned(o * k * 4) if g == 1 else 0
        per_image = k * p * 4 + (d["kc"] * o * p * 4 if g == 1 else 0)
    else:
        d["b"] = eng._params[node.inputs[2]] if len(node.inputs) > 2 else _EMPTY_F32
        if g > 1 and w.shape[1] == 1:
            d["kind"] = "direct"
            return d
        if g == 1 and kh == kw == 1 and sh == sw == 1 and ph == pw == 0 and not kfma.AVAILABLE:
            d["kind"] = "pointwise"
            d["w2"] = w.reshape(o, k)
            return d
        d["w_bytes"] = 0
        c = eng._sample[node.inputs[0]][0]
        if g == 1 and (sh, sw) == (1, 1):  # as "gemm", at a pixel pitch of Wp
            pitch = (_prep_fma(eng, node, dict(d)) if kfma.AVAILABLE else
                     _prep_pitch(eng, node, dict(d)))
            if (kh, kw) == (3, 3) and tuple(d["geom"][6:]) == (1, 1) and c >= WINOGRAD_MIN_C:
                wino = _prep_winograd(eng, node, d)
                wino["pitch_plan"] = pitch  # for batches with few tiles
                wino["scratch_bytes"] = max(wino["scratch_bytes"], pitch["scratch_bytes"])
                return wino
            return pitch
        if g == 1 and kfma.AVAILABLE:
            return _prep_fma(eng, node, d)
        if g == 1:  # one wide GEMM per chunk: col (K, m*P) and its result (O, m*P)
            d["kind"] = "gemm"
            d["w2"] = w.reshape(o, k)
            per_image = (k + o) * p * 4
        else:
            d["kind"] = "im2col"
            d["w2"] = w.reshape(g, o // g, k // g)
            per_image = k * p * 4
    d["chunk"] = max(1, min(eng.max_batch, SCRATCH_BYTES // per_image))
    d["scratch_bytes"] = d["w_bytes"] + _aligned(d["chunk"] * k * p * 4) + d["chunk"] * (
        per_image - k * p * 4)
    return d


def _winograd_sizes(d: dict, m: int) -> list[int]:
    """Scratch of a Winograd conv for m images, in order: U, padded images, row scratch, V, M,
    output scratch (float32 elements). V and M have _winograd_cols columns, rows _VM_SKEW longer."""
    c, o = d["c"], d["o"]
    cols = _winograd_cols(d, m)
    return [16 * (o * c + _U_SKEW), m * c * d["hp"] * d["wp"], m * c * 4 * d["wp"],
            16 * (c * cols + _VM_SKEW), 16 * (o * cols + _VM_SKEW), m * o * 8 * d["th"] * d["tw"]]


def _winograd_cols(d: dict, m: int) -> int:
    """Columns of V and M for m images: their tiles, rounded up for kernels_fma's GEMM."""
    t = m * d["th"] * d["tw"]
    return kfma.tile_cols(t) if d["fma"] else t


def _prep_quad(d: dict, c: int, max_batch: int, budget: int) -> dict:
    """The in-place int8 route of a stride-1 conv with C % 4 == 0 (kernels_vnni.gemm_quad):
    its images as C/4 planes of words at the pixel pitch of Wp; scratch: the weights in
    gemm_quad's order, the planes of a chunk of images, and its sums (O, chunk * cpi)."""
    kh, kw, _, _, ph, pw, dh, dw = d["geom"]
    hp, wp, o, k = d["hp"], d["wp"], d["o"], d["k"]
    pix = d["ho"] * wp
    q = {"pix": pix, "cpi": _tile_cols(pix), "img": c // 4 * hp * wp,
         "offs": kv.quad_offsets(c, hp, wp, kh, kw, dh, dw)}
    # an image's whole last vector, and the window past its last pixel, read past the planes
    q["slack"] = q["cpi"] - pix + (kw - 1) * dw + 1
    q["chunk"] = max(1, min(max_batch, budget // (4 * q["img"] + 4 * o * q["cpi"])))
    q["wq_bytes"] = _aligned(o * k)
    q["xq_bytes"] = _aligned(4 * (q["chunk"] * q["img"] + q["slack"]))
    q["scratch_bytes"] = q["wq_bytes"] + q["xq_bytes"] + _aligned(4 * o * q["chunk"] * q["cpi"])
    return q


def _prep_pitch(eng: Engine, node: Node, d: dict) -> dict:
    d.update(_pitch_geometry(eng, node, d["geom"]))
    d["kind"], d["w2"] = "gemm_pitch", d["w"].reshape(d["o"], d["k"])
    per_image = ((d["k"] + d["o"]) * d["pix"] + d["padded"]) * 4
    d["chunk"] = max(1, min(eng.max_batch, SCRATCH_BYTES // per_image))
    d["scratch_bytes"] = (sum(_aligned(d["chunk"] * e * 4) for e in (
        d["k"] * d["pix"], d["o"] * d["pix"], d["padded"])) + _aligned(d["slack"] * 4))
    return d


def _prep_fma(eng: Engine, node: Node, d: dict) -> dict:
    """fp32 conv (groups 1) on kernels_fma: a stride-1 conv at the pixel pitch of Wp, reading
    its padded images in place ("fma_pitch"), or im2col columns ("fma_cols")."""
    o, k, p = d["o"], d["k"], d["p"]
    kh, kw, sh, sw, ph, pw, dh, dw = d["geom"]
    d["w2"] = d["w"].reshape(o, k)
    if (sh, sw) == (1, 1):
        geo = _pitch_geometry(eng, node, d["geom"])
        mpi = kfma.tile_cols(geo["pix"])
        if mpi <= p * (1 + FMA_IM2COL_MACS / o):
            d.update(geo, kind="fma_pitch", mpi=mpi)
            c = eng._sample[node.inputs[0]][0]
            d["offs"] = kfma.pitch_offsets(c, geo["hp"], geo["wp"], kh, kw, dh, dw)
            # the last tile of the last image reads past its pixels (see kernels_fma.gemm)
            d["slack"] = (kw - 1) * dw + mpi - geo["pix"] + 16
            per_image = (d["padded"] + o * mpi) * 4
            d["chunk"] = max(1, min(eng.max_batch, FMA_SCRATCH_BYTES // per_image))
            d["scratch_bytes"] = (_aligned((d["chunk"] * d["padded"] + d["slack"]) * 4)
                                  + _aligned(o * d["chunk"] * mpi * 4))
            return d
    d["kind"] = "fma_cols"
    d["chunk"] = max(1, min(eng.max_batch, FMA_SCRATCH_BYTES // ((k + o) * p * 4)))
    cols = kfma.tile_cols(d["chunk"] * p)
    # (two results while the GEMM runs over the halves of K)
    halves_cols = 2 * min(cols, FMA_KSPLIT_COLS[1])
    d["scratch_bytes"] = _aligned(k * cols * 4) + _aligned(o * max(cols, halves_cols) * 4)
    return d


def _prep_winograd(eng: Engine, node: Node, d: dict) -> dict:
    c, h, w = eng._sample[node.inputs[0]]
    ph, pw = d["geom"][4:6]
    ho, wo = h + 2 * ph - 2, w + 2 * pw - 2
    d.update(kind="winograd", c=c, th=-(-ho // 2), tw=-(-wo // 2), w9=d["w"].reshape(-1, 9),
             fma=kfma.AVAILABLE)
    d["hp"], d["wp"] = 2 * d["th"] + 2, 2 * d["tw"] + 2
    # NOTE: U (16 x O x C) is not part of the budget: a GEMM reads all of U once per chunk
    # (from memory once it outgrows L2), so on small maps only big chunks amortize it
    per_image = (sum(_winograd_sizes(d, 1)[1:]) - 16 * (c + d["o"]) * (
        _winograd_cols(d, 1) - d["th"] * d["tw"])) * 4
    d["chunk"] = max(1, min(eng.max_batch, SCRATCH_BYTES // per_image))
    d["scratch_bytes"] = sum(_aligned(e * 4) for e in _winograd_sizes(d, d["chunk"]))
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


# --------------------------------------------------------------------------- builders


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
        calls = []
        if _chained_input(eng, step, n):  # the previous linear left x.T here
            xt = eng._packed(node.inputs[0], np.float32, (k, cols))
        else:
            xt = eng._scratch(step, np.float32, (k, cols))
            calls.append(partial(kfma.transpose_in, xt, x.reshape(n, k), eng._threads == 1))
        offs = kfma.row_offsets(k, cols)
        if step in eng._chained and n >= CHAIN_ROWS:  # y.T, for the next linear
            yt = eng._packed(node.outputs[0], np.float32, (o, cols))
            act = _act_code(a)
            if d["b"].size and act in (0, 1):
                # bias and ReLU on the GEMM's tiles in registers; the columns past the rows
                # get act(bias): finite, and the next GEMM's results there are never read
                return [*calls, partial(kfma.gemm, yt, w, xt, offs, 1, o, cols, 0, 0, k, 0, cols, d["b"],
                                        1 + act)]
            return [*calls, partial(kfma.gemm, yt, w, xt, offs, 1, o, cols, 0, 0, k, 0, cols, _EMPTY_F32, 0),
                    partial(kf.bias_act_cols, yt, n, d["b"], act, a["alpha"])]
        ldc = cols + _LINEAR_SKEW
        c = eng._scratch(step, np.float32, (o, ldc), _aligned(k * kfma.tile_cols(eng.max_batch) * 4))
        return [*calls, partial(kfma.gemm, c, w, xt, offs, 1, o, cols, 0, 0, k, 0, ldc, _EMPTY_F32, 0),
                partial(kfma.bias_act_t, y, c, d["b"], _act_code(a), a["alpha"])]
    if kfma.AVAILABLE:
        return [partial(kfma.gemv, y, x.reshape(n, -1), d["wf"]),
                partial(kf.bias_act_rows, y, y, d["b"], _act_code(a), a["alpha"])]
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


def _b_conv_quad(eng: Engine, step: int, d: dict, a: dict, x, y, pool, pool_geom, n: int) -> list:
    q, o, k = d["quad"], d["o"], d["k"]
    kh, kw, sh, sw, ph, pw, dh, dw = d["geom"]
    epi = (d["bias_u8"], d["m"], d["to_int8"], d["y_zp"], d["lo"], d["relu"])
    wq = eng._scratch(step, np.int8, (o, k))
    calls = [partial(kv.pack_weights_quad, wq, d["w"])]
    for start in range(0, n, q["chunk"]):
        m = min(q["chunk"], n - start)
        xq = eng._scratch(step, np.uint32, (m * q["img"] + q["slack"],), q["wq_bytes"])
        c = eng._scratch(step, np.int32, (o, m * q["cpi"]), q["wq_bytes"] + q["xq_bytes"])
        calls += [partial(kv.pad_quad, xq, x[start:start + m], ph, pw, d["hp"], d["wp"],
                          a["x_zero_point"] + 128),
                  partial(kv.gemm_quad, c, wq, xq, q["offs"], m, q["cpi"], q["img"]),
                  partial(kv.requant_cols, y[start:start + m], c, c.view(np.float32), d["wp"], q["cpi"], *epi)
                  if pool is None else
                  partial(kv.requant_cols_pool, pool[start:start + m], c, c.view(np.float32), d["ho"],
                          d["wp"], q["cpi"], *pool_geom, *epi)]
    return calls


def _b_conv2d(eng: Engine, step: int, node: Node, n: int) -> list:
    d, a = eng._prep[step], node.attrs
    if d["kind"] == "winograd" and n * d["th"] * d["tw"] < WINOGRAD_MIN_TILES:
        d = d["pitch_plan"]
    x, y = eng._view(node.inputs[0], n), eng._view(node.outputs[0], n)
    o, k, p, g, geom = d["o"], d["k"], d["p"], d["groups"], d["geom"]
    act, alpha = _act_code(a), a["alpha"]
    if d["kind"] == "direct":
        return [partial(kf.conv2d_direct, y, x, d["w"], d["b"], *geom[2:], act, alpha)]
    y3 = y.reshape(n, o, p)
    if d["kind"] == "pointwise":
        return [partial(np.matmul, d["w2"], x.reshape(n, k, p), out=y3),
                partial(kf.bias_act, y3, y3.reshape(n * o, p), o, 0, d["b"], act, alpha)]
    calls = []
    # a fused maxpool: the conv writes the pooled output; its own output buffer goes unused
    pool, pool_geom, x_w = None, (), y.shape[3]
    pstep = eng._pool_after.get(step)
    pool_ok = d["kind"] != "winograd" or (pstep is not None and tuple(
        _pool_geom(eng.graph.nodes[pstep].attrs)[:4]) == (2, 2, 2, 2))
    if pstep is not None and pool_ok and (d["kind"] in POOL_FUSING_KINDS[1:]
                                          or (g == 1 and n * p >= F32_ROUTE_ROWS)):
        pnode = eng.graph.nodes[pstep]
        pool, pool_geom = eng._view(pnode.outputs[0], n), _pool_geom(pnode.attrs)[:4]
        eng._skip.add(pstep)
    if d["kind"] == "vnni" and "quad" in d:
        return [*calls, *_b_conv_quad(eng, step, d, a, x, y, pool, pool_geom, n)]
    for start in range(0, n, d["chunk"]):
        m = min(d["chunk"], n - start)
        xs, ys = x[start:start + m], y3[start:start + m]
        if d["kind"] == "vnni":
            k4, pix, mpc = d["k4"], d["pix"], _tile_cols(m * d["pix"])
            xp_bytes, c_bytes = _vnni_cols_bytes(d["chunk"] * pix, o, 4 * k4)
            xp = eng._scratch(step, np.uint32, (k4, mpc))
            c = eng._scratch(step, np.int32, (o, mpc), xp_bytes)
            kh, kw, sh, sw, ph, pw, dh, dw = geom
            hp, wp = d["hp"], d["wp"]
            xpad = eng._scratch(step, np.uint8, (m * d["padded"] + d["slack"],), xp_bytes + c_bytes)
            w2 = d["w2"]
            if d["wpad_bytes"]:
                w2 = eng._scratch(step, np.int8, (o, 4 * k4), d["scratch_bytes"] - d["wpad_bytes"])
                if start == 0:
                    calls.append(partial(kv.pad_weights, w2, d["w2"]))
            epi = (d["bias_u8"], d["m"], d["to_int8"], d["y_zp"], d["lo"], d["relu"])
            ho, wo = y.shape[2:]
            calls += [partial(kv.pad_shift, xpad, xs.view(np.uint8), ph, pw, hp, wp,
                              a["x_zero_point"] + 128),
                      partial(kv.pack_cols, xp, xpad, m, xs.shape[1], hp, wp, kh, kw, dh, dw, pix,
                              d["poffs"]),
                      partial(kv.gemm_cols, c, w2, xp),
                      partial(kv.requant_cols, y[start:start + m], c, c.view(np.float32), d["pitch"], pix,
                              *epi)
                      if pool is None else
                      partial(kv.requant_cols_pool, pool[start:start + m], c, c.view(np.float32), ho,
                              d["pitch"], pix, *pool_geom, *epi)]
        elif d["kind"] == "int8" and g == 1 and n * p >= F32_ROUTE_ROWS:
            if start == 0:
                calls.append(partial(np.copyto, eng._scratch(step, np.float32, (o, k)), d["w2"]))
            wf = eng._scratch(step, np.float32, (o, k))
            col = eng._scratch(step, np.float32, (k, m * p), d["w_bytes"])
            yf = eng._scratch(step, np.float32, (d["kc"], o, m * p),
                              d["w_bytes"] + _aligned(d["chunk"] * k * p * 4))
            calls.append(_im2col(col, xs, geom, np.float32(a["x_zero_point"]), 0, p))
            for c in range(d["kc"]):
                k0, k1 = c * ki.EXACT_K, min(k, (c + 1) * ki.EXACT_K)
                calls.append(partial(np.matmul, wf[:, k0:k1], col[k0:k1], out=yf[c]))
            epi = (d["bias_adj"], d["m"], d["to_int8"], d["y_zp"], d["lo"], d["relu"])
            if pool is None:
                calls.append(partial(ki.requant_sum, ys, yf, 0, p, *epi))
            else:
                calls.append(partial(ki.requant_sum_pool, pool[start:start + m], yf, 0, p, x_w,
                                     *pool_geom, *epi))
        elif d["kind"] == "int8":
            col = eng._scratch(step, np.int8, (m, p, k))
            calls += [partial(ki.im2row, col, xs, *geom, np.int8(a["x_zero_point"])),
                      partial(ki.gemm_q, ys, col, d["w2"], d["bias_adj"], d["m"], g, d["to_int8"], d["y_zp"],
                              d["lo"], d["relu"])]
        elif d["kind"] == "winograd":
            c, th, tw = d["c"], d["th"], d["tw"]
            cols = _winograd_cols(d, m)
            shapes = [(16, o * c + _U_SKEW), (m, c, d["hp"], d["wp"]), (m * c, 4, d["wp"]),
                      (16, c * cols + _VM_SKEW), (16, o * cols + _VM_SKEW), (m * o, 8, th * tw)]
            at, views = 0, []
            for shape, full in zip(shapes, _winograd_sizes(d, d["chunk"])):
                views.append(eng._scratch(step, np.float32, shape, at))
                at += _aligned(full * 4)
            u, xpad, tin, v, mm, tout = views
            # AVX-512: the transforms of kernels_fma on V and M with skewed rows (_VM_SKEW);
            # else kernels_winograd's, which want them contiguous
            fast = d["fma"] and act in (0, 1)
            v = (v[:, :c * cols] if d["fma"] else v.reshape(-1)[:16 * c * cols]).reshape(16, c, cols)
            mm = (mm[:, :o * cols] if fast else mm.reshape(-1)[:16 * o * cols]).reshape(16, o, cols)
            if start == 0:  # G w G^T for this call (the weights themselves stay in the mmap)
                ft = kfma.filter_transform if d["fma"] else kwg.filter_transform
                calls.append(partial(ft, u[:, :o * c], d["w9"]))
            calls += [partial(kf.pad_images, xpad.reshape(-1), xs, *geom[4:6], d["hp"], d["wp"],
                              np.float32(0)),
                      partial(kfma.input_transform if d["fma"] else kwg.input_transform, v, xpad, tin,
                              th, tw)]
            if d["fma"]:
                if cols > m * th * tw:  # the GEMM's last tile: zeros, never denormals
                    calls.append(partial(v[:, :, m * th * tw:].fill, 0))
                calls.append(partial(kfma.gemm, mm, u, v, kfma.row_offsets(c, cols), 16, o, cols,
                                     v.strides[0] // 4, o * c + _U_SKEW, c, mm.strides[0] // 4, cols,
                                     _EMPTY_F32, 0))
            else:
                calls.append(partial(np.matmul, u[:, :o * c].reshape(16, o, c), v, out=mm))
            calls.append(partial(kfma.output_transform if fast else kwg.output_transform,
                                 y[start:start + m] if pool is None else
                                 pool[start:start + m], mm, tout, th, tw, d["b"], act, alpha,
                                 pool is not None))
        elif d["kind"] == "fma_pitch":
            mpi, padded = d["mpi"], d["padded"]
            xpad = eng._scratch(step, np.float32, (m * padded + d["slack"],))
            yw = eng._scratch(step, np.float32, (o, m * mpi),
                              _aligned((d["chunk"] * padded + d["slack"]) * 4))
            kh, kw, sh, sw, ph, pw, dh, dw = geom
            calls += [partial(kf.pad_images, xpad, xs, ph, pw, d["hp"], d["wp"], np.float32(0)),
                      partial(kfma.gemm, yw, d["w2"], xpad, d["offs"], m, o, mpi, padded, 0, k, mpi,
                              m * mpi, _EMPTY_F32, 0),
                      partial(kf.bias_act_pitch, y[start:start + m], yw, d["pitch"], mpi, d["b"], act,
                              alpha)
                      if pool is None else
                      partial(kfma.bias_act_pool2_pitch, pool[start:start + m], yw, d["pitch"], mpi,
                              d["b"], act)
                      if tuple(pool_geom) == (2, 2, 2, 2) and act in (0, 1) else
                      partial(kf.bias_act_pool_pitch, pool[start:start + m], yw, d["pitch"], mpi,
                              *pool_geom, d["b"], act, alpha)]
        elif d["kind"] == "fma_cols":
            cols = kfma.tile_cols(m * p)
            col = eng._scratch(step, np.float32, (k, cols))
            # few columns: two GEMMs over the halves of K, each reading the rows its core's
            # half of im2col wrote, then their sum
            halves = 2 if (eng._threads > 1 and FMA_KSPLIT_COLS[0] <= cols <= FMA_KSPLIT_COLS[1]
                           and k % 2 == 0) else 1
            yw = eng._scratch(step, np.float32, (halves * o, cols),
                              _aligned(k * kfma.tile_cols(d["chunk"] * p) * 4))
            kpart = k // halves
            if cols > m * p:
                calls.append(partial(col[:, m * p:].fill, 0))
            calls += [_im2col(col, xs, geom, np.float32(0), 0, p),
                      partial(kfma.gemm, yw, d["w2"], col, kfma.row_offsets(kpart, cols), halves, o, cols,
                              kpart * cols, kpart, k, o * cols, cols, _EMPTY_F32, 0)]
            if halves == 2:
                calls.append(partial(kf.add, yw[:o].reshape(-1), yw[:o].reshape(-1), yw[o:].reshape(-1)))
            yw = yw[:o]
            calls += [partial(kf.bias_act, ys, yw, 0, p, d["b"], act, alpha) if pool is None else
                      partial(kf.bias_act_pool, pool[start:start + m], yw, 0, p, x_w, *pool_geom,
                              d["b"], act, alpha)]
        elif d["kind"] == "gemm_pitch":
            pix = d["pix"]
            col = eng._scratch(step, np.float32, (k, m * pix))
            at = _aligned(d["chunk"] * pix * k * 4)
            yw = eng._scratch(step, np.float32, (o, m * pix), at)
            at += _aligned(d["chunk"] * pix * o * 4)
            xpad = eng._scratch(step, np.float32, (m * d["padded"] + d["slack"],), at)
            kh, kw, sh, sw, ph, pw, dh, dw = geom
            ho = y.shape[2]
            calls += [partial(kf.pad_images, xpad, xs, ph, pw, d["hp"], d["wp"], np.float32(0)),
                      partial(kf.im2col_pitch, col, xpad, m, xs.shape[1], d["hp"], d["wp"], kh, kw, dh,
                              dw, ho),
                      partial(np.matmul, d["w2"], col, out=yw),
                      partial(kf.bias_act_pitch, y[start:start + m], yw, d["pitch"], d["pix"], d["b"], act,
                              alpha)
                      if pool is None else
                      partial(kf.bias_act_pool_pitch, pool[start:start + m], yw, d["pitch"], d["pix"],
                              *pool_geom, d["b"], act, alpha)]
        elif d["kind"] == "gemm":
            col = eng._scratch(step, np.float32, (k, m * p))
            yw = eng._scratch(step, np.float32, (o, m * p), _aligned(d["chunk"] * k * p * 4))
            calls += [_im2col(col, xs, geom, np.float32(0), 0, p),
                      partial(np.matmul, d["w2"], col, out=yw),
                      partial(kf.bias_act, ys, yw, 0, p, d["b"], act, alpha) if pool is None else
                      partial(kf.bias_act_pool, pool[start:start + m], yw, 0, p, x_w, *pool_geom,
                              d["b"], act, alpha)]
        else:
            col = eng._scratch(step, np.float32, (m, k, p))
            calls += [_im2col(col.reshape(m * k, p), xs, geom, np.float32(0), k, 0),
                      partial(np.matmul, d["w2"], col.reshape(m, g, k // g, p),
                              out=ys.reshape(m, g, o // g, p)),
                      partial(kf.bias_act, ys, ys.reshape(m * o, p), o, 0, d["b"], act, alpha)
                      if pool is None else
                      partial(kf.bias_act_pool, pool[start:start + m], ys.reshape(m * o, p), o, 0, x_w,
                              *pool_geom, d["b"], act, alpha)]
    return calls


def _b_unary(eng: Engine, step: int, node: Node, n: int) -> list:
    a = node.attrs
    code = kf.ACT["gelu_tanh" if a.get("approximate") == "tanh" else node.op]
    x, y = eng._view(node.inputs[0], n), eng._view(node.outputs[0], n)
    return [partial(kf.unary, y.reshape(-1), x.reshape(-1), code, a.get("alpha", 0.0))]


def _pool_geom(a: dict) -> tuple[int, ...]:
    k = a["kernel"]
    s = a.get("stride") or k
    return (k[0], k[1], s[0], s[1], a["padding"][0], a["padding"][1])


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


BUILDERS = {
    "linear": _b_linear, "conv2d": _b_conv2d, "batchnorm": _b_batchnorm,
    "relu": _b_unary, "leaky_relu": _b_unary, "sigmoid": _b_unary, "tanh": _b_unary,
    "gelu": _b_unary, "maxpool2d": _b_maxpool2d, "avgpool2d": _b_avgpool2d,
    "global_avgpool": _b_global_avgpool, "flatten": _b_alias, "reshape": _b_alias,
    "dropout": _b_alias, "add": _b_add, "concat": _b_concat, "softmax": _b_softmax,
    "quantize": _b_quantize, "dequantize": _b_quantize,
}
