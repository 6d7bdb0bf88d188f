"""The cuDNN frontend glue in pocket.train.backend, with a stand-in `cudnn` module (the real one
needs a GPU): the right tensors reach the right operands, plans are cached per shape, and a
shape without an engine falls back to im2col + cuBLAS. Gradients are checked against float64
finite differences, so swapped dgrad/wgrad operands cannot pass."""

import types

import numpy as np
import pytest

from pocket.train import backend, conv
from pocket.train import functional as F
from pocket.train.gradcheck import gradcheck

pytestmark = pytest.mark.gpu

CASES = [((2, 3, 6, 5), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1),
         ((1, 4, 7, 6), (4, 2, 3, 2), (2, 1), (1, 0), (1, 2), 2)]


def _fake_cudnn(cp, log: dict, refuse=()):
    """Executes each graph with pocket's NumPy conv primitives (tested against naive loops)."""

    class T:
        def __init__(self, name="", dim=None, stride=None, data_type=None, op=None):
            self.name, self.dim, self.op = name, dim, op

        def set_output(self, v):
            return self

        def set_dim(self, d):
            self.dim = d
            return self

        def set_stride(self, s):
            return self

        def set_data_type(self, d):
            return self

    class Graph:
        def __init__(self, **kw):
            self.out = None

        def tensor(self, name, dim, stride, data_type):
            return T(name, dim, stride, data_type)

        def _op(self, kind, a, b, padding, stride, dilation, compute_data_type):
            self.out = T(op=(kind, a, b, tuple(padding), tuple(stride), tuple(dilation)))
            return self.out

        def conv_fprop(self, image, weight, **geo):
            return self._op("fprop", image, weight, **geo)

        def conv_dgrad(self, loss, filter, **geo):  # noqa: A002 - the frontend's name
            return self._op("dgrad", loss, filter, **geo)

        def conv_wgrad(self, image, loss, **geo):
            return self._op("wgrad", image, loss, **geo)

        def build(self, modes):
            kind = self.out.op[0]
            log["builds"].append(kind)
            if kind in refuse:
                raise RuntimeError("no engine")

        def get_workspace_size(self):
            return 256

        def execute(self, pack, workspace, handle=None):
            kind, ta, tb, p, s, d = self.out.op
            a, b, out = (cp.asnumpy(pack[t]) for t in (ta, tb, self.out))
            log["runs"].append(kind)
            if kind == "fprop":
                x, w, groups = a, b, a.shape[1] // b.shape[1]
            elif kind == "dgrad":
                x, w, groups = np.zeros(out.shape, a.dtype), b, out.shape[1] // b.shape[1]
            else:
                x, w, groups = a, np.zeros(out.shape, a.dtype), a.shape[1] // out.shape[1]
            ctx = types.SimpleNamespace(attrs={}, needs=(True, True), saved=None)
            ctx.save = lambda *arrs: setattr(ctx, "saved", arrs)
            y = conv._conv2d_fwd(ctx, x, w, None, s, p, d, groups)
            if kind == "fprop":
                res = y
            else:
                gx, gw, _ = conv._conv2d_bwd(ctx, a if kind == "dgrad" else b)
                res = gx if kind == "dgrad" else gw
            pack[self.out][...] = cp.asarray(res.astype(out.dtype))

    dt = types.SimpleNamespace(HALF="half", FLOAT="float", DOUBLE="double")
    return types.SimpleNamespace(
        create_handle=lambda: "handle", set_stream=lambda handle, stream: None, pygraph=Graph,
        data_type=dt, heur_mode=types.SimpleNamespace(A="A", FALLBACK="FALLBACK"))


@pytest.fixture
def fake(monkeypatch):
    xp = backend.get_device("cuda").xp
    if not getattr(xp, "is_gpu_sim", False):
        pytest.skip("the stand-in cudnn runs under the CuPy stand-in only")
    log = {"builds": [], "runs": []}

    def install(refuse=()):
        monkeypatch.setattr(backend, "_cudnn", {"module": _fake_cudnn(xp, log, refuse)})
        return xp, log

    return install


@pytest.mark.parametrize("case", CASES, ids=["plain", "grouped-strided-dilated"])
def test_conv_through_cudnn_matches_finite_differences(fake, case):
    xp, log = fake()
    xs, ws, s, p, d, g = case
    rng = np.random.default_rng(0)
    x, w, b = (xp.asarray(rng.standard_normal(sh)) for sh in (xs, ws, (ws[0],)))
    gradcheck(lambda x, w, b: F.conv2d(x, w, b, s, p, d, g), [x, w, b])
    assert {"fprop", "dgrad", "wgrad"} <= set(log["runs"]), backend._cudnn.get("failures")
    # one plan per (kind, shape): gradcheck ran the forward many times, built it once
    assert log["builds"].count("fprop") == 1 and len(log["runs"]) > len(log["builds"])


def test_a_shape_without_an_engine_falls_back_to_im2col(fake):
    xp, log = fake(refuse=("wgrad",))
    rng = np.random.default_rng(1)
    x, w = (xp.asarray(rng.standard_normal(sh)) for sh in ((2, 3, 5, 5), (2, 3, 3, 3)))
    gradcheck(lambda x, w: F.conv2d(x, w, None, 1, 1), [x, w])
    assert "wgrad" not in log["runs"] and "dgrad" in log["runs"]
    assert log["builds"].count("wgrad") == 1  # the failure is remembered


def test_no_frontend_means_the_fallback(monkeypatch):
    if not getattr(backend.get_device("cuda").xp, "is_gpu_sim", False):
        pytest.skip("on a real GPU the frontend may well be there")
    monkeypatch.setattr(backend, "_cudnn", {})
    assert not backend.cudnn_available()  # the stand-in is never driven through cuDNN
    monkeypatch.setenv("POCKET_CUDNN", "0")
    assert not backend.cudnn_conv("fprop", None, None, None, (1, 1), (0, 0), (1, 1))


def test_tf32_is_pinned_off_unless_asked(monkeypatch):
    for var in ("POCKET_TF32", "NVIDIA_TF32_OVERRIDE", "CUPY_TF32"):
        monkeypatch.delenv(var, raising=False)
    backend.pin_tf32()
    import os

    assert os.environ["NVIDIA_TF32_OVERRIDE"] == "0" and os.environ["CUPY_TF32"] == "0"
    monkeypatch.setenv("POCKET_TF32", "1")
    backend.pin_tf32()
    assert "NVIDIA_TF32_OVERRIDE" not in os.environ and os.environ["CUPY_TF32"] == "1"
