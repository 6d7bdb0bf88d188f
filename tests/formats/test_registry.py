"""The op registry (pocket/formats/ops.py): every IR op has every implementation it needs, and the
facts an entry states (kernel codes, monotonicity, fusion) hold against independent checks."""

from __future__ import annotations

import ast
import importlib
import pathlib

import numpy as np
import pytest

from pocket.formats import ops
from pocket.formats import reference as ref

# The modules that register the stages' implementations against the entries.
STAGES = ("pocket.formats.reference", "pocket.train.functional", "pocket.train.trace",
          "pocket.export.onnx_export", "pocket.infer.lowering")


def gaps() -> dict[str, list[str]]:
    for m in STAGES:
        importlib.import_module(m)
    return {n: ops.missing(n) for n in ops.OPS if ops.missing(n)}


def test_every_op_has_every_implementation():
    found = gaps()
    assert not found, "\n".join(f"op '{n}' lacks: {', '.join(s)}" for n, s in found.items())


def test_a_missing_implementation_is_named(monkeypatch):
    assert gaps() == {}
    monkeypatch.delitem(ops.OPS["tanh"].impls, "engine")
    monkeypatch.delitem(ops.OPS["conv2d"].impls, "trace")
    assert gaps() == {"conv2d": ["trace"], "tanh": ["engine"]}
    # A new op nobody implemented lacks every slot it needs; one declared neither trainable nor
    # traceable (like quantize) does not need those two.
    monkeypatch.setitem(ops.OPS, "mish", ops.Op("mish", 1, 1, {}, ops.infer_unary_f32))
    monkeypatch.setitem(ops.OPS, "q2", ops.Op("q2", 1, 1, {}, ops.infer_unary_f32,
                                              trainable=False, traceable=False))
    found = gaps()
    assert found["mish"] == ["reference", "train", "trace", "onnx_export", "engine"]
    assert found["q2"] == ["reference", "onnx_export", "engine"]


def test_register_checks_names():
    with pytest.raises(KeyError, match="unknown op 'hardswishh'"):
        ops.register("onnx_export", "hardswishh")
    with pytest.raises(ValueError, match="unknown slot 'onnx'"):
        ops.register("onnx", "relu")
    gaps()
    with pytest.raises(ValueError, match="'relu' already has a reference implementation"):
        ops.register("reference", "relu")(lambda a, x: x)
    # quantize is not trainable, so no stage ever fills its train slot (onnx_import, empty
    # once, now has pocket.importer's importers)
    with pytest.raises(KeyError, match="op 'quantize' has no train implementation"):
        ops.impl("train", "quantize")


def test_entries_are_consistent():
    policies = {ops.INT8_LAYER, ops.INT8_PASS, ops.INT8_FUSE, ops.INT8_F32, ops.INT8_QDQ}
    for name, op in ops.OPS.items():
        assert op.name == name and op.int8 in policies, name
        assert 1 <= op.min_inputs <= op.max_inputs, name
        if op.fusion is not None:
            assert op.min_inputs == op.max_inputs == 1, name
            assert set(op.fusion.attrs) <= set(ops.OPS["conv2d"].attrs), name
    assert ops.OPS["conv2d"].attrs["activation"].choices == ("none", *ops.activations())
    assert ops.OPS["linear"].attrs["activation"].choices == ("none", *ops.activations())
    codes = list(ops.activation_codes().values())
    assert len(codes) == len(set(codes)), "two activations share a kernel code"


def _grid() -> np.ndarray:
    return np.concatenate([np.linspace(-8, 8, 4001), [-1e4, -30.5, 0.0, 1e-7, 30.5, 1e4]])


def test_monotone_flags_hold():
    """The engine fuses a maxpool after an activation flagged monotone: check the flag."""
    x = np.sort(_grid())
    for name in ops.activations():
        y = ref.__dict__[name].f64(x, {"alpha": 0.01})
        assert ops.OPS[name].fusion.monotone == bool(np.all(np.diff(y) >= 0)), name


def test_kernel_codes_compute_their_op():
    """kernels_fp32.ACT's code for each activation runs that op (vs the reference)."""
    from pocket.infer import kernels_fp32 as kf

    x = _grid().astype(np.float32)
    for name, code in kf.ACT.items():
        # 0.3: the one activation parameter the kernels take (leaky_relu's alpha, clip's max)
        op, attrs = ((name, {"alpha": 0.3, "max": 0.3}) if name != "gelu_tanh"
                     else ("gelu", {"approximate": "tanh"}))
        want = x if name == "none" else ref.__dict__[op](attrs, x)
        got = np.empty_like(x)
        kf.unary(got, x, code, 0.3)
        np.testing.assert_allclose(got, want, rtol=2e-7, atol=1e-6, err_msg=name)


def test_every_elementwise_layer_traces_to_its_op():
    from pocket.train import nn
    from pocket.train.trace import trace

    assert set(ops.activations()) <= set(nn.ELEMENTWISE)
    for name, cls in nn.ELEMENTWISE.items():
        g, _ = trace(nn.Sequential(cls.from_ir()), (2, 3, 3))
        assert [n.op for n in g.nodes] == [name]


def _imports(path: pathlib.Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_formats_has_no_import_cycle():
    root = pathlib.Path(ops.__file__).parent
    mods = {f"pocket.formats.{p.stem}": p for p in root.glob("*.py") if p.stem != "__init__"}
    deps = {m: {d for d in _imports(p) if d in mods and d != m} for m, p in mods.items()}

    def visit(m, stack):
        assert m not in stack, f"import cycle: {' -> '.join([*stack, m])}"
        for d in deps[m]:
            visit(d, [*stack, m])

    for m in mods:
        visit(m, [])
    assert "pocket.formats.ir" not in deps["pocket.formats.ops"]
