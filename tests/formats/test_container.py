"""Round trips through the container, and the spec comment checked against real bytes."""

from __future__ import annotations

import json
import mmap
import os
import re
import zlib

import numpy as np
import pytest

import pocket.formats.container as container
from pocket.formats import FormatError, Graph
from pocket.formats.container import (
    ALIGN,
    FORMAT_VERSION,
    HEADER_SIZE,
    TensorEntry,
    decode_header,
    read_container,
    write_container,
)
from pocket.formats.describe import describe, render

# Independent of the module under test: the spec's dtype names and their NumPy equivalents.
DTYPES = {"f32": "<f4", "f16": "<f2", "i8": "i1", "u8": "u1", "i32": "<i4", "i64": "<i8"}
SHAPES = [(), (0,), (3, 0, 2), (7,), (2, 3, 5), (1, 1, 1, 1, 1, 1, 1, 3)]


def sample(dtype: str, shape: tuple, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dt = np.dtype(DTYPES[dtype])
    if dt.kind == "f":
        a = rng.standard_normal(shape).astype(dt)
        if a.size >= 3:  # special values must survive bit-exactly
            a.flat[0], a.flat[1], a.flat[2] = np.inf, -0.0, np.nan
        return a
    info = np.iinfo(dt)
    a = rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)
    if a.size >= 2:
        a.flat[0], a.flat[1] = info.min, info.max
    return a


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype.str[1:] == b.dtype.str[1:] and (
        np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).astype(a.dtype).tobytes()
    )


