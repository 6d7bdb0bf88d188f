"""`pocket compare`: the same inputs through the training model, the `.bin` engine and
onnxruntime; per pair the error metrics, per engine the accuracy, and gates that fail loudly.

The training model is rebuilt from the checkpoint's config and fp32 weights and run by
pocket.train in eval mode: that is the model the user trained, not its traced graph, so a
tracing or export bug cannot hide by being on both sides of a comparison.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from pocket.errors import PocketError

# Default gates by the precision of the pair (the looser side decides).
# fp32: exports must reproduce the training model to float32 rounding.
# int8: outputs move by quantization noise; top-1 must rarely change.
GATES = {
    "fp32": {"atol": 1e-4, "rtol": 1e-4, "min_agreement": 0.99},
    "int8": {"atol": None, "rtol": 0.1, "min_agreement": 0.97},
}


# Spiking models whose output is spike counts (a final lif with output "count") are gated on
# count agreement instead of atol/rtol (one spike more is an error of 1, not of rounding): the
# share of samples whose count vector differs anywhere. Not zero for fp32: a membrane that lands
# within float32 rounding of the threshold fires in one engine and not in another, because each
# sums its synaptic currents in its own order (the training model in float32 BLAS, the engine
# and the reference in float64, onnxruntime in its own float32 GEMM), and one flipped spike
# changes the counts after it. int8 weights move every current, so only top-1 is gated there.
SPIKE_GATES = {"fp32": 0.01, "int8": None}


class CompareError(PocketError):
    """Inputs or models that cannot be compared (shape mismatch, missing onnxruntime...)."""


# --------------------------------------------------------------------------- engines

def _training_model(ckpt: str):
    from pocket.train import backend, lora
    from pocket.train.checkpoint import load_checkpoint
    from pocket.train.models import build_model

    ck = load_checkpoint(ckpt)
    meta = ck["meta"]
    ds = meta.get("dataset", {})
    input_shape = tuple(ds.get("input_shape") or ck["graph"].inputs[
        next(iter(ck["graph"].inputs))].shape[1:])
    num_outputs = int(ck["graph"].output_infos()[0].shape[-1])
    if ds.get("task") == "embedding":
        from pocket.compare_embed import rebuild

        model = rebuild(ck, input_shape)
    else:
        model = build_model(meta["config"]["model"], input_shape, num_outputs,
                            np.random.default_rng(0))
        lora.apply_config(model, meta["config"])  # a LoRA run's adapters, as it trained them
    model.load_state_dict({k: v for k, v in ck["state"].items()
                           if k in dict(model.state_dict())})
    model.eval()
    model.to(backend.get_device("cpu"))
    return model, ck


def _run_training(model, x: np.ndarray, batch: int = 256) -> np.ndarray:
    from pocket.train.tensor import Tensor, no_grad

    outs = []
    with no_grad():
        for i in range(0, len(x), batch):
            outs.append(np.asarray(model(Tensor(x[i:i + batch])).data, np.float32))
    return np.concatenate(outs)


def _run_bin(path: str, x: np.ndarray) -> tuple[np.ndarray, bool]:
    from pocket.infer import Engine

    with Engine(path, max_batch=min(64, max(1, len(x)))) as eng:
        if tuple(eng.input_shape) != tuple(x.shape[1:]):
            raise CompareError(f"{path}: the model takes inputs of shape {list(eng.input_shape)}, "
                               f"the inputs have {list(x.shape[1:])}")
        int8 = any(n.op == "quantize" or "x_scale" in n.attrs for n in eng.graph.nodes) or any(
            v.dtype == "i8" for v in eng.graph.params.values())  # weight-only int8 (lif)
        return np.array(eng.run(x, copy=True), np.float32), int8


def _run_onnx(path: str, x: np.ndarray) -> tuple[np.ndarray, bool]:
    try:
        import onnx
        import onnxruntime as ort
    except ImportError:
        raise CompareError("comparing an ONNX model needs onnxruntime: "
                           "pip install 'pocketnn[onnx]'") from None
    if not Path(path).is_file():
        raise CompareError(f"{path}: no such file")
    try:
        model = onnx.load(path)
    except Exception as e:  # noqa: BLE001 - onnx raises many types for a bad file
        raise CompareError(f"{path}: not a readable ONNX model ({type(e).__name__})") from None
    int8 = any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in model.graph.node)
    opts = exact_session_options(ort)
    opts.log_severity_level = 3
    try:
        sess = ort.InferenceSession(model.SerializeToString(), opts,
                                    providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001
        raise CompareError(f"{path}: onnxruntime cannot load it: {e}") from None
    name = sess.get_inputs()[0].name
    outs = [sess.run(None, {name: x[i:i + 256]})[0] for i in range(0, len(x), 256)]
    return np.concatenate(outs).astype(np.float32), int8


def exact_session_options(ort):
    """onnxruntime SessionOptions whose int8 kernels compute exactly on every x86 CPU.

    NOTE: without AVX-512 VNNI (AVX2 machines, older AVX-512 ones) onnxruntime's default
    u8s8 GEMM sums pairs of products in int16 with saturation (VPMADDUBSW): a QDQ model's
    convs then drift far from the int8 arithmetic its file defines (MobileNetV3-Small's int8
    export: 8.4% of the output range, top-1 changed; the digits CNN: max_rel 0.17; see
    bench/ort_int8_precision.py). session.x64quantprecision=1 makes
    it use its exact u8u8 kernels there; VNNI and ARM machines are unaffected."""
    opts = ort.SessionOptions()
    opts.add_session_config_entry("session.x64quantprecision", "1")
    return opts


# --------------------------------------------------------------------------- metrics

def pair_metrics(ref: np.ndarray, out: np.ndarray, classification: bool) -> dict:
    ref64, out64 = ref.astype(np.float64), out.astype(np.float64)
    diff = np.abs(out64 - ref64)
    scale = float(np.abs(ref64).max()) if ref64.size else 0.0
    a, b = ref64.ravel(), out64.ravel()
    denom = float(np.linalg.norm(a) * np.linalg.norm(b))
    noise = float(((ref64 - out64) ** 2).sum())
    m = {
        "max_abs": float(diff.max()) if diff.size else 0.0,
        "max_rel": float(diff.max() / scale) if diff.size and scale > 0 else 0.0,
        "mean_abs": float(diff.mean()) if diff.size else 0.0,
        "cosine": float(a @ b / denom) if denom > 0 else 1.0,
        "sqnr_db": (float(10 * np.log10((ref64**2).sum() / noise)) if noise > 0 else math.inf),
    }
    if classification and ref.ndim == 2 and ref.shape[1] > 1:
        m["top1_agreement"] = float((ref.argmax(1) == out.argmax(1)).mean())
    return m


def spike_counts(graph) -> bool:
    """Whether the graph's output is spike counts (its last node a lif decoding by count)."""
    last = graph.nodes[-1] if graph.nodes else None
    return last is not None and last.op == "lif" and last.attrs.get("output") == "count"


