"""Recognize files by their first bytes, so a file of the wrong kind gets a sentence, not a
parser's complaint about byte 127 (an ONNX model handed to `pocket infer`, say)."""

from __future__ import annotations

import os
import stat

from pocket.formats.errors import FormatError

# ModelProto field number -> protobuf wire type (0 varint, 2 length-delimited); onnx.proto3
_ONNX_MODEL_FIELDS = {1: 0, 2: 2, 3: 2, 4: 2, 5: 0, 6: 2, 7: 2, 8: 2, 14: 2, 20: 2, 25: 2}
HEAD_BYTES = 4096


def _varint(b: bytes, pos: int) -> tuple[int | None, int]:
    value = shift = 0
    while pos < len(b) and shift < 64:
        byte = b[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    return None, pos


def looks_like_onnx(head: bytes, size: int | None = None) -> bool:
    """True when `head` (the file's first bytes) parses as the start of an ONNX ModelProto:
    an ir_version first, then only ModelProto fields whose lengths fit in the file."""
    size = len(head) if size is None else size
    pos, seen = 0, []
    while pos < len(head) and len(seen) < 32:
        key, pos = _varint(head, pos)
        if key is None:
            break
        field, wire = key >> 3, key & 7
        if _ONNX_MODEL_FIELDS.get(field) != wire or (seen and field < seen[-1]):
            return False
        value, pos = _varint(head, pos)
        if value is None:
            break
        if field == 1 and not 1 <= value <= 64:
            return False
        if wire == 2:
            pos += value
            if pos > size:
                return False
        seen.append(field)
        if field == 7:  # the graph: nothing a pocket container could start with gets here
            break
    return bool(seen) and seen[0] == 1 and len(seen) >= 2


def check_file(path: str | os.PathLike, what: str = "file", *, allow_onnx: bool = False) -> bool:
    """Refuse what cannot be a pocket container before anything opens it for reading: a missing
    path, a FIFO or device (reading one blocks), and ONNX models unless `allow_onnx` (the
    callers that import them, pocket.importer). Returns whether the file is ONNX."""
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise FormatError(f"{p}: no such {what}; check the path") from None
    except OSError as e:
        raise FormatError(f"{p}: cannot read ({e.strerror or e})") from None
    if stat.S_ISDIR(st.st_mode):
        raise FormatError(f"{p}: is a folder; give the {what} itself")
    if not stat.S_ISREG(st.st_mode):
        raise FormatError(f"{p}: not a regular file (a FIFO, device or socket); copy it to a file first")
    try:
        with open(p, "rb") as f:
            head = f.read(HEAD_BYTES)
    except OSError as e:
        raise FormatError(f"{p}: cannot read ({e.strerror or e})") from None
    onnx = looks_like_onnx(head, st.st_size)
    if onnx and not allow_onnx:
        raise FormatError(f"{p}: this is an ONNX file; this command reads pocket's own .bin/.ckpt "
                          f"files: convert it with `pocket import {p} -o MODEL.bin`")
    return onnx
