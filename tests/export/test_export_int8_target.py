"""Per-layer sensitivity, --int8-target, and exports bit-identical to those before the one-pass
calibration (the digests below were taken from the exporter at commit 254da8a)."""

import hashlib
import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from export_models import residual_cnn, smooth_images, wide_cnn

from pocket.export import calibrate as C
from pocket.export import transforms as T
from pocket.export.app import export, render
from pocket.export.quantize import layer_values, quantize_graph
from pocket.export.sensitivity import layer_sensitivity, meet_target, unchanged_values
from pocket.formats import quant as Q
from pocket.formats import reference
from pocket.formats.container import read_container, write_container

REPO = Path(__file__).resolve().parents[2]


def write_ckpt(path, graph, params, x):
    write_container(path, kind="checkpoint", tensors={**params, "calib/x": x}, graph=graph,
                    meta={"trainer": {}, "config": {}})
    return path


def digest(path) -> str:
    """What an export computes: nodes with attrs, tensors with bytes and qparams."""
    h = hashlib.sha256()
    with read_container(path) as c:
        h.update(json.dumps([[n.name, n.op, n.inputs, n.outputs, n.attrs] for n in c.graph.nodes],
                            sort_keys=True).encode())
        for name in sorted(c.tensors):
            a = np.asarray(c.tensors[name])
            h.update(name.encode())
            h.update(str(a.dtype).encode())
            h.update(a.tobytes())
            h.update(json.dumps(c.quant(name), sort_keys=True).encode())
    return h.hexdigest()[:16]


GOLDEN = {
    "residual-fp32": "b9038d296e73dcc9", "residual-minmax": "73e49eea29895be2",
    "residual-percentile": "0de622e1da83a264", "residual-guard": "36575bc6370ac842",
    "wide-fp32": "cbfb9042c2492522", "wide-minmax": "bd010f3d61d1e7ec",
    "wide-percentile": "6661f21e66db850c", "wide-guard": "f43462eae91e8df2",
}
GUARD_FP32 = {"residual": ["head"], "wide": ["fc1"]}


@pytest.mark.parametrize("model", ["residual", "wide"])
def test_exports_are_bit_identical_to_before(model, tmp_path):
    build, shape = {"residual": (residual_cnn, (1, 8, 8)), "wide": (wide_cnn, (3, 12, 12))}[model]
    g, p = build(5)
    ck = write_ckpt(tmp_path / "m.ckpt", g, p, smooth_images(np.random.default_rng(5), 96, shape))
    for tag, kw in (("fp32", {}), ("minmax", {"int8": True}),
                    ("percentile", {"int8": True, "calib_method": "percentile"}),
                    ("guard", {"int8": True, "max_layer_error": 0.02})):
        r = export(ck, tmp_path / f"{tag}.bin", **kw)
        assert digest(r["output"]) == GOLDEN[f"{model}-{tag}"], tag
        if tag == "guard":
            assert [x["name"] for x in r["layers_fp32"]] == GUARD_FP32[model]
    assert set(r["timings"]) >= {"read", "transforms", "calibrate", "check", "quantize",
                                 "write", "agreement"}


@pytest.fixture(scope="module")
def residual():
    graph, params = residual_cnn(seed=8)
    g, p, _ = T.optimize(graph, params)
    x = smooth_images(np.random.default_rng(8), 96, (1, 8, 8))
    calib = C.run_pass(g, p, x, keep=layer_values(g))
    quantize = partial(quantize_graph, g, p, x, calib=calib)
    qz = quantize()
    xs = x[:24]
    env = reference.run(g, p, xs, keep_all=True)
    return g, p, xs, env, qz, partial(quantize, errors=qz.errors)


def test_sensitivity_is_each_layer_alone_run_in_full(residual):
    g, p, xs, env, qz, quantize = residual
    sens = layer_sensitivity(g, qz, xs, env, quantize)
    layers = [r["name"] for r in qz.layers if r["int8"]]
    assert sorted(sens) == sorted(layers) and len(layers) == 6
    fp32 = reference.run(g, p, xs)["logits"]
    for name in layers:
        alone = quantize(keep_fp32={n: "x" for n in layers if n != name})
        assert [n.name for n in alone.graph.nodes if "x_scale" in n.attrs] == [name]
        y = reference.run(alone.graph, alone.params, xs, alone.quant)["logits"]  # no reuse
        assert sens[name] == Q.sqnr_db(fp32, y)
    assert all(np.isfinite(v) and v > 10 for v in sens.values())


def test_unchanged_values_stop_at_the_first_quantized_layer(residual):
    g, p, xs, env, qz, quantize = residual
    alone = quantize(keep_fp32={n: "x" for n in ("stem", "b1c1", "b1c2", "c3")})  # fc1 int8
    clean = unchanged_values(g, alone.graph)
    order = [n.outputs[0] for n in g.nodes]
    fc1 = next(n for n in g.nodes if n.name == "fc1")
    assert clean == set(order[:order.index(fc1.outputs[0])])


