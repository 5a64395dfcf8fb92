"""nvprof's units, and exact conversion of its decimal numbers to integer ns and bytes.

nvprof writes times as ``512ns``, ``4.5440us``, ``8.6348ms``, ``1.2s`` (one
unit per cell in text output, one per column in the CSV units row), sizes as
``0B``, ``4.0000KB``, ``38.147MB`` and throughputs as ``5.8163GB/s``.
Sizes and throughputs are binary: 1 KB = 1024 B, 1 MB = 1024 KB, 1 GB =
1024 MB. Published logs show it: a copy of 10,000,000 floats (40,000,000
bytes) is printed as ``38.147MB`` (40e6 / 2^20 = 38.147), and its
``5.8163GB/s`` is 40e6 B / 6.4049 ms / 2^30. See docs/formats/nvprof.md.

Numbers are parsed as exact decimals (polars' ``str.to_decimal``), multiplied
by the unit and rounded half away from zero to an integer: no float drift.
"""

from __future__ import annotations

from decimal import Decimal

import polars as pl

#: Time unit -> nanoseconds.
TIME_UNITS: dict[str, int] = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
#: Size unit -> bytes (binary multiples, as nvprof prints them).
SIZE_UNITS: dict[str, int] = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}
#: Throughput unit -> bytes per second.
RATE_UNITS: dict[str, int] = {f"{unit}/s": factor for unit, factor in SIZE_UNITS.items()}

#: Words that may appear in a CSV units row (besides empty cells).
UNIT_WORDS = frozenset(TIME_UNITS) | frozenset(SIZE_UNITS) | frozenset(RATE_UNITS) | {"%"}

_NUMBER = r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?"
NUMBER = rf"^\s*{_NUMBER}\s*$"

_SCALE = 9  # decimal places kept while parsing (1e-9 of a second is a ns)
_HALF = Decimal("0.5")


def exact_int(number: pl.Expr, factor: pl.Expr) -> pl.Expr:
    """``number`` (decimal text) × ``factor`` (integer) as an exactly rounded Int64; null where either is null.

    Rounds half away from zero. Text that is not a number gives null.
    """
    product = number.str.to_decimal(scale=_SCALE) * factor.cast(pl.Int64)
    rounded = pl.when(product >= 0).then(product + pl.lit(_HALF)).otherwise(product - pl.lit(_HALF))
    return rounded.cast(pl.Int64)


def exact_float(number: pl.Expr, factor: pl.Expr) -> pl.Expr:
    """``number`` × ``factor`` as Float64, multiplied exactly before the one final rounding to float."""
    return (number.str.to_decimal(scale=_SCALE) * factor.cast(pl.Int64)).cast(pl.Float64)


_UNIT_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ%/"


def split_number(cell: pl.Expr) -> tuple[pl.Expr, pl.Expr]:
    """(number text, unit text) of cells such as ``4.5440us``: the unit is the trailing run of letters, % and /.

    The number part is checked where it is parsed (:func:`exact_int` gives
    null for text that is not a number).
    """
    text = cell.str.strip_chars()
    return text.str.strip_chars_end(_UNIT_CHARS), text.str.strip_chars_start("0123456789.+-eE")


def factor_of(unit: pl.Expr, table: dict[str, int]) -> pl.Expr:
    """The multiplier of each unit in ``table``; null for a unit not in it."""
    return unit.replace_strict(list(table), list(table.values()), default=None, return_dtype=pl.Int64)
