"""`pocket import MODEL.onnx -o MODEL.bin`: read, map, fold, optionally quantize, write atomically.

The report is plain JSON (what `--json` prints); `render` turns it into text. `load` imports in
memory for the commands that take a model (infer, inspect, compare, doctor): the container is
written to an unlinked temporary file and mapped, so the engine reads it as it reads any .bin.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pocket.export.transforms import optimize, remove_dead
from pocket.formats.container import read_container, write_container
from pocket.formats.ir import Graph
from pocket.importer.passes import fold_bias_add, fold_silu, int8_layers, int8_luts
from pocket.importer.reader import ImportError_, onnx_module, parse_shapes, read_model


@dataclass
class Imported:
    graph: Graph
    params: dict[str, np.ndarray]
    quant: dict[str, dict]
    report: dict = field(default_factory=dict)


def is_onnx(path: str | os.PathLike) -> bool:
    """Whether a file is an ONNX model (by its first bytes; False for anything unreadable)."""
    from pocket.formats.sniff import HEAD_BYTES, looks_like_onnx

    try:
        with open(path, "rb") as f:
            return looks_like_onnx(f.read(HEAD_BYTES), os.fstat(f.fileno()).st_size)
    except OSError:
        return False


def load_onnx(path: str | os.PathLike):
    onnx = onnx_module()
    from pocket.formats.sniff import check_file

    if not check_file(path, "ONNX model", allow_onnx=True):
        raise ImportError_(f"{path}: not an ONNX model (pocket import reads .onnx files)")
    try:
        return onnx.load(os.fspath(path))
    except Exception as e:  # noqa: BLE001 - protobuf raises its own DecodeError and more
        raise ImportError_(f"{path}: not a readable ONNX model ({type(e).__name__}: {e})") from None


def import_onnx(model_or_path, *, input_shapes: dict | list | None = None, int8: bool = False,
                calib: np.ndarray | None = None, calib_samples: int | None = None,
                name: str | None = None) -> Imported:
    """An ONNX model (path or ModelProto) as a folded pocket graph, its params and int8 quant."""
    model = model_or_path
    if isinstance(model_or_path, str | os.PathLike):
        name = name or str(model_or_path)
        model = load_onnx(model_or_path)
    name = name or "model"
    if isinstance(input_shapes, list | tuple):
        input_shapes = parse_shapes(input_shapes)
    graph, params, qconsts = read_model(model, input_shapes=input_shapes, name=name)
    applied = []
    graph, params, n = fold_bias_add(graph, params)
    if n:
        applied.append(f"folded {n} bias add")
    graph, params, n = fold_silu(graph, params)
    if n:
        applied.append(f"made {n} silu from sigmoid * x")
    graph, params, more = optimize(graph, params)
    applied += more
    graph, params, quant, n = int8_layers(graph, params, qconsts)
    if n:
        applied.append(f"made {n} int8 ops from QDQ")
        graph, params, n = int8_luts(graph, params)
        if n:
            applied.append(f"made {n} int8 lookup tables from QDQ elementwise ops")
        # The dequantize nodes the int8 layers no longer read.
        graph, params, _ = remove_dead(graph, params)
        quant = {k: v for k, v in quant.items() if k in params}
    qdq = any(x.op in ("quantize", "dequantize") for x in graph.nodes)
    report = {
        "model": name, "opset": graph.metadata["onnx"]["opset"],
        "producer": " ".join(x for x in (graph.metadata["onnx"]["producer"],
                                         graph.metadata["onnx"]["producer_version"]) if x),
        "inputs": {k: list(v.shape) for k, v in graph.inputs.items()},
        "outputs": {k: list(v.shape) for k, v in zip(graph.outputs, graph.output_infos())},
        "nodes": {"onnx": len(model.graph.node), "pocket": len(graph.nodes)},
        "ops": dict(Counter(x.op for x in graph.nodes)), "transforms": applied,
        "qdq": qdq, "int8_layers": sum(1 for x in graph.nodes if "x_scale" in x.attrs),
    }
    if int8:
        if qdq:
            raise ImportError_(f"{name} is already quantized (QuantizeLinear/DequantizeLinear); "
                               "import it without --int8")
        if calib is None:
            raise ImportError_("--int8 calibrates on real inputs: pass --calib X.npz with an "
                               "array `x` of preprocessed samples")
        from pocket.export.app import _check_calib
        from pocket.export.quantize import quantize_graph

        if len(graph.inputs) != 1:
            raise ImportError_(f"--int8 calibrates a single-input graph; this one has "
                               f"{len(graph.inputs)}")
        try:
            x = _check_calib(graph, calib, calib_samples)
        except Exception as e:
            raise ImportError_(str(e)) from None
        qz = quantize_graph(graph, params, x)
        graph, params, quant = qz.graph, qz.params, qz.quant
        report["int8_layers"] = sum(1 for x in graph.nodes if "x_scale" in x.attrs)
        report["layers_fp32"] = [{"name": r["name"], "reason": r["reason"]}
                                 for r in qz.layers if not r["int8"]]
        report["calib_samples"] = len(x)
    graph.metadata = {**graph.metadata, "import": {"int8": bool(int8 or quant),
                                                   "source": Path(name).name}}
    return Imported(graph, params, quant, report)


def run(path: str, out: str | None = None, *, int8: bool = False, calib_path: str | None = None,
        calib_samples: int | None = None, input_shapes: list[str] | None = None) -> dict:
    """`pocket import`: the report of writing MODEL.bin (default: next to the ONNX file)."""
    shapes = parse_shapes(input_shapes or [])
    calib = None
    if calib_path is not None:
        from pocket.export.app import _load_npz

        try:
            calib = _load_npz(calib_path)
        except Exception as e:
            raise ImportError_(str(e)) from None
    imp = import_onnx(path, input_shapes=shapes, int8=int8, calib=calib,
                      calib_samples=calib_samples)
    dest = Path(out) if out is not None else Path(path).with_suffix(".int8.bin" if int8 else ".bin")
    if dest.suffix.lower() == ".onnx":
        raise ImportError_(f"output {dest} ends in .onnx; pocket import writes a .bin")
    imp.report["output"] = str(dest)
    imp.report["size"] = write_container(dest, kind="model", tensors=imp.params, graph=imp.graph,
                                         quant=imp.quant, meta={"imported_from": Path(path).name})
    return imp.report


def load(path: str | os.PathLike, *, input_shapes: list[str] | None = None, quiet: bool = False):
    """Import an ONNX file in memory; returns an open model Container (see the module doc)."""
    import sys

    if not quiet:
        print(f"importing {path} in memory (pocket import writes it as a .bin once)",
              file=sys.stderr)
    imp = import_onnx(path, input_shapes=input_shapes)
    fd, tmp = tempfile.mkstemp(prefix=".pocket-import.", suffix=".bin")
    os.close(fd)
    try:
        write_container(tmp, kind="model", tensors=imp.params, graph=imp.graph, quant=imp.quant,
                        meta={"imported_from": Path(path).name})
        return read_container(tmp, expect_kind="model")
    finally:
        Path(tmp).unlink(missing_ok=True)


@contextlib.contextmanager
def as_bin(path: str | os.PathLike, *, input_shapes: list[str] | None = None):
    """For the commands that open a .bin by path: the ONNX file imported into a temporary
    .bin that lives as long as the `with` block (said on stderr)."""
    import sys

    print(f"importing {path} in memory (`pocket import {path} -o MODEL.bin` keeps the "
          "conversion)", file=sys.stderr)
    imp = import_onnx(path, input_shapes=input_shapes)
    with tempfile.TemporaryDirectory(prefix="pocket-import-") as tmp:
        dest = Path(tmp) / (Path(path).stem + ".bin")
        write_container(dest, kind="model", tensors=imp.params, graph=imp.graph, quant=imp.quant,
                        meta={"imported_from": Path(path).name})
        yield str(dest)


def render(r: dict) -> str:
    lines = [f"imported {r['model']} (opset {r['opset']}, {r['producer'] or 'unknown producer'})"
             f" -> {r['output']}: {r['size']} bytes"]
    lines.append(f"nodes: {r['nodes']['onnx']} ONNX -> {r['nodes']['pocket']} pocket; "
                 f"transforms: {', '.join(r['transforms']) or 'none'}")
    for k, v in r["inputs"].items():
        lines.append(f"input  {k}: {v}")
    for k, v in r["outputs"].items():
        lines.append(f"output {k}: {v}")
    lines.append("ops: " + ", ".join(f"{k} x{v}" for k, v in sorted(r["ops"].items())))
    if r["int8_layers"]:
        lines.append(f"int8 layers: {r['int8_layers']}")
    for x in r.get("layers_fp32", []):
        lines.append(f"  kept fp32: {x['name']}: {x['reason']}")
    return "\n".join(lines)
