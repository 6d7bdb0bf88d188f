"""The ONNX backend node tests through `pocket import` + the engine, and the report of it.

The node tests ship with the `onnx` package as generators (onnx.backend.test.case.node: each a
one-node model with its input and expected-output arrays, made by onnx's own NumPy reference);
this runs every one whose ONNX op type pocket imports (an importer's `onnx_types`, see
pocket/importer/ops_core.py) and compares the engine's outputs with the expected ones at the
test's own tolerances (rtol 1e-3, atol 1e-7 unless it says otherwise).

A node test feeds every input of the node as a graph input, weights included; pocket imports
weights as constants, so a test that does not import as it is is tried once more with every
input but the first bound as an initializer (the report says so).

Each test ends as:
    passed       imported, ran, every output within the tolerance
    unsupported  the import (or the engine) refused it; the reason is the one-line error
    failed       ran, but an output differs (the reason gives the worst error) or it crashed

    python bench/onnx_conformance.py [-o bench/onnx_conformance.md] [--json]

regenerates the Markdown report; tests/importer/test_onnx_conformance.py runs the same tests
and fails when a test that does not pass is missing from the committed report.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np

REPORT = Path(__file__).resolve().parent / "onnx_conformance.md"


def collect():
    """Every node test case of the installed onnx (name, model, data sets, rtol, atol)."""
    from onnx.backend.test.case import node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return list(node.collect_testcases(None))


def claimed_types() -> dict[str, str]:
    """ONNX op type -> the IR op whose importer takes it."""
    from pocket.formats import ops
    from pocket.importer.reader import importers

    importers()  # registers every importer module
    return {t: name for name, fn in ops.implementations("onnx_import").items()
            for t in fn.onnx_types}


def _bind(model, inputs: list[np.ndarray]):
    """The model with every graph input but the first turned into an initializer."""
    import onnx
    from onnx import numpy_helper

    if not all(isinstance(a, np.ndarray | np.generic) and np.asarray(a).dtype.kind in "biuf"
               for a in inputs):
        return None
    m = onnx.ModelProto()
    m.CopyFrom(model)
    keep = m.graph.input[0]
    bound = list(m.graph.input[1:])
    for vi, arr in zip(bound, inputs[1:]):
        m.graph.initializer.append(numpy_helper.from_array(np.asarray(arr), vi.name))
    del m.graph.input[:]
    m.graph.input.append(keep)
    return m


def _reason(e: BaseException) -> str:
    msg = str(e).split(": cannot import ", 1)[-1]
    return " ".join(msg.split())[:300]


def run_case(case) -> dict:
    """One node test: {name, op_types, status, reason, bound}."""
    model = case.model
    types = sorted({n.op_type for n in model.graph.node})
    res = {"name": case.name, "op_types": types, "bound": False}
    sets = case.data_sets or []
    if not sets:
        return {**res, "status": "unsupported", "reason": "the test has no data set"}
    first = _attempt(model, case, sets, False)
    if first["status"] != "passed" and len(model.graph.input) >= 2:
        bound = _bind(model, list(sets[0][0]))
        if bound is not None:
            second = _attempt(bound, case, sets, True)
            if second["status"] == "passed":
                return {**res, "status": "passed", "reason": "", "bound": True}
            # With the weights bound the reason is about the op, not about its inputs.
            return {**res, **second, "reason": f"(weights bound) {second['reason']}"}
    return {**res, **first}


def _attempt(model, case, sets, bound: bool) -> dict:
    from pocket.importer.app import import_onnx
    from pocket.importer.reader import ImportError_

    try:
        imp = import_onnx(model, name=case.name)
    except ImportError_ as e:
        return {"status": "unsupported", "reason": _reason(e)}
    try:
        eng = _engine(imp)
    except Exception as e:  # noqa: BLE001 - the engine's refusal is the reason
        return {"status": "unsupported", "reason": f"engine: {_reason(e)}"}
    try:
        worst = _check(eng, model, sets, case, bound)
    except Exception as e:  # noqa: BLE001 - a crash is a failure with its reason
        return {"status": "failed", "reason": f"{type(e).__name__}: {_reason(e)}"}
    finally:
        eng.close()
    return {"status": "failed", "reason": worst} if worst else {"status": "passed", "reason": ""}


def _engine(imp):
    import os
    import tempfile

    from pocket.formats.container import read_container, write_container
    from pocket.infer.engine import Engine

    fd, tmp = tempfile.mkstemp(suffix=".bin")
    os.close(fd)
    try:
        write_container(tmp, kind="model", tensors=imp.params, graph=imp.graph, quant=imp.quant)
        c = read_container(tmp, expect_kind="model")
    finally:
        Path(tmp).unlink(missing_ok=True)
    batch = next(iter(imp.graph.inputs.values())).shape[0]
    return Engine(c, max_batch=batch if isinstance(batch, int) else 64)


def _check(eng, model, sets, case, bound: bool) -> str:
    """'' when every output of every data set is within tolerance, else the worst miss."""
    names = [vi.name for vi in model.graph.input]
    outs = [vi.name for vi in model.graph.output]
    rtol = getattr(case, "rtol", 1e-3)
    atol = getattr(case, "atol", 1e-7)
    for inputs, expected in sets:
        feed = dict(zip(names, inputs))
        if bound:
            feed = {names[0]: feed[names[0]]}
        names_in = {vi.name for vi in model.graph.input}
        feed = {k: v for k, v in feed.items() if k in names_in}
        got = eng.run_all(feed, copy=True)
        for name, want in zip(outs, expected):
            want = np.asarray(want)
            if name not in got:
                return f"output '{name}' is missing"
            y = got[name]
            if y.shape != want.shape:
                return f"output '{name}' has shape {list(y.shape)}, expected {list(want.shape)}"
            a, b = y.astype(np.float64), want.astype(np.float64)
            bad = ~np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
            if bad.any():
                err = float(np.nanmax(np.abs(a - b)))
                return (f"output '{name}': {int(bad.sum())} of {bad.size} values off "
                        f"(max abs error {err:.3g}; rtol {rtol:g}, atol {atol:g})")
    return ""


def relevant(case, claimed, handled) -> bool:
    """A test of pocket's op set: its one node (Constants aside) has an op type pocket claims,
    or every node of it is an op pocket imports or folds (a function's expansion, say)."""
    types = [n.op_type for n in case.model.graph.node if n.op_type != "Constant"]
    if len(types) == 1:
        return types[0] in claimed
    return bool(types) and any(t in claimed for t in types) and all(t in handled for t in types)


def pattern_cases() -> list:
    """pocket's own multi-node cases, for ops that ONNX writes as a chain the importer fuses
    (ReduceL2 is pocket's l2norm only as exporters write it): named pocket_*, laid out as onnx's
    node tests, their expected outputs from onnx's reference evaluator."""
    from types import SimpleNamespace

    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(0)
    f = np.float32
    eps = numpy_helper.from_array(np.array(1e-12, f), "eps")
    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    chains = {
        # pocket's own export of l2norm
        "pocket_l2norm_reducel2_max_div": (17, [5, 7], [eps], [
            helper.make_node("ReduceL2", ["x"], ["n"], axes=[1], keepdims=1),
            helper.make_node("Max", ["n", "eps"], ["d"]),
            helper.make_node("Div", ["x", "d"], ["y"])]),
        # torch.nn.functional.normalize(x, dim=1) from torch.onnx.export
        "pocket_l2norm_reducel2_clip_expand_div": (17, [3, 4, 2, 5], [eps], [
            helper.make_node("ReduceL2", ["x"], ["n"], axes=[1], keepdims=1),
            helper.make_node("Clip", ["n", "eps", ""], ["c"]),
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Expand", ["c", "s"], ["ce"]),
            helper.make_node("Div", ["x", "ce"], ["y"])]),
        # opset 18: axes as an input
        "pocket_l2norm_reducel2_axes_input_div": (18, [2, 3, 6], [axes], [
            helper.make_node("ReduceL2", ["x", "axes"], ["n"], keepdims=1),
            helper.make_node("Div", ["x", "n"], ["y"])]),
    }
    cases = []
    for name, (opset, shape, inits, nodes) in chains.items():
        g = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                              initializer=inits)
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        x = rng.standard_normal(shape).astype(f)
        want = ReferenceEvaluator(model).run(None, {"x": x})[0]
        cases.append(SimpleNamespace(name=name, model=model, data_sets=[([x], [want])],
                                     rtol=1e-3, atol=1e-7))
    return cases


