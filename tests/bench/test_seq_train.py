"""bench/seq_train.py's torch twins: the same parameter count and, with pocket's weights copied
in, the same outputs and gradients as the pocket zoo models they are timed against."""

import importlib.util
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def st():
    spec = importlib.util.spec_from_file_location("seq_train", ROOT / "bench" / "seq_train.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["seq_train"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name", ["tcn", "ssm", "transformer"])
def test_twin_is_the_same_model(st, name):
    p, t = st.param_counts(name)
    assert p == t
    d_out, d_grad = st.same_function(name)
    assert d_out < 1e-5 and d_grad < 1e-4


def test_a_different_twin_is_caught(st, monkeypatch):
    # the ssm twin with its S4D skip D dropped: the same parameters, another function
    build = st.build_torch

    def without_skip(name):
        net = build(name)
        for m in net.modules():
            if hasattr(m, "d") and isinstance(m.d, torch.nn.Parameter):
                m.forward = _no_skip(m)
        return net

    def _no_skip(m):
        plain = type(m).forward

        def forward(u):
            return plain(m, u) - u * m.d
        return forward

    monkeypatch.setattr(st, "build_torch", without_skip)
    d_out, d_grad = st.same_function("ssm")
    assert max(d_out, d_grad) > 1e-2