def count_metrics(ref: np.ndarray, out: np.ndarray) -> dict:
    differ = (ref.reshape(len(ref), -1) != out.reshape(len(out), -1)).any(axis=1)
    return {"count_mismatch_samples": int(differ.sum()),
            "count_mismatch": float(differ.mean()) if len(differ) else 0.0,
            "count_mismatch_spikes": int(np.abs(ref.astype(np.int64) - out.astype(np.int64)).sum())}


def _gate(metrics: dict, gates: dict) -> list[str]:
    fails = []
    limit = gates.get("max_count_mismatch")
    if limit is not None and metrics.get("count_mismatch", 0.0) > limit:
        fails.append(f"{metrics['count_mismatch_samples']} samples' spike counts differ "
                     f"({metrics['count_mismatch']:.2%} > max_count_mismatch {limit:g})")
    if gates["atol"] is not None and metrics["max_abs"] > gates["atol"]:
        fails.append(f"max_abs {metrics['max_abs']:.3g} > atol {gates['atol']:g}")
    if gates["rtol"] is not None and metrics["max_rel"] > gates["rtol"]:
        fails.append(f"max_rel {metrics['max_rel']:.3g} > rtol {gates['rtol']:g}")
    agree = metrics.get("top1_agreement")
    if gates["min_agreement"] is not None and agree is not None and agree < gates["min_agreement"]:
        fails.append(f"top1_agreement {agree:.4f} < min_agreement {gates['min_agreement']:g}")
    return fails


