"""The vision ops in the engine: each new kernel against a naive NumPy twin on odd shapes, and the
activation codes of clip (relu6, 9) and silu (10) through the conv/linear epilogues of every route
(fp32 within 1e-5 of formats/reference.py, int8 with a fused clip bit for bit)."""

from __future__ import annotations

import numpy as np
import pytest
from test_kernels import CONV_CASES, _conv_params, _int8_conv_params, assert_close, run_both

from pocket.formats import quant as qm
from pocket.formats.ir import Node
from pocket.infer import kernels_fp32 as kf
from pocket.infer import kernels_vision as kv
from pocket.infer.plan import EngineError
from pocket.infer.routes import ROUTES

RNG = np.random.default_rng(23)


# --------------------------------------------------------------------------- the kernels alone


def test_clip_kernel_against_its_twin():
    x = np.concatenate([RNG.normal(0, 3, 97), [np.nan, np.inf, -np.inf, -1.0, 2.5, 0.0]])
    x = x.astype(np.float32)
    for lo, hi in ((0.0, 6.0), (-1.0, 2.5), (0.1, 0.1)):
        out = np.empty_like(x)
        kv.clip(out, x, np.float32(lo), np.float32(hi))
        want = np.array([v if v != v else min(max(v, lo), hi) for v in x.tolist()], np.float32)
        np.testing.assert_array_equal(out, want)


def test_activation_codes_against_their_twins():
    x = np.concatenate([np.linspace(-9, 9, 1001), [np.nan, 1e4, -1e4, 0.0, 6.0]]).astype(np.float32)
    for code, alpha, twin in ((kf.ACT["clip"], 6.0, lambda v: min(max(v, 0.0), 6.0)),
                              (kf.ACT["clip"], 0.5, lambda v: min(max(v, 0.0), 0.5)),
                              (kf.ACT["silu"], 0.0, lambda v: v / (1 + np.exp(-v)) if v > -700
                               else -0.0)):
        out = np.empty_like(x)
        kf.unary(out, x, code, alpha)
        want = np.array([v if v != v else twin(v) for v in x.astype(np.float64).tolist()],
                        np.float32)
        np.testing.assert_allclose(out, want, rtol=2e-7, atol=1e-30)
        # the vectorized relu6 of the epilogues equals activate's
        got = np.empty_like(x)
        kf.bias_act_run(got, x, x.shape[0], np.float32(0.0), code, alpha)
        np.testing.assert_array_equal(got, out)


@pytest.mark.parametrize("shape_a, shape_b", [((3, 5, 4, 7), (3, 5, 1, 1)), ((1, 5, 4, 7), (1, 5, 4, 7)),
                                              ((2, 3, 1, 7), (2, 1, 4, 1)), ((2, 6), (2, 1)),
                                              ((2, 1, 4, 3), (2, 5, 4, 3))])
