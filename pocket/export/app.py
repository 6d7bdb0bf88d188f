"""`pocket export`: checkpoint -> optimized (optionally int8) model as .bin or .onnx, and a report.

The report is plain JSON (what `--json` prints); `render` turns it into text.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import numpy as np

from pocket.export import onnx_export  # noqa: F401 - registers the ONNX mapping of every op
from pocket.export.calibrate import DEFAULT_PERCENTILE, METHODS, RUN_BATCH, batches, run_pass
from pocket.export.errors import ExportError
from pocket.export.quantize import (
    DEFAULT_CALIB_SAMPLES,
    DEFAULT_MAX_LAYER_ERROR,
    layer_values,
    quantize_graph,
)
from pocket.export.sensitivity import SENSITIVITY_SAMPLES, layer_sensitivity, meet_target
from pocket.export.transforms import optimize
from pocket.formats import ops, reference
from pocket.formats import quant as Q
from pocket.formats.container import HEADER_SIZE, decode_header, read_container, write_container
from pocket.formats.errors import FormatError
from pocket.formats.ir import Graph

FORMATS = ("bin", "onnx")
# The ops of a checkpoint both writers handle (the ONNX mapping is the narrower one); anything
# else is refused before any work, naming the node.
SUPPORTED = tuple(sorted(n for n, op in ops.OPS.items()
                         if op.trainable and "onnx_export" in op.impls))
# Samples on which the fp32 transforms are checked against the checkpoint graph. Few: every
# output of each is compared, and at 224x224 a sample costs ~0.5 CPU-s in the reference
# interpreter (the fp32 export's whole cost).
CHECK_SAMPLES = 8


class _Timer:
    """Wall seconds per export phase for the report's `timings`, and the process's CPU seconds
    in `cpu_timings` (both threads of BLAS; on a loaded machine wall time is the larger)."""

    def __init__(self):
        self.s: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str):
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.s[phase] = round(self.s.get(phase, 0.0) + time.perf_counter() - t0, 3)
            self.cpu[phase] = round(self.cpu.get(phase, 0.0) + time.process_time() - c0, 3)


def export(ckpt_path: str | os.PathLike, out_path: str | os.PathLike | None = None, *,
           fmt: str | None = None, int8: bool = False, calib_samples: int | None = None,
           calib_path: str | os.PathLike | None = None, max_layer_error: float | None = None,
           calib_method: str | None = None, percentile: float | None = None,
           int8_target: float | None = None, sensitivity_samples: int | None = None) -> dict:
    """Export a checkpoint; returns the report (see `render`).

    fmt: "bin" or "onnx"; None takes it from out_path's suffix (".onnx"), else "bin".
    Default output: model[.int8].bin|onnx next to the checkpoint.
    int8 options: calib_method (minmax, percentile, mse, entropy; default minmax), percentile
    (for the percentile method, default 99.99), int8_target (an output SQNR in dB: the most
    sensitive layers fall back to fp32 until it is met), sensitivity_samples (how many
    calibration samples measure each layer's sensitivity; default none, 16 with a target).
    """
    timer = _Timer()
    ckpt_path = Path(ckpt_path)
    fmt = _format(fmt, out_path)
    with timer("read"):
        graph, params, calib, ckpt_meta = _read_checkpoint(
            ckpt_path, need_calib=int8 and not calib_path)
    # The run's [export] section gives the defaults; arguments (the CLI's flags) win.
    cfg = (ckpt_meta.get("config") or {}).get("export") or {}
    calib_method = calib_method if calib_method is not None else cfg.get("calibration")
    percentile = percentile if percentile is not None else cfg.get("percentile")
    int8_target = int8_target if int8_target is not None else cfg.get("int8_target")
    if sensitivity_samples is None:
        sensitivity_samples = cfg.get("sensitivity_samples")
    method = calib_method or "minmax"
    if method not in METHODS:
        raise ExportError(f"calibration method must be one of {', '.join(METHODS)}, "
                          f"got {method!r}")
    pct = DEFAULT_PERCENTILE if percentile is None else float(percentile)
    if not 50 < pct <= 100:
        raise ExportError(f"percentile must be in (50, 100], got {pct:g}")
    if int8_target is not None and not (isinstance(int8_target, int | float)
                                        and math.isfinite(int8_target)):
        raise ExportError(f"int8 target must be a finite SQNR in dB, got {int8_target}")
    if sensitivity_samples is not None and not (isinstance(sensitivity_samples, int)
                                                and sensitivity_samples >= 0):
        raise ExportError(f"sensitivity samples must be a count >= 0, got {sensitivity_samples}")
    out = Path(out_path) if out_path is not None else ckpt_path.with_name(
        f"model{'.int8' if int8 else ''}.{fmt}")
    with timer("read"):
        _check_supported(graph)
        if int8 and len(graph.inputs) != 1:
            raise ExportError(f"int8 export calibrates a single-input graph; this one has "
                              f"{len(graph.inputs)} inputs ({', '.join(graph.inputs)})")
        if calib_path is not None:
            calib = _load_npz(calib_path)
        if calib is not None:
            calib = _check_calib(graph, calib, calib_samples if int8 else CHECK_SAMPLES)

    with timer("transforms"):
        fgraph, fparams, applied = optimize(graph, params)
    report: dict = {
        "checkpoint": str(ckpt_path), "output": str(out), "format": fmt, "int8": int8,
        "transforms": applied,
        "nodes": {"before": len(graph.nodes), "after": len(fgraph.nodes)},
        "timings": timer.s, "cpu_timings": timer.cpu,
    }
    for key in ("task", "dataset", "metrics"):
        value = graph.metadata.get(key, ckpt_meta.get(key))
        if value is not None:
            report[key] = value

    calibration = None
    if int8:
        # The one fp32 pass: ranges for every value, the fp32 outputs for the checks, and the
        # int8 layers' inputs and outputs for the guard.
        with timer("calibrate"):
            calibration = run_pass(fgraph, fparams, calib, subsample=method != "minmax",
                                   keep=layer_values(fgraph))
    if calib is not None:
        # The transforms must not change what the model computes: check on real samples.
        with timer("check"):
            xs = calib[:CHECK_SAMPLES]
            want = _run(graph, params, None, xs)
            got = (calibration.outputs[fgraph.outputs[0]][:len(xs)] if calibration is not None
                   else _run(fgraph, fparams, None, xs))
            report["transform_check"] = {"samples": len(xs),
                                         "max_abs_error": _diff(want, got)["max_abs_error"]}

    if not int8:
        fgraph.metadata = {**graph.metadata,
                           "export": {"int8": False, "calib_samples": 0, "layers_fp32": []}}
        with timer("write"):
            report["size"] = _write(fmt, out, fgraph, fparams, None, ckpt_path)
        return report

    quantize = partial(quantize_graph, fgraph, fparams, calib, max_layer_error=max_layer_error,
                       method=method, percentile=pct, calib=calibration)
    with timer("quantize"):
        qz = quantize()
    # NOTE: off unless asked: each layer costs a run of the graph below it on the samples,
    # about as much as the whole calibration pass for ResNet-18 at 224x224
    n_sens = 0 if sensitivity_samples is None else int(sensitivity_samples)
    if int8_target is not None:
        n_sens = n_sens or SENSITIVITY_SAMPLES
    sens, target = {}, None
    if n_sens > 0:
        with timer("sensitivity"):
            xs = calib[:n_sens]
            env = reference.run(fgraph, fparams, xs, keep_all=True)
            quantize = partial(quantize, errors=qz.errors)
            sens = layer_sensitivity(fgraph, qz, xs, env, quantize)
        if int8_target is not None:
            with timer("int8_target"):
                qz, target = meet_target(fgraph, qz, xs, env, float(int8_target), sens, quantize)
    qz.graph.metadata = {**graph.metadata, "export": {
        "int8": True, "calib_samples": len(calib), "layers_fp32": qz.layers_fp32}}
    with timer("write"):
        report["size"] = _write(fmt, out, qz.graph, qz.params, qz.quant, ckpt_path)
        report["fp32_size"] = _size_fp32(fmt, fgraph, fparams, out.parent)
    report["size_ratio"] = report["size"] / report["fp32_size"]
    report["calib_samples"] = len(calib)
    report["calib_source"] = str(calib_path) if calib_path is not None else "checkpoint calib/x"
    report["calibration"] = {"method": method, **({"percentile": pct}
                                                  if method == "percentile" else {})}
    report["max_layer_error"] = (DEFAULT_MAX_LAYER_ERROR if max_layer_error is None
                                 else max_layer_error)
    for r in qz.layers:
        r["sensitivity_db"] = sens.get(r["name"])
    report["layers"] = qz.layers
    report["layers_fp32"] = [{"name": r["name"], "reason": r["reason"]}
                             for r in qz.layers if not r["int8"]]
    report["sensitivity_samples"] = min(n_sens, len(calib)) if sens else 0
    if target is not None:
        report["int8_target"] = target
    report["weights"] = qz.weights
    with timer("agreement"):
        out_name = fgraph.outputs[0]
        report["agreement"] = _diff(calibration.outputs[out_name],
                                    _run(qz.graph, qz.params, qz.quant, calib),
                                    graph.metadata.get("task"))
    report["agreement"]["output"] = out_name
    return report


# --------------------------------------------------------------------------- reading


def _format(fmt: str | None, out_path) -> str:
    suffix = Path(out_path).suffix.lower() if out_path is not None else ""
    if fmt is None:
        return "onnx" if suffix == ".onnx" else "bin"
    if fmt not in FORMATS:
        raise ExportError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    other = {"bin": ".onnx", "onnx": ".bin"}[fmt]
    if suffix == other:
        raise ExportError(f"output {out_path} ends in {other} but the format is {fmt}; "
                          f"pass --format {other[1:]} or change the file name")
    return fmt


def _read_checkpoint(path: Path, need_calib: bool):
    # A model file is a valid container too; say plainly what went wrong before the generic
    # kind check in the reader does.
    try:
        with open(path, "rb") as f:
            head = decode_header(f.read(HEADER_SIZE))
        if head["kind"] == "model":
            raise ExportError(f"{path} is an exported model, not a training checkpoint; "
                              "export reads the .ckpt that `pocket train` writes")
    except (OSError, FormatError):
        pass  # read_container reports it properly
    ckpt = read_container(path, expect_kind="checkpoint")
    try:
        if ckpt.graph is None:
            raise ExportError(f"{path} holds no graph; re-run `pocket train` to get a checkpoint "
                              "with the traced model")
        graph = ckpt.graph
        # Copies: the container's views die with its mmap, and small models fit in memory anyway.
        params = {n: np.array(ckpt.tensors[n]) for n in graph.params}
        calib = np.array(ckpt.tensors["calib/x"]) if "calib/x" in ckpt.tensors else None
        meta = dict(ckpt.meta)
    finally:
        ckpt.close()
    if need_calib and calib is None:
        raise ExportError(f"{path} has no calibration samples (calib/x); pass --calib X.npz "
                          "with an array `x` of preprocessed training inputs")
    return graph, params, calib, meta


def _check_supported(graph: Graph) -> None:
    for n in graph.nodes:
        if n.op not in SUPPORTED:
            raise ExportError(f"node '{n.name}' (op '{n.op}'): export cannot handle this op yet; "
                              f"supported: {', '.join(SUPPORTED)}")


def _load_npz(path) -> np.ndarray:
    import zipfile

    from pocket.formats.sniff import check_file

    check_file(path, "calibration file")
    if not zipfile.is_zipfile(path):
        raise ExportError(f"{path}: not an .npz archive; save the calibration inputs with "
                          "np.savez(path, x=x)")
    try:
        with np.load(path, allow_pickle=False) as z:
            if "x" not in z.files:
                raise ExportError(f"{path}: no array named 'x' (found: {', '.join(z.files) or 'none'})")
            x = np.array(z["x"])
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise ExportError(f"{path}: cannot read calibration arrays ({e}); expected an .npz "
                          "with an array `x`") from None
    if x.dtype.kind not in "biuf":
        raise ExportError(f"{path}: array 'x' holds {x.dtype} values; calibration needs the "
                          "model's preprocessed float inputs")
    return x


def _check_calib(graph: Graph, x: np.ndarray, samples: int | None) -> np.ndarray:
    (name, info), = graph.inputs.items()
    want = list(info.shape[1:])
    if x.ndim != len(info.shape) or any(isinstance(d, int) and d != s
                                        for d, s in zip(want, x.shape[1:])):
        raise ExportError(f"calibration samples have shape {list(x.shape)}, but input '{name}' "
                          f"is {list(info.shape)}")
    if len(x) == 0:
        raise ExportError("calibration set is empty")
    x = np.asarray(x, np.float32)
    if not np.isfinite(x).all():
        raise ExportError("calibration samples contain NaN or infinity")
    n = DEFAULT_CALIB_SAMPLES if samples is None else int(samples)
    if n < 1:
        raise ExportError(f"calib_samples must be >= 1, got {n}")
    if info.dtype in ("i64", "i32"):  # token ids (an embedding's input), stored as float32
        if not np.array_equal(x, np.rint(x)):
            raise ExportError(f"input '{name}' takes integer ids, but the calibration samples "
                              "are not whole numbers")
        return x[:n].astype(np.int64 if info.dtype == "i64" else np.int32)
    return x[:n]


# --------------------------------------------------------------------------- writing


def _write(fmt: str, out: Path, graph: Graph, params, quant, source: Path) -> int:
    if fmt == "onnx":
        from pocket.export.onnx_export import save, to_onnx

        return save(to_onnx(graph, params, quant), out)
    return write_container(out, kind="model", tensors=params, graph=graph, quant=quant,
                           meta={"exported_from": source.name})


def _size_fp32(fmt: str, graph: Graph, params, folder: Path) -> int:
    """What the fp32 export of the same checkpoint weighs, for the size ratio."""
    if fmt == "onnx":
        from pocket.export.onnx_export import to_onnx

        return to_onnx(graph, params, check=False).ByteSize()
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        return write_container(Path(tmp) / "fp32.bin", kind="model", tensors=params, graph=graph)


# --------------------------------------------------------------------------- checking


def _run(g: Graph, p, q, x: np.ndarray) -> np.ndarray:
    """The first output of a graph on x, through the reference interpreter, chunk by chunk."""
    out = g.outputs[0]
    return np.concatenate([reference.run(g, p, xb, q)[out] for xb in batches(x, RUN_BATCH)])


def _diff(a: np.ndarray, b: np.ndarray, task: str | None = None) -> dict:
    """How far b (the export) is from a (the model it must compute)."""
    res = {"samples": len(a),
           "max_abs_error": float(np.abs(a.astype(np.float64) - b).max(initial=0)),
           "sqnr_db": Q.sqnr_db(a, b)}
    if task == "classification" and a.ndim == 2:
        res["top1_agreement"] = float(np.mean(a.argmax(1) == b.argmax(1)))
    return res


# --------------------------------------------------------------------------- text


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024 or unit == "MiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def _db(v: float | None) -> str:
    if v is None:
        return "-"
    return "inf" if math.isinf(v) else f"{v:.1f}"


def render(report: dict) -> str:
    r = report
    lines = [f"exported {r['output']} ({r['format']}{', int8' if r['int8'] else ''}): "
             f"{_size(r['size'])}"
             + (f" (fp32 {_size(r['fp32_size'])}, {r['size_ratio']:.2f}x)" if r["int8"] else "")]
    lines.append(f"transforms: {', '.join(r['transforms']) or 'none'}; "
                 f"{r['nodes']['before']} -> {r['nodes']['after']} nodes")
    if "transform_check" in r:
        c = r["transform_check"]
        lines.append(f"fp32 check on {c['samples']} samples: max abs error {c['max_abs_error']:.2e}"
                     " vs the checkpoint graph")
    if r["int8"]:
        n8 = sum(1 for x in r["layers"] if x["int8"])
        cal = r.get("calibration", {"method": "minmax"})
        how = cal["method"] + (f" {cal['percentile']:g}" if "percentile" in cal else "")
        lines.append(f"int8: {n8}/{len(r['layers'])} layers, calibrated ({how}) on "
                     f"{r['calib_samples']} samples ({r['calib_source']}); max layer error "
                     f"{r['max_layer_error']:g}")
        sens = r.get("sensitivity_samples", 0)
        lines.append(f"  {'layer':<24} {'op':<7} {'int8':<5} {'error':>8} {'SQNR dB':>8}"
                     + (f" {'alone dB':>9}" if sens else ""))
        for x in r["layers"]:
            err = "-" if x["error"] is None else f"{x['error']:.4f}"
            lines.append(f"  {x['name']:<24} {x['op']:<7} {'yes' if x['int8'] else 'no':<5} "
                         f"{err:>8} {_db(x['sqnr_db']):>8}"
                         + (f" {_db(x.get('sensitivity_db')):>9}" if sens else ""))
        if sens:
            lines.append(f"  (alone dB: the model output's SQNR with only that layer in int8, "
                         f"on {sens} samples)")
        for x in r["layers_fp32"]:
            lines.append(f"  kept fp32: {x['name']}: {x['reason']}")
        if "int8_target" in r:
            t = r["int8_target"]
            lines.append(f"int8 target {t['sqnr_db']:g} dB {'met' if t['met'] else 'NOT met'}: "
                         f"{_db(t['reached_db'])} dB on {t['samples']} samples with "
                         f"{len(t['layers_fp32'])} layer(s) kept fp32")
        if r["weights"]:
            worst = min(r["weights"], key=lambda w: w["sqnr_db"])
            lines.append(f"weights: {len(r['weights'])} int8 tensors, worst {worst['name']} "
                         f"(SQNR {_db(worst['sqnr_db'])} dB, max abs error "
                         f"{worst['max_abs_error']:.2e}, rel {worst['rel_error']:.2e})")
        a = r["agreement"]
        agree = (f"top-1 agreement {100 * a['top1_agreement']:.1f}%, "
                 if "top1_agreement" in a else "")
        lines.append(f"int8 vs fp32 on {a['samples']} calibration samples: {agree}"
                     f"max abs error {a['max_abs_error']:.3g}, SQNR {_db(a['sqnr_db'])} dB")
    if r.get("timings"):
        lines.append("time: " + ", ".join(f"{k} {v:.1f} s" for k, v in r["timings"].items()))
    return "\n".join(lines)
