"""Units, and the one exact conversion of decimal text to integers.

Every reader turns the decimal numbers of its input (``"1234.5678"`` µs,
``"9.634"`` MB, ``"1.6E+07"``) into integer nanoseconds or bytes here, and
only here, so the same decimal gives the same integer whatever format it
came from.

**Rounding rule.** The text is parsed as an exact decimal, multiplied
exactly by the unit's factor, and rounded once to an integer with
``ROUND_HALF_EVEN`` (a tie goes to the even neighbour: ``0.5`` ns -> 0,
``1.5`` -> 2, ``2.5`` -> 2, ``-0.5`` -> 0, ``-1.5`` -> -2). No floating point
is involved. A float result (:func:`to_float`) is the exact product rounded
once to the nearest double.

**Numbers.** Plain ASCII decimals with an optional sign, fraction and
exponent: ``12``, ``-3.25``, ``.5``, ``1.``, ``1.6E+07``. Spaces and tabs
around the number are ignored. Anything else (thousands separators,
underscores, ``NaN``/``Infinity``, non-ASCII digits such as ``١٢``) is
refused with a :class:`ValueError` whose message is short enough for a
reader to put in its one-line error; a reader removes its own decorations
(e.g. thousands separators) first.

**Units.** The registry (:data:`UNITS`) knows these dimensions and their base
units:

========== ====== ==========================================================
dimension  base   units
========== ====== ==========================================================
time       ns     ps, ns, us, ms, s
bytes      B      B; SI kB, MB, GB, TB, PB (10^3 steps); binary KiB, MiB,
                  GiB, TiB, PiB (2^10 steps)
rate       B/s    B/s, kB/s ... PB/s, KiB/s ... PiB/s
frequency  Hz     Hz, kHz, MHz, GHz, THz
count      1      1 (a plain number of things: calls, instructions)
========== ====== ==========================================================

A reader names units in its own spellings and passes an alias map from its
spelling to a registry name (nvprof: ``{"KB": "KiB", "MB": "MiB"}``, its
sizes are binary; nsys: ``{"MB": "MB"}``, SI). A spelling that is already a
registry name needs no alias.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal
from fractions import Fraction
from typing import Mapping

import polars as pl

#: The one rounding rule of every decimal-to-integer conversion.
ROUNDING = ROUND_HALF_EVEN

INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class Unit:
    """A registry unit: ``factor`` base units of its ``dimension`` per unit (exact)."""

    name: str
    dimension: str
    factor: Decimal


def _build() -> dict[str, Unit]:
    units: list[Unit] = []
    time = {"ps": Decimal("0.001"), "ns": Decimal(1), "us": Decimal(10) ** 3, "ms": Decimal(10) ** 6,
            "s": Decimal(10) ** 9}
    units += [Unit(n, "time", f) for n, f in time.items()]
    size = {"B": Decimal(1)}
    for i, (si, binary) in enumerate((("kB", "KiB"), ("MB", "MiB"), ("GB", "GiB"), ("TB", "TiB"), ("PB", "PiB")),
                                     start=1):
        size[si] = Decimal(1000) ** i
        size[binary] = Decimal(1024) ** i
    units += [Unit(n, "bytes", f) for n, f in size.items()]
    units += [Unit(f"{n}/s", "rate", f) for n, f in size.items()]
    freq = {"Hz": Decimal(1), "kHz": Decimal(10) ** 3, "MHz": Decimal(10) ** 6, "GHz": Decimal(10) ** 9,
            "THz": Decimal(10) ** 12}
    units += [Unit(n, "frequency", f) for n, f in freq.items()]
    units.append(Unit("1", "count", Decimal(1)))  # a plain count (calls, instructions): no scaling
    return {u.name: u for u in units}


#: Registry name -> :class:`Unit`.
UNITS: dict[str, Unit] = _build()
#: The base unit of each dimension (factor 1).
BASE = {"time": "ns", "bytes": "B", "rate": "B/s", "frequency": "Hz", "count": "1"}
#: SI multipliers of count units (``Kinst``, ``Gbyte``...), as some tools write them.
SI_PREFIXES: dict[str, Decimal] = {"": Decimal(1), "K": Decimal(10) ** 3, "M": Decimal(10) ** 6,
                                   "G": Decimal(10) ** 9, "T": Decimal(10) ** 12, "P": Decimal(10) ** 15}


def resolve(spelling: str, spellings: Mapping[str, str] | None = None) -> str:
    """The registry name of ``spelling`` (through the reader's alias map ``spellings``); ValueError if unknown."""
    name = spellings.get(spelling, spelling) if spellings else spelling
    if name not in UNITS:
        raise ValueError(f"unknown unit {spelling!r}")
    return name


def dimension(unit: str, spellings: Mapping[str, str] | None = None) -> str:
    """``"time"``, ``"bytes"``, ``"rate"``, ``"frequency"`` or ``"count"``."""
    return UNITS[resolve(unit, spellings)].dimension


def factor(unit: str, to: str | None = None, spellings: Mapping[str, str] | None = None) -> Decimal:
    """How many ``to`` (default: the base unit of its dimension) one ``unit`` is, exactly.

    ``factor("MiB") == 1048576``; ``factor("ms", to="us") == 1000``;
    ``factor("ps") == Decimal("0.001")``. Units of two dimensions raise ValueError.
    """
    r = ratio(unit, to, spellings)
    return Decimal(r.numerator) / Decimal(r.denominator)


def ratio(unit: str, to: str | None = None, spellings: Mapping[str, str] | None = None) -> Fraction:
    """:func:`factor` as an exact :class:`~fractions.Fraction` (for composing units: ``cycle/usecond``)."""
    source = UNITS[resolve(unit, spellings)]
    if to is None:
        return Fraction(source.factor)
    target = UNITS[resolve(to)]
    if target.dimension != source.dimension:
        raise ValueError(f"cannot convert {unit!r} ({source.dimension}) to {to!r} ({target.dimension})")
    return Fraction(source.factor) / Fraction(target.factor)


# -- one number --------------------------------------------------------------------------------------------
_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)
_SPACE = " \t\r\n"


