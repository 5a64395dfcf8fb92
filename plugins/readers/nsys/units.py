"""Units written in ``nsys stats`` report headers, and their spellings for :mod:`traceparse.units`.

A header names its unit in parentheses: ``Start (ns)``, ``Duration(nsec)``,
``Bytes (MB)``, ``Throughput (MBps)``, ``Time(%)``. :func:`split_header`
separates the name from the unit; :data:`SPELLINGS` maps nsys's spellings
(lower-cased) to the unit registry, and :func:`time_factor` /
:func:`size_factor` give how many ns or bytes one unit is. Cells of decimal text
(``9.634`` MB, ``16.673290`` s) become integers only through
:func:`traceparse.units.column_to_int`: exact, rounded half to even to a
whole ns or byte.

nsys writes SI prefixes: its ``MB`` is 10^6 bytes (checked on the 2025.3
samples: a 9,633,792-byte copy is written ``9.634`` MB, not ``9.187``).
Binary prefixes (``KiB``, ``MiB``, ``GiB``) are read as powers of two where
a header says so.
"""

from __future__ import annotations

import re

import polars as pl

from traceparse import units

#: nsys's unit spellings (lower-case) -> registry unit.
SPELLINGS: dict[str, str] = {
    "ns": "ns", "nsec": "ns", "nanoseconds": "ns",
    "us": "us", "usec": "us", "\u00b5s": "us", "\u03bcs": "us", "microseconds": "us",
    "ms": "ms", "msec": "ms", "milliseconds": "ms",
    "s": "s", "sec": "s", "seconds": "s",
    "b": "B", "byte": "B", "bytes": "B",
    "kb": "kB", "mb": "MB", "gb": "GB", "tb": "TB",
    "kib": "KiB", "mib": "MiB", "gib": "GiB", "tib": "TiB",
}

_HEADER = re.compile(r"\((?P<unit>[^()]*+)\)$")  # searched in the stripped header: linear time


def split_header(header: str) -> tuple[str, str | None]:
    """``"Start (ns)"`` -> ``("Start", "ns")``; ``"Name"`` -> ``("Name", None)``."""
    text = header.strip().lstrip("\ufeff")
    m = _HEADER.search(text)
    if not m:
        return text, None
    return text[:m.start()].strip(), m.group("unit").strip()


def _unit(unit: str | None, dimension: str) -> str | None:
    """The registry unit of an nsys spelling, if it is one of ``dimension``."""
    name = SPELLINGS.get(unit.strip().lower()) if unit is not None else None
    return name if name is not None and units.dimension(name) == dimension else None


def time_factor(unit: str | None) -> int | None:
    """Nanoseconds per ``unit``; None when ``unit`` is not a time unit."""
    name = _unit(unit, "time")
    return None if name is None else int(units.factor(name))


def size_factor(unit: str | None) -> int | None:
    """Bytes per ``unit``; None when ``unit`` is not a size unit."""
    name = _unit(unit, "bytes")
    return None if name is None else int(units.factor(name))


class NotANumber(ValueError):
    """A cell that should hold a number does not; ``index`` is its row."""

    def __init__(self, index: int, text: str):
        super().__init__(text)
        self.index = index
        self.text = text


class OutOfRange(NotANumber):
    """A number too large for a 64-bit count of ns or bytes."""


def _blank_to_null(values: pl.Series) -> pl.Series:
    """Text cells, with empty ones as null (the CSV parser already gives null for an empty field)."""
    s = values.cast(pl.String)
    if s.str.len_bytes().min() == 0:
        s = pl.select(pl.when(s == "").then(None).otherwise(s)).to_series().alias(values.name)
    return s


def _first_bad(s: pl.Series, ok: pl.Series) -> NotANumber | None:
    bad = s.is_not_null() & ~ok.fill_null(False)
    if not bad.any():
        return None
    index = int(bad.arg_max())
    return NotANumber(index, s[index])


def integers(values: pl.Series, *, thousands: bool = False) -> pl.Series:
    """Whole-number text -> Int64 (blank cells -> null); raise :class:`NotANumber` at the first other cell.

    ``thousands`` accepts ``1,234`` separators (the table format writes them).
    """
    s = _blank_to_null(values)
    if thousands:
        s = s.str.replace_all(",", "", literal=True)
    out = s.cast(pl.Int64, strict=False)
    if out.null_count() != s.null_count():
        raise _first_bad(s, out.is_not_null())
    return out


def fraction_digits(values: pl.Series) -> int:
    """The most digits after the decimal point in a column of decimal text (0 for whole numbers)."""
    digits = values.cast(pl.String).str.extract(r"\.([0-9]+)\s*$").str.len_chars().max()
    return int(digits or 0)


def decimals_to_int(values: pl.Series, unit: str, *, thousands: bool = False) -> pl.Series:
    """decimal-text cells in ``unit`` (an nsys spelling) -> exact Int64 of the base unit (ns or bytes); blank -> null.

    E.g. ``"9.634"`` MB gives 9634000 bytes and ``"16.673290"`` s gives
    16673290000 ns (:func:`traceparse.units.column_to_int`, half to even).
    Raises :class:`NotANumber` at the first cell that is not a plain
    decimal, :class:`OutOfRange` at one too large for Int64.
    """
    s = _blank_to_null(values)
    if thousands:
        s = s.str.replace_all(",", "", literal=True)
    try:
        return units.column_to_int(s, unit.strip().lower(), spellings=SPELLINGS).alias(values.name)
    except units.NumberError as exc:
        error = OutOfRange if exc.reason == "out of range" else NotANumber
        raise error(exc.index, exc.text) from None
