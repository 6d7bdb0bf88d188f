"""Per-layer agreement of a QDQ import with onnxruntime: where pocket's int8 codes and
onnxruntime's part, and whether they part because an op means something else or because the
network amplifies a one-code rounding difference.

    python bench/onnx_qdq_layers.py MODEL.qdq.onnx [--n 2] [--json]

onnxruntime's codes come from its own optimized graph (what its default session runs), with
every value exposed, and from the file run unfused (ORT_DISABLE_ALL: plain float Q/DQ). On x86
that optimized graph turns int8 activations into uint8 (zero point + 128) and runs most Convs
as U8S8 QLinearConv (integer, requantized in float32), keeps a Conv whose output also feeds a
float op (a residual Add) as float DQ -> Conv -> Q, and runs Gemm, GlobalAveragePool and some
Sigmoids as QGemm / QLinear* kernels; Add, Mul and the rest stay float between Q/DQ pairs.
Pocket's import runs in the reference interpreter (formats/reference.py, what
the engine's kernels are tested to equal bit for bit) and is compared on the same values twice:

    alone    each pocket node fed onnxruntime's own input codes: the codes it gets wrong are
             its own, grouped by op and producer (`conv2d(quantize)`)
    chained  pocket's run end to end: the first value that differs, and how the share of
             differing codes grows layer by layer (next to onnxruntime fused vs unfused)

Needs onnx and onnxruntime; the inputs are bench/onnx_models.py's (standard normal, seed 7).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np


def _ort_codes(path: Path, x: np.ndarray) -> tuple[dict, dict, list[str]]:
    """{Q output of the file: int8 codes} from onnxruntime fused and unfused; the Q outputs.

    NOTE: the fused codes come from onnxruntime's own optimized graph (ORT_ENABLE_EXTENDED,
    which computes what its default ORT_ENABLE_ALL does), saved and run as it is with every
    value exposed: exposing the file's Q outputs instead stops most fusions (a fused node may
    not feed a graph output). On x86 that graph turns int8 activations into uint8 (zero point
    + 128) for QLinearConv, so its values have new names; `_fused_names` maps them back.
    """
    import tempfile

    import onnx
    import onnxruntime as ort

    src = onnx.load(str(path))
    qs = [n.output[0] for n in src.graph.node if n.op_type == "QuantizeLinear"]
    iname = src.graph.input[0].name
    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.optimized_model_filepath = str(Path(tmp) / "fused.onnx")
        so.log_severity_level = 3
        ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        fused = onnx.load(so.optimized_model_filepath)
    names = _fused_names(src, fused)
    runs = []
    for m, want in ((fused, names), (src, {q: q for q in qs})):
        have = {o.name for o in m.graph.output}
        for v in want:
            if v not in have:
                m.graph.output.append(onnx.helper.make_empty_tensor_value_info(v))
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.intra_op_num_threads = 1
        so.log_severity_level = 3
        s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        outs = [o.name for o in s.get_outputs()]
        # uint8 codes -> pocket's int8 (zero point - 128, as the importer maps them)
        runs.append({want[k]: (v.astype(np.int16) - 128).astype(np.int8)
                     if v.dtype == np.uint8 else v
                     for k, v in zip(outs, s.run(None, {iname: x})) if k in want})
    return runs[0], runs[1], [q for q in qs if q in runs[0] and q in runs[1]]


def _fused_names(src, fused) -> dict[str, str]:
    """{value of onnxruntime's fused graph: the file's Q output it holds}, for every fused value
    that holds one: a node of the fused graph is matched to the file's node of the same op
    (QLinearConv to Conv, QGemm to Gemm, QLinearAdd to Add, ...) by its weights, or else by the
    Q outputs its inputs hold; its output then holds the Q output that follows that node."""
    made = {o: n for n in src.graph.node for o in n.output}
    readers: dict[str, list] = {}
    for n in src.graph.node:
        for v in n.input:
            readers.setdefault(v, []).append(n)

    def source(v):  # the Q output a DequantizeLinear'd input of the file reads, or None
        dq = made.get(v)
        return dq.input[0] if dq is not None and dq.op_type == "DequantizeLinear" else None

    def q_after(node):  # the Q that quantizes node's output (through a Relu/Clip the Q made redundant)
        for _ in range(2):
            nxt = readers.get(node.output[0], [])
            q = [r for r in nxt if r.op_type == "QuantizeLinear"]
            if q:
                return q[0].output[0]
            if len(nxt) != 1 or nxt[0].op_type not in ("Relu", "Clip"):
                return None
            node = nxt[0]
        return None

    base = {"QLinearConv": "Conv", "QGemm": "Gemm", "QLinearMatMul": "MatMul"}
    out: dict[str, str] = {}
    for n in fused.graph.node:
        if n.op_type == "QuantizeLinear":
            q = [r.output[0] for r in readers.get(n.input[0], []) if r.op_type == "QuantizeLinear"]
            if q:
                out[n.output[0]] = q[0]
            continue
        if n.op_type == "DequantizeLinear":
            continue
        op = base.get(n.op_type, n.op_type.removeprefix("QLinear"))
        cands = [m for m in src.graph.node if m.op_type == op]
        if op in ("Conv", "Gemm", "MatMul") and len(n.input) > 3:
            cands = [m for m in cands if len(m.input) > 1 and source(m.input[1]) == n.input[3]]
        else:
            ins = {out[v] for v in n.input if v in out}
            cands = [m for m in cands if ins and {source(v) for v in m.input} - {None} == ins]
        if len(cands) == 1:
            q = q_after(cands[0])
            if q is not None:
                out[n.output[0]] = q
    return out


def layers(path: str | Path, n: int = 2) -> dict:
    from pocket.formats import ops, reference  # noqa: F401 - registers the references
    from pocket.importer.app import import_onnx

    path = Path(path)
    imp = import_onnx(path)
    g = imp.graph
    shape = next(iter(g.inputs.values())).shape[1:]
    x = np.random.default_rng(7).standard_normal((n, *shape)).astype(np.float32)
    fused, plain, qouts = _ort_codes(path, x)
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
    # NOTE: in pocket's (topological) order: quantize_static's files list nodes out of order.
    order = {o: i for i, nd in enumerate(g.nodes) for o in nd.outputs}
    for q in sorted((q for q in qouts if q in order), key=order.get):
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
