"""Calibration methods, each against an independent computation on small synthetic data."""

import numpy as np
import pytest
from export_models import Net, residual_cnn, smooth_images

from pocket.export import calibrate as C
from pocket.export import transforms as T
from pocket.export.quantize import calibrate, quantize_graph
from pocket.formats import quant as Q
from pocket.formats import reference


def qdq_mse(x: np.ndarray, lo: float, hi: float) -> float:
    """The mean squared error int8 quantize-dequantize causes on x with range [lo, hi]."""
    scale, zp = Q.choose_activation_qparams(lo, hi)
    x = x.astype(np.float32)
    return float(np.mean((Q.dequantize(Q.quantize(x, scale, zp), scale, zp) - x) ** 2.0))


def test_mse_clip_of_a_laplace_sample_is_the_brute_force_optimum():
    x = np.random.default_rng(0).laplace(0, 1, 20_000)
    lo, hi = C.mse_clip(*C.histogram(x, x.min(), x.max()))
    # Brute force on the raw sample: every (lo, hi) of a grid.
    grid = np.linspace(0.02, 1, 50)
    best = min(qdq_mse(x, a * x.min(), b * x.max()) for a in grid for b in grid)
    assert qdq_mse(x, lo, hi) <= 1.02 * best
    # NOTE: 256 levels leave little to gain on a Laplace (the optimum clips near 10 b, Banner
    # et al. 2019), and rare outliers are kept: clipping them costs their squared distance
    assert qdq_mse(x, lo, hi) < qdq_mse(x, x.min(), x.max())
    assert x.min() < lo < 0 < hi < x.max()


def test_mse_clip_one_sided():
    # After a ReLU: half the mass at 0, a long right tail.
    x = np.maximum(np.random.default_rng(1).laplace(0, 1, 20_000), 0)
    lo, hi = C.mse_clip(*C.histogram(x, x.min(), x.max()))
    assert lo == 0.0
    best = min(qdq_mse(x, 0.0, t * x.max()) for t in np.linspace(0.01, 1, 400))
    assert qdq_mse(x, lo, hi) <= 1.01 * best


def naive_kl_threshold(hist, levels, step):
    """TensorRT's entropy calibration (Migacz, GTC 2017), written as plainly as possible, for
    a one-sided histogram starting at 0: returns the number of bins kept."""
    n = len(hist)
    best, best_i = None, None
    for i in list(range(levels, n, step)) + [n]:
        ref = [float(c) for c in hist[:i]]
        ref[i - 1] += float(sum(hist[i:]))
        merged = i // levels
        cand = [0.0] * i
        for j in range(levels):
            start = j * merged
            stop = i if j == levels - 1 else start + merged
            total = float(sum(hist[start:stop]))
            nonzero = sum(1 for b in range(start, stop) if hist[b] > 0)
            for b in range(start, stop):
                if hist[b] > 0:
                    cand[b] = total / nonzero
        ps, qs = sum(ref), sum(cand)
        kl = 0.0
        for p, q in zip(ref, cand):
            if p > 0:
                kl += p / ps * np.log((p / ps) / max(q / qs, 1e-4 / i))
        if best is None or kl < best:
            best, best_i = kl, i
    return best_i


def test_entropy_clip_matches_a_naive_tensorrt_calibrator():
    rng = np.random.default_rng(2)
    x = np.abs(rng.laplace(0, 1, 50_000))
    counts, edges = C.histogram(x, 0.0, x.max(), bins=640)
    lo, hi = C.entropy_clip(counts, edges, levels=64, step=16)
    i = naive_kl_threshold(counts, 64, 16)
    assert lo == 0.0 and hi == pytest.approx(edges[i])
    assert i < 640  # the long tail is clipped


def test_entropy_clip_signed():
    x = np.random.default_rng(3).laplace(0, 1, 50_000)
    counts, edges = C.histogram(x, x.min(), x.max())
    lo, hi = C.entropy_clip(counts, edges)
    assert x.min() < lo < 0 < hi < x.max()
    kl = C.kl_divergence(counts, *np.searchsorted(edges, [lo, hi]))
    assert kl < C.kl_divergence(counts, 0, C.BINS)
    # One outlier on one side only: that side is clipped, the other barely.
    y = np.concatenate([x, [80.0]])
    lo, hi = C.entropy_clip(*C.histogram(y, y.min(), 80.0))
    assert hi < 20 and lo < 0.5 * x.min()


def identity_net(shape=(2, 5, 5)):
    n = Net(shape)
    out = n.op("relu", n.input, out="y")
    return n.graph([out]), n.params


def test_percentile_and_minmax_against_numpy():
    g, p = identity_net()
    x = np.random.default_rng(4).normal(0, 1, (150, 2, 5, 5)).astype(np.float32)
    x[3, 0, 0, 0] = 40.0
    for pct in (99.0, 99.99):
        lo, hi = calibrate(g, p, x, method="percentile", percentile=pct)["input"]
        assert (lo, hi) == (np.percentile(x, 100 - pct), np.percentile(x, pct))
    assert calibrate(g, p, x)["input"] == (float(x.min()), 40.0)
    assert calibrate(g, p, x)["y"] == (0.0, 40.0)


def test_every_method_exports_a_working_int8_graph():
    graph, params = residual_cnn(seed=3)
    g, p, _ = T.optimize(graph, params)
    x = smooth_images(np.random.default_rng(3), 96, (1, 8, 8))
    x[0, 0, 0, 0] = 60.0  # an outlier that min-max pays for
    fp32 = reference.run(g, p, x)["logits"]
    sqnr, scale = {}, {}
    for method in C.METHODS:
        qz = quantize_graph(g, p, x, method=method)
        y = reference.run(qz.graph, qz.params, x, qz.quant)["logits"]
        sqnr[method] = Q.sqnr_db(fp32[1:], y[1:])
        scale[method] = Q.choose_activation_qparams(*qz.ranges["input"])[0]
    assert scale["minmax"] * 255 > 60.0
    assert scale["percentile"] * 255 < 30.0 and scale["entropy"] * 255 < 30.0
    assert scale["mse"] <= scale["minmax"]
    assert min(sqnr["percentile"], sqnr["entropy"]) > sqnr["minmax"]
    with pytest.raises(ValueError, match="minmax, percentile, mse, entropy"):
        quantize_graph(g, p, x, method="kl")


def test_one_pass_keeps_what_the_guard_reads_or_recomputes_the_same():
    graph, params = residual_cnn(seed=4)
    g, p, _ = T.optimize(graph, params)
    x = smooth_images(np.random.default_rng(4), 150, (1, 8, 8))
    from pocket.export.quantize import layer_values

    kept = C.run_pass(g, p, x, keep=layer_values(g))
    assert kept.kept is not None and len(kept.kept) == 3  # chunks of 64
    dropped = C.run_pass(g, p, x, keep=layer_values(g), keep_bytes=0)
    assert dropped.kept is None
    a = quantize_graph(g, p, x, calib=kept)
    b = quantize_graph(g, p, x, calib=dropped)
    assert a.errors == b.errors and a.layers == b.layers
    np.testing.assert_array_equal(kept.outputs["logits"], reference.run(g, p, x)["logits"])