def test_mul_kernels_against_numpy(shape_a, shape_b):
    from pocket.infer.lowering_vision import _b_mul

    a = RNG.standard_normal(shape_a).astype(np.float32)
    b = RNG.standard_normal(shape_b).astype(np.float32)
    want = (a.astype(np.float64) * b).astype(np.float32)
    out = np.empty(want.shape, np.float32)

    class Ctx:
        gated = {}  # (no gate taken into a conv's weights: lowering_vision.gated_convs)

        def view(self, v, n):
            return {"a": a, "b": b, "y": out}[v]

    calls = _b_mul(Ctx(), 0, Node("m", "mul", ["a", "b"], ["y"], {}), a.shape[0])
    assert all(c.func is not np.multiply for c in calls)  # a Numba kernel each time
    for c in calls:
        c()
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("dtype", [np.float32, np.int8])
def test_shuffle_and_slice_kernels_against_their_twins(dtype):
    x = RNG.integers(-128, 128, (3, 12, 5, 3)).astype(dtype)
    for g in (1, 2, 3, 12):
        out = np.empty_like(x)
        kv.channel_shuffle(out.reshape(3, 12, -1), x.reshape(3, 12, -1), g)
        want = np.empty_like(x)
        for j in range(12):
            want[:, j] = x[:, (j % g) * (12 // g) + j // g]
        np.testing.assert_array_equal(out, want)
    for axis, start, end in ((1, 0, 6), (1, 5, 12), (2, 1, 4), (3, 2, 3)):
        want = np.take(x, range(start, end), axis=axis)
        rows = int(np.prod(x.shape[:axis]))
        inner = int(np.prod(x.shape[axis + 1:]))
        out = np.empty_like(want)
        kv.slice_cols(out.reshape(rows, -1), x.reshape(rows, -1), start * inner)
        np.testing.assert_array_equal(out, want)


# --------------------------------------------------------------------------- through the routes

ROUTE_CASES = ["3x3-pad", "1x1", "depthwise", "5x5-stride2"]
FUSED = [{"activation": "clip", "max": 6.0}, {"activation": "clip", "max": 0.75},
         {"activation": "silu"}]


@pytest.mark.parametrize("name", ROUTE_CASES)
@pytest.mark.parametrize("act", FUSED, ids=["relu6", "clip0.75", "silu"])
@pytest.mark.parametrize("n", [1, 5])
def test_conv2d_fp32_fused(name, act, n, fp32_route):
    c, h, w, o, kh, kw, s, p, d, g = CONV_CASES[name]
    params = _conv_params(c, o, kh, kw, g)
    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    node = Node("conv", "conv2d", ["x", "w", "b"], ["y"],
                {"stride": s, "padding": p, "dilation": d, "groups": g, **act})
    got, want = run_both(x, [node], params)
    assert_close(got, want, scale=c * kh * kw)
    if act.get("max") == 0.75:
        assert (want == np.float32(0.75)).any() and (want == 0).any()


def test_conv2d_relu6_then_maxpool_fp32():
    """A maxpool after relu6 (monotone) fuses into the conv's epilogue."""
    params = _conv_params(3, 4, 3, 3, 1)
    x = (3 * RNG.standard_normal((2, 3, 9, 7))).astype(np.float32)
    nodes = [Node("conv", "conv2d", ["x", "w", "b"], ["c"], {"padding": [1, 1], "activation": "clip",
                                                            "max": 6.0}),
             Node("pool", "maxpool2d", ["c"], ["y"], {"kernel": [2, 2]})]
    got, want = run_both(x, nodes, params)
    assert_close(got, want, scale=27)


@pytest.mark.parametrize("act", FUSED, ids=["relu6", "clip0.75", "silu"])
@pytest.mark.parametrize("n", [1, 17, 40])
def test_linear_fp32_fused(act, n, fp32_route):
    params = {"w": RNG.standard_normal((37, 300)).astype(np.float32),
              "b": RNG.standard_normal(37).astype(np.float32)}
    x = RNG.standard_normal((n, 300)).astype(np.float32)
    got, want = run_both(x, [Node("fc", "linear", ["x", "w", "b"], ["y"], act)], params, max_batch=64)
    assert_close(got, want, scale=300)


@pytest.mark.parametrize("name", ["3x3-pad", "1x1", "depthwise", "groups2"])
@pytest.mark.parametrize("n", [1, 7])
@pytest.mark.parametrize("mode", ["i8", "f32"])
@pytest.mark.parametrize("top", [6.0, 0.3])
def test_conv2d_int8_clip_exact(name, n, mode, top, int8_route):
    c, h, w, o, kh, kw, s, p, d, g = CONV_CASES[name]
    params, quant = _int8_conv_params(c, o, kh, kw, g, 0.05)
    x_q = RNG.integers(-128, 128, (n, c, h, w)).astype(np.int8)
    attrs = {"stride": s, "padding": p, "dilation": d, "groups": g, "x_scale": 0.05,
             "x_zero_point": 9, "activation": "clip", "max": top}
    if mode == "i8":
        attrs.update(y_scale=0.01, y_zero_point=-100)  # quantize(6) = 127 + ..., quantize(0.3) = -70
    got, want = run_both(x_q, [Node("conv", "conv2d", ["x", "w", "b"], ["y"], attrs)], params, quant)
    assert np.array_equal(got, want)
    if mode == "i8":
        hi = int(qm.quantize(np.float32(top), 0.01, -100))
        assert want.min() == -100 and want.max() == hi  # both clamps were in play
    else:
        assert want.min() == 0 and want.max() == np.float32(top)


@pytest.mark.parametrize("n", [1, 7, 40])
@pytest.mark.parametrize("mode", ["i8", "f32"])
def test_linear_int8_clip_exact(n, mode, int8_route):
    w_q, w_s = qm.quantize_weights(RNG.standard_normal((9, 37)).astype(np.float32))
    params = {"w": w_q, "b": qm.quantize_bias(RNG.standard_normal(9).astype(np.float32), 0.1, w_s)}
    quant = {"w": {"scale": w_s.tolist(), "zero_point": [0] * 9, "axis": 0}}
    attrs = {"x_scale": 0.1, "x_zero_point": -20, "activation": "clip", "max": 2.0}
    if mode == "i8":
        attrs.update(y_scale=0.03, y_zero_point=11)
    x_q = RNG.integers(-128, 128, (n, 37)).astype(np.int8)
    got, want = run_both(x_q, [Node("fc", "linear", ["x", "w", "b"], ["y"], attrs)], params, quant,
                         max_batch=64)
    assert np.array_equal(got, want)


def _conv_cases(name, act, dtype, n=3):
    c, h, w, o, kh, kw, s, p, d, g = CONV_CASES[name]
    attrs = {"stride": s, "padding": p, "dilation": d, "groups": g, **act}
    if dtype == "f32":
        return (RNG.standard_normal((n, c, h, w)).astype(np.float32), attrs,
                _conv_params(c, o, kh, kw, g), None, c * kh * kw)
    params, quant = _int8_conv_params(c, o, kh, kw, g, 0.05)
    attrs.update(x_scale=0.05, x_zero_point=9, y_scale=0.01, y_zero_point=-100)
    return RNG.integers(-128, 128, (n, c, h, w)).astype(np.int8), attrs, params, quant, 0


@pytest.mark.parametrize("route", [r for r, v in ROUTES.items() if v.op == "conv2d"])
def test_every_conv_route_runs_the_new_codes(route, monkeypatch):
    """POCKET_ROUTE forces each route in turn (winograd, the pitch and FMA routes, depthwise,
    VNNI, the int8 BLAS / im2row ones...) on the convs it can run; fp32 relu6, clip and silu,
    int8 with a clip clamp below 127."""
    monkeypatch.setenv("POCKET_ROUTE", route)
    ran = 0
    for name in ("3x3-pad", "depthwise", "1x1", "5x5-stride2", "groups2"):
        for dtype, acts in (("f32", FUSED), ("i8", FUSED[:2])):
            for act in acts:
                x, attrs, params, quant, scale = _conv_cases(name, act, dtype)
                node = Node("conv", "conv2d", ["x", *params], ["y"], attrs)
                try:
                    got, want = run_both(x, [node], params, quant)
                except EngineError as e:
                    assert "cannot run it" in str(e)
                    break
                if dtype == "i8":
                    assert np.array_equal(got, want), (name, act)
                else:
                    assert_close(got, want, scale=scale)
                ran += 1
    if not ran:
        pytest.skip(f"{route} runs none of these convs on this CPU")
