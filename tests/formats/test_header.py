"""`head -c 128 FILE` is one readable JSON object, and no legal file's header outgrows it."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pocket.formats import FormatError
from pocket.formats.container import (
    HEADER_SIZE,
    MAX_FILE_SIZE,
    MAX_GRAPH_SIZE,
    MAX_MINOR,
    decode_header,
    encode_header,
    write_container,
)

U32 = 2**32 - 1


def data_start(g: int) -> int:
    return (128 + g + 63) // 64 * 64


@pytest.mark.parametrize("kind", ["model", "checkpoint"])
def test_first_128_bytes_are_one_json_object(tmp_path, kind):
    p = tmp_path / "m.bin"
    write_container(p, kind=kind, tensors={"w": np.ones((3, 3), np.float32)}, meta={"k": "v" * 300})
    head = p.read_bytes()[:128]
    if shutil.which("head"):
        head = subprocess.run(["head", "-c", "128", str(p)], capture_output=True, check=True).stdout
    assert len(head) == 128 and head.endswith(b"\n")
    text = head.decode("ascii")
    obj, end = json.JSONDecoder().raw_decode(text)
    assert text[end:] == " " * (127 - end) + "\n"
    assert obj["pocket"] == [1, 0] and obj["kind"] == kind


@pytest.mark.parametrize("kind", ["model", "checkpoint"])
@pytest.mark.parametrize("minor", [0, MAX_MINOR])
def test_extremes_fit(kind, minor):
    # Largest graph section, largest file, all-ones CRCs: the longest header a legal file has.
    g = MAX_GRAPH_SIZE
    d = MAX_FILE_SIZE - data_start(g)
    raw = encode_header(kind, (g, U32), (d, U32), version=(1, minor))
    assert len(raw) == HEADER_SIZE
    h = decode_header(raw)
    assert h["g"] == [g, U32] and h["d"] == [d, U32] and h["pocket"] == [1, minor]
    assert h["kind"] == kind and 0 <= h["crc"] <= U32
    json.loads(raw[:127])


def test_longest_header_has_room_for_every_crc_value():
    # The header CRC is the one value we cannot choose; the bound must hold for 4294967295.
    g, d = MAX_GRAPH_SIZE, MAX_FILE_SIZE - data_start(MAX_GRAPH_SIZE)
    longest = (f'{{"pocket":[1,{MAX_MINOR}],"kind":"checkpoint","le":1,"align":64,'
               f'"g":[{g},{U32}],"d":[{d},{U32}],"crc":{U32}}}')
    assert len(longest) <= HEADER_SIZE - 1


def test_minimum_values():
    raw = encode_header("model", (2, 0), (0, 0))
    assert decode_header(raw)["d"] == [0, 0]


@given(g=st.integers(2, MAX_GRAPH_SIZE), frac=st.floats(0, 1), c1=st.integers(0, U32),
       c2=st.integers(0, U32), kind=st.sampled_from(["model", "checkpoint"]))
def test_any_legal_header_fits_and_decodes(g, frac, c1, c2, kind):
    d = int((MAX_FILE_SIZE - data_start(g)) * frac)
    raw = encode_header(kind, (g, c1), (d, c2))
    assert len(raw) == HEADER_SIZE and raw[-1:] == b"\n"
    assert decode_header(raw)["g"] == [g, c1]


@pytest.mark.parametrize("g, d", [((MAX_GRAPH_SIZE + 1, 0), (0, 0)), ((2, 0), (MAX_FILE_SIZE + 1, 0)),
                                  ((2, U32 + 1), (0, 0))])
def test_values_past_the_limits_are_rejected(g, d):
    with pytest.raises(FormatError):
        decode_header(encode_header("model", g, d))
