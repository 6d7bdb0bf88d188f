"""A float32 residual add and the ReLU after it in one pass (lowering.fused_add_relus): the
kernel against NumPy, the engine against formats/reference.py, and when the ReLU must stay."""

from __future__ import annotations

import numpy as np
import pytest
from models import Builder, matches_reference, save_model

from pocket.infer import kernels_fp32 as kf
from pocket.infer.engine import Engine


@pytest.mark.parametrize("serial", [False, True])
def test_add_relu_against_numpy(serial):
    rng = np.random.default_rng(8)
    a = rng.standard_normal(1001).astype(np.float32)
    b = rng.standard_normal(1001).astype(np.float32)
    a[3], b[7], a[9], b[9] = np.nan, np.nan, np.inf, -np.inf
    out = np.full(1001, 5.0, np.float32)
    (kf.add_relu.serial if serial else kf.add_relu)(out, a, b)
    with np.errstate(invalid="ignore"):  # inf + -inf: NaN, as in the kernel
        s = a + b
    want = np.where(np.isnan(s), s, np.maximum(s, 0)).astype(np.float32)
    np.testing.assert_array_equal(out, want)


def _block(rng, *, second_reader=False):
    """conv -> conv -> add(the block's input) -> relu -> conv (ResNet's basic block, shortened)."""
    b = Builder((8, 6, 6), rng)
    inp = b.conv(8, 8, 3, padding=[1, 1], activation="relu")
    b.conv(8, 8, 3, padding=[1, 1])
    b.op("add", inp)
    added = b.last
    b.op("relu")
    if second_reader:  # the sum read again: the ReLU stays a pass of its own
        b.op("add", added)
    b.conv(8, 4, 1)
    return b


@pytest.mark.parametrize("second_reader", [False, True])
def test_the_engine_fuses_the_relu_into_the_add(tmp_path, second_reader):
    """The ReLU binds no call where it is the sum's only reader; batches 1 and 3 on 1 and 2
    threads match the reference, the arena starting as NaN."""
    rng = np.random.default_rng(9)
    b = _block(rng, second_reader=second_reader)
    path = tmp_path / "res.bin"
    save_model(path, b.graph(), b.params, None)
    for threads in (1, 2):
        with Engine(path, max_batch=3, threads=threads) as eng:
            for n in (1, 3):
                x = rng.standard_normal((n, 8, 6, 6)).astype(np.float32)
                eng._arena.fill(255)
                got = eng.run(x, copy=True)
                names = [getattr(c.func, "__name__", "") for c in eng._bound[n].calls]
                assert any(s.startswith("add_relu") for s in names) != second_reader, names
                assert any(s.startswith("unary") for s in names) == second_reader, names
                matches_reference(path, x, got, False)
