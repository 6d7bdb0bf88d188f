"""The pocket container: one file holding a graph, metadata and tensors (`.bin` and `.ckpt`).

Format specification, version 1.0 (tests/formats/test_container.py::test_spec_byte_layout
checks a written file against every statement below):

    [0, 128)      header: one JSON object in compact form (no whitespace), ASCII, right-padded
                  with spaces; byte 127 is '\\n', so `head -c 128 FILE` prints it. Keys, all
                  required, in this order:
                    "pocket": [major, minor]   format name and version; major 1, minor 0..99.
                                               A reader accepts its own major and any minor;
                                               minor versions only add fields to the graph
                                               section (a reader ignores unknown fields there
                                               only when the file's minor is newer than its own)
                    "kind":   "model" | "checkpoint"
                    "le":     1                byte order of all tensor data: little-endian
                    "align":  64               every tensor starts at a multiple of 64
                    "g":      [G, crc32]       graph section: length in bytes, CRC32
                    "d":      [L, crc32]       data section: length in bytes, CRC32
                    "crc":    crc32            CRC32 of the header JSON text written without its
                                               `,"crc":N` member, e.g. of
                                               {"pocket":[1,0],...,"d":[L,C]}
                  Offsets are implied, not stored (the header has no room for them, see below):
                  the graph section starts at 128; the data section at
                  W = 128 + G rounded up to a multiple of 64.
                  Example (a real header; the spec test decodes it):
                    {"pocket":[1,0],"kind":"model","le":1,"align":64,"g":[427,4245054707],
                     "d":[144,3794424629],"crc":3714365902}
    [128, 128+G)  graph section: one UTF-8 JSON object (the writer adds no whitespace; a reader
                  accepts JSON whitespace) {"graph": <graph> | null, "meta": {...},
                  "tensors": [entry, ...]}; <graph> as in pocket.formats.ir; "meta" is free
                  JSON. NaN and Infinity are not JSON and are rejected; nesting depth <= 64.
                  Tensor entry: {"name": str (1..256 chars, unique), "dtype": "f32" | "f16" |
                  "i8" | "u8" | "i32" | "i64", "shape": [int >= 0, ...] (at most 32 dims),
                  "offset": absolute file offset, "length": itemsize * prod(shape),
                  "crc32": CRC32 of the tensor's bytes, "quant" (optional, only for i8, u8 and
                  i32): {"scale": [positive finite float32, ...], "zero_point": [int in the
                  dtype's range, ...], "axis": int | null}} with one scale/zero point per index
                  of `axis`, or exactly one of each when axis is null (per tensor). Scales are
                  float32 values written as the shortest decimal that rounds back to them;
                  readers round each to float32.
                  Every param of the graph has an entry of the same dtype and shape.
    [128+G, W)    zero bytes.
    [W, W+L)      data section: the tensors in table order, C order, little-endian. Entry i
                  starts at the previous entry's end (W for the first) rounded up to a multiple
                  of 64; an empty tensor (a zero in its shape, length 0) gets that offset too.
                  The gaps are zero bytes. The data section ends where the last entry ends
                  (L = 0 without tensors) and the file ends exactly there: size == W + L.

Limits that make every legal file's header fit in 128 bytes: G <= 64 MiB, size <= 2**36 bytes
(64 GiB); for an empty tensor the product of its non-zero dims times the itemsize is <= 2**36,
so that NumPy can represent its shape. The longest legal header is 126 bytes for version 1.0
and 127 for minor 99 (tested).

The reader trusts nothing (as safetensors): every check above is enforced, the header, graph
and data CRCs and every tensor's CRC are verified (verify_crc=False skips only the data and
tensor CRCs), and any violation raises FormatError naming the field. Tensors are read-only
NumPy views into a read-only mmap of the file: no copies. No pickle anywhere.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import secrets
import stat
import types
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from pocket.formats.errors import FormatError
from pocket.formats.ir import DTYPES, Graph
from pocket.formats.quant import SCALE_RULE, is_scale

FORMAT_NAME = "pocket"
FORMAT_VERSION = (1, 0)
HEADER_SIZE = 128
ALIGN = 64
KINDS = ("model", "checkpoint")
MAX_MINOR = 99
MAX_GRAPH_SIZE = 64 * 2**20
MAX_FILE_SIZE = 2**36
MAX_NAME_LEN = 256
MAX_NDIM = 32
MAX_JSON_DEPTH = 64
HEADER_KEYS = ("pocket", "kind", "le", "align", "g", "d", "crc")
SECTION_KEYS = ("graph", "meta", "tensors")
ENTRY_KEYS = ("name", "dtype", "shape", "offset", "length", "crc32")
QUANT_KEYS = ("scale", "zero_point", "axis")
_U32 = 2**32 - 1

NP_DTYPES = {
    "f32": np.dtype("<f4"), "f16": np.dtype("<f2"), "i8": np.dtype("i1"),
    "u8": np.dtype("u1"), "i32": np.dtype("<i4"), "i64": np.dtype("<i8"),
}
_DTYPE_OF_CODE = {dt.str[1:]: name for name, dt in NP_DTYPES.items()}
QUANT_RANGES = {"i8": (-128, 127), "u8": (0, 255), "i32": (-(2**31), 2**31 - 1)}


@dataclass
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    length: int
    crc32: int
    quant: dict | None

    def to_dict(self) -> dict:
        d = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape),
             "offset": self.offset, "length": self.length, "crc32": self.crc32}
        if self.quant is not None:
            d["quant"] = self.quant
        return d


def align_up(n: int, a: int = ALIGN) -> int:
    return -(-n // a) * a


# --------------------------------------------------------------------------- strict JSON


def _is_int(v: Any) -> bool:
    # JSON true/false parse to bool, a subclass of int: never accept them as numbers.
    return isinstance(v, int) and not isinstance(v, bool)


def _uint(where: str, v: Any, hi: int, lo: int = 0) -> int:
    if not _is_int(v):
        raise FormatError(f"{where}: must be an integer, got {_short(v)}")
    if not lo <= v <= hi:
        raise FormatError(f"{where}: {v} is out of range [{lo}, {hi}]")
    return v


def _short(v: Any) -> str:
    r = v if isinstance(v, str) and v.isidentifier() else repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _loads(text: str, where: str) -> Any:
    def pairs(items: list) -> dict:
        out = {}
        for k, v in items:
            if k in out:
                raise FormatError(f"{where}: duplicate key {_short(k)}")
            out[k] = v
        return out

    def constant(name: str) -> Any:
        raise FormatError(f"{where}: {name} is not valid JSON")

    def number(s: str) -> float:
        x = float(s)
        if not math.isfinite(x):
            raise FormatError(f"{where}: number {_short(s)} is out of range")
        return x

    try:
        obj = json.loads(text, object_pairs_hook=pairs, parse_constant=constant, parse_float=number)
    except FormatError:
        raise
    except RecursionError:
        raise FormatError(f"{where}: JSON nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, and ints past Python's digit limit
        raise FormatError(f"{where}: not valid JSON ({e})") from None
    _check_depth(obj, where)
    return obj


def _check_depth(obj: Any, where: str) -> None:
    # Iterative, so a deep document cannot exhaust the stack of whoever walks it later.
    stack = [(obj, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise FormatError(f"{where}: JSON nested deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(v, dict):
            stack.extend((x, depth + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, depth + 1) for x in v)


def _json_default(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    raise TypeError(f"{type(v).__name__} is not JSON serializable")


def _dumps(obj: Any, where: str) -> str:
    try:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False,
                          default=_json_default)
    except (TypeError, ValueError, RecursionError) as e:
        raise FormatError(f"{where}: cannot be written as JSON ({e})") from None


# --------------------------------------------------------------------------- header


def _header_text(version: tuple[int, int], kind: str, g: tuple[int, int], d: tuple[int, int],
                 crc: int | None) -> str:
    obj: dict[str, Any] = {"pocket": list(version), "kind": kind, "le": 1, "align": ALIGN,
                           "g": list(g), "d": list(d)}
    if crc is not None:
        obj["crc"] = crc
    return json.dumps(obj, separators=(",", ":"))


def header_crc(text_without_crc: str) -> int:
    return zlib.crc32(text_without_crc.encode("ascii"))


def encode_header(kind: str, g: tuple[int, int], d: tuple[int, int],
                  version: tuple[int, int] = FORMAT_VERSION) -> bytes:
    """The 128 header bytes for a graph section (length, crc) and data section (length, crc)."""
    crc = header_crc(_header_text(version, kind, g, d, None))
    text = _header_text(version, kind, g, d, crc)
    if len(text) > HEADER_SIZE - 1:
        raise FormatError(f"header: {len(text)} bytes do not fit in {HEADER_SIZE - 1}")
    return text.ljust(HEADER_SIZE - 1).encode("ascii") + b"\n"


def decode_header(raw: bytes) -> dict:
    """Parse and check the 128 header bytes; returns the header object."""
    if len(raw) != HEADER_SIZE:
        raise FormatError(f"header: need {HEADER_SIZE} bytes, got {len(raw)}")
    if raw[-1:] != b"\n":
        raise FormatError("header: byte 127 must be '\\n'")
    try:
        text = raw[:-1].decode("ascii")
    except UnicodeDecodeError:
        raise FormatError("header: must be ASCII JSON padded with spaces") from None
    body = text.rstrip(" ")
    if not body.startswith("{"):
        raise FormatError("header: must start with a JSON object")
    h = _loads(body, "header")
    if not isinstance(h, dict):
        raise FormatError("header: must be a JSON object")
    for k in h:
        if k not in HEADER_KEYS:
            raise FormatError(f"header.{_short(k)}: unknown field")
    for k in HEADER_KEYS:
        if k not in h:
            raise FormatError(f"header.{k}: missing")
    v = h["pocket"]
    if not (isinstance(v, list) and len(v) == 2 and all(_is_int(x) for x in v)):
        raise FormatError(f"header.pocket: must be [major, minor], got {_short(v)}")
    if v[0] != FORMAT_VERSION[0]:
        raise FormatError(f"header.pocket: format version {v[0]}.{v[1]} is not supported; this "
                          f"reader reads {FORMAT_VERSION[0]}.x (upgrade pocket for newer files)")
    _uint("header.pocket[1]", v[1], MAX_MINOR)
    if h["kind"] not in KINDS:
        raise FormatError(f"header.kind: must be one of {', '.join(KINDS)}, got {_short(h['kind'])}")
    if not _is_int(h["le"]) or h["le"] != 1:
        raise FormatError(f"header.le: only little-endian (1) is defined, got {_short(h['le'])}")
    if not _is_int(h["align"]) or h["align"] != ALIGN:
        raise FormatError(f"header.align: must be {ALIGN}, got {_short(h['align'])}")
    for key, hi in (("g", MAX_GRAPH_SIZE), ("d", MAX_FILE_SIZE)):
        s = h[key]
        if not (isinstance(s, list) and len(s) == 2):
            raise FormatError(f"header.{key}: must be [length, crc32], got {_short(s)}")
        _uint(f"header.{key}[0]", s[0], hi)
        _uint(f"header.{key}[1]", s[1], _U32)
    _uint("header.crc", h["crc"], _U32)
    if list(h) != list(HEADER_KEYS) or json.dumps(h, separators=(",", ":")) != body:
        raise FormatError(f"header: must be compact JSON with keys in the order {HEADER_KEYS}")
    want = header_crc(body[: body.rindex(',"crc":')] + "}")
    if h["crc"] != want:
        raise FormatError(f"header.crc: CRC mismatch (stored {h['crc']}, computed {want}); "
                          "the header is corrupt")
    return h


# --------------------------------------------------------------------------- tensor table


def check_quant(where: str, q: Any, dtype: str, shape: tuple[int, ...]) -> dict:
    """Check quantization parameters against their tensor; returns them in canonical form."""
    if not isinstance(q, dict):
        raise FormatError(f"{where}: must be an object with scale, zero_point, axis")
    for k in q:
        if k not in QUANT_KEYS:
            raise FormatError(f"{where}.{_short(k)}: unknown field")
    for k in QUANT_KEYS:
        if k not in q:
            raise FormatError(f"{where}.{k}: missing")
    if dtype not in QUANT_RANGES:
        raise FormatError(f"{where}: only {', '.join(QUANT_RANGES)} tensors carry quantization "
                          f"parameters, not {dtype}")
    axis = q["axis"]
    if axis is None:
        n = 1
    else:
        if not _is_int(axis) or not 0 <= axis < len(shape):
            raise FormatError(f"{where}.axis: must be null or an axis of the {len(shape)}-d "
                              f"tensor, got {_short(axis)}")
        n = shape[axis]
    scale, zp = q["scale"], q["zero_point"]
    for key, v in (("scale", scale), ("zero_point", zp)):
        if not isinstance(v, list) or len(v) != n:
            raise FormatError(f"{where}.{key}: must be a list of {n} values "
                              f"({'per tensor' if axis is None else f'size of axis {axis}'})")
    for i, s in enumerate(scale):
        if isinstance(s, bool) or not isinstance(s, int | float) or not is_scale(s):
            raise FormatError(f"{where}.scale[{i}]: must be {SCALE_RULE}, got {_short(s)}")
    lo, hi = QUANT_RANGES[dtype]
    for i, z in enumerate(zp):
        _uint(f"{where}.zero_point[{i}]", z, hi, lo)
    return {"scale": [float(s) for s in scale], "zero_point": list(zp), "axis": axis}


def _check_entry(i: int, e: Any, minor: int) -> TensorEntry:
    where = f"tensors[{i}]"
    if not isinstance(e, dict):
        raise FormatError(f"{where}: must be an object")
    for k in ENTRY_KEYS:
        if k not in e:
            raise FormatError(f"{where}.{k}: missing")
    if minor <= FORMAT_VERSION[1]:
        for k in e:
            if k not in ENTRY_KEYS and k != "quant":
                raise FormatError(f"{where}.{_short(k)}: unknown field")
    name = e["name"]
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME_LEN:
        raise FormatError(f"{where}.name: must be a string of 1..{MAX_NAME_LEN} characters")
    dtype = e["dtype"]
    if dtype not in DTYPES:
        raise FormatError(f"{where}.dtype: unknown dtype {_short(dtype)}; expected one of {DTYPES}")
    shape = e["shape"]
    if not isinstance(shape, list) or len(shape) > MAX_NDIM:
        raise FormatError(f"{where}.shape: must be a list of at most {MAX_NDIM} sizes")
    for j, n in enumerate(shape):
        _uint(f"{where}.shape[{j}]", n, MAX_FILE_SIZE)
    itemsize = NP_DTYPES[dtype].itemsize
    nonzero = itemsize
    for n in shape:
        nonzero *= n or 1
        if nonzero > MAX_FILE_SIZE:
            raise FormatError(f"{where}.shape: {shape} is larger than the {MAX_FILE_SIZE}-byte "
                              "file limit")
    length = _uint(f"{where}.length", e["length"], MAX_FILE_SIZE)
    want = 0 if 0 in shape else nonzero
    if length != want:
        raise FormatError(f"{where}.length: {length} != {want} ({dtype} x {shape})")
    offset = _uint(f"{where}.offset", e["offset"], MAX_FILE_SIZE)
    crc = _uint(f"{where}.crc32", e["crc32"], _U32)
    quant = e.get("quant")
    if quant is not None:
        quant = check_quant(f"{where}.quant", quant, dtype, tuple(shape))
        # NOTE: scales are float32 values; the writer stores the shortest decimal that rounds
        # back to the same float32, so the reader rounds to float32 here.
        quant["scale"] = [float(np.float32(s)) for s in quant["scale"]]
    return TensorEntry(name, dtype, tuple(shape), offset, length, crc, quant)


# --------------------------------------------------------------------------- reader


class Container:
    """An open container: parsed header, graph, meta and read-only views of the tensors.

    The views point into a read-only mmap of the file. close() releases the mapping once no view
    is alive; views handed out before close() stay valid (they keep the mapping alive).
    """

    def __init__(self, path: str, header: dict, graph: Graph | None, meta: dict,
                 entries: dict[str, TensorEntry], mm: mmap.mmap, file_size: int):
        self.path = path
        self.header = header
        self.kind: str = header["kind"]
        self.version: tuple[int, int] = tuple(header["pocket"])
        self.graph = graph
        self.meta = meta
        self.entries = entries
        self.file_size = file_size
        self._mm: mmap.mmap | None = mm
        self._tensors = {n: _view(mm, e) for n, e in entries.items()}
        self.tensors: Mapping[str, np.ndarray] = types.MappingProxyType(self._tensors)

    def quant(self, name: str) -> dict | None:
        if name not in self.entries:
            raise KeyError(name)
        return self.entries[name].quant

    def close(self) -> None:
        mm, self._mm = self._mm, None
        self._tensors.clear()
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # views are still alive; the mapping closes when the last one goes away

    def __enter__(self) -> Container:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Container({self.path!r}, kind={self.kind!r}, version={self.version}, "
                f"tensors={len(self.entries)})")


def _view(mm: mmap.mmap, e: TensorEntry) -> np.ndarray:
    dt = NP_DTYPES[e.dtype]
    return np.frombuffer(mm, dtype=dt, count=e.length // dt.itemsize, offset=e.offset).reshape(e.shape)


def _crc_range(mm: mmap.mmap, start: int, end: int) -> int:
    with memoryview(mm) as mv, mv[start:end] as part:
        return zlib.crc32(part)


def read_container(path: str | os.PathLike, *, verify_crc: bool = True,
                   expect_kind: str | None = None) -> Container:
    """Open and validate a container; any problem with the file is a FormatError."""
    path = os.fspath(path)
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise FormatError(f"file: {path} is not a regular file")
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < HEADER_SIZE:
                raise FormatError(f"file: {size} bytes is shorter than the {HEADER_SIZE}-byte header")
            if size > MAX_FILE_SIZE:
                raise FormatError(f"file: {size} bytes is over the {MAX_FILE_SIZE}-byte limit")
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise FormatError(f"file: cannot read {path}: {e.strerror or e}") from None
    try:
        return _read(path, mm, size, verify_crc, expect_kind)
    except BaseException:
        try:
            mm.close()
        except BufferError:
            pass
        raise


def _read(path: str, mm: mmap.mmap, size: int, verify_crc: bool,
          expect_kind: str | None) -> Container:
    h = decode_header(mm[:HEADER_SIZE])
    if expect_kind is not None and h["kind"] != expect_kind:
        hint = {"model": "; export it first: pocket export CKPT -o model.bin",
                "checkpoint": "; give the training checkpoint (.ckpt) it was exported from"}
        raise FormatError(f"header.kind: expected a {expect_kind} file, got a {h['kind']}"
                          + hint.get(expect_kind, ""))
    minor = h["pocket"][1]
    g_len, g_crc = h["g"]
    d_len, d_crc = h["d"]
    g_end = HEADER_SIZE + g_len
    w = align_up(g_end)
    if g_end > size:
        raise FormatError(f"header.g: graph section [{HEADER_SIZE}, {g_end}) runs past the end "
                          f"of the {size}-byte file (truncated?)")
    if w + d_len != size:
        raise FormatError(f"header.d: the header says the file is {w + d_len} bytes "
                          f"(data section [{w}, {w + d_len})), but it is {size} bytes")
    section = mm[HEADER_SIZE:g_end]
    if zlib.crc32(section) != g_crc:
        raise FormatError(f"header.g: graph section CRC mismatch (stored {g_crc}, computed "
                          f"{zlib.crc32(section)}); the graph section is corrupt")
    if mm[g_end:w] != bytes(w - g_end):
        raise FormatError(f"padding: bytes [{g_end}, {w}) after the graph section must be zero")
    try:
        text = section.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FormatError(f"graph section: not valid UTF-8 ({e.reason} at byte {e.start})") from None
    sec = _loads(text, "graph section")
    if not isinstance(sec, dict):
        raise FormatError("graph section: must be a JSON object")
    for k in SECTION_KEYS:
        if k not in sec:
            raise FormatError(f"graph section.{k}: missing")
    if minor <= FORMAT_VERSION[1]:
        for k in sec:
            if k not in SECTION_KEYS:
                raise FormatError(f"graph section.{_short(k)}: unknown field")
    meta = sec["meta"]
    if not isinstance(meta, dict):
        raise FormatError("meta: must be a JSON object")
    table = sec["tensors"]
    if not isinstance(table, list):
        raise FormatError("tensors: must be a list")

    entries: dict[str, TensorEntry] = {}
    end = w
    for i, raw in enumerate(table):
        e = _check_entry(i, raw, minor)
        if e.name in entries:
            raise FormatError(f"tensors[{i}].name: duplicate tensor name '{e.name}'")
        want = align_up(end)
        if e.offset < end:
            raise FormatError(f"tensors[{i}].offset: {e.offset} overlaps the "
                              f"{'previous tensor' if i else 'graph section'} (ends at {end})")
        if e.offset != want:
            raise FormatError(f"tensors[{i}].offset: must be {want} (the previous end {end} "
                              f"rounded up to {ALIGN}), got {e.offset}")
        if e.offset + e.length > size:
            raise FormatError(f"tensors[{i}].length: [{e.offset}, {e.offset + e.length}) runs "
                              f"past the end of the {size}-byte file")
        if mm[end:e.offset] != bytes(e.offset - end):
            raise FormatError(f"tensors[{i}].offset: padding [{end}, {e.offset}) must be zero")
        entries[e.name] = e
        end = e.offset + e.length
    if end != size:
        raise FormatError(f"header.d: the data section ends at {size} but the tensors end at "
                          f"{end}")

    if verify_crc:
        got = _crc_range(mm, w, size)
        if got != d_crc:
            raise FormatError(f"header.d: data section CRC mismatch (stored {d_crc}, computed "
                              f"{got}); the data is corrupt")
        for i, e in enumerate(entries.values()):
            got = _crc_range(mm, e.offset, e.offset + e.length)
            if got != e.crc32:
                raise FormatError(f"tensors[{i}].crc32: CRC mismatch for '{e.name}' (stored "
                                  f"{e.crc32}, computed {got})")

    graph = None if sec["graph"] is None else _load_graph(sec["graph"], entries)
    return Container(path, h, graph, meta, entries, mm, size)


def _load_graph(d: Any, entries: dict[str, TensorEntry]) -> Graph:
    # A param's bytes live in the data section, so its shape must be fixed integers; checking
    # that first also keeps symbolic shapes away from IR shape rules that assume integers.
    params = d.get("params") if isinstance(d, dict) else None
    if isinstance(params, dict):
        for name, p in params.items():
            if not isinstance(p, dict) or not isinstance(name, str):
                continue  # Graph.from_dict names the problem
            where = f"graph.params['{name}']"
            shape = p.get("shape")
            if isinstance(shape, list) and not all(_is_int(n) for n in shape):
                raise FormatError(f"{where}.shape: a param needs integer dims, got {_short(shape)}")
            e = entries.get(name)
            if e is None:
                raise FormatError(f"{where}: no tensor of that name in the file")
            if p.get("dtype") != e.dtype:
                raise FormatError(f"{where}.dtype: graph says {_short(p.get('dtype'))}, tensor is "
                                  f"{e.dtype}")
            if isinstance(shape, list) and tuple(shape) != e.shape:
                raise FormatError(f"{where}.shape: graph says {shape}, tensor is {list(e.shape)}")
    try:
        graph = Graph.from_dict(d)
    except FormatError:
        raise
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError,
            ZeroDivisionError, RecursionError) as e:
        raise FormatError(f"graph: invalid ({type(e).__name__}: {e})") from None
    check_params(graph, {n: (e.dtype, e.shape) for n, e in entries.items()})
    return graph


def check_params(graph: Graph, tensors: Mapping[str, tuple[str, tuple[int, ...]]]) -> None:
    for name, info in graph.params.items():
        where = f"graph.params['{name}']"
        if name not in tensors:
            raise FormatError(f"{where}: no tensor of that name in the file")
        dtype, shape = tensors[name]
        if info.dtype != dtype:
            raise FormatError(f"{where}.dtype: graph says {info.dtype}, tensor is {dtype}")
        if tuple(info.shape) != tuple(shape):
            raise FormatError(f"{where}.shape: graph says {list(info.shape)}, tensor is "
                              f"{list(shape)}")


# --------------------------------------------------------------------------- writer


def _as_le(name: str, a: Any) -> tuple[str, np.ndarray]:
    if not isinstance(a, np.ndarray | np.generic):
        raise FormatError(f"tensors['{name}']: must be a NumPy array, got {type(a).__name__}")
    a = np.asarray(a)
    code = a.dtype.str[1:]
    dtype = _DTYPE_OF_CODE.get(code) if a.dtype.kind in "fiu" else None
    if dtype is None:
        raise FormatError(f"tensors['{name}']: unsupported dtype {a.dtype}; use one of "
                          f"{', '.join(str(d) for d in NP_DTYPES.values())}")
    if a.ndim > MAX_NDIM:
        raise FormatError(f"tensors['{name}']: {a.ndim} dims, at most {MAX_NDIM}")
    # np.asarray keeps 0-d arrays 0-d (np.ascontiguousarray would make them 1-d).
    return dtype, np.asarray(a, dtype=NP_DTYPES[dtype], order="C")


def _norm_quant(name: str, q: Any, dtype: str, shape: tuple[int, ...]) -> dict:
    where = f"quant['{name}']"
    if not isinstance(q, Mapping):
        raise FormatError(f"{where}: must be a dict with scale, zero_point, axis")
    q = dict(q)
    try:
        if "scale" in q:
            # Shortest float32 decimal: quant tables are a visible part of an int8 file's size.
            with np.errstate(over="ignore"):  # an overflowing scale is refused below, by name
                q["scale"] = [float(str(s)) for s in np.ravel(
                    np.asarray(q["scale"], dtype=np.float64)).astype(np.float32)]
        if "zero_point" in q:
            zp = np.ravel(np.asarray(q["zero_point"]))
            if zp.size and zp.dtype.kind not in "iu":
                raise FormatError(f"{where}.zero_point: must be integers, got {zp.dtype}")
            q["zero_point"] = [int(z) for z in zp]
        if isinstance(q.get("axis"), np.integer):
            q["axis"] = int(q["axis"])
    except (TypeError, ValueError) as e:
        if isinstance(e, FormatError):
            raise
        raise FormatError(f"{where}: {e}") from None
    return check_quant(where, q, dtype, shape)


def _byte_view(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1).view(np.uint8)


def write_container(path: str | os.PathLike, *, kind: str, tensors: Mapping[str, np.ndarray],
                    graph: Graph | None = None, meta: dict | None = None,
                    quant: Mapping[str, dict] | None = None) -> int:
    """Write a container atomically (temporary file, fsync, rename); returns its size in bytes."""
    path = os.fspath(path)
    if kind not in KINDS:
        raise FormatError(f"kind: must be one of {', '.join(KINDS)}, got {kind!r}")
    meta = {} if meta is None else meta
    if not isinstance(meta, dict):
        raise FormatError("meta: must be a dict")
    quant = dict(quant or {})
    for name in quant:
        if name not in tensors:
            raise FormatError(f"quant['{name}']: no tensor of that name")

    arrays: list[tuple[str, str, np.ndarray]] = []
    for name, a in tensors.items():
        if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME_LEN:
            raise FormatError(f"tensors: name {_short(name)} must be a string of "
                              f"1..{MAX_NAME_LEN} characters")
        dtype, a = _as_le(name, a)
        arrays.append((name, dtype, a))

    graph_dict = None
    if graph is not None:
        if not isinstance(graph, Graph):
            raise FormatError(f"graph: must be a pocket.formats.Graph, got {type(graph).__name__}")
        checked = Graph.from_dict(json.loads(_dumps(graph.to_dict(), "graph")))
        check_params(checked, {n: (dt, a.shape) for n, dt, a in arrays})
        graph_dict = checked.to_dict()

    # Pass 1: offsets and CRCs, which the graph section and header need before any data is written.
    entries_meta = []
    for name, dtype, a in arrays:
        q = quant.get(name)
        entries_meta.append((name, dtype, a, None if q is None else _norm_quant(name, q, dtype, a.shape)))

    def layout(data_start: int) -> tuple[list[dict], int, int]:
        out, end, crc = [], data_start, 0
        for name, dtype, a, q in entries_meta:
            off = align_up(end)
            crc = zlib.crc32(bytes(off - end), crc)
            b = _byte_view(a)
            t_crc = zlib.crc32(b) if b.size else 0
            crc = zlib.crc32(b, crc) if b.size else crc
            e = TensorEntry(name, dtype, tuple(int(n) for n in a.shape), off, a.nbytes, t_crc, q)
            out.append(e.to_dict())
            end = off + a.nbytes
        return out, end, crc

    # Absolute offsets depend on the graph section's length, which depends on the offsets'
    # digits: iterate until the data start is stable (two rounds at most in practice).
    data_start = align_up(HEADER_SIZE + 2)
    for _ in range(8):
        table, end, d_crc = layout(data_start)
        section = _dumps({"graph": graph_dict, "meta": meta, "tensors": table}, "meta").encode("utf-8")
        if align_up(HEADER_SIZE + len(section)) == data_start:
            break
        data_start = align_up(HEADER_SIZE + len(section))
    else:  # pragma: no cover - offsets grow by at most a few digits per round
        raise FormatError("tensors: could not settle the layout")
    if len(section) > MAX_GRAPH_SIZE:
        raise FormatError(f"graph section: {len(section)} bytes is over the {MAX_GRAPH_SIZE} limit; "
                          "move bulky metadata into tensors")
    if end > MAX_FILE_SIZE:
        raise FormatError(f"file: {end} bytes is over the {MAX_FILE_SIZE}-byte limit")
    _loads(section.decode("utf-8"), "meta")  # what the reader will reject (duplicate keys, depth)
    header = encode_header(kind, (len(section), zlib.crc32(section)), (end - data_start, d_crc))

    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(header)
            f.write(section)
            pos = HEADER_SIZE + len(section)
            for (_, _, a, _), e in zip(entries_meta, table):
                f.write(bytes(e["offset"] - pos))
                if a.nbytes:
                    f.write(_byte_view(a))
                pos = e["offset"] + e["length"]
            f.write(bytes(max(0, data_start - pos)))  # only when there are no tensors
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(folder)
    return end


def _fsync_dir(folder: str) -> None:
    # Makes the rename durable on POSIX; directories cannot be opened this way on Windows.
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
