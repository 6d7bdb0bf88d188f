"""What `pocket inspect FILE` shows: a JSON-ready summary of a container and its text rendering."""

from __future__ import annotations

import math
import os
from typing import Any

from pocket.formats.container import read_container


def _numel(shape) -> int:
    return math.prod(shape) if all(isinstance(d, int) for d in shape) else 0


def _quant_summary(q: dict | None) -> dict | None:
    if q is None:
        return None
    return {"axis": q["axis"], "channels": len(q["scale"]),
            "scale_min": min(q["scale"], default=None), "scale_max": max(q["scale"], default=None),
            "zero_point_min": min(q["zero_point"], default=None),
            "zero_point_max": max(q["zero_point"], default=None)}


def describe(path: str | os.PathLike) -> dict:
    """Summarize a container (all CRCs checked); a corrupt file raises FormatError."""
    with read_container(path) as c:
        out: dict[str, Any] = {
            "path": os.fspath(path),
            "kind": c.kind,
            "version": f"{c.version[0]}.{c.version[1]}",
            "file_size": c.file_size,
            "header": dict(c.header),
            "graph": None,
            "tensors": [
                {"name": e.name, "dtype": e.dtype, "shape": list(e.shape), "bytes": e.length,
                 "offset": e.offset, "quant": _quant_summary(e.quant)}
                for e in c.entries.values()
            ],
            "tensor_bytes": sum(e.length for e in c.entries.values()),
            "metadata": {},
            "meta_keys": sorted(c.meta),
        }
        if c.kind == "model":
            out["meta"] = c.meta
        g = c.graph
        if g is not None:
            infos = g.validate()
            out["metadata"] = g.metadata
            out["graph"] = {
                "inputs": [{"name": n, "dtype": v.dtype, "shape": list(v.shape)}
                           for n, v in g.inputs.items()],
                "outputs": [{"name": o, "dtype": infos[o].dtype, "shape": list(infos[o].shape)}
                            for o in g.outputs],
                "nodes": [{"name": n.name, "op": n.op, "inputs": list(n.inputs),
                           "outputs": list(n.outputs), "dtype": infos[n.outputs[0]].dtype,
                           "shape": list(infos[n.outputs[0]].shape)} for n in g.nodes],
                "param_count": sum(_numel(v.shape) for v in g.params.values()),
                "params": len(g.params),
            }
    return out


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _shape(s: list) -> str:
    return "(" + ", ".join(str(d) for d in s) + ("," if len(s) == 1 else "") + ")"


def render(d: dict) -> str:
    """A readable text report of describe()'s result."""
    lines = [f"{d['path']}: pocket {d['kind']}, format {d['version']}, "
             f"{_fmt_bytes(d['file_size'])} ({d['file_size']} bytes)"]
    g = d.get("graph")
    if g is not None:
        lines.append("")
        lines.append("inputs:")
        lines += [f"  {x['name']:<24} {x['dtype']:<4} {_shape(x['shape'])}" for x in g["inputs"]]
        lines.append("outputs:")
        lines += [f"  {x['name']:<24} {x['dtype']:<4} {_shape(x['shape'])}" for x in g["outputs"]]
        lines.append(f"nodes ({len(g['nodes'])}):")
        lines += [f"  {n['name']:<24} {n['op']:<15} -> {n['dtype']:<4} {_shape(n['shape'])}"
                  for n in g["nodes"]]
        lines.append(f"params: {g['params']} tensors, {g['param_count']:,} values")
    lines.append("")
    lines.append(f"tensors ({len(d['tensors'])}, {_fmt_bytes(d['tensor_bytes'])}):")
    for t in d["tensors"]:
        q = t["quant"]
        qs = ""
        if q is not None:
            where = "per tensor" if q["axis"] is None else f"axis {q['axis']} x{q['channels']}"
            qs = f"  quant {where}, scale {q['scale_min']:.3g}..{q['scale_max']:.3g}" \
                if q["channels"] else f"  quant {where}"
        lines.append(f"  {t['name']:<32} {t['dtype']:<4} {_shape(t['shape']):<20} "
                     f"{t['bytes']:>12,} B{qs}")
    if d.get("metadata"):
        lines.append("")
        lines.append("metadata:")
        lines += [f"  {k}: {v}" for k, v in d["metadata"].items()]
    if d["meta_keys"]:
        lines.append("")
        lines.append("meta keys: " + ", ".join(d["meta_keys"]))
    return "\n".join(lines)
