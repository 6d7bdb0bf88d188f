"""A squeeze-and-excitation gate taken into the weights of the 1x1 conv after it
(lowering_vision.gated_convs): the engine against formats/reference.py (fp32 to float32
rounding), which plans take it, and which must keep the gate's own multiply."""

from __future__ import annotations

import numpy as np
import pytest
from models import Builder, matches_reference, save_model

from pocket.infer import kernels_fma as kfma
from pocket.infer.engine import Engine

needs_fma = pytest.mark.skipif(not kfma.AVAILABLE, reason="this CPU has no AVX-512")


def _se(rng, c, hw, o, *, gate_first=False, second_reader=False, act="relu"):
    """dw conv -> (global pool, 1x1 conv + relu, 1x1 conv + hardsigmoid) -> mul -> 1x1 conv."""
    b = Builder((c, hw, hw), rng)
    big = b.conv(c, c, 3, groups=c, stride=[1, 1], padding=[1, 1], dilation=[1, 1], activation="relu")
    b.op("global_avgpool")
    b.conv(c, 4, 1, stride=[1, 1], padding=[0, 0], dilation=[1, 1], activation="relu")
    gate = b.conv(4, c, 1, stride=[1, 1], padding=[0, 0], dilation=[1, 1], activation="hardsigmoid")
    if gate_first:
        b.op("mul", big)
    else:
        b.last = big
        b.op("mul", gate)
    gated = b.last
    b.conv(c, o, 1, stride=[1, 1], padding=[0, 0], dilation=[1, 1], activation=act)
    if second_reader:  # the gated map read again: the mul must stay
        b.op("add", gated)
    return b


def _names(eng, n):
    return [getattr(c.func, "__name__", "") for c in eng._bound[n].calls]


@needs_fma
@pytest.mark.parametrize("gate_first", [False, True])
@pytest.mark.parametrize("act", ["none", "relu", "hardswish"])
def test_the_gate_goes_into_the_weights(tmp_path, gate_first, act):
    """24 channels of 16x16 pixels into 8: the conv gates its weights (gate_weights), no
    mul_rows runs, and batches of 1 and 3 on 1 and 2 threads match the reference; the arena
    starts as 0xff bytes (NaN), so a read of the unwritten mul output would show."""
    rng = np.random.default_rng(5)
    b = _se(rng, 24, 16, 8, gate_first=gate_first, act=act)
    path = tmp_path / "se.bin"
    save_model(path, b.graph(), b.params, None)
    for threads in (1, 2):
        with Engine(path, max_batch=3, threads=threads) as eng:
            for n in (1, 3):
                x = rng.standard_normal((n, 24, 16, 16)).astype(np.float32)
                eng._arena.fill(255)
                got = eng.run(x, copy=True)
                names = _names(eng, n)
                assert any(s.startswith("gate_weights") for s in names), names
                assert not any(s.startswith("mul_rows") for s in names), names
                matches_reference(path, x, got, False)


@pytest.mark.parametrize("case", ["second_reader", "few_pixels"])
def test_the_gate_stays_a_multiply(tmp_path, case):
    """The gated map read by a second node, or a conv with more output channels than pixels
    (its weights would cost more to gate than the map): mul_rows runs, as before."""
    rng = np.random.default_rng(6)
    b = _se(rng, 24, 16, 24, second_reader=True) if case == "second_reader" else _se(rng, 24, 4, 32)
    path = tmp_path / "se.bin"
    save_model(path, b.graph(), b.params, None)
    hw = 16 if case == "second_reader" else 4
    x = rng.standard_normal((2, 24, hw, hw)).astype(np.float32)
    with Engine(path, max_batch=2) as eng:
        got = eng.run(x, copy=True)
        names = _names(eng, 2)
        assert any(s.startswith("mul_rows") for s in names), names
        assert not any(s.startswith("gate_weights") for s in names), names
    matches_reference(path, x, got, False)


@pytest.mark.parametrize("serial", [False, True])
def test_gate_weights_against_numpy(serial):
    """out[i, o, k] = w[o, k] * s[i, k], one float32 product each (NumPy's float32 product)."""
    from pocket.infer import kernels_vision as kv

    rng = np.random.default_rng(7)
    w = rng.standard_normal((13, 37)).astype(np.float32)
    s = rng.standard_normal((3, 37)).astype(np.float32)
    s[1, 5] = np.nan
    out = np.full((3, 13, 37), 7.0, np.float32)
    (kv.gate_weights.serial if serial else kv.gate_weights)(out, w, s)
    np.testing.assert_array_equal(out, w[None] * s[:, None, :])