def parse(text: str) -> Decimal:
    """``text`` as an exact :class:`~decimal.Decimal`; ValueError (short message) if it is not a plain number."""
    if not isinstance(text, str):
        raise ValueError(f"not a number: {text!r}")
    stripped = text.strip(_SPACE)
    if not stripped.isascii():
        raise ValueError(f"not a number (non-ASCII characters): {text[:40]!r}")
    if not _NUMBER.fullmatch(stripped):
        raise ValueError(f"not a number: {text[:40]!r}")
    return Decimal(stripped)


def _scaled(value: Decimal, by: Fraction) -> int:
    """``value * by`` rounded to an integer with :data:`ROUNDING`, in exact integer arithmetic (ValueError past Int64).

    The same arithmetic as the column path: mantissa × numerator × 10^up
    divided by denominator × 10^down, the remainder deciding the rounding.
    """
    sign, digits, exponent = value.as_tuple()
    mantissa = int("".join(map(str, digits)) or "0")
    if mantissa == 0:
        return 0
    if value.adjusted() > 40:  # 10**40 of anything in the registry is past Int64
        raise ValueError("out of range")
    if value.adjusted() < -400:  # far below any unit: rounds to 0
        return 0
    numerator = mantissa * by.numerator * 10 ** max(exponent, 0)
    denominator = by.denominator * 10 ** max(-exponent, 0)
    quotient, remainder = divmod(numerator, denominator)
    if 2 * remainder > denominator or (2 * remainder == denominator and quotient % 2 == 1):
        quotient += 1  # ROUND_HALF_EVEN
    if quotient > INT64_MAX:
        raise ValueError("out of range")
    return -quotient if sign else quotient


def to_int(text: str, unit: str, *, to: str | None = None, spellings: Mapping[str, str] | None = None) -> int:
    """Decimal ``text`` in ``unit`` as an integer count of ``to`` (default: the base unit), rounded half to even.

    >>> to_int("1.0005", "us")
    1000
    >>> to_int("9.634", "MB")
    9634000
    >>> to_int("38.147", "MB", spellings={"MB": "MiB"})
    40000029

    Raises ValueError for text that is not a plain ASCII decimal, an unknown
    unit, or a result outside Int64.
    """
    return _scaled(parse(text), ratio(unit, to, spellings))