# --------------------------------------------------------------------------- inputs

def _inputs(ck: dict, data: str | None, inputs_path: str | None, random_n: int | None,
            limit: int | None) -> tuple[np.ndarray, np.ndarray | None, str]:
    shape = tuple(ck["meta"].get("dataset", {}).get("input_shape") or ())
    if inputs_path:
        from pocket.formats.sniff import check_file
        from pocket.infer.inputs import read_npy

        check_file(inputs_path, "inputs file")
        with open(inputs_path, "rb") as f:
            if f.read(2) == b"PK":
                raise CompareError(f"{inputs_path}: give a .npy array, not an .npz archive")
            f.seek(0)
            x = read_npy(f, inputs_path)
        if x.dtype.kind not in "biuf":
            raise CompareError(f"{inputs_path}: holds {x.dtype} values; expected real numbers")
        x = np.asarray(x, np.float32)
        if x.shape == shape:
            x = x[None]
        if tuple(x.shape[1:]) != shape:
            raise CompareError(f"{inputs_path}: shape {list(x.shape)} does not fit the model's "
                               f"input {['N', *shape]}")
        source, y = inputs_path, None
    elif random_n:
        x = np.random.default_rng(0).standard_normal((random_n, *shape)).astype(np.float32)
        source, y = f"random normal x {random_n}", None
    else:
        from pocket.train.data import load_dataset

        cfg = ck["meta"]["config"]
        src = data or cfg["data"]["source"]
        ds = load_dataset(src, target=cfg["data"]["target"], task=cfg["data"]["task"],
                          val_fraction=cfg["data"]["val_fraction"],
                          test_fraction=cfg["data"]["test_fraction"],
                          cache_dir=cfg["data"]["cache_dir"], seed=cfg["run"]["seed"],
                          limit=cfg["data"]["limit"],
                          **{k: cfg["data"][k] for k in ("window", "horizon", "stride", "season",
                                                         "time_column", "relative", "layout", "classes",
                                                         "holdout")
                             if k in cfg["data"]})  # timeseries:PATH
        if tuple(ds.input_shape) != shape:
            raise CompareError(f"dataset {src}: inputs {list(ds.input_shape)} do not fit the "
                               f"model's {list(shape)}")
        # NOTE: the checkpoint's normalization statistics are what the exports carry; the
        # dataset is re-normalized identically because the split and statistics are seeded.
        x, y, source = ds.test.x, ds.test.y, f"{src} (test split)"
    if limit:
        x = x[:limit]
        y = None if y is None else y[:limit]
    if len(x) == 0:
        if not inputs_path and not random_n:
            raise CompareError(f"{source} holds no samples (the checkpoint was trained with "
                               "test_fraction = 0?); pass --inputs X.npy, --random N or --data SRC")
        raise CompareError(f"{source}: no inputs to compare")
    return np.ascontiguousarray(x, np.float32), y, source


def _token_ids(graph, x: np.ndarray, random_n: int | None) -> np.ndarray:
    """x as the graph input's integer dtype where an embedding reads it (token ids): random
    ids in [0, V) for --random, whole numbers checked otherwise."""
    name = next(iter(graph.inputs))
    if graph.inputs[name].dtype not in ("i64", "i32"):
        return x
    if random_n:
        vocab = min(graph.params[n.inputs[1]].shape[0] for n in graph.nodes
                    if n.op == "embedding" and n.inputs[0] == name)
        return np.random.default_rng(0).integers(0, vocab, x.shape)
    if not np.array_equal(x, np.rint(x)):
        raise CompareError("the model reads token ids: the inputs must be whole numbers")
    return x.astype(np.int64)


# --------------------------------------------------------------------------- main

