"""nvprof's unit spellings, for the exact conversions of :mod:`traceparse.units`.

nvprof writes times as ``512ns``, ``4.5440us``, ``8.6348ms``, ``1.2s`` (one
unit per cell in text output, one per column in the CSV units row), sizes as
``0B``, ``4.0000KB``, ``38.147MB`` and throughputs as ``5.8163GB/s``.
Sizes and throughputs are binary: 1 KB = 1024 B, 1 MB = 1024 KB, 1 GB =
1024 MB. Published logs show it: a copy of 10,000,000 floats (40,000,000
bytes) is printed as ``38.147MB`` (40e6 / 2^20 = 38.147), and its
``5.8163GB/s`` is 40e6 B / 6.4049 ms / 2^30. See docs/formats/nvprof.md.

Numbers become integers (:func:`to_ints`) or floats (:func:`to_floats`) only
through :mod:`traceparse.units`: exact decimal arithmetic, integers rounded
half to even.
"""

from __future__ import annotations

import polars as pl

from traceparse import units

#: nvprof's spelling -> registry unit (its K/M/G/T are binary).
SPELLINGS: dict[str, str] = {
    "ns": "ns", "us": "us", "ms": "ms", "s": "s",
    "B": "B", "KB": "KiB", "MB": "MiB", "GB": "GiB", "TB": "TiB",
    "B/s": "B/s", "KB/s": "KiB/s", "MB/s": "MiB/s", "GB/s": "GiB/s", "TB/s": "TiB/s",
}
#: nvprof's spellings of each dimension.
TIME_UNITS = tuple(u for u in SPELLINGS if units.dimension(u, SPELLINGS) == "time")
SIZE_UNITS = tuple(u for u in SPELLINGS if units.dimension(u, SPELLINGS) == "bytes")
RATE_UNITS = tuple(u for u in SPELLINGS if units.dimension(u, SPELLINGS) == "rate")
#: What each kind of Converter column holds.
DIMENSION_UNITS = {"time": TIME_UNITS, "size": SIZE_UNITS}

#: Words that may appear in a CSV units row (besides empty cells).
UNIT_WORDS = frozenset(SPELLINGS) | {"%"}

_UNIT_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ%/"


def to_ints(numbers: pl.Series, unit: str | pl.Series, allowed: tuple[str, ...]) -> pl.Series:
    """Numbers (decimal text) × their unit (one spelling, or a column of them) as exact Int64 base units.

    Null where the text is not a number or the unit is not one of ``allowed``
    (the caller reports those cells).
    """
    if isinstance(unit, str):
        unit = pl.Series([unit] * len(numbers), dtype=pl.String)
    unit = pl.select(pl.when(unit.is_in(list(allowed))).then(unit)).to_series()
    return units.column_to_int(numbers, unit, spellings=SPELLINGS, strict=False)


def to_floats(numbers: pl.Series, unit: pl.Series) -> pl.Series:
    """Numbers (decimal text) × their unit as Float64 (the exact product, rounded once); a null unit is a plain number.

    Null where the text is not a number or the unit is not nvprof's.
    """
    return units.column_to_float(numbers, unit, spellings=SPELLINGS, strict=False)


def split_number(cell: pl.Expr) -> tuple[pl.Expr, pl.Expr]:
    """(number text, unit text) of cells such as ``4.5440us``: the unit is the trailing run of letters, % and /.

    The number part is checked where it is parsed (:func:`to_ints` gives
    null for text that is not a number).
    """
    text = cell.str.strip_chars()
    return (text.str.strip_chars_end(_UNIT_CHARS).alias("number"),
            text.str.strip_chars_start("0123456789.+-eE").alias("unit"))
