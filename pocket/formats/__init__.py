"""pocket.formats: the graph IR, its op registry, the container format and the int8 math.

Standard library + NumPy only; every stage imports it, it imports no stage. `ir` holds the
values, nodes and graphs (JSON form, the validation walk, metadata); `ops` holds one entry per
op (schema: attrs, shape inference; fusion as an activation and its kernel code; int8 policy;
ONNX mapping) and is the only list of op names; `reference` is the naive NumPy interpreter, the
meaning of every op that exporter and engine are tested against; `container` reads and writes
the `.bin`/`.ckpt` file (spec at its top); `quant` is the int8 arithmetic shared by writer,
reference and engine; `describe` is what `pocket inspect` shows. An op flows from its entry in
`ops`: `ir.Graph.validate` checks nodes against its schema; `reference` registers its NumPy
meaning under the op's name; train registers a forward/backward and a tracer, export an ONNX
emitter (fusion and int8 passes read the entry's flags), and the engine a builder of kernel
calls that reads the entry's activation code; `ops.register` refuses a name the registry does
not know, and tests/formats/test_registry.py fails for an op that lacks any of them.
"""

from pocket.formats.errors import FormatError
from pocket.formats.ir import OPS, Graph, Node, ValueInfo, make_metadata

__all__ = ["OPS", "FormatError", "Graph", "Node", "ValueInfo", "make_metadata"]
