"""TAU's decimal text to exact integers, through :mod:`traceparse.units`.

TAU writes times as ``%.16G`` doubles in microseconds (``51781``,
``1234.567890123456``, ``1.6E+07``), ParaProf exports Java doubles
(``449.0``, ``1.2345E7``), pprof prints milliseconds. Turning them into
integer nanoseconds with float math can drift by a nanosecond, so they go
through :func:`traceparse.units.column_to_int`: exact decimal arithmetic,
rounded half to even.
"""

from __future__ import annotations

import polars as pl

from traceparse import units

#: sign, integer digits, fraction digits, exponent
DECIMAL_PATTERN = r"^\s*([+-]?)([0-9]*)(?:\.([0-9]*))?(?:[eE]([+-]?[0-9]+))?\s*$"
#: 10**power -> the unit TAU's text is in, as integer ns (times) or a plain count.
_UNIT_OF_POWER = {0: "1", 3: "us", 6: "ms", 9: "s"}


def scaled_int(text: pl.Series, power: int = 0) -> pl.Series:
    """``text`` (decimal strings, exponent allowed) × 10**``power`` as exact Int64, rounded half to even.

    ``power`` 0 reads counts, 3 microseconds, 6 milliseconds (both to ns).
    Null where the text is null or not a number, or the result does not fit
    in Int64; callers report those rows.
    """
    unit = _UNIT_OF_POWER[power]
    return units.column_to_int(text.cast(pl.String).str.strip_chars(), unit, to=None if power == 0 else "ns",
                               strict=False).alias(text.name)


def is_number(text: pl.Expr) -> pl.Expr:
    """True where ``text`` is a decimal number (optionally with an exponent)."""
    return text.str.contains(DECIMAL_PATTERN) & text.str.contains(r"[0-9]")


def to_float(text: pl.Expr) -> pl.Expr:
    """``text`` as Float64 (counter values, which the schema keeps as floats); null where not a number."""
    return pl.when(is_number(text)).then(text.str.strip_chars().cast(pl.Float64, strict=False))