def to_float(text: str, unit: str | None = None, *, to: str | None = None,
             spellings: Mapping[str, str] | None = None, scale: Decimal | int | None = None) -> float:
    """Decimal ``text`` × the unit's factor (× ``scale``) as the nearest float: the exact product, rounded once.

    Raises ValueError for a product past the float range (about 1.8e308), which no measured figure reaches.
    """
    value = parse(text)
    by = ratio(unit, to, spellings) if unit is not None else Fraction(1)
    if scale is not None:
        by *= Fraction(scale)
    try:
        out = float(value) if by == 1 else float(Fraction(value) * by)  # exact product, rounded once
    except OverflowError:
        out = math.inf
    if math.isinf(out):
        raise ValueError(f"{text} is too large for a float")
    return out


# -- columns -----------------------------------------------------------------------------------------------
class NumberError(ValueError):
    """A cell of a column could not be converted: ``index`` is its row, ``text`` the cell, ``reason`` why."""

    def __init__(self, index: int, text: str, reason: str):
        super().__init__(f"row {index}: {reason}")
        self.index, self.text, self.reason = index, text, reason


_COLUMN_NUMBER = r"^[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$"
_FAST_DIGITS = 37  # Int128 holds 38 decimal digits: products and divisors stay below 10**37


def column_to_int(values: pl.Series, unit: str | pl.Series, *, to: str | None = None,
                  spellings: Mapping[str, str] | None = None, strict: bool = True) -> pl.Series:
    """A column of decimal text in ``unit`` as Int64 counts of ``to``: :func:`to_int` on every cell, vectorized.

    ``unit`` is one unit for the whole column or a column of per-cell unit
    spellings. Null cells give null. With ``strict`` the first cell that
    cannot be converted (not a number, unknown or missing unit, out of range)
    raises :class:`NumberError` naming its row; without, such cells give null.
    The result equals :func:`to_int` cell by cell (the column path uses
    Int128 arithmetic and falls back to :func:`to_int` for the rare cell whose
    digits do not fit).
    """
    name = values.name
    text = values.cast(pl.String).str.strip_chars(_SPACE)
    units = pl.Series([unit] * len(text), dtype=pl.String) if isinstance(unit, str) else unit.cast(pl.String)
    ratios = {}
    for spelling in units.drop_nulls().unique().to_list():
        try:
            ratios[spelling] = ratio(spelling, to, spellings)
        except ValueError:
            if isinstance(unit, str):
                raise
    keys = list(ratios)

    def per_unit(values: list[int], dtype) -> pl.Series:
        return units.replace_strict(keys, values, default=None, return_dtype=dtype)

    df = pl.DataFrame({
        "t": text,
        "num": per_unit([ratios[k].numerator for k in keys], pl.Int128),
        "den": per_unit([ratios[k].denominator for k in keys], pl.Int128),
        "num_digits": per_unit([len(str(ratios[k].numerator)) for k in keys], pl.Int64),
        "den_digits": per_unit([len(str(ratios[k].denominator)) for k in keys], pl.Int64),
    })
    out = _fast(df)
    # cells the fast path could not do (long digits, far exponents, bad text or unit): the exact scalar path
    todo = (text.is_not_null() & out.is_null()).arg_true().to_list()
    if todo:
        filled = out.to_list()
        for i in todo:
            try:
                if units[i] is None:
                    raise ValueError("no unit")
                filled[i] = to_int(text[i], units[i], to=to, spellings=spellings)
            except ValueError as exc:
                if strict:
                    raise NumberError(i, values[i], str(exc)) from None
        out = pl.Series(name, filled, dtype=pl.Int64)
    return out.alias(name)