def compare(ckpt: str, *, bin_path: str | None = None, onnx_path: str | None = None,
            data: str | None = None, inputs_path: str | None = None, random_n: int | None = None,
            limit: int | None = None, atol: float | None = None, rtol: float | None = None,
            min_agreement: float | None = None, max_count_mismatch: float | None = None,
            min_cosine: float | None = None) -> dict:
    """Run every engine on the same inputs; result["passed"] is False when a gate fails.
    Embedding models are gated on cosine and retrieval agreement (compare_embed.py)."""
    model, ck = _training_model(ckpt)
    task = ck["meta"].get("dataset", {}).get("task", "classification")
    classification = task == "classification"
    embedding = task == "embedding"
    if embedding:
        from pocket import compare_embed
    counts = spike_counts(ck["graph"])
    x, y, source = _inputs(ck, data, inputs_path, random_n, limit)
    x = _token_ids(ck["graph"], x, random_n)
    outputs = {"train": _run_training(model, x)}
    precision = {"train": "fp32"}
    paths = {"train": ckpt}
    if bin_path:
        outputs["bin"], int8 = _run_bin(bin_path, x)
        precision["bin"], paths["bin"] = ("int8" if int8 else "fp32"), bin_path
    if onnx_path:
        outputs["onnx"], int8 = _run_onnx(onnx_path, x)
        precision["onnx"], paths["onnx"] = ("int8" if int8 else "fp32"), onnx_path
    for name, out in outputs.items():
        if out.shape != outputs["train"].shape:
            raise CompareError(f"{paths[name]}: output shape {list(out.shape)} differs from the "
                               f"training model's {list(outputs['train'].shape)}")
    engines = {}
    for name, out in outputs.items():
        e = {"path": paths[name], "precision": precision[name]}
        if y is not None and classification:
            e["accuracy"] = float((out.argmax(1) == y).mean())
        elif y is not None and embedding:
            e["retrieval_top1"] = compare_embed.retrieval_top1(out, y)
        elif y is not None:
            e["mse"] = float(((out.reshape(len(y), -1) - y.reshape(len(y), -1)) ** 2).mean())
        engines[name] = e
    pairs, failures = [], []
    names = list(outputs)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            kind = "int8" if "int8" in (precision[a], precision[b]) else "fp32"
            gates = dict(GATES[kind])
            if counts:
                gates.update(atol=None, rtol=None, max_count_mismatch=SPIKE_GATES[kind])
            if embedding:
                gates.update(compare_embed.GATES[kind])
            for key, val in (("atol", atol), ("rtol", rtol), ("min_agreement", min_agreement),
                             ("max_count_mismatch", max_count_mismatch),
                             ("min_cosine", min_cosine)):
                if val is not None:
                    gates[key] = val
            m = pair_metrics(outputs[a], outputs[b], classification)
            if counts:
                m.update(count_metrics(outputs[a], outputs[b]))
            if embedding:
                m.update(compare_embed.metrics(outputs[a], outputs[b]))
            fails = _gate(m, gates) + (compare_embed.gate(m, gates) if embedding else [])
            pairs.append({"pair": f"{a} vs {b}", "precision": kind, "gates": gates,
                          "metrics": m, "passed": not fails, "failures": fails})
            failures += [f"{a} vs {b}: {f}" for f in fails]
    return {"checkpoint": ckpt, "inputs": source, "samples": int(len(x)), "task": task,
            "spike_counts": counts, "engines": engines, "pairs": pairs, "passed": not failures,
            "failures": failures}


