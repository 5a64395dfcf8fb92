"""Integer arguments as every PyTorch build writes them, and one warning saying what was coerced.

CUDA builds of Kineto write ids, streams and byte counts as JSON integers.
Other builds do not always: ROCm's roctracer path writes a runtime event's
stream as a hex pointer string (``"stream": "0x0"``) and a copy's size as text
(``"bytes": "128"``); hand-edited or rewritten traces may hold a float. The
reader takes each such value as the integer it spells (decimal or ``0x`` hex
text; a float with no fractional part) and counts it; a value that is no
integer (``"abc"``, ``1.5``) or that does not fit the column's type is left
empty and counted too. After the whole trace is read the reader gives ONE
warning naming each field and how many values it coerced or left empty.
Only ASCII digits count as digits.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Sequence

import polars as pl

_RANGES = {pl.Int32: (-(2 ** 31), 2 ** 31 - 1), pl.Int64: (-(2 ** 63), 2 ** 63 - 1)}
_DECIMAL = re.compile(r"[+-]?[0-9]{1,40}", re.ASCII)
_HEX = re.compile(r"0[xX][0-9a-fA-F]{1,32}", re.ASCII)

TEXT = "text read as an integer"
FLOAT = "whole float read as an integer"
NOT_INT = "not an integer, left empty"
RANGE = "out of the column's range, left empty"
NOT_DIM3 = "not a list of three numbers, left empty"


#: Categories of complete events read as nothing, and said nothing of: older Kineto's whole-trace span
#: (``Trace``) and CUPTI's buffer overhead (``overhead``), lower-cased.
UNREAD_QUIETLY = frozenset({"trace", "overhead"})


class Coercions:
    """What one trace's reading had to coerce: (field, what) -> count; and ``unread``: category -> count of the
    complete events of a category the reader does not read (an MTIA device's ``mtia_ccp_events``)."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        self.unread: Counter[str] = Counter()

    def __bool__(self) -> bool:
        return bool(self.counts)

    def skipped(self, category, n: int = 1) -> None:
        """Count ``n`` complete events of ``category``, which the reader makes no row of (both paths ask here)."""
        if str(category).lower() not in UNREAD_QUIETLY:
            self.unread["(none)" if category is None else category] += n

    def merge(self, other: "Coercions") -> None:
        """Add what another chunk's reading counted."""
        self.counts.update(other.counts)
        self.unread.update(other.unread)

    def unread_warning(self, path: object) -> str | None:
        """The one warning naming the categories of complete events that were not read (None: none)."""
        if not self.unread:
            return None
        total = sum(self.unread.values())
        named = ", ".join(f"{cat} {n:,}" for cat, n in sorted(self.unread.items(), key=lambda kv: (-kv[1], kv[0])))
        return (f"{path}: skipped {total:,} complete event{'s' if total != 1 else ''} of categories traceparse does "
                f"not read ({named}): their time is in no figure")

    def add(self, field: str, what: str, n: int = 1) -> None:
        self.counts[(field, what)] += n

    def warning(self, path: object) -> str | None:
        """The one warning for the trace (None when nothing was coerced)."""
        if not self.counts:
            return None
        parts = [f"{field} {n}× {what}" for (field, what), n in sorted(self.counts.items())]
        total = sum(self.counts.values())
        return (f"{path}: {total} argument value{'s' if total != 1 else ''} not written as JSON integers "
                f"(as ROCm and some other PyTorch builds write them): " + "; ".join(parts))


def to_int(value: object) -> tuple[int | None, str | None]:
    """One argument value -> (integer or None, what was done: None when it was already an int)."""
    if value is None or type(value) is int:
        return value, None
    if isinstance(value, str):
        text = value.strip()
        if _DECIMAL.fullmatch(text):
            return int(text), TEXT
        if _HEX.fullmatch(text):
            return int(text, 16), TEXT
        return None, NOT_INT
    if isinstance(value, float):
        if value == value and value not in (float("inf"), float("-inf")) and value.is_integer():
            return int(value), FLOAT
        return None, NOT_INT
    return None, NOT_INT


def int_column(values: Sequence, field: str, dtype: pl.DataType, coerced: Coercions) -> pl.Series:
    """``values`` as an integer Series of ``dtype``; anything not an int in range is coerced and counted.

    The common case (every value an int in range, or None) is built in one
    call; only a batch that holds something else is walked value by value.
    """
    try:
        return pl.Series(values, dtype=dtype)
    except (TypeError, OverflowError, ValueError, pl.exceptions.PolarsError):
        pass
    lo, hi = _RANGES[dtype]
    out: list[int | None] = []
    for value in values:
        number, what = to_int(value)
        if number is not None and not lo <= number <= hi:
            number, what = None, RANGE
        if what is not None:
            coerced.add(field, what)
        out.append(number)
    return pl.Series(out, dtype=dtype)