def test_target_keeps_the_fewest_sensitive_layers_fp32(residual):
    g, p, xs, env, qz, quantize = residual
    sens = layer_sensitivity(g, qz, xs, env, quantize)
    fp32 = env["logits"]
    base = Q.sqnr_db(fp32, reference.run(qz.graph, qz.params, xs, qz.quant)["logits"])
    order = sorted(sens, key=lambda n: (sens[n], n))
    for target in (base - 1, base + 3, base + 12, 300.0):
        best, info = meet_target(g, qz, xs, env, target, sens, quantize)
        k = len(info["layers_fp32"])
        assert info["met"] and info["layers_fp32"] == order[:k]
        assert best.layers_fp32 == [r["name"] for r in qz.layers
                                    if r["name"] in order[:k] or not r["int8"]]
        got = Q.sqnr_db(fp32, reference.run(best.graph, best.params, xs, best.quant)["logits"])
        assert got == info["reached_db"] >= target
        if k:  # one layer fewer in fp32 misses the target
            fewer = quantize(keep_fp32={n: "x" for n in order[:k - 1]})
            y = reference.run(fewer.graph, fewer.params, xs, fewer.quant)["logits"]
            assert Q.sqnr_db(fp32, y) < target
        else:
            assert target < base
    assert k == len(order)  # 300 dB: everything fp32 (inf)


def test_export_with_target_reports_and_writes_the_fallback(tmp_path):
    g, p = wide_cnn(9)
    ck = write_ckpt(tmp_path / "m.ckpt", g, p,
                    smooth_images(np.random.default_rng(9), 80, (3, 12, 12)))
    plain = export(ck, tmp_path / "a.bin", int8=True, sensitivity_samples=8)
    assert plain["sensitivity_samples"] == 8 and "int8_target" not in plain
    assert all(r["sensitivity_db"] is not None for r in plain["layers"] if r["int8"])
    assert "alone dB" in render(plain)
    target = plain["agreement"]["sqnr_db"] + 6
    r = export(ck, tmp_path / "b.bin", int8=True, int8_target=target, calib_method="mse")
    t = r["int8_target"]
    assert t["met"] and t["layers_fp32"] and t["samples"] == 16
    assert sorted(x["name"] for x in r["layers_fp32"]
                  if "--int8-target" in x["reason"]) == sorted(t["layers_fp32"])
    assert r["calibration"] == {"method": "mse"}
    m = read_container(r["output"])
    assert set(m.graph.metadata["export"]["layers_fp32"]) >= set(t["layers_fp32"])
    assert "int8 target" in render(r)


def _pocket(args, cwd):
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("POCKET_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "pocket.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_cli_flags(tmp_path):
    g, p = residual_cnn(10)
    write_ckpt(tmp_path / "m.ckpt", g, p, smooth_images(np.random.default_rng(10), 64, (1, 8, 8)))
    r = _pocket(["export", "m.ckpt", "--int8", "--calibration", "percentile", "--percentile",
                 "99.9", "--int8-target", "35", "--json"], tmp_path)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["calibration"] == {"method": "percentile", "percentile": 99.9}
    assert rep["int8_target"]["sqnr_db"] == 35 and rep["int8_target"]["met"]
    r = _pocket(["export", "m.ckpt", "--int8", "--calibration", "kl"], tmp_path)
    assert r.returncode == 2 and "kl" in r.stderr
    r = _pocket(["export", "m.ckpt", "--int8", "--int8-target", "nan"], tmp_path)
    assert r.returncode == 3 and r.stderr.count("Error:") == 1 and "Traceback" not in r.stderr


def test_the_runs_export_section_gives_defaults(tmp_path):
    from pocket.train.config import ConfigError, merge

    cfg = merge({"export": {"calibration": "percentile", "percentile": 99.9}})
    assert cfg["export"]["int8_target"] is None
    for bad in ({"calibration": "kl"}, {"percentile": 101.0}, {"int8_target": "high"},
                {"sensitivity_samples": 1.5}):
        with pytest.raises(ConfigError, match="export"):
            merge({"export": bad})
    g, p = residual_cnn(12)
    path = tmp_path / "m.ckpt"
    write_container(path, kind="checkpoint", graph=g, meta={"config": cfg},
                    tensors={**p, "calib/x": smooth_images(np.random.default_rng(12), 40,
                                                           (1, 8, 8))})
    r = export(path, tmp_path / "a.bin", int8=True)
    assert r["calibration"] == {"method": "percentile", "percentile": 99.9}
    r = export(path, tmp_path / "b.bin", int8=True, calib_method="mse")
    assert r["calibration"] == {"method": "mse"}
