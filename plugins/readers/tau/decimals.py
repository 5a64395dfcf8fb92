"""Exact decimal text to integers, column at a time with polars.

TAU writes times as ``%.16G`` doubles in microseconds (``51781``,
``1234.567890123456``, ``1.6E+07``), ParaProf exports Java doubles
(``449.0``, ``1.2345E7``), pprof prints milliseconds. Turning them into
integer nanoseconds with float math can drift by a nanosecond, so the
decimal text is taken apart (sign, digits, exponent) and scaled with
128-bit integer arithmetic, rounding half to even only below the unit.
"""

from __future__ import annotations

import polars as pl

#: sign, integer digits, fraction digits, exponent
DECIMAL_PATTERN = r"^\s*([+-]?)(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?\s*$"
_INT64_MAX = 2**63 - 1
_MAX_DIGITS = 36  # significant digits an Int128 mantissa holds with room to round


def scaled_int(text: pl.Series, power: int = 0) -> pl.Series:
    """``text`` (decimal strings, exponent allowed) × 10**``power`` as exact Int64, rounded half to even.

    Null where the text is null or not a number, has more than 36
    significant digits, or the result does not fit in Int64; callers report
    those rows.
    """
    plain = text.cast(pl.String).str.strip_chars()
    simple = plain.str.contains(r"^[+-]?\d{1,18}$")
    if power >= 0 and simple.all():  # whole numbers (Calls, Subrs, integral times): no decimal arithmetic needed
        values = plain.cast(pl.Int64)
        limit = _INT64_MAX // 10**power
        return pl.select(pl.when(values.abs() <= limit).then(values * 10**power).alias(text.name)).to_series()
    df = _parts(plain)
    df = df.with_columns(
        digits=(pl.col("whole").fill_null("") + pl.col("frac").fill_null("")),
        shift=(pl.col("exp").cast(pl.Int64, strict=False).fill_null(0)
               - pl.col("frac").fill_null("").str.len_chars().cast(pl.Int64) + power),
    ).with_columns(sig=pl.col("digits").str.strip_chars_start("0"))
    df = df.with_columns(
        n=pl.col("sig").str.len_chars().cast(pl.Int64),
        valid=pl.col("sign").is_not_null() & (pl.col("digits").str.len_chars() > 0),
    ).with_columns(
        valid=pl.col("valid") & (pl.col("n") <= _MAX_DIGITS) & (pl.col("n") + pl.col("shift").clip(0, None) <= 19),
        mantissa=pl.when(pl.col("n") == 0).then(pl.lit("0")).otherwise(pl.col("sig"))
        .cast(pl.Int128, strict=False),
        up=pl.col("shift").clip(0, 37).cast(pl.UInt32),
        down=(-pl.col("shift")).clip(0, 37).cast(pl.UInt32),
    ).with_columns(
        divisor=pl.lit(10, pl.Int128).pow(pl.col("down")),
        factor=pl.lit(10, pl.Int128).pow(pl.col("up")),
    ).with_columns(quotient=pl.col("mantissa") // pl.col("divisor")).with_columns(
        remainder=pl.col("mantissa") - pl.col("quotient") * pl.col("divisor"),
    ).with_columns(
        magnitude=pl.when(pl.col("shift") >= 0).then(pl.col("mantissa") * pl.col("factor"))
        .when(pl.col("shift") <= -37).then(pl.lit(0, pl.Int128))  # mantissa < 10**36 rounds to 0
        .otherwise(pl.col("quotient") + (
            (2 * pl.col("remainder") > pl.col("divisor"))
            | ((2 * pl.col("remainder") == pl.col("divisor")) & (pl.col("quotient") % 2 == 1))
        ).cast(pl.Int128)),
    )
    magnitude = pl.when(pl.col("valid") & (pl.col("magnitude") <= _INT64_MAX)).then(pl.col("magnitude"))
    out = df.select(magnitude.cast(pl.Int64).alias("m"), pl.col("sign"))
    out = out.select(pl.when(pl.col("sign") == "-").then(-pl.col("m")).otherwise(pl.col("m")).alias(text.name))
    return out.to_series()


def _parts(text: pl.Series) -> pl.DataFrame:
    """sign, whole, frac, exp columns of decimal text (split, not a regex: this runs on every value);
    sign is null where the text is not a number."""
    df = pl.DataFrame({"t": text}).with_columns(
        e=pl.col("t").str.replace("E", "e", literal=True).str.splitn("e", 2))
    df = df.select(mantissa=pl.col("e").struct.field("field_0"), exp=pl.col("e").struct.field("field_1"))
    df = df.with_columns(
        sign=pl.when(pl.col("mantissa").str.starts_with("-")).then(pl.lit("-"))
        .when(pl.col("mantissa").str.starts_with("+")).then(pl.lit("+")).otherwise(pl.lit("")),
    ).with_columns(body=pl.col("mantissa").str.slice(pl.col("sign").str.len_bytes()).str.splitn(".", 2))
    df = df.select("sign", whole=pl.col("body").struct.field("field_0"), frac=pl.col("body").struct.field("field_1"),
                   exp=pl.col("exp"))
    valid = (pl.col("whole").str.contains(r"^\d*$") & (pl.col("frac").is_null() | pl.col("frac").str.contains(r"^\d*$"))
             & (pl.col("exp").is_null() | pl.col("exp").str.contains(r"^[+-]?\d+$")))
    return df.with_columns(sign=pl.when(valid).then(pl.col("sign")))


def is_number(text: pl.Expr) -> pl.Expr:
    """True where ``text`` is a decimal number (optionally with an exponent)."""
    return text.str.contains(DECIMAL_PATTERN) & text.str.contains(r"\d")


def to_float(text: pl.Expr) -> pl.Expr:
    """``text`` as Float64 (counter values, which the schema keeps as floats); null where not a number."""
    return pl.when(is_number(text)).then(text.str.strip_chars().cast(pl.Float64, strict=False))
