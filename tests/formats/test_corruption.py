"""A corrupt or hostile file raises FormatError, and nothing else, quickly."""

from __future__ import annotations

import copy
import json
import random
import sys
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pocket.formats import FormatError, Graph
from pocket.formats.container import read_container, write_container


def build_graph() -> tuple[Graph, dict[str, np.ndarray]]:
    params = {"w": np.arange(12, dtype=np.float32).reshape(3, 4) / 10,
              "b": np.array([0.5, -1, 2], np.float32)}
    g = Graph.from_dict({
        "inputs": [{"name": "x", "dtype": "f32", "shape": ["N", 4]}],
        "outputs": ["y"],
        "params": {"w": {"dtype": "f32", "shape": [3, 4]}, "b": {"dtype": "f32", "shape": [3]}},
        "nodes": [{"name": "fc", "op": "linear", "inputs": ["x", "w", "b"], "outputs": ["h"]},
                  {"name": "act", "op": "relu", "inputs": ["h"], "outputs": ["y"]}],
    })
    return g, params


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> bytes:
    g, params = build_graph()
    p = tmp_path_factory.mktemp("good") / "m.bin"
    write_container(p, kind="model", graph=g, meta={"epoch": 2, "rng": [2**100, 7]},
                    tensors={**params, "q": np.arange(-3, 3, dtype=np.int8).reshape(2, 3),
                             "s": np.array(5, np.int64), "e": np.zeros((0, 2), np.float16),
                             "odd": np.arange(5, dtype=np.uint8)},
                    quant={"q": {"scale": [0.1, 0.2], "zero_point": [0, 1], "axis": 0}})
    return p.read_bytes()


class Loader:
    """Writes bytes to one path and loads them; returns 'ok' or 'format', lets anything else out."""

    def __init__(self, path):
        self.path = path

    def __call__(self, data: bytes, **kw) -> str:
        self.path.write_bytes(data)
        try:
            c = read_container(self.path, **kw)
        except FormatError:
            return "format"
        # A loaded file must be usable: touch every tensor and the graph.
        for a in c.tensors.values():
            np.asarray(a).sum()
        if c.graph is not None:
            c.graph.validate()
        c.close()
        return "ok"


@pytest.fixture
def load(tmp_path) -> Loader:
    return Loader(tmp_path / "f.bin")


# --------------------------------------------------------------------------- file surgery
# Independent of the writer: parse the sections with json/zlib, edit, then re-emit with fresh CRCs
# so that the reader's structural checks, not only its CRCs, see the edit.


def split(raw: bytes) -> tuple[dict, dict, bytes]:
    h = json.loads(raw[:127].decode())
    glen = h["g"][0]
    sec = json.loads(raw[128:128 + glen].decode())
    w = (128 + glen + 63) // 64 * 64
    return h, sec, raw[w:]


