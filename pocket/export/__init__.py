"""pocket.export: checkpoint -> folded (and optionally int8) graph -> .bin or .onnx.

Light on purpose: `onnx` is imported only when an ONNX file is written.
"""

from pocket.export.errors import ExportError

__all__ = ["ExportError", "export", "render"]


def export(*args, **kwargs) -> dict:
    from pocket.export.app import export as _export

    return _export(*args, **kwargs)


def render(report: dict) -> str:
    from pocket.export.app import render as _render

    return _render(report)
