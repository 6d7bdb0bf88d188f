"""Per-layer agreement of a QDQ import with onnxruntime: where pocket's int8 codes and
onnxruntime's part, and whether they part because an op means something else or because the
network amplifies a one-code rounding difference.

    python bench/onnx_qdq_layers.py MODEL.qdq.onnx [--n 2] [--json]

Every QuantizeLinear output of the model becomes an extra graph output of onnxruntime's session
(its default, fused graph: on x86 an int8-activation Conv stays DQ -> float Conv -> Q, since
onnxruntime allows s8 x s8 QLinearConv only on ARM; Add, Mul, Concat, GlobalAveragePool,
Sigmoid become its QLinear* integer kernels), and of the same session unfused (ORT_DISABLE_ALL,
plain float Q/DQ). Pocket's import runs in the reference interpreter (formats/reference.py, what
the engine's kernels are tested to equal bit for bit) and is compared on the same values twice:

    alone    each pocket node fed onnxruntime's own input codes: the codes it gets wrong are
             its own, grouped by op and producer (`conv2d(quantize)`)
    chained  pocket's run end to end: the first value that differs, and how the share of
             differing codes grows layer by layer (next to onnxruntime fused vs unfused)

Needs onnx and onnxruntime; inputs are bench/onnx_models.py's (standard normal, 3x224x224).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np


def _ort_codes(path: Path, x: np.ndarray) -> tuple[dict, dict, list[str]]:
    """{Q output: int8 codes} from onnxruntime fused and unfused; the Q outputs in graph order."""
    import onnx
    import onnxruntime as ort

    m = onnx.load(str(path))
    inits = {t.name: t.data_type for t in m.graph.initializer}
    qs = [n for n in m.graph.node if n.op_type == "QuantizeLinear"]
    have = {o.name for o in m.graph.output}
    for n in qs:
        if n.output[0] not in have:
            elem = inits.get(n.input[2], onnx.TensorProto.UINT8) if len(n.input) > 2 else 2
            m.graph.output.append(onnx.helper.make_tensor_value_info(n.output[0], elem, None))
    names = [o.name for o in m.graph.output]
    iname = m.graph.input[0].name
    runs = []
    for level in (ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                  ort.GraphOptimizationLevel.ORT_DISABLE_ALL):
        so = ort.SessionOptions()
        so.graph_optimization_level = level
        so.intra_op_num_threads = 1
        s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        # uint8 codes -> pocket's int8 (zero point - 128, as the importer maps them)
        runs.append({k: (v.astype(np.int16) - 128).astype(np.int8) if v.dtype == np.uint8 else v
                     for k, v in zip(names, s.run(None, {iname: x}))})
    return runs[0], runs[1], [n.output[0] for n in qs]


def layers(path: str | Path, n: int = 2) -> dict:
    from pocket.formats import ops, reference  # noqa: F401 - registers the references
    from pocket.importer.app import import_onnx

    path = Path(path)
    x = np.random.default_rng(7).standard_normal((n, 3, 224, 224)).astype(np.float32)
    fused, plain, qouts = _ort_codes(path, x)
    imp = import_onnx(path)
    g = imp.graph
    made = {o: nd for nd in g.nodes for o in nd.outputs}

    def run(node, env):
        kw = {}
        if ops.OPS[node.op].int8 == ops.INT8_LAYER and "x_scale" in node.attrs:
            kw["w_scale"] = np.asarray(imp.quant[node.inputs[1]]["scale"], np.float32)
        return ops.impl("reference", node.op)(node.attrs, *(env[i] for i in node.inputs), **kw)

    alone: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # differing, total, by > 1
    chained_env = {**imp.params, next(iter(g.inputs)): x}
    alone_env = dict(chained_env)
    for node in g.nodes:
        out = node.outputs[0]
        chained_env[out] = run(node, chained_env)
        y = run(node, alone_env)
        if out in fused and y.dtype == np.int8 and fused[out].size == y.size:
            # NOTE: a channel shuffle's transpose is 5-D in ONNX, (N, C/g, g, H, W): the same
            # memory as pocket's (N, C, H, W) result.
            fused[out] = fused[out].reshape(y.shape)
            d = np.abs(y.astype(np.int32) - fused[out].astype(np.int32))
            key = f"{node.op}({','.join(made[i].op for i in node.inputs if i in made)})"
            alone[key][0] += int((d > 0).sum())
            alone[key][1] += d.size
            alone[key][2] += int((d > 1).sum())
            y = fused[out]
        alone_env[out] = y
    chain, first = [], None
    for q in qouts:
        a = chained_env.get(q)
        if a is None or a.dtype != np.int8 or a.size != fused[q].size:
            continue
        d = np.abs(a.astype(np.int32) - fused[q].reshape(a.shape).astype(np.int32))
        own = np.abs(plain[q].astype(np.int32) - fused[q].astype(np.int32).reshape(plain[q].shape))
        row = {"value": q, "op": made[q].op if q in made else "?", "codes": d.size,
               "differ": int((d > 0).sum()), "differ_by_more_than_1": int((d > 1).sum()),
               "onnxruntime_unfused_differ": int((own > 0).sum())}
        chain.append(row)
        if first is None and row["differ"]:
            first = row
    return {"model": path.name, "inputs": n,
            "alone": {k: {"differ": v[0], "codes": v[1], "differ_by_more_than_1": v[2]}
                      for k, v in sorted(alone.items())},
            "alone_agreement": 1 - sum(v[0] for v in alone.values())
            / max(1, sum(v[1] for v in alone.values())),
            "first_difference": first, "chained": chain,
            "output": chained_env[g.outputs[0]]}  # the reference's result, for the engine


def render(r: dict) -> str:
    lines = [f"{r['model']}: {r['inputs']} inputs; each pocket node fed onnxruntime's codes "
             f"agrees on {100 * r['alone_agreement']:.5f}% of codes"]
    for k, v in r["alone"].items():
        lines.append(f"  alone  {k:<36} {v['differ']:>6} of {v['codes']:>9} codes differ "
                     f"({v['differ_by_more_than_1']} by more than 1)")
    f = r["first_difference"]
    if f:
        lines.append(f"  chained: first difference at {f['value']} ({f['op']}): {f['differ']} "
                     f"of {f['codes']} codes, {f['differ_by_more_than_1']} by more than 1")
    for c in r["chained"]:
        lines.append(f"  chained {c['value'][:56]:<56} {c['op']:<10} pocket vs onnxruntime "
                     f"{100 * c['differ'] / c['codes']:7.3f}% (>1: {c['differ_by_more_than_1']:>5})"
                     f"   onnxruntime fused vs unfused "
                     f"{100 * c['onnxruntime_unfused_differ'] / c['codes']:7.3f}%")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--n", type=int, default=2)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    r = layers(a.model, a.n)
    r.pop("output")
    print(json.dumps(r) if a.json else render(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
