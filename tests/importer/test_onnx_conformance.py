"""The ONNX backend node tests of pocket's op set through import + the engine (see
bench/onnx_conformance.py): prints the pass count, and fails when a test that does not pass is
missing from the committed report (bench/onnx_conformance.md) or has changed status there."""

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("onnx")
ROOT = Path(__file__).resolve().parents[2]


def _runner():
    spec = importlib.util.spec_from_file_location("onnx_conformance",
                                                  ROOT / "bench" / "onnx_conformance.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_node_tests_pass_or_the_report_says_why(capsys):
    oc = _runner()
    results = oc.run_all()
    passed = [r for r in results if r["status"] == "passed"]
    with capsys.disabled():
        print(f"\nONNX node tests: {len(passed)} of {len(results)} pass through pocket import")
    listed = oc.listed(oc.REPORT.read_text())
    unexplained = [f"{r['name']} ({r['status']}: {r['reason']})" for r in results
                   if r["status"] != "passed" and listed.get(r["name"]) != r["status"]]
    assert not unexplained, ("node tests that do not pass and that bench/onnx_conformance.md "
                             "does not name (run python bench/onnx_conformance.py):\n"
                             + "\n".join(unexplained))
    assert len(passed) >= 70
