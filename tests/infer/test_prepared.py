"""Weights prepared once in another layout (routes.base.prepared): made at the first bind that
needs them, counted in Engine.prepared_bytes and `pocket inspect --routes`, never remade, and
the results the reference's (int8 bit for bit)."""

from __future__ import annotations

import numpy as np
from models import Builder, quantize_sequential, save_model

from pocket.formats import reference as ref
from pocket.formats.container import read_container
from pocket.infer import kernels_tile, kernels_vnni
from pocket.infer.engine import Engine

KEYS = ("wf", "wq", "w_pad", "w_tiles")


def _conv_bytes(route: str) -> int:
    """The conv's prepared weights: float32 codes, as kernels_tile lays them out (channels in
    whole groups of ROWS) or as they are (BLAS)."""
    rows = -(-16 // kernels_tile.ROWS) * kernels_tile.ROWS if route == "conv_tile_q_cols" else 16
    return 4 * rows * 8 * 9


def _int8_model(tmp_path, rng):
    b = Builder((8, 10, 10), rng)
    b.conv(8, 16, 3, padding=[1, 1], stride=[1, 1], dilation=[1, 1], activation="relu")
    b.op("flatten")
    b.linear(16 * 100, 12)
    g, p = b.graph(), b.params
    g, p, quant = quantize_sequential(g, p, rng.standard_normal((8, 8, 10, 10)).astype(np.float32))
    return save_model(tmp_path / "m.int8.bin", g, p, quant)


def test_prepared_once_and_exact(tmp_path, int8_route):
    portable = int8_route == "portable"
    rng = np.random.default_rng(3)
    path = _int8_model(tmp_path, rng)
    x = rng.standard_normal((20, 8, 10, 10)).astype(np.float32)
    with read_container(path) as c:
        want = ref.run_container(c, x)[c.graph.outputs[0]]
    with Engine(path, max_batch=32) as eng:
        assert eng.prepared_bytes == 0  # nothing before a bind
        got = eng.run(x, copy=True)
        made = eng.prepared_bytes
        table = {r["node"]: r for r in eng.routes()}
        ids = {k: id(v) for p in eng._prep for k, v in p.items() if k in KEYS}
        for _ in range(2):
            again = eng.run(x, copy=True)
        assert eng.prepared_bytes == made
        assert ids == {k: id(v) for p in eng._prep for k, v in p.items() if k in KEYS}
    assert np.array_equal(got, want) and np.array_equal(again, want)
    if portable:
        # batch 20 >= F32_ROUTE_ROWS: both layers on float32 copies of their codes (the conv on
        # kernels_tile's GEMM, or BLAS's where the tiles are off)
        assert table["conv2d0"]["route"] in ("conv_tile_q_cols", "conv_int8_blas")
        conv = _conv_bytes(table["conv2d0"]["route"])
        assert made == conv + 4 * 12 * 1600
        assert table["conv2d0"]["prepared_bytes"] == conv
    else:
        assert table["conv2d0"]["route"] in ("conv_vnni_quad", "conv_vnni")
        assert made >= 16 * 8 * 9  # the conv's reordered int8 weights


def test_inspect_routes_reports_prepared(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from pocket.cli import main

    monkeypatch.setattr(kernels_vnni, "AVAILABLE", False)
    path = _int8_model(tmp_path, np.random.default_rng(4))
    out = CliRunner().invoke(main, ["inspect", str(path), "--routes"])
    assert out.exit_code == 0, out.output
    assert f"prepared {_conv_bytes('conv_tile_q_cols')} B" in out.output
    assert "weights prepared in another layout" in out.output
