"""Squeeze-and-excitation blocks split by channels on 2+ threads (lowering_block's SE blocks,
kernels_fma_block.se_parts / se_project): the kernels against a float64 NumPy block and
against the node-by-node calls they replace, and the engine against formats/reference.py."""

from __future__ import annotations

import numpy as np
import pytest
from models import BindRecorder, Builder, arena_hazards, matches_reference, save_model

from pocket.infer import engine as engine_mod
from pocket.infer import kernels_fma as kfma
from pocket.infer import kernels_fma_block as kb
from pocket.infer import kernels_fma_cv as kcv
from pocket.infer import kernels_fma_dw as kfd
from pocket.infer import kernels_fma_dwcv as kdc
from pocket.infer import kernels_fma_im2col as kfi
from pocket.infer import kernels_fp32 as kf
from pocket.infer import kernels_vision as kv
from pocket.infer.engine import Engine

needs_fma = pytest.mark.skipif(not kfma.AVAILABLE, reason="this CPU has no AVX-512")
S1 = {"stride": [1, 1], "dilation": [1, 1]}
RELU6 = 1 + kfma.MODE_RELU6  # kernels_fma.gemm's epi: + bias, then relu6


def _depthwise64(e, w, b, s, pad):
    """float64 depthwise conv of e (C, H, W), w (C, 1, k, k), stride s, zero padding pad."""
    c, h, wd = e.shape
    k = w.shape[2]
    ep = np.zeros((c, h + 2 * pad, wd + 2 * pad))
    ep[:, pad:pad + h, pad:pad + wd] = e
    ho, wo = (h + 2 * pad - k) // s + 1, (wd + 2 * pad - k) // s + 1
    out = np.zeros((c, ho, wo)) + b[:, None, None]
    for i in range(k):
        for j in range(k):
            out += w[:, 0, i, j, None, None] * ep[:, i:i + (ho - 1) * s + 1:s, j:j + (wo - 1) * s + 1:s]
    return out


def _case(rng, kind, k, s, h, c1, c3):
    kk = 5 if kind == kb.DW_CV else k
    ph = kk // 2
    ho = (h + 2 * ph - kk) // s + 1
    a = {"x": rng.standard_normal((12, h * h)).astype(np.float32),
         "w1": (rng.standard_normal((c1, 12)) / np.sqrt(12)).astype(np.float32),
         "b1": rng.standard_normal(c1).astype(np.float32),
         "w2": (rng.standard_normal((c1, 1, kk, kk)) / kk).astype(np.float32),
         "b2": rng.standard_normal(c1).astype(np.float32),
         "w3": (rng.standard_normal((c3, c1)) / np.sqrt(c1)).astype(np.float32),
         "b3": rng.standard_normal(c3).astype(np.float32),
         "gate": rng.random(c1).astype(np.float32),
         "res": rng.standard_normal((c3, ho * ho)).astype(np.float32)}
    return a, kk, ph, ho