def _fast(df: pl.DataFrame) -> pl.Series:
    """Int128 conversion of column ``t`` × ``num``/``den``, rounded half to even; null where it does not apply.

    Computed in stages (each a column), so that no part is evaluated twice.
    """
    parts = pl.col("t").str.extract_groups(r"^([+-]?)([0-9]*)(?:\.([0-9]*))?(?:[eE]([+-]?[0-9]{1,9}))?$")
    df = df.with_columns(parts.alias("p")).select(
        "num", "den", "num_digits", "den_digits",
        ok=pl.col("t").str.contains(_COLUMN_NUMBER),
        sign=pl.col("p").struct.field("1"),
        digits=(pl.col("p").struct.field("2").fill_null("") + pl.col("p").struct.field("3").fill_null(""))
        .str.strip_chars_start("0"),
        has_exp=pl.col("t").str.contains("[eE]"),
        shift=pl.col("p").struct.field("4").cast(pl.Int64).fill_null(0)
        - pl.col("p").struct.field("3").fill_null("").str.len_chars().cast(pl.Int64),
    )
    df = df.with_columns(n_sig=pl.col("digits").str.len_chars().cast(pl.Int64),
                         up=pl.col("shift").clip(0, None), down=(-pl.col("shift")).clip(0, None))
    fits = (pl.col("ok") & pl.col("sign").is_not_null() & pl.col("num").is_not_null()
            & (pl.col("n_sig") + pl.col("num_digits") + pl.col("up") <= _FAST_DIGITS)
            & (pl.col("den_digits") + pl.col("down") <= _FAST_DIGITS))
    ten = pl.lit(10, pl.Int128)
    df = df.with_columns(fits=fits).with_columns(
        numerator=pl.when(pl.col("fits")).then(
            pl.col("digits").replace("", "0").cast(pl.Int128, strict=False) * pl.col("num")
            * ten.pow(pl.col("up").clip(0, _FAST_DIGITS).cast(pl.UInt32))),
        denominator=pl.when(pl.col("fits")).then(
            pl.col("den") * ten.pow(pl.col("down").clip(0, _FAST_DIGITS).cast(pl.UInt32))),
    ).with_columns(q=pl.col("numerator") // pl.col("denominator"))
    df = df.with_columns(r=pl.col("numerator") - pl.col("q") * pl.col("denominator"))
    half_even = ((2 * pl.col("r") > pl.col("denominator"))
                 | ((2 * pl.col("r") == pl.col("denominator")) & (pl.col("q") % 2 == 1)))
    df = df.with_columns(rounded=pl.col("q") + half_even.cast(pl.Int128))
    magnitude = pl.when(pl.col("rounded") <= INT64_MAX).then(pl.col("rounded")).cast(pl.Int64)
    df = df.select(m=magnitude, sign="sign")
    return df.select(pl.when(pl.col("sign") == "-").then(-pl.col("m")).otherwise(pl.col("m"))).to_series()


def column_to_float(values: pl.Series, unit: str | pl.Series | None = None, *, to: str | None = None,
                    spellings: Mapping[str, str] | None = None, strict: bool = True) -> pl.Series:
    """A column of decimal text × its unit's factor as Float64: :func:`to_float` on every cell.

    ``unit`` is one unit, a column of per-cell spellings (a null spelling:
    a plain number), or None (plain numbers). Null cells give null; a bad
    cell (not a number, unknown unit) raises :class:`NumberError` with
    ``strict``, else gives null.
    """
    name = values.name
    text = values.cast(pl.String)
    if unit is None or isinstance(unit, str):
        units = pl.Series([unit] * len(text), dtype=pl.String)
    else:
        units = unit.cast(pl.String)
    results: dict[tuple, float | str] = {}
    for cell, spelling in pl.DataFrame({"t": text, "u": units}).filter(pl.col("t").is_not_null()).unique().iter_rows():
        try:
            results[(cell, spelling)] = to_float(cell, spelling, to=to, spellings=spellings)
        except ValueError as exc:
            results[(cell, spelling)] = str(exc)
    out = []
    for i, key in enumerate(zip(text.to_list(), units.to_list())):
        got = None if key[0] is None else results[key]
        if isinstance(got, str):
            if strict:
                raise NumberError(i, values[i], got)
            got = None
        out.append(got)
    return pl.Series(name, out, dtype=pl.Float64)