def run_all(cases=None) -> list[dict]:
    """Every node test of pocket's op set (`relevant`), each run once, and pattern_cases."""
    from pocket.importer.reader import supported_types

    claimed, handled = claimed_types(), set(supported_types())
    cases = collect() if cases is None else cases
    return ([run_case(c) for c in cases if relevant(c, claimed, handled)]
            + [run_case(c) for c in pattern_cases()])


def render(results: list[dict], seconds: float | None = None) -> str:
    import onnx

    claimed = claimed_types()
    by_type: dict[str, list[dict]] = defaultdict(list)
    for r in results:
        for t in r["op_types"]:
            if t in claimed:
                by_type[t].append(r)
    passed = sum(r["status"] == "passed" for r in results)
    lines = [
        "# ONNX backend node tests through `pocket import`",
        "",
        "Generated by `python bench/onnx_conformance.py` (do not edit): the node tests of "
        f"onnx {onnx.__version__} whose op type pocket imports, run through import + the engine "
        "and compared at each test's tolerance. `tests/importer/test_onnx_conformance.py` fails "
        "when a test that does not pass is missing from this file.",
        "",
        f"**{passed} of {len(results)} node tests pass** "
        f"({sum(r['status'] == 'failed' for r in results)} failed, "
        f"{sum(r['status'] == 'unsupported' for r in results)} unsupported)"
        + (f"; {seconds:.0f} s." if seconds is not None else "."),
        "",
        "Weights bound: a test whose node reads its weights as graph inputs runs with every "
        "input but the first as an initializer (pocket imports weights as constants). "
        "`pocket_*` tests are pocket's own, for chains the importer fuses into one op "
        "(`pattern_cases`: expected outputs from onnx's reference evaluator).",
        "",
        "| ONNX op | pocket op | passed | failed | unsupported |",
        "|---|---|---|---|---|",
    ]
    for t in sorted(by_type):
        rs = by_type[t]
        lines.append(f"| {t} | {claimed[t]} | {sum(r['status'] == 'passed' for r in rs)} | "
                     f"{sum(r['status'] == 'failed' for r in rs)} | "
                     f"{sum(r['status'] == 'unsupported' for r in rs)} |")
    lines += ["", "## Tests that do not pass, and why", ""]
    for t in sorted(by_type):
        bad = [r for r in by_type[t] if r["status"] != "passed"]
        if not bad:
            continue
        lines += [f"### {t}", ""]
        for r in bad:
            lines.append(f"- `{r['name']}`: {r['status']}: {r['reason'].replace('|', '/')}")
        lines.append("")
    lines += ["## Tests that pass", ""]
    lines.append(", ".join(f"`{r['name']}`" + (" (weights bound)" if r["bound"] else "")
                           for r in results if r["status"] == "passed"))
    return "\n".join(lines) + "\n"


def listed(report: str) -> dict[str, str]:
    """test name -> the status the report gives it (for the tests that do not pass)."""
    out = {}
    for line in report.splitlines():
        if line.startswith("- `") and "`: " in line:
            name, rest = line[3:].split("`: ", 1)
            out[name] = rest.split(":", 1)[0]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-o", "--output", default=str(REPORT))
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    t = time.perf_counter()
    results = run_all()
    seconds = time.perf_counter() - t
    Path(a.output).write_text(render(results, seconds))
    passed = sum(r["status"] == "passed" for r in results)
    if a.json:
        print(json.dumps({"passed": passed, "total": len(results), "results": results}))
    else:
        print(f"{passed} of {len(results)} node tests pass; report: {a.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
