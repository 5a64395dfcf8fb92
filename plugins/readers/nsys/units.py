"""Units written in ``nsys stats`` report headers, and exact conversion of decimal text to integers.

A header names its unit in parentheses: ``Start (ns)``, ``Duration(nsec)``,
``Bytes (MB)``, ``Throughput (MBps)``, ``Time(%)``. :func:`split_header`
separates the name from the unit; :func:`time_factor` and :func:`size_factor`
give how many ns or bytes one unit is. Decimal cells (``9.634`` MB,
``16.673290`` s) become integers with integer arithmetic only, so no
floating-point drift: the result is the decimal's exact value in the base
unit, rounded half away from zero to a whole ns or byte.

nsys writes SI prefixes: its ``MB`` is 10^6 bytes (checked on the 2025.3
samples: a 9,633,792-byte copy is written ``9.634`` MB, not ``9.187``), and
its throughput ``MB/s`` / ``MBps`` is 10^6 bytes per second. Binary prefixes
(``KiB``, ``MiB``, ``GiB``) are read as powers of two where a header says so.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation, ROUND_HALF_UP

import polars as pl

#: Unit text (lower-case) -> nanoseconds per unit.
TIME_NS: dict[str, int] = {
    "ns": 1, "nsec": 1, "nanoseconds": 1,
    "us": 10**3, "usec": 10**3, "µs": 10**3, "μs": 10**3, "microseconds": 10**3,
    "ms": 10**6, "msec": 10**6, "milliseconds": 10**6,
    "s": 10**9, "sec": 10**9, "seconds": 10**9,
}
#: Unit text (lower-case) -> bytes per unit.
SIZE_B: dict[str, int] = {
    "b": 1, "byte": 1, "bytes": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
#: Unit text (lower-case) -> bytes per second per unit.
RATE_BPS: dict[str, int] = {
    **{f"{k}/s": v for k, v in SIZE_B.items()},
    **{f"{k}ps": v for k, v in SIZE_B.items()},
}

_HEADER = re.compile(r"^(?P<base>.*?)\s*\((?P<unit>[^()]*)\)\s*$")
_DECIMAL = r"^[+-]?(\d+\.?\d*|\.\d+)$"
#: Above this many fraction digits the integer fast path could overflow Int64.
_MAX_FAST_DIGITS = 9
_MAX_FAST_VALUE = 9 * 10**18


def split_header(header: str) -> tuple[str, str | None]:
    """``"Start (ns)"`` -> ``("Start", "ns")``; ``"Name"`` -> ``("Name", None)``."""
    text = header.strip().lstrip("\ufeff")
    m = _HEADER.match(text)
    if not m:
        return text, None
    return m.group("base").strip(), m.group("unit").strip()


def time_factor(unit: str | None) -> int | None:
    """Nanoseconds per ``unit``; None when ``unit`` is not a time unit."""
    return None if unit is None else TIME_NS.get(unit.strip().lower())


def size_factor(unit: str | None) -> int | None:
    """Bytes per ``unit``; None when ``unit`` is not a size unit."""
    return None if unit is None else SIZE_B.get(unit.strip().lower())


def rate_factor(unit: str | None) -> int | None:
    """Bytes per second per ``unit``; None when ``unit`` is not a throughput unit."""
    return None if unit is None else RATE_BPS.get(unit.strip().lower().replace(" ", ""))


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
    digits = values.cast(pl.String).str.extract(r"\.(\d+)\s*$").str.len_chars().max()
    return int(digits or 0)


def decimals_to_int(values: pl.Series, factor: int, *, thousands: bool = False) -> pl.Series:
    """Decimal text times ``factor`` -> exact Int64, rounded half away from zero; blank -> null.

    E.g. ``"9.634"`` with factor 10**6 (MB -> bytes) gives 9634000, and
    ``"16.673290"`` with 10**9 (s -> ns) gives 16673290000. Raises
    :class:`NotANumber` at the first cell that is not a plain decimal.
    """
    s = _blank_to_null(values)
    if thousands:
        s = s.str.replace_all(",", "", literal=True)
    whole_numbers = s.cast(pl.Int64, strict=False)
    if whole_numbers.null_count() == s.null_count() and (whole_numbers.abs().max() or 0) * factor <= _MAX_FAST_VALUE:
        return (whole_numbers * factor).alias(values.name)  # the common case: integer ns
    ok = s.str.contains(_DECIMAL)
    bad = _first_bad(s, ok)
    if bad is not None:
        raise bad
    frac = s.str.extract(r"\.(\d*)$").fill_null("")
    digits = int(frac.str.len_chars().max() or 0)
    whole = s.str.extract(r"^[+-]?(\d*)").replace("", "0").cast(pl.Int64, strict=False)
    biggest = int(whole.max() or 0) if whole.len() else 0
    if digits > _MAX_FAST_DIGITS or whole.null_count() > s.null_count() or biggest * factor > _MAX_FAST_VALUE:
        return _decimals_slow(s, factor)
    scale = 10**digits
    f = (frac + "0" * digits).str.slice(0, digits).replace("", "0").cast(pl.Int64) if digits else pl.zeros(
        s.len(), dtype=pl.Int64, eager=True)
    magnitude = whole * factor + (f * factor * 2 + scale) // (2 * scale)
    negative = s.str.starts_with("-")
    out = pl.select(pl.when(negative).then(-magnitude).otherwise(magnitude)).to_series()
    return pl.select(pl.when(s.is_null()).then(None).otherwise(out)).to_series().cast(pl.Int64).alias(values.name)


def _decimals_slow(s: pl.Series, factor: int) -> pl.Series:
    """Python :class:`Decimal` path for long fractions or huge values (rare)."""
    out = []
    for i, text in enumerate(s.to_list()):
        if text is None:
            out.append(None)
            continue
        try:
            value = (Decimal(text) * factor).quantize(Decimal(1), rounding=ROUND_HALF_UP)
        except InvalidOperation:
            raise NotANumber(i, text) from None
        if not -(2**63) <= value < 2**63:
            raise OutOfRange(i, text)
        out.append(int(value))
    return pl.Series(s.name, out, dtype=pl.Int64)
