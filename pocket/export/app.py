"""`pocket export`: checkpoint -> optimized (optionally int8) model as .bin or .onnx, and a report.

The report is plain JSON (what `--json` prints); `render` turns it into text.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import numpy as np

from pocket.export import onnx_export  # noqa: F401 - registers the ONNX mapping of every op
from pocket.export.errors import ExportError
from pocket.export.quantize import DEFAULT_CALIB_SAMPLES, DEFAULT_MAX_LAYER_ERROR, quantize_graph
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
CHECK_SAMPLES = 64  # samples used to check the fp32 transforms against the checkpoint graph


def export(ckpt_path: str | os.PathLike, out_path: str | os.PathLike | None = None, *,
           fmt: str | None = None, int8: bool = False, calib_samples: int | None = None,
           calib_path: str | os.PathLike | None = None, max_layer_error: float | None = None,
           calib_method: str = "minmax") -> dict:
    """Export a checkpoint; returns the report (see `render`).

    fmt: "bin" or "onnx"; None takes it from out_path's suffix (".onnx"), else "bin".
    Default output: model[.int8].bin|onnx next to the checkpoint.
    """
    ckpt_path = Path(ckpt_path)
    fmt = _format(fmt, out_path)
    out = Path(out_path) if out_path is not None else ckpt_path.with_name(
        f"model{'.int8' if int8 else ''}.{fmt}")
    graph, params, calib, ckpt_meta = _read_checkpoint(ckpt_path, need_calib=int8 and not calib_path)
    _check_supported(graph)
    if int8 and len(graph.inputs) != 1:
        raise ExportError(f"int8 export calibrates a single-input graph; this one has "
                          f"{len(graph.inputs)} inputs ({', '.join(graph.inputs)})")
    if calib_path is not None:
        calib = _load_npz(calib_path)
    if calib is not None:
        calib = _check_calib(graph, calib, calib_samples if int8 else CHECK_SAMPLES)

    fgraph, fparams, applied = optimize(graph, params)
    report: dict = {
        "checkpoint": str(ckpt_path), "output": str(out), "format": fmt, "int8": int8,
        "transforms": applied,
        "nodes": {"before": len(graph.nodes), "after": len(fgraph.nodes)},
    }
    for key in ("task", "dataset", "metrics"):
        value = graph.metadata.get(key, ckpt_meta.get(key))
        if value is not None:
            report[key] = value
    if calib is not None:
        # The transforms must not change what the model computes: check on real samples.
        xs = calib[:CHECK_SAMPLES]
        report["transform_check"] = {
            "samples": len(xs),
            "max_abs_error": _compare(graph, params, None, fgraph, fparams, None, xs)[
                "max_abs_error"]}

    if not int8:
        fgraph.metadata = {**graph.metadata,
                           "export": {"int8": False, "calib_samples": 0, "layers_fp32": []}}
        report["size"] = _write(fmt, out, fgraph, fparams, None, ckpt_path)
        return report

    qz = quantize_graph(fgraph, fparams, calib, max_layer_error=max_layer_error,
                        method=calib_method)
    qz.graph.metadata = {**graph.metadata, "export": {
        "int8": True, "calib_samples": len(calib), "layers_fp32": qz.layers_fp32}}
    report["size"] = _write(fmt, out, qz.graph, qz.params, qz.quant, ckpt_path)
    report["fp32_size"] = _size_fp32(fmt, fgraph, fparams, out.parent)
    report["size_ratio"] = report["size"] / report["fp32_size"]
    report["calib_samples"] = len(calib)
    report["calib_source"] = str(calib_path) if calib_path is not None else "checkpoint calib/x"
    report["max_layer_error"] = (DEFAULT_MAX_LAYER_ERROR if max_layer_error is None
                                 else max_layer_error)
    report["layers"] = qz.layers
    report["layers_fp32"] = [{"name": r["name"], "reason": r["reason"]}
                             for r in qz.layers if not r["int8"]]
    report["weights"] = qz.weights
    report["agreement"] = _compare(fgraph, fparams, None, qz.graph, qz.params, qz.quant, calib,
                                   graph.metadata.get("task"))
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


def _compare(g_ref, p_ref, q_ref, g, p, q, x: np.ndarray, task: str | None = None) -> dict:
    """Outputs of two graphs on the same samples, through the reference interpreter."""
    out = g_ref.outputs[0]
    a = np.concatenate([reference.run(g_ref, p_ref, xb, q_ref)[out] for xb in _chunks(x)])
    b = np.concatenate([reference.run(g, p, xb, q)[out] for xb in _chunks(x)])
    res = {"samples": len(x), "output": out,
           "max_abs_error": float(np.abs(a.astype(np.float64) - b).max(initial=0)),
           "sqnr_db": Q.sqnr_db(a, b)}
    if task == "classification" and a.ndim == 2:
        res["top1_agreement"] = float(np.mean(a.argmax(1) == b.argmax(1)))
    return res


def _chunks(x: np.ndarray, size: int = 64):
    for i in range(0, len(x), size):
        yield x[i:i + size]


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
        lines.append(f"int8: {n8}/{len(r['layers'])} layers, calibrated on {r['calib_samples']} "
                     f"samples ({r['calib_source']}); max layer error {r['max_layer_error']:g}")
        lines.append(f"  {'layer':<24} {'op':<7} {'int8':<5} {'error':>8} {'SQNR dB':>8}")
        for x in r["layers"]:
            err = "-" if x["error"] is None else f"{x['error']:.4f}"
            lines.append(f"  {x['name']:<24} {x['op']:<7} {'yes' if x['int8'] else 'no':<5} "
                         f"{err:>8} {_db(x['sqnr_db']):>8}")
        for x in r["layers_fp32"]:
            lines.append(f"  kept fp32: {x['name']}: {x['reason']}")
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
    return "\n".join(lines)
