"""The one CSV reader of training (`csv:PATH`) and inference (`pocket infer rows.csv`).

Both must read the same files the same way, or a table that trains fine fails on the device:
- UTF-8, with or without a byte-order mark (spreadsheet exports add one);
- `,`, `;` or tab separators, sniffed from the header line unless given;
- quoted fields (a separator or a line break inside quotes is part of the field);
- blank lines (a trailing one above all) are skipped;
- a field longer than MAX_FIELD characters is refused: the csv module's own limit, made a clear
  error instead of `_csv.Error`, and checked here too because that limit is process-wide state
  that any other library may have raised.
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass

from pocket.errors import PocketError

MAX_FIELD = 131072
DELIMITERS = (",", ";", "\t")


class CsvError(PocketError, ValueError):
    """A CSV that cannot be read; the message names the file and, where known, the line."""


@dataclass
class Table:
    header: list[str]  # stripped column names
    rows: list[list[str]]  # raw cells of each non-blank data row
    lines: list[int]  # the (1-based) line each row ends on, for error messages
    delimiter: str


def sniff_delimiter(header_line: str) -> str:
    """The most frequent of , ; tab in the header line (`,` when none)."""
    counts = {d: header_line.count(d) for d in DELIMITERS}
    return max(counts, key=counts.get) if any(counts.values()) else ","


def read_table(source: str | os.PathLike | io.TextIOBase, *, name: str | None = None,
               delimiter: str | None = None) -> Table:
    """A CSV file (path) or text stream -> Table. An empty file gives an empty header."""
    label = name or (os.fspath(source) if isinstance(source, str | os.PathLike) else "<stdin>")
    if delimiter is not None and (len(delimiter) != 1 or delimiter in "\"\r\n"):
        raise CsvError(f"{label}: the separator must be one character such as ',' or ';', "
                       f"got {delimiter!r}")
    try:
        if isinstance(source, str | os.PathLike):
            with open(source, newline="", encoding="utf-8-sig") as f:
                return _read(f, label, delimiter)
        return _read(source, label, delimiter)
    except FileNotFoundError:
        raise CsvError(f"{label}: file not found") from None
    except UnicodeDecodeError as e:
        raise CsvError(f"{label}: not UTF-8 text ({e.reason} at byte {e.start}); "
                       "save the table as UTF-8 CSV") from None
    except IsADirectoryError:
        raise CsvError(f"{label}: is a folder, not a CSV file") from None
    except OSError as e:
        raise CsvError(f"{label}: cannot read ({e.strerror or e})") from None


def read_text(text: str, *, name: str = "<stdin>", delimiter: str | None = None) -> Table:
    """CSV text (stdin, say) -> Table; a leading byte-order mark is dropped."""
    return read_table(io.StringIO(text.removeprefix("\ufeff"), newline=None), name=name,
                      delimiter=delimiter)


def _read(f, label: str, delimiter: str | None) -> Table:
    first = f.readline()
    f.seek(0)
    if len(first) > MAX_FIELD * 4:
        # NOTE: the header line is read whole before the csv module's limit applies
        raise CsvError(f"{label}: line 1 is {len(first)} characters long; a field may hold at "
                       f"most {MAX_FIELD}")
    sep = delimiter or sniff_delimiter(first.removeprefix("\ufeff"))
    reader = csv.reader(f, delimiter=sep)
    header: list[str] | None = None
    rows, lines = [], []
    try:
        for row in reader:
            if not row or all(not c.strip() for c in row):
                continue
            long = next((c for c in row if len(c) > MAX_FIELD), None)
            if long is not None:
                raise CsvError(f"{label}: line {reader.line_num} has a field of {len(long)} "
                               f"characters; a field may hold at most {MAX_FIELD} (is a quote "
                               "left open?)")
            if header is None:
                header = [h.strip().removeprefix("\ufeff") for h in row]
                continue
            rows.append(row)
            lines.append(reader.line_num)
    except csv.Error as e:
        what = str(e)
        if "field larger than field limit" in what:
            what = f"a field is longer than {MAX_FIELD} characters (is a quote left open?)"
        raise CsvError(f"{label}: line {reader.line_num}: {what}") from None
    return Table(header=header or [], rows=rows, lines=lines, delimiter=sep)