def small_graph() -> tuple[Graph, dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    params = {
        "conv.weight": rng.standard_normal((4, 1, 3, 3)).astype(np.float32),
        "conv.bias": rng.standard_normal(4).astype(np.float32),
        "fc.weight": rng.standard_normal((3, 4 * 6 * 6)).astype(np.float32),
        "fc.bias": np.zeros(3, np.float32),
    }
    g = Graph.from_dict({
        "inputs": [{"name": "x", "dtype": "f32", "shape": ["N", 1, 8, 8]}],
        "outputs": ["probs"],
        "params": {k: {"dtype": "f32", "shape": list(v.shape)} for k, v in params.items()},
        "nodes": [
            {"name": "conv", "op": "conv2d", "inputs": ["x", "conv.weight", "conv.bias"],
             "outputs": ["h1"], "attrs": {"activation": "relu"}},
            {"name": "flat", "op": "flatten", "inputs": ["h1"], "outputs": ["h2"]},
            {"name": "fc", "op": "linear", "inputs": ["h2", "fc.weight", "fc.bias"],
             "outputs": ["logits"]},
            {"name": "sm", "op": "softmax", "inputs": ["logits"], "outputs": ["probs"]},
        ],
        "metadata": {"task": "classification", "labels": ["a", "b", "c"]},
    })
    return g, params


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_roundtrip_every_dtype_and_shape(tmp_path, dtype, shape):
    a = sample(dtype, shape)
    p = tmp_path / "t.bin"
    n = write_container(p, kind="model", tensors={"t": a, "after": np.ones(3, np.uint8)})
    assert n == os.path.getsize(p)
    with read_container(p) as c:
        got = c.tensors["t"]
        assert got.shape == shape and got.dtype == np.dtype(DTYPES[dtype])
        assert same_bits(a, got)
        assert c.entries["t"].length == a.nbytes
        assert c.entries["t"].offset % ALIGN == 0
        assert list(c.tensors["after"]) == [1, 1, 1]


def test_roundtrip_big_tensor(tmp_path):
    a = np.random.default_rng(0).standard_normal((1031, 1037)).astype(np.float32)
    p = tmp_path / "big.bin"
    write_container(p, kind="checkpoint", tensors={"a": a[:, :3], "big": a})
    with read_container(p) as c:
        np.testing.assert_array_equal(c.tensors["big"], a)
        np.testing.assert_array_equal(c.tensors["a"], a[:, :3])


@pytest.mark.parametrize("make", [
    lambda a: a.T,
    lambda a: a[::2, 1::3],
    lambda a: a[:, ::-1],
    lambda a: np.asfortranarray(a),
], ids=["transposed", "strided", "reversed", "fortran"])
def test_roundtrip_non_contiguous(tmp_path, make):
    base = np.arange(7 * 11, dtype=np.int32).reshape(7, 11)
    a = make(base)
    write_container(tmp_path / "n.bin", kind="model", tensors={"a": a})
    with read_container(tmp_path / "n.bin") as c:
        np.testing.assert_array_equal(c.tensors["a"], a)
        assert c.tensors["a"].flags.c_contiguous


@pytest.mark.parametrize("be", [">f4", ">f2", ">i4", ">i8"])
def test_roundtrip_big_endian_input(tmp_path, be):
    a = np.arange(-5, 7).reshape(3, 4).astype(be)
    write_container(tmp_path / "b.bin", kind="model", tensors={"a": a, "s": a[0, 0]})
    raw = (tmp_path / "b.bin").read_bytes()
    with read_container(tmp_path / "b.bin") as c:
        np.testing.assert_array_equal(c.tensors["a"], a)
        assert c.tensors["a"].dtype.byteorder in "<="
        assert c.tensors["s"].shape == () and c.tensors["s"] == a[0, 0]
        off = c.entries["a"].offset
    assert raw[off:off + a.nbytes] == a.astype("<" + be[1:]).tobytes()


@pytest.mark.parametrize("kind", ["model", "checkpoint"])
@pytest.mark.parametrize("with_graph", [False, True])
@pytest.mark.parametrize("with_meta", [False, True])
@pytest.mark.parametrize("with_quant", [False, True])
def test_roundtrip_kinds_graph_meta_quant(tmp_path, kind, with_graph, with_meta, with_quant):
    g, params = small_graph()
    tensors = dict(params)
    tensors["q"] = np.arange(-6, 6, dtype=np.int8).reshape(3, 4)
    tensors["bias_q"] = np.array([1, -2, 3], np.int32)
    meta = {"epoch": 3, "rng": {"state": 2**127 + 12345, "inc": 2**64 + 1},
            "history": [{"loss": 0.5, "acc": 0.9}], "config": {"lr": 1e-3, "name": "ö"}}
    quant = {"q": {"scale": np.array([0.5, 0.25, 0.125], np.float32), "zero_point": [0, 1, -1],
                   "axis": 0},
             "bias_q": {"scale": [0.01], "zero_point": [0], "axis": None}}
    p = tmp_path / "k.bin"
    write_container(p, kind=kind, tensors=tensors, graph=g if with_graph else None,
                    meta=meta if with_meta else None, quant=quant if with_quant else None)
    with read_container(p, expect_kind=kind) as c:
        assert c.kind == kind and c.version == FORMAT_VERSION
        assert list(c.entries) == list(tensors)
        for k, v in tensors.items():
            np.testing.assert_array_equal(c.tensors[k], v)
        assert c.meta == (meta if with_meta else {})
        if with_graph:
            assert c.graph is not None and c.graph.to_dict() == g.to_dict()
        else:
            assert c.graph is None
        if with_quant:
            assert c.quant("q") == {"scale": [0.5, 0.25, 0.125], "zero_point": [0, 1, -1], "axis": 0}
            # scales are float32: 0.01 comes back as the float32 nearest to it
            assert c.quant("bias_q") == {"scale": [float(np.float32(0.01))], "zero_point": [0],
                                         "axis": None}
        else:
            assert c.quant("q") is None
        assert isinstance(c.entries["q"], TensorEntry)
        with pytest.raises(KeyError):
            c.quant("nope")
    other = "checkpoint" if kind == "model" else "model"
    with pytest.raises(FormatError, match="header.kind"):
        read_container(p, expect_kind=other)


def test_no_tensors_and_only_empty_tensors(tmp_path):
    for tensors in ({}, {"e": np.zeros((0, 4), np.float32)},
                    {"a": np.ones(3, np.int8), "e": np.zeros((5, 0), np.int64)}):
        p = tmp_path / "e.bin"
        n = write_container(p, kind="checkpoint", tensors=tensors)
        with read_container(p) as c:
            assert c.file_size == n
            for k, v in tensors.items():
                assert c.tensors[k].shape == v.shape
                np.testing.assert_array_equal(c.tensors[k], v)


# --------------------------------------------------------------------------- the spec, in bytes


def test_spec_byte_layout(tmp_path):
    """Every statement of the spec comment, checked with zlib/json on the raw bytes."""
    g, params = small_graph()
    tensors = {"odd": np.arange(5, dtype=np.int8), **params, "empty": np.zeros((2, 0), np.float32),
               "scalar": np.array(7, np.int64), "tail_empty": np.zeros(0, np.uint8)}
    p = tmp_path / "spec.bin"
    write_container(p, kind="model", tensors=tensors, graph=g, meta={"m": 1},
                    quant={"odd": {"scale": [0.5], "zero_point": [3], "axis": None}})
    raw = p.read_bytes()

    head = raw[:128]
    assert head[127:] == b"\n"
    text = head[:127].decode("ascii")
    body = text.rstrip(" ")
    assert set(text[len(body):]) <= {" "}
    h = json.loads(body)
    assert list(h) == ["pocket", "kind", "le", "align", "g", "d", "crc"]
    assert body == json.dumps(h, separators=(",", ":"))
    assert h["pocket"] == [1, 0] and h["kind"] == "model" and h["le"] == 1 and h["align"] == 64
    assert h["crc"] == zlib.crc32(re.sub(r',"crc":\d+\}$', "}", body).encode())

    glen, gcrc = h["g"]
    section = raw[128:128 + glen]
    assert zlib.crc32(section) == gcrc
    sec = json.loads(section.decode("utf-8"))
    assert list(sec) == ["graph", "meta", "tensors"]
    assert sec["meta"] == {"m": 1} and sec["graph"]["outputs"] == ["probs"]
    w = (128 + glen + 63) // 64 * 64
    assert raw[128 + glen:w] == bytes(w - 128 - glen)

    dlen, dcrc = h["d"]
    assert len(raw) == w + dlen
    assert zlib.crc32(raw[w:]) == dcrc
    end = w
    for e, (name, a) in zip(sec["tensors"], tensors.items()):
        assert e["name"] == name
        assert e["offset"] == (end + 63) // 64 * 64  # previous end rounded up to 64
        assert raw[end:e["offset"]] == bytes(e["offset"] - end)  # zero gaps
        le = a.astype(np.dtype(DTYPES[e["dtype"]]))
        assert e["shape"] == list(a.shape)
        assert e["length"] == le.nbytes
        assert raw[e["offset"]:e["offset"] + e["length"]] == le.tobytes()
        assert e["crc32"] == zlib.crc32(le.tobytes())
        end = e["offset"] + e["length"]
    assert end == len(raw)  # the file ends where the last tensor ends
    assert sec["tensors"][-1]["name"] == "tail_empty" and sec["tensors"][-1]["length"] == 0
    assert sec["tensors"][0]["quant"] == {"scale": [0.5], "zero_point": [3], "axis": None}
    assert "quant" not in sec["tensors"][1]


def test_spec_example_header_is_real():
    doc = container.__doc__
    m = re.search(r"Example.*?:\s*(\{.*?\})\n\s*\[128", doc, re.S)
    example = re.sub(r"\s+", "", m.group(1))
    h = decode_header(example.ljust(127).encode() + b"\n")
    assert h["kind"] == "model"


def test_header_sizes_named_in_spec():
    assert (HEADER_SIZE, ALIGN, FORMAT_VERSION) == (128, 64, (1, 0))


# --------------------------------------------------------------------------- views


def _owner(a: np.ndarray):
    while isinstance(a, np.ndarray):
        a = a.base
    return a.obj if isinstance(a, memoryview) else a


def test_views_are_read_only_and_not_copies(tmp_path):
    a = np.arange(100, dtype=np.float32).reshape(10, 10)
    write_container(tmp_path / "v.bin", kind="model", tensors={"a": a, "b": a[0]})
    c = read_container(tmp_path / "v.bin")
    v = c.tensors["a"]
    assert not v.flags.writeable
    with pytest.raises(ValueError):
        v[0, 0] = 1
    assert isinstance(_owner(v), mmap.mmap) and _owner(v) is _owner(c.tensors["b"])
    with pytest.raises(TypeError):
        c.tensors["z"] = v  # the mapping itself is read-only
    # Closing with a live view must not crash, and the view stays valid.
    c.close()
    c.close()
    np.testing.assert_array_equal(v, a)
    del v


def test_close_releases_mapping_without_views(tmp_path):
    write_container(tmp_path / "v.bin", kind="model", tensors={"a": np.ones(4, np.float32)})
    with read_container(tmp_path / "v.bin") as c:
        mm = _owner(c.tensors["a"])
    assert mm.closed


# --------------------------------------------------------------------------- writer checks


def test_atomic_write_keeps_previous_file(tmp_path, monkeypatch):
    p = tmp_path / "m.bin"
    write_container(p, kind="model", tensors={"a": np.ones(3, np.float32)})
    before = p.read_bytes()

    def boom(fd):
        raise OSError("disk full")

    monkeypatch.setattr(container.os, "fsync", boom)
    with pytest.raises(OSError, match="disk full"):
        write_container(p, kind="model", tensors={"a": np.zeros(1000, np.float32)})
    monkeypatch.undo()
    assert p.read_bytes() == before
    assert os.listdir(tmp_path) == ["m.bin"]
    with pytest.raises(FormatError):
        write_container(p, kind="model", tensors={"a": np.zeros(3, np.float64)})
    assert p.read_bytes() == before and os.listdir(tmp_path) == ["m.bin"]


@pytest.mark.parametrize("bad", [np.zeros(2, np.float64), np.zeros(2, bool), np.zeros(2, np.complex64),
                                 np.zeros(2, np.uint16), np.array(["a"]), [1.0, 2.0]],
                         ids=["f64", "bool", "c64", "u16", "str", "list"])
def test_writer_rejects_unsupported_dtypes(tmp_path, bad):
    with pytest.raises(FormatError, match="tensors\\['w'\\]"):
        write_container(tmp_path / "x.bin", kind="model", tensors={"ok": np.ones(1, np.int8), "w": bad})


def test_writer_checks_graph_params(tmp_path):
    g, params = small_graph()
    missing = {k: v for k, v in params.items() if k != "fc.bias"}
    with pytest.raises(FormatError, match="fc.bias"):
        write_container(tmp_path / "x.bin", kind="model", tensors=missing, graph=g)
    with pytest.raises(FormatError, match="conv.bias.*shape"):
        write_container(tmp_path / "x.bin", kind="model", graph=g,
                        tensors={**params, "conv.bias": np.zeros(5, np.float32)})
    with pytest.raises(FormatError, match="conv.bias.*dtype"):
        write_container(tmp_path / "x.bin", kind="model", graph=g,
                        tensors={**params, "conv.bias": np.zeros(4, np.float16)})
    bad = Graph.from_dict(g.to_dict())
    bad.nodes[0].op = "conv3d"
    with pytest.raises(FormatError, match="unknown op"):
        write_container(tmp_path / "x.bin", kind="model", graph=bad, tensors=params)
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize("kwargs, match", [
    ({"kind": "weights"}, "kind"),
    ({"tensors": {"": np.ones(1, np.int8)}}, "name"),
    ({"tensors": {"x" * 257: np.ones(1, np.int8)}}, "name"),
    ({"meta": {"loss": float("nan")}}, "meta"),
    ({"meta": {"x": object()}}, "meta"),
    ({"meta": {1: "a", "1": "b"}}, "duplicate"),
    ({"meta": []}, "meta"),
    ({"quant": {"a": {"scale": [-1.0], "zero_point": [0], "axis": None}}}, "scale"),
    ({"quant": {"a": {"scale": [1.0], "zero_point": [200], "axis": None}}}, "zero_point"),
    ({"quant": {"a": {"scale": [1.0, 2.0], "zero_point": [0, 0], "axis": 0}}}, "scale"),
    ({"quant": {"a": {"scale": [1.0], "zero_point": [0], "axis": 3}}}, "axis"),
    ({"quant": {"a": {"scale": [1.0], "zero_point": [0.5], "axis": None}}}, "zero_point"),
    ({"quant": {"f": {"scale": [1.0], "zero_point": [0], "axis": None}}}, "f32"),
    ({"quant": {"zz": {"scale": [1.0], "zero_point": [0], "axis": None}}}, "zz"),
])
def test_writer_rejects_bad_arguments(tmp_path, kwargs, match):
    args = {"kind": "model", "tensors": {"a": np.ones((3, 2), np.int8), "f": np.ones(2, np.float32)}}
    args.update(kwargs)
    with pytest.raises(FormatError, match=match):
        write_container(tmp_path / "x.bin", **args)
    assert not os.listdir(tmp_path)


def test_verify_crc_false_skips_only_data_crcs(tmp_path):
    p = tmp_path / "c.bin"
    write_container(p, kind="model", tensors={"a": np.arange(64, dtype=np.float32)})
    raw = bytearray(p.read_bytes())
    raw[-5] ^= 0x10
    p.write_bytes(raw)
    with pytest.raises(FormatError, match="CRC"):
        read_container(p)
    with read_container(p, verify_crc=False) as c:
        assert c.tensors["a"].shape == (64,)
    raw[-5] ^= 0x10
    raw[130] ^= 0x01  # inside the graph section: always checked
    p.write_bytes(raw)
    with pytest.raises(FormatError, match="header.g"):
        read_container(p, verify_crc=False)


def test_missing_file_is_format_error(tmp_path):
    with pytest.raises(FormatError, match="file"):
        read_container(tmp_path / "nope.bin")
    with pytest.raises(FormatError, match="file"):
        read_container(tmp_path)


# --------------------------------------------------------------------------- describe


def test_describe_and_render(tmp_path):
    g, params = small_graph()
    p = tmp_path / "m.bin"
    write_container(p, kind="model", tensors={**params, "q": np.ones(4, np.int8)}, graph=g,
                    quant={"q": {"scale": [0.5, 1, 2, 4], "zero_point": [0] * 4, "axis": 0}})
    d = describe(p)
    json.dumps(d)  # the CLI's --json prints it as is
    assert d["kind"] == "model" and d["version"] == "1.0" and d["file_size"] == os.path.getsize(p)
    gd = d["graph"]
    assert [n["op"] for n in gd["nodes"]] == ["conv2d", "flatten", "linear", "softmax"]
    # conv 3x3 on 8x8, no padding: 6x6; flatten 4*6*6 = 144
    assert gd["nodes"][0]["shape"] == ["N", 4, 6, 6] and gd["nodes"][1]["shape"] == ["N", 144]
    assert gd["outputs"] == [{"name": "probs", "dtype": "f32", "shape": ["N", 3]}]
    assert gd["param_count"] == 4 * 9 + 4 + 3 * 144 + 3
    t = {x["name"]: x for x in d["tensors"]}
    assert t["q"]["quant"]["channels"] == 4 and t["q"]["quant"]["scale_max"] == 4.0
    assert t["fc.weight"]["bytes"] == 3 * 144 * 4
    assert d["metadata"]["labels"] == ["a", "b", "c"]
    text = render(d)
    assert "conv2d" in text and "fc.weight" in text and "model" in text

    ck = tmp_path / "c.ckpt"
    write_container(ck, kind="checkpoint", tensors=params, graph=g,
                    meta={"trainer": {"epoch": 1}, "config": {}, "optimizer": "adam"})
    d = describe(ck)
    assert d["meta_keys"] == ["config", "optimizer", "trainer"]
    assert "meta keys: config, optimizer, trainer" in render(d)

    raw = bytearray(ck.read_bytes())
    raw[200] ^= 4
    ck.write_bytes(raw)
    with pytest.raises(FormatError):
        describe(ck)
