"""pocket.formats: the graph IR, the container format and the int8 math. Stdlib + NumPy only."""

from pocket.formats.errors import FormatError
from pocket.formats.ir import OPS, Graph, Node, ValueInfo, make_metadata

__all__ = ["OPS", "FormatError", "Graph", "Node", "ValueInfo", "make_metadata"]
