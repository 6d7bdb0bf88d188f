"""The shared CSV reader against the csv module read by hand, and the dialects users hand it."""

from __future__ import annotations

import csv
import io

import pytest

from pocket.formats import csvio


def _plain(text: str, sep: str) -> list[list[str]]:
    # the independent reading: the csv module on the exact text, blank rows dropped
    return [r for r in csv.reader(io.StringIO(text), delimiter=sep) if any(c.strip() for c in r)]


@pytest.mark.parametrize("sep", [",", ";", "\t"])
@pytest.mark.parametrize("bom", ["", "\ufeff"])
@pytest.mark.parametrize("tail", ["", "\n", "\n\n", "\r\n  \r\n"])
def test_dialects_read_like_the_csv_module(tmp_path, sep, bom, tail):
    body = sep.join(["a", "b b", "c"]) + "\n" + sep.join(["1", '"2' + sep + '5"', "3"]) + "\n\n" \
        + sep.join(["4", "5", '"six\nlines"']) + tail
    path = tmp_path / "t.csv"
    path.write_text(bom + body, encoding="utf-8", newline="")
    want = _plain(body, sep)
    for table in (csvio.read_table(path), csvio.read_text(bom + body)):
        assert table.delimiter == sep
        assert table.header == want[0]
        assert table.rows == want[1:]
        assert table.lines == [2, 5]


def test_declared_separator_wins_over_sniffing(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("a;b,c\n1;2,3\n")
    assert csvio.read_table(path, delimiter=";").header == ["a", "b,c"]
    assert csvio.read_table(path).header == ["a;b", "c"]  # a tie goes to the comma
    with pytest.raises(csvio.CsvError, match="one character"):
        csvio.read_table(path, delimiter=";;")


def test_long_fields_are_refused_by_line(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text('a,b\n1,2\n3,"' + "x" * (csvio.MAX_FIELD + 1) + '"\n')
    with pytest.raises(csvio.CsvError, match=rf"t\.csv: line 3.*{csvio.MAX_FIELD}"):
        csvio.read_table(path)
    path.write_text('a,b\n1,"' + "x" * csvio.MAX_FIELD + '"\n')
    assert len(csvio.read_table(path).rows[0][1]) == csvio.MAX_FIELD
    # an unclosed quote swallows the rest of the file into one field
    path.write_text('a,b\n1,"2\n' + "3,4\n" * 40000)
    with pytest.raises(csvio.CsvError, match="quote"):
        csvio.read_table(path)


def test_unreadable_files(tmp_path):
    with pytest.raises(csvio.CsvError, match="file not found"):
        csvio.read_table(tmp_path / "nope.csv")
    (tmp_path / "latin.csv").write_bytes(b"a,b\n\xe9,1\n")
    with pytest.raises(csvio.CsvError, match="not UTF-8"):
        csvio.read_table(tmp_path / "latin.csv")
    (tmp_path / "empty.csv").write_text("\n\n")
    assert csvio.read_table(tmp_path / "empty.csv").header == []