def _dw_args(kind, a, h, ho, kk, s, parts):
    """se_parts' depthwise arguments (w2, b2, masks, scratch) for `parts` parts."""
    none = np.zeros((0, 1), np.int64)
    if kind == kb.DW_CV:
        hp = (ho - 1) * s + kk
        rows = np.full((parts, kdc.scratch_floats(hp, hp, ho, ho)), np.nan, np.float32)
        return kdc.pack(a["w2"]), kcv.pad_bias(a["b2"], a["w2"].shape[0]), none, rows
    if kind == kb.DW_FLAT:
        masks = kfi.same_masks(kf.same_valid(h, h, kk, kk, kk // 2, kk // 2, 1, 1))
        return a["w2"], a["b2"], masks, np.zeros((parts, 1), np.float32)
    return a["w2"], a["b2"], none, np.full((parts, kfd.scratch_size(h, ho)), np.nan, np.float32)


def _unfused(kind, a, h, ho, kk, s, ph, rows):
    """The node-by-node calls: expand, the depthwise kernel, global_avgpool, the gate (on the
    weights or the rows), the project GEMM with its bias, the add."""
    c1, c3 = a["w1"].shape[0], a["w3"].shape[0]
    m1, m2 = h * h, ho * ho
    e = np.zeros((1, c1, m1), np.float32)
    kfma.gemm.serial(e, a["w1"], a["x"].reshape(-1), kfma.row_offsets(12, m1), 1, c1, m1, 12 * m1, 0, 12,
                     c1 * m1, m1, a["b1"], RELU6)
    e = e.reshape(1, c1, h, h)
    d = np.zeros((1, c1, ho, ho), np.float32)
    w2, b2, masks, scratch = _dw_args(kind, a, h, ho, kk, s, 1)
    if kind == kb.DW_CV:
        kdc.dw_conv_fma_cv.serial(d, e, w2, b2, scratch, s, ph, ph, RELU6 - 1, 0, 0.0)
    elif kind == kb.DW_FLAT:
        kfd.dw_conv_fma_flat.serial(d, e, w2, b2, masks, 1, ph, ph, RELU6 - 1, 0, 0.0)
    else:
        kfd.dw_conv_fma.serial(d, e, w2, b2, scratch, s, ph, ph, RELU6 - 1, 0, 0.0)
    means = np.zeros((1, c1), np.float32)
    kf.global_avgpool.serial(means, d.reshape(1, c1, m2))
    proj = np.zeros((1, c3, m2), np.float32)
    offs = kfma.row_offsets(c1, m2)
    if rows:
        gated = np.zeros((c1, m2), np.float32)
        kv.mul_rows.serial(gated, d.reshape(c1, m2), a["gate"])
        w = a["w3"]
    else:
        gated, w = d.reshape(c1, m2), np.zeros((1, c3, c1), np.float32)
        kv.gate_weights.serial(w, a["w3"], a["gate"].reshape(1, c1))
    kfma.gemm.serial(proj, w.reshape(c3, c1), gated.reshape(-1), offs, 1, c3, m2, c1 * m2, 0, c1, c3 * m2, m2,
                     a["b3"], 1)
    return e, d, means.reshape(c1), proj[0] + a["res"]


KINDS = [(kb.DW_ROWS, 3, 1, 20), (kb.DW_ROWS, 3, 2, 17), (kb.DW_ROWS, 5, 1, 18), (kb.DW_FLAT, 3, 1, 9),
         (kb.DW_CV, 5, 2, 13), (kb.DW_CV, 5, 1, 7)]


@needs_fma
@pytest.mark.parametrize("kind,k,s,h", KINDS)
@pytest.mark.parametrize("rows", [False, True])
@pytest.mark.parametrize("parts", [1, 2, 3])
def test_se_kernels_against_numpy_and_the_node_calls(kind, k, s, h, rows, parts):
    """se_parts + se_project + block_sum on 1-3 parts, each depthwise kernel, the gate on the
    weights or on the map's rows: the expanded map, the depthwise map and the means are the
    node calls' bits on any parts; the block's output is too on one part, float32 rounding of
    the split sums on more; all within float32 rounding of a float64 NumPy block. 40 expanded
    channels: three groups of 16, the last short (the parts split whole groups)."""
    rng = np.random.default_rng(31 + kind + 7 * k + h)
    c1, c3 = 40, 24
    a, kk, ph, ho = _case(rng, kind, k, s, h, c1, c3)
    m2 = ho * ho
    e = np.full((1, c1, h, h), np.nan, np.float32)
    d = np.full((1, c1, ho, ho), np.nan, np.float32)
    means = np.full(c1, np.nan, np.float32)
    w2, b2, masks, scratch = _dw_args(kind, a, h, ho, kk, s, parts)
    kb.se_parts(means, e, d, a["x"], a["w1"], a["b1"], RELU6, kfma.row_offsets(12, h * h), kind, w2, b2,
                masks, scratch, s, ph, ph, RELU6 - 1, 0, 0.0, parts)
    psum = np.full((parts, c3, m2), np.nan, np.float32)
    wg = np.full((c3, c1), np.nan, np.float32) if not rows else np.zeros((0, 1), np.float32)
    dmap = d.reshape(c1, m2).copy()  # (the rows form gates it in place)
    kb.se_project(psum, dmap, a["w3"], a["gate"], wg, kfma.row_offsets(c1, m2), rows)
    out = np.full((c3, m2), np.nan, np.float32)
    kb.block_sum(out, psum, a["b3"], a["res"])

    e_ref, d_ref, means_ref, out_ref = _unfused(kind, a, h, ho, kk, s, ph, rows)
    np.testing.assert_array_equal(e, e_ref)
    np.testing.assert_array_equal(d, d_ref)
    np.testing.assert_array_equal(means, means_ref)
    if parts == 1:
        np.testing.assert_array_equal(out, out_ref)
    else:
        np.testing.assert_allclose(out, out_ref, rtol=1e-5, atol=1e-5)

    e64 = np.clip(a["w1"].astype(np.float64) @ a["x"] + a["b1"][:, None], 0, 6).reshape(c1, h, h)
    d64 = np.clip(_depthwise64(e64, a["w2"].astype(np.float64), a["b2"], s, ph), 0, 6).reshape(c1, m2)
    out64 = a["w3"].astype(np.float64) @ (d64 * a["gate"][:, None]) + a["b3"][:, None] + a["res"]
    np.testing.assert_allclose(means, d64.mean(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out, out64, rtol=1e-4, atol=1e-4)


def _se_block(rng, c, hw, t, o, *, k=3, stride=1, residual=True, dw_act="relu"):
    """A 1x1 conv c -> t (hardswish), a k x k depthwise conv, its squeeze-and-excitation gate
    (global pool, 1x1 conv + relu, 1x1 conv + hardsigmoid, mul), a 1x1 conv t -> o
    (+ the block's input), then a reader."""
    b = Builder((c, hw, hw), rng)
    b.conv(c, c, 1, padding=[0, 0], activation="relu", **S1)  # the block's input: computed
    inp = b.last
    b.conv(c, t, 1, padding=[0, 0], activation="hardswish", **S1)
    big = b.conv(t, t, k, groups=t, padding=[k // 2, k // 2], activation=dw_act, stride=[stride, stride],
                 dilation=[1, 1])
    b.op("global_avgpool")
    b.conv(t, 8, 1, padding=[0, 0], activation="relu", **S1)
    gate = b.conv(8, t, 1, padding=[0, 0], activation="hardsigmoid", **S1)
    b.last = big
    b.op("mul", gate)
    b.conv(t, o, 1, padding=[0, 0], activation="none", **S1)
    if residual:
        b.op("add", inp)
    b.conv(o, 8, 1, padding=[0, 0], activation="none", **S1)
    return b


def _names(eng, n):
    return [getattr(c.func, "__name__", "") for c in eng._bound[n].calls]


@needs_fma
@pytest.mark.parametrize("case", [(16, 16, 64, 16, 3, 1, True, "relu"),  # row kernels, gated weights
                                  (16, 17, 48, 24, 3, 2, False, "hardswish"),  # stride 2
                                  (24, 8, 96, 24, 3, 1, True, "relu"),  # flat kernel
                                  (24, 7, 120, 64, 5, 1, False, "hardswish"),  # dwcv, gate on the rows
                                  (16, 14, 72, 24, 5, 2, False, "relu")])  # dwcv at stride 2
def test_the_se_block_runs_as_parts_on_two_threads(tmp_path, monkeypatch, case):
    """At batch 1 on two threads the block binds se_parts (no depthwise, pool or mul call of
    its own), the gate's FCs, se_project and block_sum (no add); on one thread and at batch 3
    the nodes run one by one. Each matches the reference, the arena starting as NaN."""
    import numba

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs 2 Numba threads")
    monkeypatch.setattr(engine_mod, "_PARALLEL_WORK", 0)
    monkeypatch.setattr(engine_mod, "_PARALLEL_WORK_PINNED", 0)
    c, hw, t, o, k, stride, residual, dw_act = case
    rng = np.random.default_rng(41)
    b = _se_block(rng, c, hw, t, o, k=k, stride=stride, residual=residual, dw_act=dw_act)
    path = tmp_path / "se.bin"
    save_model(path, b.graph(), b.params, None)
    rec = BindRecorder(monkeypatch)
    for threads in (1, 2):
        with Engine(path, max_batch=3, threads=threads) as eng:
            assert len(eng._ctx.se_blocks) == 1
            for n in (1, 3):
                x = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
                eng._arena.fill(255)
                got = eng.run(x, copy=True)
                names = _names(eng, n)
                fused = n == 1 and threads == 2
                assert any(s.startswith("se_parts") for s in names) == fused, names
                assert any(s.startswith("se_project") for s in names) == fused, names
                assert any(s.startswith("global_avgpool") for s in names) != fused, names
                assert not fused or not any(s.startswith(("add", "mul_rows", "gate_weights")) for s in names)
                matches_reference(path, x, got, False)
                assert arena_hazards(eng, n, rec) == []
                if fused:
                    _project_reads_apart_from_its_sums(eng)


def _span(a):
    lo = a.__array_interface__["data"][0]
    return lo, lo + a.nbytes


def _project_reads_apart_from_its_sums(eng):
    """se_project's parts write their partial sums while the other parts still read the map
    and the gate: the arena must keep those bytes apart (a shared one raced on two threads)."""
    call = next(c for c in eng._bound[1].calls if c.func.__name__.startswith("se_project"))
    psum, dv, _, gate = call.args[:4]
    for a in (dv, gate):
        (lo, hi), (plo, phi) = _span(a), _span(psum)
        assert hi <= plo or phi <= lo, "se_project's partial sums overlap what it reads"
    # ... and not by the luck of this graph's layout: both live until the project's step
    ctx, g = eng._ctx, eng.graph
    for dw, _, mul, proj, _ in ctx.se_blocks.values():
        dname = g.nodes[dw].outputs[0]
        gname = next(v for v in g.nodes[mul].inputs if v != dname)
        for v in (dname, gname):
            assert ctx.buffers[ctx.root[v]].last >= proj, v


@needs_fma
def test_a_second_reader_of_the_depthwise_map_keeps_the_nodes(tmp_path):
    """The depthwise map read by a third node: no SE block."""
    rng = np.random.default_rng(42)
    b = _se_block(rng, 16, 16, 64, 16, residual=False)
    dw = b.nodes[2].outputs[0]
    b.op("global_avgpool")
    b.nodes[-1].inputs[0] = dw
    path = tmp_path / "se2.bin"
    b.last = b.nodes[-2].outputs[0]
    g = b.graph()
    g.outputs.append(b.nodes[-1].outputs[0])
    save_model(path, g, b.params, None)
    with Engine(path, max_batch=1, threads=2) as eng:
        assert eng._ctx.se_blocks == {}