def render(r: dict) -> str:
    lines = [f"compared {r['samples']} inputs from {r['inputs']}", ""]
    lines.append(f"{'engine':<7} {'precision':<9} {'accuracy':>9}  file")
    for name, e in r["engines"].items():
        acc = f"{e['accuracy'] * 100:.2f}%" if "accuracy" in e else (
            f"mse {e['mse']:.3g}" if "mse" in e else
            f"r@1 {e['retrieval_top1']:.1%}" if "retrieval_top1" in e else "-")
        lines.append(f"{name:<7} {e['precision']:<9} {acc:>9}  {e['path']}")
    lines.append("")
    head = (f"{'pair':<15} {'max_abs':>9} {'max_rel':>9} {'mean_abs':>9} {'cosine':>9} "
            f"{'sqnr_db':>8} {'top1':>7}  gate")
    lines.append(head)
    for p in r["pairs"]:
        m = p["metrics"]
        top1 = f"{m['top1_agreement'] * 100:.2f}%" if "top1_agreement" in m else "-"
        lines.append(f"{p['pair']:<15} {m['max_abs']:>9.2e} {m['max_rel']:>9.2e} "
                     f"{m['mean_abs']:>9.2e} {m['cosine']:>9.6f} {m['sqnr_db']:>8.1f} "
                     f"{top1:>7}  {'pass' if p['passed'] else 'FAIL'} ({p['precision']})")
    if r.get("task") == "embedding":
        lines += ["", "embeddings: per-sample cosine, and nearest-neighbour (retrieval) agreement"]
        for p in r["pairs"]:
            m = p["metrics"]
            agree = m.get("retrieval_agreement")
            lines.append(f"  {p['pair']:<15} cosine min {m['cosine_min']:.6f} mean "
                         f"{m['cosine_mean']:.6f}, retrieval agreement "
                         + (f"{agree:.2%}" if agree is not None else "-")
                         + f"  (gates {p['gates']['min_cosine']:g}, "
                           f"{p['gates']['min_agreement']:g})")
    if r.get("spike_counts"):
        lines += ["", "spike counts (the output): samples whose counts differ"]
        for p in r["pairs"]:
            m, lim = p["metrics"], p["gates"].get("max_count_mismatch")
            gate = f"gate {lim:.2%}" if lim is not None else "not gated (top-1 is)"
            lines.append(f"  {p['pair']:<15} {m['count_mismatch_samples']:>5} of {r['samples']} "
                         f"({m['count_mismatch']:.2%}), {m['count_mismatch_spikes']} spikes; {gate}")
    lines.append("")
    if r["passed"]:
        lines.append("PASS: every pair is within its gates")
    else:
        lines += [f"FAIL {f}" for f in r["failures"]]
    return "\n".join(lines)


# --------------------------------------------------------------------------- an imported model


def compare_onnx(onnx_path: str, *, bin_path: str | None = None, inputs_path: str | None = None,
                 random_n: int | None = None, limit: int | None = None,
                 atol: float | None = None, rtol: float | None = None,
                 min_agreement: float | None = None) -> dict:
    """An ONNX model from elsewhere: onnxruntime on it against pocket's engine on its import
    (`bin_path`, or the file imported in memory); no checkpoint involved."""
    from pocket.importer.app import import_onnx

    imp = import_onnx(onnx_path)
    info = next(iter(imp.graph.inputs.values()))
    shape = tuple(info.shape[1:])
    if not all(isinstance(d, int) for d in shape):
        raise CompareError(f"{onnx_path}: input dims after the batch must be fixed, got "
                           f"{list(info.shape)}")
    ck = {"meta": {"dataset": {"input_shape": list(shape)}}}
    x, _, source = _inputs(ck, None, inputs_path, random_n or (None if inputs_path else 16), limit)
    outputs = {"onnx": _run_onnx(onnx_path, x)[0]}
    if bin_path:
        outputs["bin"], int8 = _run_bin(bin_path, x)
    else:
        from pocket.importer.app import as_bin

        with as_bin(onnx_path) as tmp:
            outputs["bin"], int8 = _run_bin(tmp, x)
    if outputs["bin"].shape != outputs["onnx"].shape:
        raise CompareError(f"output shapes differ: engine {list(outputs['bin'].shape)}, "
                           f"onnxruntime {list(outputs['onnx'].shape)}")
    classification = outputs["onnx"].ndim == 2 and outputs["onnx"].shape[1] > 1
    kind = "int8" if int8 or imp.report["qdq"] else "fp32"
    gates = dict(GATES[kind])
    for key, val in (("atol", atol), ("rtol", rtol), ("min_agreement", min_agreement)):
        if val is not None:
            gates[key] = val
    m = pair_metrics(outputs["onnx"], outputs["bin"], classification)
    fails = _gate(m, gates)
    engines = {"onnx": {"path": onnx_path, "precision": kind},
               "bin": {"path": bin_path or f"{onnx_path} (imported in memory)", "precision": kind}}
    return {"checkpoint": None, "model": onnx_path, "inputs": source, "samples": int(len(x)),
            "task": "classification" if classification else None, "engines": engines,
            "pairs": [{"pair": "onnx vs bin", "precision": kind, "gates": gates, "metrics": m,
                       "passed": not fails, "failures": fails}],
            "passed": not fails, "failures": [f"onnx vs bin: {f}" for f in fails]}
