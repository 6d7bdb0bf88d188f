"""Every call of the edge zoo's plans uses only arena bytes that are live at its step
(models.arena_hazards): fused blocks read values past their graph readers' steps, and a
lifetime that ends too early lets the arena hand those bytes to a value or scratch that the
same call writes (s21's SE gate under the project's partial sums: a wrong output in about one
call of six on two threads). Every call split across the threads, as on large maps."""

from __future__ import annotations

import numpy as np
import pytest
from models import BindRecorder, arena_hazards
from zoo_small import SMALL, randomize_bn

from pocket.export import export
from pocket.formats.container import write_container
from pocket.infer import engine as engine_mod
from pocket.infer.engine import Engine
from pocket.train import models
from pocket.train.trace import trace

SHAPE = (3, 32, 32)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_every_call_uses_live_arena_bytes(tmp_path, monkeypatch, name):
    """fp32 and int8 exports, 1 and 2 threads (every call split), batch 1 and 3: no bound call
    touches bytes outside the regions live at its step. The plans are bound, not run: what
    they compute is checked against the reference by the zoo's e2e tests and each fused
    path's own tests (running them here compiled every kernel's parallel twin, ~2 minutes of
    a cold suite)."""
    monkeypatch.setattr(engine_mod, "_PARALLEL_WORK", 0)
    monkeypatch.setattr(engine_mod, "_PARALLEL_WORK_PINNED", 0)
    rec = BindRecorder(monkeypatch)
    rng = np.random.default_rng(3)
    model = models.build_model({"name": name, **SMALL[name]}, SHAPE, 10, rng)
    randomize_bn(model, rng)
    model.eval()
    graph, params = trace(model, SHAPE, {"task": "classification"})
    ckpt = tmp_path / "best.ckpt"
    calib = rng.random((16, *SHAPE), dtype=np.float32)
    write_container(ckpt, kind="checkpoint", tensors={**params, "calib/x": calib}, graph=graph,
                    meta={"epoch": 1})
    for int8 in (False, True):
        out = tmp_path / ("m.int8.bin" if int8 else "m.bin")
        export(ckpt, out, int8=int8)
        for threads in (1, 2):
            with Engine(out, threads=threads, max_batch=3, adaptive_threads=False) as eng:
                for n in (1, 3):
                    eng._bind(n)
                    assert arena_hazards(eng, n, rec) == [], (int8, threads, n)