def emit(h: dict, section: bytes | dict, data: bytes, *, fix_data_crc: bool = True,
         fix_len: bool = True, w: int | None = None) -> bytes:
    if isinstance(section, dict):
        section = _relocate(section, w or (128 + h["g"][0] + 63) // 64 * 64)
    h = dict(h)
    h.pop("crc", None)
    if fix_len:
        h["g"] = [len(section), zlib.crc32(section)]
        h["d"] = [len(data), zlib.crc32(data) if fix_data_crc else h["d"][1]]
    text = json.dumps(h, separators=(",", ":"))
    text = text[:-1] + f',"crc":{zlib.crc32(text.encode())}}}'
    head = text.encode().ljust(127) + b"\n"
    pad = bytes(-(128 + len(section)) % 64)
    return head + section + pad + data


def _relocate(sec: dict, w: int) -> bytes:
    """Serialize so that the data section still starts at w: offsets are absolute, so a
    section that grew past a 64-byte boundary moves every tensor; one that shrank is padded
    with JSON whitespace."""
    for _ in range(8):
        text = json.dumps(sec, separators=(",", ":")).encode()
        new_w = (128 + len(text) + 63) // 64 * 64
        if new_w <= w:
            return text.ljust(w - 128) if new_w < w else text
        for e in sec.get("tensors", []) if isinstance(sec.get("tensors"), list) else []:
            if isinstance(e, dict) and type(e.get("offset")) is int:
                e["offset"] += new_w - w
        w = new_w
    raise AssertionError("layout did not settle")


def test_surgery_roundtrip_is_identity(good, load):
    h, sec, data = split(good)
    assert emit(h, sec, data) == good
    assert load(good) == "ok"


# --------------------------------------------------------------------------- truncation


def boundaries(raw: bytes) -> list[int]:
    h, sec, data = split(raw)
    glen = h["g"][0]
    w = (128 + glen + 63) // 64 * 64
    cuts = {0, 1, 64, 126, 127, 129, 128 + glen - 1, 128 + glen, w - 1, w, len(raw) - 1}
    for e in sec["tensors"]:
        cuts |= {e["offset"] - 1, e["offset"], e["offset"] + 1, e["offset"] + e["length"] - 1}
    return sorted(c for c in cuts if 0 <= c < len(raw))


def test_truncation_at_every_boundary(good, load):
    for cut in boundaries(good):
        assert load(good[:cut]) == "format", cut
        assert load(good[:cut], verify_crc=False) == "format", cut


def test_truncation_at_random_points(good, load):
    rng = random.Random(1)
    for _ in range(200):
        cut = rng.randrange(len(good))
        assert load(good[:cut]) == "format", cut


def test_trailing_bytes(good, load):
    assert load(good + b"\0") == "format"
    assert load(good + bytes(64)) == "format"
    h, sec, data = split(good)
    # Trailing bytes that the header even accounts for: the tensors no longer end the file.
    assert load(emit(h, sec, data + bytes(64))) == "format"


# --------------------------------------------------------------------------- bit flips


def regions(raw: bytes) -> dict[str, range]:
    h, sec, data = split(raw)
    glen = h["g"][0]
    w = (128 + glen + 63) // 64 * 64
    gaps = []
    end = w
    for e in sec["tensors"]:
        gaps += range(end, e["offset"])
        end = e["offset"] + e["length"]
    return {"header": range(0, 128), "graph": range(128, 128 + glen),
            "graph_padding": range(128 + glen, w), "data": range(w, len(raw)), "data_gaps": gaps}


@pytest.mark.parametrize("region", ["header", "graph", "graph_padding", "data", "data_gaps"])
def test_bit_flips(good, load, region):
    where = regions(good)[region]
    assert len(where) > 0
    rng = random.Random(region)
    positions = list(where) if len(where) <= 300 else rng.sample(list(where), 300)
    for pos in positions:
        bad = bytearray(good)
        bad[pos] ^= 1 << rng.randrange(8)
        assert load(bytes(bad)) == "format", (region, pos)


def test_data_flip_passes_without_crc(good, load):
    h, sec, data = split(good)
    e = next(e for e in sec["tensors"] if e["name"] == "w")
    bad = bytearray(good)
    bad[e["offset"] + 1] ^= 0x40
    assert load(bytes(bad)) == "format"
    assert load(bytes(bad), verify_crc=False) == "ok"


# --------------------------------------------------------------------------- structural edits


def edit_entry(good: bytes, target: str, **fields) -> bytes:
    h, sec, data = split(good)
    for e in sec["tensors"]:
        if e["name"] == target:
            e.update(fields)
    return emit(h, sec, data)


def expect(load, data: bytes, match: str) -> None:
    path = load.path
    path.write_bytes(data)
    with pytest.raises(FormatError, match=match):
        read_container(path)


@pytest.mark.parametrize("fields, match", [
    ({"offset": 0}, r"tensors\[\d\]"),
    ({"offset": 64}, r"tensors\[\d\].offset"),
    ({"offset": 2**40}, r"tensors\[\d\].offset"),
    ({"offset": 2**64}, r"tensors\[\d\].offset"),
    ({"offset": -64}, r"tensors\[\d\].offset"),
    ({"offset": True}, r"tensors\[\d\].offset"),
    ({"offset": 64.0}, r"tensors\[\d\].offset"),
    ({"offset": "64"}, r"tensors\[\d\].offset"),
    ({"length": 2**64}, r"tensors\[\d\].length"),
    ({"length": -1}, r"tensors\[\d\].length"),
    ({"length": 0}, r"tensors\[\d\].length"),
    ({"shape": [2**40, 2**40]}, r"tensors\[\d\].shape"),
    ({"shape": [0, 2**62]}, r"tensors\[\d\].shape"),
    ({"shape": [0, 2**30, 2**30]}, r"tensors\[\d\].shape"),
    ({"shape": [-3, -4]}, r"tensors\[\d\].shape"),
    ({"shape": [3, 4.0]}, r"tensors\[\d\].shape"),
    ({"shape": [3, True, 4]}, r"tensors\[\d\]"),
    ({"shape": [1] * 40 + [12]}, r"tensors\[\d\].shape"),
    ({"shape": "3x4"}, r"tensors\[\d\].shape"),
    ({"dtype": "f64"}, r"tensors\[\d\].dtype"),
    ({"dtype": "i8"}, r"tensors\[\d\].length"),
    ({"name": ""}, r"tensors\[\d\].name"),
    ({"name": "x" * 257}, r"tensors\[\d\].name"),
    ({"name": "b"}, "duplicate"),
    ({"name": 5}, r"tensors\[\d\].name"),
    ({"crc32": 2**32}, r"tensors\[\d\].crc32"),
    ({"crc32": 12345}, r"tensors\[\d\].crc32: CRC mismatch"),
    ({"quant": {"scale": [1.0], "zero_point": [0], "axis": None}}, "only i8"),
    ({"extra": 1}, "unknown field"),
])
def test_bad_tensor_entries(good, load, fields, match):
    expect(load, edit_entry(good, "w", **fields), match)


@pytest.mark.parametrize("quant, match", [
    ({"scale": [0.1, 0.0], "zero_point": [0, 0], "axis": 0}, r"scale\[1\]"),
    ({"scale": [0.1, -1], "zero_point": [0, 0], "axis": 0}, r"scale\[1\]"),
    ({"scale": [0.1, 1e308, 1], "zero_point": [0, 0, 0], "axis": 0}, "scale"),
    ({"scale": [0.1, True], "zero_point": [0, 0], "axis": 0}, r"scale\[1\]"),
    ({"scale": [0.1, 0.2], "zero_point": [0, 128], "axis": 0}, r"zero_point\[1\]"),
    ({"scale": [0.1, 0.2], "zero_point": [0, 1.0], "axis": 0}, r"zero_point\[1\]"),
    ({"scale": [0.1, 0.2], "zero_point": [0, 0], "axis": 2}, "axis"),
    ({"scale": [0.1, 0.2], "zero_point": [0, 0], "axis": -1}, "axis"),
    ({"scale": [0.1, 0.2], "zero_point": [0, 0], "axis": None}, "scale"),
    ({"scale": [0.1, 0.2], "zero_point": [0, 0]}, "axis: missing"),
    ({"scale": [0.1, 0.2], "zero_point": [0, 0], "axis": 0, "bits": 8}, "unknown field"),
    ([1, 2], "quant"),
])
def test_bad_quant(good, load, quant, match):
    expect(load, edit_entry(good, "q", quant=quant), match)


def test_overlapping_and_out_of_order_offsets(good, load):
    h, sec, data = split(good)
    t = sec["tensors"]
    swapped = copy.deepcopy(sec)
    swapped["tensors"][0]["offset"], swapped["tensors"][1]["offset"] = t[1]["offset"], t[0]["offset"]
    expect(load, emit(h, swapped, data), r"tensors\[\d\].offset")
    overlap = copy.deepcopy(sec)
    overlap["tensors"][1]["offset"] = t[0]["offset"]
    expect(load, emit(h, overlap, data), r"tensors\[1\].offset.*overlaps")
    gap = copy.deepcopy(sec)
    for e in gap["tensors"]:
        e["offset"] += 64
    expect(load, emit(h, gap, bytes(64) + data), r"tensors\[0\].offset")
    misaligned = copy.deepcopy(sec)
    misaligned["tensors"][1]["offset"] += 1
    expect(load, emit(h, misaligned, data), r"tensors\[1\].offset")


def test_nonzero_padding_with_fixed_crcs(good, load):
    h, sec, data = split(good)
    glen = h["g"][0]
    pad = (128 + glen + 63) // 64 * 64 - 128 - glen
    assert pad > 0
    raw = bytearray(emit(h, sec, data))
    raw[128 + glen] = 1
    expect(load, bytes(raw), "padding")
    gaps = regions(good)["data_gaps"]
    w = 128 + glen + pad
    d = bytearray(data)
    d[gaps[0] - w] = 7
    expect(load, emit(h, sec, bytes(d)), r"tensors\[\d\].offset: padding")


@pytest.mark.parametrize("edit, match", [
    (lambda h: h.update(pocket=[2, 0]), "header.pocket: format version 2.0"),
    (lambda h: h.update(pocket=[0, 9]), "header.pocket"),
    (lambda h: h.update(pocket=[1, 100]), r"header.pocket\[1\]"),
    (lambda h: h.update(pocket=[1, -1]), r"header.pocket\[1\]"),
    (lambda h: h.update(pocket=[1]), "header.pocket"),
    (lambda h: h.update(pocket=[True, 0]), "header.pocket"),
    (lambda h: h.update(kind="weights"), "header.kind"),
    (lambda h: h.update(le=0), "header.le"),
    (lambda h: h.update(le=True), "header.le"),
    (lambda h: h.update(align=32), "header.align"),
    (lambda h: h.update(align=64.0), "header.align"),
    (lambda h: h.pop("align"), "header.align: missing"),
    (lambda h: h.update(extra=1), "header.extra: unknown"),
])
def test_bad_header_fields(good, load, edit, match):
    h, sec, data = split(good)
    edit(h)
    expect(load, emit(h, sec, data), match)


@pytest.mark.parametrize("g, d, match", [
    ([2**26 + 1, 0], None, r"header.g\[0\]"),
    ([-1, 0], None, r"header.g\[0\]"),
    ([10**6, 0], None, "header.g"),
    (None, [2**64, 0], r"header.d\[0\]"),
    (None, [2**36 + 1, 0], r"header.d\[0\]"),
    (None, [0, 0], "header.d"),
    (None, [1, 2**32], r"header.d\[1\]"),
    ([5, "x"], None, r"header.g\[1\]"),
])
def test_bad_section_sizes(good, load, g, d, match):
    h, sec, data = split(good)
    if g is not None:
        h["g"] = g
    if d is not None:
        h["d"] = d
    expect(load, emit(h, sec, data, fix_len=False), match)


def test_header_crc_and_form(good, load):
    text = good[:127].decode().rstrip()
    bad = text.replace('"crc":', '"crc":1') if '"crc":0' not in text else text
    expect(load, bad.encode().ljust(127) + b"\n" + good[128:], "header.crc")
    spaced = text.replace(',"kind"', ', "kind"')
    expect(load, spaced.encode().ljust(127) + b"\n" + good[128:], "compact")
    expect(load, good[:127] + b" " + good[128:], "byte 127")
    expect(load, text.encode().ljust(127, b"\0") + b"\n" + good[128:], "header")
    expect(load, b"\xff" + good[1:], "header")


def test_duplicate_keys(good, load):
    h, sec, data = split(good)
    text = good[:127].decode().rstrip()
    dup = text.replace('"le":1,', '"le":1,"le":1,')
    expect(load, dup.encode().ljust(127) + b"\n" + good[128:], "duplicate key '?le")
    s = json.dumps(sec, separators=(",", ":"))
    for old, new in [('"meta":{', '"meta":{"epoch":1,'), ('{"graph":', '{"meta":{},"graph":'),
                     ('"name":"w"', '"name":"w","name":"v"'), ('"op":"relu"', '"op":"relu","op":"tanh"')]:
        assert old in s
        expect(load, emit(h, s.replace(old, new, 1).encode(), data), "duplicate key")


@pytest.mark.parametrize("section_text, match", [
    (b'{"graph":null,"meta":{},"tensors":[]', "not valid JSON"),
    (b"[]", "graph section"),
    (b'{"graph":null,"meta":[],"tensors":[]}', "meta"),
    (b'{"graph":null,"meta":{},"tensors":{}}', "tensors"),
    (b'{"graph":null,"meta":{}}', "tensors: missing"),
    (b'{"graph":null,"meta":{},"tensors":[],"x":1}', "unknown field"),
    (b'{"graph":null,"meta":{"a":NaN},"tensors":[]}', "NaN"),
    (b'{"graph":null,"meta":{"a":-Infinity},"tensors":[]}', "Infinity"),
    (b'{"graph":null,"meta":{"a":1e999},"tensors":[]}', "out of range"),
    (b'{"graph":null,"meta":{"a":' + b"9" * 5000 + b"},\"tensors\":[]}", "not valid JSON"),
    (b'{"graph":null,"meta":' + b"[" * 100000 + b"]" * 100000 + b',"tensors":[]}', "nested"),
    (b'{"graph":null,"meta":{"a":' + b"[" * 70 + b"]" * 70 + b'},"tensors":[]}', "nested"),
    (b'{"graph":null,"meta":{"a":"\xff"},"tensors":[]}', "UTF-8"),
    (b'{"graph":[],"meta":{},"tensors":[]}', "graph"),
])
def test_bad_graph_section_json(good, load, section_text, match):
    h, _, _ = split(good)
    expect(load, emit(h, section_text, b""), match)


def graph_edit(good: bytes, fn) -> bytes:
    h, sec, data = split(good)
    fn(sec["graph"])
    return emit(h, sec, data)


@pytest.mark.parametrize("fn, match", [
    (lambda g: g["nodes"][1].update(op="swish"), "unknown op 'swish'"),
    (lambda g: g["nodes"][1].update(inputs=["h", "h"]), "takes 1..1 inputs"),
    (lambda g: g["nodes"][0].update(inputs=["x", "w", "nope"]), "nope"),
    (lambda g: g["params"].update(c={"dtype": "f32", "shape": [3]}), r"graph.params\['c'\]"),
    (lambda g: g["params"]["w"].update(shape=[4, 3]), r"graph.params\['w'\].shape"),
    (lambda g: g["params"]["w"].update(dtype="f16"), r"graph.params\['w'\].dtype"),
    (lambda g: g["params"]["w"].update(shape=["N", 4]), r"graph.params\['w'\].shape"),
    (lambda g: g["params"]["b"].update(shape=["K"]), r"graph.params\['b'\].shape"),
    (lambda g: g["nodes"][0]["attrs"].update(alpha=10**400), "alpha"),
    (lambda g: g["nodes"][0]["attrs"].update(activation=3), "activation"),
    (lambda g: g.update(outputs=[]), "graph.outputs"),
    (lambda g: g.pop("nodes"), "graph.nodes"),
])
def test_bad_graphs(good, load, fn, match):
    expect(load, graph_edit(good, fn), match)


def test_symbolic_param_conv_weight_is_format_error(load, tmp_path):
    # A symbolic dim in a conv weight reached integer-only arithmetic in the IR's shape rules.
    h, sec, data = split(_conv_file(tmp_path))
    sec["graph"]["params"]["w"]["shape"] = ["O", 1, 3, 3]
    expect(load, emit(h, sec, data), r"graph.params\['w'\].shape")


def _conv_file(tmp_path) -> bytes:
    g = Graph.from_dict({
        "inputs": [{"name": "x", "dtype": "f32", "shape": ["N", 1, 5, 5]}], "outputs": ["y"],
        "params": {"w": {"dtype": "f32", "shape": [2, 1, 3, 3]}},
        "nodes": [{"name": "c", "op": "conv2d", "inputs": ["x", "w"], "outputs": ["y"]}]})
    p = tmp_path / "conv.bin"
    write_container(p, kind="model", graph=g, tensors={"w": np.ones((2, 1, 3, 3), np.float32)})
    return p.read_bytes()


@pytest.mark.parametrize("data", [b"", b"\n" * 127, b" " * 127 + b"\n", bytes(128), b"{}".ljust(127) + b"\n",
                                  b"[1,2]".ljust(127) + b"\n", b'{"pocket":[1,0]}'.ljust(127) + b"\n"])
def test_tiny_and_degenerate_files(load, data):
    assert load(data) == "format"


# --------------------------------------------------------------------------- randomized mutation

NASTY = [None, True, False, 0, -1, 1, 63, 64, 65, 2**31, 2**32, 2**63, 2**64, -(2**63), 10**30,
         0.5, 1e308, -0.0, "", "x", "f32", "i8", "N", [], [0], [-1], [2**62, 2**62], [1] * 40, {},
         {"a": 1}, "model", "checkpoint", [1, 0], [2, 0], [[]]]


def _paths(obj, prefix=()):
    """Every (container, key) inside a JSON value, so an edit can target any field."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield obj, k
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield obj, i
            yield from _paths(v, prefix + (i,))


def _structural_mutant(good: bytes, rng: random.Random) -> bytes:
    h, sec, data = split(good)
    w = (128 + h["g"][0] + 63) // 64 * 64
    target = rng.choice(["header", "section", "section", "both"])
    for obj in ([h] if target == "header" else [sec] if target == "section" else [h, sec]):
        slots = list(_paths(obj))
        for _ in range(rng.randint(1, 3)):
            parent, key = rng.choice(slots)
            r = rng.random()
            if r < 0.6:
                parent[key] = copy.deepcopy(rng.choice(NASTY))
            elif r < 0.8 and isinstance(parent[key], int) and not isinstance(parent[key], bool):
                parent[key] += rng.choice([-64, -1, 1, 64, 2**32])
            elif isinstance(parent, dict):
                del parent[key]
                break
            elif isinstance(parent, list) and parent:
                parent.insert(rng.randrange(len(parent) + 1), copy.deepcopy(parent[key]))
                break
    if rng.random() < 0.2:
        data = bytearray(data)
        if data:
            data[rng.randrange(len(data))] ^= 0xFF
        data = bytes(data)
    return emit(h, sec, data, fix_len=rng.random() < 0.9, w=w)


def _byte_mutant(good: bytes, rng: random.Random) -> bytes:
    raw = bytearray(good)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        pos = rng.randrange(len(raw) + 1) if raw else 0
        if op == 0 and raw:
            raw[min(pos, len(raw) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1 and raw:
            raw[min(pos, len(raw) - 1)] = rng.randrange(256)
        elif op == 2:
            del raw[pos:]
        elif op == 3:
            raw[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 70)))
        elif op == 4:
            del raw[pos:pos + rng.randint(1, 70)]
        else:
            raw[pos:pos + 4] = rng.choice([b"\xff\xff\xff\xff", b"9999", b"null", b'"",'])
    return bytes(raw)


class CallBudget:
    """Counts the function calls (Python and C) made while active and raises past `limit`.

    NOTE: the work bound is counted, not timed: a wall-clock bound failed on a loaded CI
    machine while the reader did nothing wrong. A reader that loops on a hostile size field
    makes calls per iteration and runs out of budget on any machine, at the same mutant."""

    def __init__(self, limit: int):
        self.limit, self.calls, self.most = limit, 0, 0

    def _count(self, frame, event, arg):
        if event in ("call", "c_call"):
            self.calls += 1
            if self.calls > self.limit:
                raise RuntimeError(f"over {self.limit} calls")

    def run(self, fn, *args):
        self.calls = 0
        sys.setprofile(self._count)
        try:
            return fn(*args)
        finally:
            sys.setprofile(None)
            self.most = max(self.most, self.calls)


def test_randomized_mutations(good, load):
    """Thousands of seeded mutants: each loads or raises FormatError; nothing else, no hang."""
    rng = random.Random(20240601)
    counts = {"ok": 0, "format": 0}
    # Measured: the good file takes ~1300 calls and the costliest of these mutants ~1350, so
    # 20x the good file's count means runaway work, on any machine.
    good_calls = CallBudget(10**9)
    good_calls.run(load, good)
    budget = CallBudget(20 * good_calls.calls)
    for i in range(4000):
        mutant = _structural_mutant(good, rng) if i % 2 else _byte_mutant(good, rng)
        counts[budget.run(load, mutant)] += 1
    assert counts["format"] > 2000  # the mutants do reach the checks


# --------------------------------------------------------------------------- hypothesis

DT = {"f32": np.float32, "f16": np.float16, "i8": np.int8, "u8": np.uint8, "i32": np.int32,
      "i64": np.int64}


@st.composite
def arrays(draw):
    dtype = np.dtype(DT[draw(st.sampled_from(list(DT)))])
    shape = tuple(draw(st.lists(st.integers(0, 5), max_size=4)))
    n = int(np.prod(shape))
    raw = draw(st.binary(min_size=n * dtype.itemsize, max_size=n * dtype.itemsize))
    # Any bit pattern is a legal value, NaN payloads included: compare bytes.
    a = np.frombuffer(raw, dtype=dtype.newbyteorder("<")).reshape(shape)
    if draw(st.booleans()):
        a = a.astype(dtype.newbyteorder(">"))
    return a


names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tensors=st.dictionaries(names, arrays(), max_size=6), kind=st.sampled_from(["model", "checkpoint"]))
def test_property_roundtrip(tmp_path, tensors, kind):
    p = tmp_path / "h.bin"
    write_container(p, kind=kind, tensors=tensors)
    with read_container(p) as c:
        assert list(c.entries) == list(tensors)
        for k, a in tensors.items():
            got = c.tensors[k]
            assert got.shape == a.shape
            assert got.tobytes() == a.astype(a.dtype.newbyteorder("<")).tobytes()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=600))
def test_property_arbitrary_bytes(tmp_path, data):
    assert Loader(tmp_path / "a.bin")(data) == "format"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pos=st.integers(0, 10**6), junk=st.binary(max_size=40), cut=st.booleans())
def test_property_spliced_bytes(tmp_path, good, pos, junk, cut):
    pos %= len(good) + 1
    mutant = good[:pos] + junk + (b"" if cut else good[pos + len(junk):])
    assert Loader(tmp_path / "s.bin")(mutant) in ("ok", "format")
