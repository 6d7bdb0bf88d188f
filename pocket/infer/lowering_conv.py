"""How a conv2d becomes kernel calls: its route (direct, pointwise, im2col, pitch, Winograd, AVX-512
FMA, int8, VNNI packed or in place), prepared once at load, bound per batch size (see lowering.py)."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from pocket.formats.ir import Node
from pocket.infer import kernels_fma as kfma
from pocket.infer import kernels_fma_winograd as kfw
from pocket.infer import kernels_fp32 as kf
from pocket.infer import kernels_int8 as ki
from pocket.infer import kernels_vnni as kv
from pocket.infer import kernels_winograd as kwg

if TYPE_CHECKING:
    from pocket.infer.engine import Engine

from pocket.infer.lowering_common import (
    _EMPTY_F32,
    F32_ROUTE_ROWS,
    POOL_FUSING_KINDS,
    SCRATCH_BYTES,
    _act_code,
    _aligned,
    _im2col,
    _int8_consts,
    _pool_geom,
    _register_epi,
    _tile_cols,
    _vnni_cols_bytes,
)

# fp32 3x3 stride-1 convs with at least this many input channels run as Winograd F(2x2, 3x3)
# (kernels_winograd): its 16 GEMMs do 2.25x fewer multiply-adds, which outweighs the
# transforms from about 64 channels on (32 was a little slower, measured at batch 1 and 64;
# with kernels_fma's transforms, cnn_mnist fp32 batch 64 at 32 went 4.82 -> 4.59 ms on one
# thread but 2.57 -> 2.74 ms on two).
WINOGRAD_MIN_C = 64
# ... from this many on the fused conv of kernels_fma_winograd (AVX-512, act none or ReLU, at
# least WINOGRAD_FUSED_PER_THREAD images a thread): cnn_mnist fp32 at batch 64, whose 32 -> 64
# conv is 3/4 of the model, went 4.03 -> 3.14 ms on one thread, 2.28 -> 1.79 on two
WINOGRAD_FUSED_MIN_C = 32
# ... and at least this many tiles (2x2 outputs) a call: with fewer (batch 1 on maps of 8x8 and
# less) the per-call filter transform and short loops cost more than the GEMM saves (cnn_cifar
# fp32 batch 1: 3.6 ms at 64, 4.2 ms at 16, 4.0 ms at 512).
WINOGRAD_MIN_TILES = 64
# The fused conv runs each thread's images one chunk at a time in its own part of the scratch,
# sized to stay in L2 (this many bytes) but of at least WINOGRAD_CHUNK_TILES tiles, so that the
# 16 GEMMs' reads of U (16 x O x C floats, from L3 once it outgrows L2) are shared by enough
# columns. cnn_cifar fp32 at batch 64 (U up to 4 MiB): 93.0 ms on one thread at 4 MiB and no
# minimum, 89.8 at 2 MiB and 96 or 128 tiles, 91.7 at 192, 93.8 at 256; two threads 50.5,
# 48.9, 48.5, 49.0, 49.9. cnn_mnist (U 128 KiB) ran best at 2 MiB (1 MiB: +5%, 4 MiB: +16%).
WINOGRAD_SCRATCH_BYTES = 2 << 20
WINOGRAD_CHUNK_TILES = 128
# With one image a thread or fewer, the fused conv leaves cores idle: the four kernels a chunk
# (each parallel) take those batches (cnn_cifar fp32 at batch 1 on two threads: 1.26 ms, fused
# 1.63).
WINOGRAD_FUSED_PER_THREAD = 2
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
# Winograd's U (16, O*C) has rows this many floats longer: at O*C a multiple of 1024 its 16
# rows fall in one L1 set, and the filter transform, which writes all 16 per filter, ran 10x
# slower
_U_SKEW = 16
# With AVX-512 VNNI (kernels_vnni), a stride-1 int8 conv whose output is at most this wide
# packs its columns at a pitch of Wo (no junk columns) rather than Wp: on 4x4 and 8x8 maps
# the junk (33%, 20%) cost the GEMM more than packing by a pixel table costs (cnn_cifar int8
# at batch 1: 1021 -> 940 us)
VNNI_PITCH_MAX_WO = 8
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
        if c % 4 == 0:
            d["quad"] = q = _prep_quad(d, c, flat, eng.max_batch, VNNI_SCRATCH_BYTES * eng._threads)
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
            min_c = WINOGRAD_FUSED_MIN_C if kfma.AVAILABLE else WINOGRAD_MIN_C
            if (kh, kw) == (3, 3) and tuple(d["geom"][6:]) == (1, 1) and c >= min_c:
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
    """Scratch of a Winograd conv for m images, in order: U, padded images (none for
    kernels_fma_winograd, which reads them unpadded), row scratch, V, M, output scratch
    (float32 elements). V and M have _winograd_cols columns, rows kfw.VM_SKEW longer."""
    c, o = d["c"], d["o"]
    cols = _winograd_cols(d, m)
    return [16 * (o * c + _U_SKEW), 0 if d["fma"] else m * c * d["hp"] * d["wp"], m * c * 4 * d["wp"],
            16 * (c * cols + kfw.VM_SKEW), 16 * (o * cols + kfw.VM_SKEW), m * o * 8 * d["th"] * d["tw"]]


def _winograd_cols(d: dict, m: int) -> int:
    """Columns of V and M for m images: their tiles, rounded up for kernels_fma's GEMM."""
    t = m * d["th"] * d["tw"]
    return kfma.tile_cols(t) if d["fma"] else t


