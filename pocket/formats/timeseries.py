"""Time series in CSV: one time column and value columns, read the same way by training
(`timeseries:PATH`) and by `pocket infer` (the last window in, the forecast out).

- The time column (the first column unless named) holds dates `YYYY-MM-DD` or `YYYYMMDD`,
  date-times `YYYY-MM-DDTHH:MM[:SS]` (or with a space), or plain numbers; it must increase.
- Every other column (or the ones named) is numeric. Empty or NaN cells are filled by linear
  interpolation in time (the nearest value at either end), and the count is returned, so a
  caller can say so; a column with no value at all is an error.
- The step between stamps is the series' spacing: a whole number of days, of calendar months
  (same day of the month), of seconds, or a number; `continue_times` extends the stamps past
  the last one by that step, in the column's own format.

Standard library + NumPy only (the edge engine reads forecasts through it).
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass

import numpy as np

from pocket.formats import csvio
from pocket.formats.errors import FormatError

MISSING = {"", "nan", "na", "n/a", "null", "none", "?"}


@dataclass
class Series:
    times: list[str]  # the stamps as written
    time_format: str  # "yyyymmdd" | "date" | "datetime" | "number"
    step: dict  # {"days": n} | {"months": n} | {"seconds": n} | {"number": x}
    columns: list[str]
    values: np.ndarray  # (T, C) float64
    filled: int  # cells filled by interpolation


def _parse_time(cell: str, fmt: str | None):
    """(value, format): a date, a datetime or a float."""
    s = cell.strip()
    if fmt in (None, "yyyymmdd") and len(s) == 8 and s.isdigit():
        return dt.date(int(s[:4]), int(s[4:6]), int(s[6:])), "yyyymmdd"
    if fmt in (None, "date") and len(s) == 10 and s[4] == "-" and s[7] == "-":
        return dt.date.fromisoformat(s), "date"
    if fmt in (None, "datetime") and len(s) > 10 and s[4] == "-" and s[10] in "T ":
        return dt.datetime.fromisoformat(s), "datetime"
    if fmt in (None, "number"):
        return float(s), "number"
    raise ValueError(s)


def format_time(v, fmt: str) -> str:
    if fmt == "yyyymmdd":
        return v.strftime("%Y%m%d")
    if fmt == "date":
        return v.isoformat()
    if fmt == "datetime":
        return v.isoformat(timespec="seconds")
    return f"{v:g}"


def parse_time(cell: str, fmt: str):
    return _parse_time(cell, fmt)[0]


def _months(a, b) -> int:
    return (b.year - a.year) * 12 + b.month - a.month


def _step(stamps: list, fmt: str) -> dict:
    if len(stamps) < 2:
        return {"number": 1.0} if fmt == "number" else {"days": 1}
    if fmt == "number":
        diffs = np.diff(np.asarray(stamps, np.float64))
        return {"number": float(np.median(diffs))}
    if fmt == "datetime":
        secs = [(b - a).total_seconds() for a, b in zip(stamps, stamps[1:])]
        return {"seconds": float(np.median(secs))}
    days = [(b - a).days for a, b in zip(stamps, stamps[1:])]
    months = [_months(a, b) for a, b in zip(stamps, stamps[1:])]
    if all(s.day == stamps[0].day for s in stamps) and min(days) >= 28 and len(set(months)) == 1:
        return {"months": months[0]}
    return {"days": int(np.median(days))}


def continue_times(last: str, step: dict, fmt: str, count: int) -> list[str]:
    """The `count` stamps after `last`, `step` apart, formatted as the column writes them."""
    t = parse_time(last, fmt)
    out = []
    for k in range(1, count + 1):
        if "months" in step:
            m = t.month - 1 + k * step["months"]
            v = t.replace(year=t.year + m // 12, month=m % 12 + 1)
        elif "days" in step:
            v = t + dt.timedelta(days=k * step["days"])
        elif "seconds" in step:
            v = t + dt.timedelta(seconds=k * step["seconds"])
        else:
            v = t + k * step["number"]
        out.append(format_time(v, fmt))
    return out


def _fill(path: str, name: str, v: np.ndarray) -> int:
    bad = np.isnan(v)
    if bad.all():
        raise FormatError(f"{path}: column {name!r} has no values")
    if bad.any():
        idx = np.arange(len(v))
        v[bad] = np.interp(idx[bad], idx[~bad], v[~bad])
    return int(bad.sum())


def read_series(source: str | os.PathLike, *, time_column: str | None = None,
                columns: list[str] | None = None, time_format: str | None = None) -> Series:
    """A time-series CSV -> Series; FormatError (or csvio.CsvError) naming the problem."""
    path = os.fspath(source)
    table = csvio.read_table(path)
    header, rows, lines = table.header, table.rows, table.lines
    if not header or not rows:
        raise FormatError(f"{path}: a time series needs a header row and data rows")
    tcol = time_column or header[0]
    if tcol not in header:
        raise FormatError(f"{path}: no time column {tcol!r}; columns: {', '.join(header)}")
    names = columns or [h for h in header if h != tcol]
    missing = [c for c in names if c not in header]
    if missing or not names:
        raise FormatError(f"{path}: no value column(s) {', '.join(map(repr, missing)) or ''}; "
                          f"columns: {', '.join(header)}")
    for row, line in zip(rows, lines):
        if len(row) != len(header):
            raise FormatError(f"{path}: line {line} has {len(row)} fields, the header has "
                              f"{len(header)}")
    ti = header.index(tcol)
    fmt = time_format
    stamps = []
    for row, line in zip(rows, lines):
        try:
            v, f = _parse_time(row[ti], fmt)
        except ValueError:
            raise FormatError(f"{path}: line {line}: time {row[ti]!r} in column {tcol!r} is "
                              "not a date (YYYY-MM-DD or YYYYMMDD), a date-time or a number"
                              ) from None
        fmt = fmt or f
        stamps.append(v)
    for (a, b), line in zip(zip(stamps, stamps[1:]), lines[1:]):
        if not b > a:
            raise FormatError(f"{path}: line {line}: time {format_time(b, fmt)} does not come "
                              f"after {format_time(a, fmt)}; sort the rows by time")
    values = np.empty((len(rows), len(names)), np.float64)
    filled = 0
    for j, name in enumerate(names):
        ci = header.index(name)
        for i, (row, line) in enumerate(zip(rows, lines)):
            cell = row[ci].strip()
            if cell.lower() in MISSING:
                values[i, j] = np.nan
                continue
            try:
                values[i, j] = float(cell)
            except ValueError:
                raise FormatError(f"{path}: line {line}: column {name!r} is not numeric "
                                  f"({cell!r})") from None
            if not np.isfinite(values[i, j]):
                raise FormatError(f"{path}: line {line}: column {name!r} holds {cell!r}")
        filled += _fill(path, name, values[:, j])
    return Series([row[ti].strip() for row in rows], fmt, _step(stamps, fmt), list(names),
                  values, filled)