def _prep_quad(d: dict, c: int, in_place: bool, max_batch: int, budget: int) -> dict:
    """The int8 route of a conv with C % 4 == 0 on its images as C/4 planes of words, four
    channels a word (kernels_vnni.pad_quad): read in place by gemm_quad where the packed
    columns would be at the pitch of Wp anyway, else packed from the planes by the pixel
    table (pack_quad_cols: a word a column, not four bytes). In place on narrow maps, each
    image's pixels in whole vectors cost more than packing saves (cnn_cifar int8 at batch 64:
    52.1 ms, 48.1 with those packed by pack_cols). Scratch: the weights in gemm_quad's order,
    the planes of a chunk of images, [its packed columns,] its sums."""
    kh, kw, _, _, ph, pw, dh, dw = d["geom"]
    hp, wp, o, k = d["hp"], d["wp"], d["o"], d["k"]
    img = c // 4 * hp * wp
    offs = kv.quad_offsets(c, hp, wp, kh, kw, dh, dw)
    if in_place:
        pix = d["ho"] * wp
        q = {"pix": pix, "cpi": _tile_cols(pix), "img": img, "offs": offs, "in_place": True}
        # an image's whole last vector, and the window past its last pixel, read past the planes
        q["slack"] = q["cpi"] - pix + (kw - 1) * dw + 1
        per_image = 4 * img + 4 * o * q["cpi"]
    else:
        q = {"pix": d["pix"], "img": img, "koffs": offs // 4, "in_place": False,
             "slack": (kw - 1) * dw + 1}  # a window past the last row's end, at stride 1
        per_image = 4 * img + (k + 4 * o) * d["pix"]
    q["chunk"] = max(1, min(max_batch, budget // per_image))
    cols = q["chunk"] * q["cpi"] if in_place else _tile_cols(q["chunk"] * d["pix"])
    q["wq_bytes"] = _aligned(o * k)
    q["xq_bytes"] = _aligned(4 * (q["chunk"] * q["img"] + q["slack"]))
    q["xp_bytes"] = 0 if in_place else _aligned(k * cols)  # K/4 rows of cols words
    q["scratch_bytes"] = q["wq_bytes"] + q["xq_bytes"] + q["xp_bytes"] + _aligned(4 * o * cols)
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
    plain = dict(d)
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
            # a batch of one takes im2col where the GEMM can write its output directly (see
            # _b_conv2d): cnn_cifar fp32's first conv (3 -> 64, 32x32) at batch 1 saved the
            # padding and the epilogue pass (~50 -> ~30 us)
            if p % kfma.HALF_P == 0:
                cols = _prep_fma_cols(eng, plain)
                d["cols_plan"] = cols
                d["scratch_bytes"] = max(d["scratch_bytes"], cols["scratch_bytes"])
            return d
    return _prep_fma_cols(eng, d)


def _prep_fma_cols(eng: Engine, d: dict) -> dict:
    """The "fma_cols" route of _prep_fma: im2col columns of a chunk of images, one GEMM."""
    o, k, p = d["o"], d["k"], d["p"]
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
    if d["fma"]:  # kernels_fma_winograd.fused_conv: U, then a part of WINOGRAD_SCRATCH_BYTES a thread
        th, tw, o = d["th"], d["tw"], d["o"]
        per_image = 4 * sum(kfw.slot_floats(c, o, 1, th, tw))
        d["fused_chunk"] = max(1, min(eng.max_batch, max(WINOGRAD_SCRATCH_BYTES // per_image,
                                                          -(-WINOGRAD_CHUNK_TILES // (th * tw)))))
        d["u_bytes"] = _aligned(16 * (o * c + _U_SKEW) * 4)
        d["slot_bytes"] = 4 * sum(kfw.slot_floats(c, o, d["fused_chunk"], th, tw))
        d["scratch_bytes"] = max(d["scratch_bytes"], d["u_bytes"] + eng._threads * d["slot_bytes"])
    return d


def _b_conv_quad(eng: Engine, step: int, d: dict, a: dict, x, y, pool, pool_geom, n: int) -> list:
    q, o, k = d["quad"], d["o"], d["k"]
    kh, kw, sh, sw, ph, pw, dh, dw = d["geom"]
    epi = (d["bias_u8"], d["m"], d["to_int8"], d["y_zp"], d["lo"], d["relu"])
    wq = eng._scratch(step, np.int8, (o, k))
    calls = [partial(kv.pack_weights_quad, wq, d["w"])]
    pitch = d["wp"] if q["in_place"] else d["pitch"]
    for start in range(0, n, q["chunk"]):
        m = min(q["chunk"], n - start)
        xq = eng._scratch(step, np.uint32, (m * q["img"] + q["slack"],), q["wq_bytes"])
        at = q["wq_bytes"] + q["xq_bytes"]
        calls.append(partial(kv.pad_quad, xq, x[start:start + m], ph, pw, d["hp"], d["wp"],
                             a["x_zero_point"] + 128))
        if q["in_place"]:
            istride = q["cpi"]
            c = eng._scratch(step, np.int32, (o, m * istride), at)
            calls.append(partial(kv.gemm_quad, c, wq, xq, q["offs"], m, istride, q["img"]))
        else:
            istride, cols = q["pix"], _tile_cols(m * q["pix"])
            xp = eng._scratch(step, np.uint32, (k // 4, cols), at)
            c = eng._scratch(step, np.int32, (o, cols), at + q["xp_bytes"])
            calls += [partial(kv.pack_quad_cols, xp, xq, m, q["img"], q["koffs"], q["pix"], d["poffs"]),
                      partial(kv.gemm_cols, c, wq, xp)]
        calls.append(partial(kv.requant_cols, y[start:start + m], c, c.view(np.float32), pitch, istride, *epi)
                     if pool is None else
                     partial(kv.requant_cols_pool, pool[start:start + m], c, c.view(np.float32), d["ho"],
                             pitch, istride, *pool_geom, *epi))
    return calls


def padded_pairs(eng: Engine) -> dict[int, int]:
    """{conv step A: conv step B} where A (an AVX-512 pitch conv with a fused 2x2/2 pool
    and ReLU or none) may write its pooled output straight into B's padded images, B being a
    pitch conv (or a Winograd one with a pitch plan) and that output's only reader
    (kernels_fma.gemm_pool2_padded): B then pads nothing. Whether they do at a batch size
    is _pads_into's call; the engine keeps B's scratch live from A on for these pairs."""
    readers, pairs = eng.readers(), {}
    for a_step, pool_step in eng._pool_after.items():
        node, d = eng.graph.nodes[a_step], eng._prep[a_step]
        out = eng.graph.nodes[pool_step].outputs[0]
        nxt = readers.get(out, [])
        if (d.get("kind") != "fma_pitch" or _act_code(node.attrs) not in (0, 1)
                or d["mpi"] > kfma.POOL_GROUP_MAX or out in eng.graph.outputs or len(nxt) != 1
                or tuple(_pool_geom(eng.graph.nodes[pool_step].attrs)[:4]) != (2, 2, 2, 2)):
            continue
        b_node, q = eng.graph.nodes[nxt[0]], eng._prep[nxt[0]]
        if b_node.op == "conv2d" and b_node.inputs[0] == out and "fma_pitch" in (
                q.get("kind"), q.get("pitch_plan", {}).get("kind")):
            pairs[a_step] = nxt[0]
    return pairs


def _pads_into(eng: Engine, step: int, n: int) -> int | None:
    """The conv whose padded images conv `step` writes at batch n (see padded_pairs): where
    that conv runs at its pitch, all n images in one chunk."""
    b_step = eng._pad_after.get(step)
    if b_step is None:
        return None
    d, _ = _route_at(eng, b_step, n)
    cols = ("cols_plan" in d and n == 1 and b_step not in eng._pool_after
            and _register_epi(d["b"], _act_code(eng.graph.nodes[b_step].attrs)) is not None)
    return b_step if d["kind"] == "fma_pitch" and n <= d["chunk"] and not cols else None


def _route_at(eng: Engine, step: int, n: int) -> tuple[dict, bool]:
    """Conv `step`'s prepared route at batch n, and whether it is kernels_fma_winograd's fused
    conv: a Winograd conv with few tiles takes its pitch plan."""
    d, a = eng._prep[step], eng.graph.nodes[step].attrs
    fused = (d["kind"] == "winograd" and d["fma"] and _act_code(a) in (0, 1)
             and n >= WINOGRAD_FUSED_PER_THREAD * eng._threads)
    if d["kind"] == "winograd" and not fused and (n * d["th"] * d["tw"] < WINOGRAD_MIN_TILES
                                                  or d["c"] < WINOGRAD_MIN_C):
        d = d["pitch_plan"]
    return d, fused


def _b_conv2d(eng: Engine, step: int, node: Node, n: int) -> list:
    a = node.attrs
    d, fused = _route_at(eng, step, n)
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
    if "cols_plan" in d and n == 1 and pool is None and _register_epi(d["b"], act) is not None:
        d = d["cols_plan"]  # (see the fma_cols route: no epilogue pass for one image)
    if d["kind"] == "vnni" and "quad" in d:
        return [*calls, *_b_conv_quad(eng, step, d, a, x, y, pool, pool_geom, n)]
    if fused:
        return _b_winograd_fused(eng, step, d, x, y if pool is None else pool, pool is not None, act)
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
            padded = (0,) if d["fma"] else (m, c, d["hp"], d["wp"])
            shapes = [(16, o * c + _U_SKEW), padded, (m * c, 4, d["wp"]),
                      (16, c * cols + kfw.VM_SKEW), (16, o * cols + kfw.VM_SKEW), (m * o, 8, th * tw)]
            at, views = 0, []
            for shape, full in zip(shapes, _winograd_sizes(d, d["chunk"])):
                views.append(eng._scratch(step, np.float32, shape, at))
                at += _aligned(full * 4)
            u, xpad, tin, v, mm, tout = views
            # AVX-512: the transforms of kernels_fma_winograd on V and M with skewed rows (VM_SKEW);
            # else kernels_winograd's, which want them contiguous
            fast = d["fma"] and act in (0, 1)
            v = (v[:, :c * cols] if d["fma"] else v.reshape(-1)[:16 * c * cols]).reshape(16, c, cols)
            mm = (mm[:, :o * cols] if fast else mm.reshape(-1)[:16 * o * cols]).reshape(16, o, cols)
            if start == 0:  # G w G^T for this call (the weights themselves stay in the mmap)
                ft = kfw.filter_transform if d["fma"] else kwg.filter_transform
                calls.append(partial(ft, u[:, :o * c], d["w9"]))
            if d["fma"]:
                calls.append(partial(kfw.input_transform, v, xs, tin, th, tw, *geom[4:6]))
            else:
                calls += [partial(kf.pad_images, xpad.reshape(-1), xs, *geom[4:6], d["hp"], d["wp"],
                                  np.float32(0)),
                          partial(kwg.input_transform, v, xpad, tin, th, tw)]
            if d["fma"]:
                if cols > m * th * tw:  # the GEMM's last tile: zeros, never denormals
                    calls.append(partial(v[:, :, m * th * tw:].fill, 0))
                calls.append(partial(kfma.gemm, mm, u, v, kfma.row_offsets(c, cols), 16, o, cols,
                                     v.strides[0] // 4, o * c + _U_SKEW, c, mm.strides[0] // 4, cols,
                                     _EMPTY_F32, 0))
            else:
                calls.append(partial(np.matmul, u[:, :o * c].reshape(16, o, c), v, out=mm))
            calls.append(partial(kfw.output_transform if fast else kwg.output_transform,
                                 y[start:start + m] if pool is None else
                                 pool[start:start + m], mm, tout, th, tw, d["b"], act, alpha,
                                 pool is not None))
        elif d["kind"] == "fma_pitch":
            mpi, padded = d["mpi"], d["padded"]
            xpad = eng._scratch(step, np.float32, (m * padded + d["slack"],))
            yw = eng._scratch(step, np.float32, (o, m * mpi),
                              _aligned((d["chunk"] * padded + d["slack"]) * 4))
            kh, kw, sh, sw, ph, pw, dh, dw = geom
            if not any(_pads_into(eng, s, n) == step for s in eng._pad_after):
                calls.append(partial(kf.pad_images, xpad, xs, ph, pw, d["hp"], d["wp"], np.float32(0)))
            if (pool is not None and tuple(pool_geom) == (2, 2, 2, 2) and act in (0, 1)
                    and mpi <= kfma.POOL_GROUP_MAX):  # each part pools its own planes
                b_step = _pads_into(eng, step, n)
                if b_step is not None:  # ... into the next conv's padded images
                    q = _route_at(eng, b_step, n)[0]
                    bpad = eng._scratch(b_step, np.float32, (n * q["padded"] + q["slack"],))
                    _, _, _, _, qph, qpw, _, _ = q["geom"]
                    calls.append(partial(kfma.gemm_pool2_padded, bpad[start * q["padded"]:], q["hp"], q["wp"],
                                         qph, qpw, *pool.shape[2:], yw, d["w2"], xpad, d["offs"], m, o, mpi,
                                         padded, k, d["pitch"], d["b"], act))
                    continue
                calls.append(partial(kfma.gemm_pool2_pitch, pool[start:start + m], yw, d["w2"], xpad,
                                     d["offs"], m, o, mpi, padded, k, d["pitch"], d["b"], act))
                continue
            calls += [partial(kfma.gemm, yw, d["w2"], xpad, d["offs"], m, o, mpi, padded, 0, k, mpi,
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
            calls.append(_im2col(col, xs, geom, np.float32(0), 0, p))
            # one image whose pixels fill whole tiles: the GEMM's (O, P) is its NCHW output,
            # so the GEMM writes it with the bias and ReLU (no epilogue pass)
            epi = _register_epi(d["b"], act)
            if m == 1 and cols == p and halves == 1 and pool is None and epi is not None:
                calls.append(partial(kfma.gemm, ys[0], d["w2"], col, kfma.row_offsets(k, cols), 1, o, cols,
                                     0, 0, k, 0, cols, d["b"], epi))
                continue
            calls.append(partial(kfma.gemm, yw, d["w2"], col, kfma.row_offsets(kpart, cols), halves, o, cols,
                                 kpart * cols, kpart, k, o * cols, cols, _EMPTY_F32, 0))
            if halves == 2:  # the halves' sum in the epilogue (see kernels_fp32.bias_act_sum)
                calls.append(partial(kf.bias_act_sum, ys, yw, p, d["b"], act, alpha) if pool is None else
                             partial(kf.bias_act_pool_sum, pool[start:start + m], yw, p, x_w, *pool_geom,
                                     d["b"], act, alpha))
                continue
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


def _b_winograd_fused(eng: Engine, step: int, d: dict, x, out, pool: bool, act: int) -> list:
    """kernels_fma_winograd.fused_conv over the whole batch, a part of the scratch a thread (as many
    as were prepared, should the thread count have grown since), after this call's U."""
    c, o, th, tw, chunk = d["c"], d["o"], d["th"], d["tw"], d["fused_chunk"]
    ph, pw = d["geom"][4:6]
    u = eng._scratch(step, np.float32, (16, o * c + _U_SKEW))
    nt = max(1, min(eng._threads, (d["scratch_bytes"] - d["u_bytes"]) // d["slot_bytes"]))
    scratch = eng._scratch(step, np.float32, (nt * d["slot_bytes"] // 4,), d["u_bytes"])
    offs = kfma.row_offsets(c, kfma.tile_cols(chunk * th * tw))
    return [partial(kfw.filter_transform, u[:, :o * c], d["w9"]),
            partial(kfw.fused_conv, out, x, u, scratch, offs, nt, chunk, th, tw, ph, pw, d["b"], act, pool,
                    kfw.slot_floats(c, o, chunk, th, tw))]
