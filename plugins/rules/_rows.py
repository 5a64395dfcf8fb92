"""Helpers the rules share: choosing rows, classifying names by a pattern table, rounding figures.

A trace can hold timed events (``start_ns`` set, ``calls`` 1) and aggregated
rows (``start_ns`` null, ``duration_ns`` the total of ``calls`` calls, ``bytes``
the total bytes) of the same kind, e.g. an nvprof log with both a GPU trace
and a summary, or nsys trace and summary reports of one capture ingested
together. Both then describe the same calls, so a rule counts one of them:
the timed events, which are the more detailed.
"""

from __future__ import annotations

import polars as pl

#: Copy directions that cross the host link (PCIe, or NVLink-C2C on Grace systems).
HOST_DEVICE = ("HtoD", "DtoH")


def first_match(names: pl.Expr, table: list[tuple[str, str]], default: str, *, lowercase: bool = False) -> pl.Expr:
    """A polars expression giving, for each name, the label of the first (label, regex) row that matches it.

    Rules keep their classification (kernel categories, API classes) as such
    a readable table; ``default`` labels names no pattern matches.
    """
    subject = names.str.to_lowercase() if lowercase else names
    expr = pl.lit(default)
    for label, pattern in reversed(table):
        expr = pl.when(subject.str.contains(pattern)).then(pl.lit(label)).otherwise(expr)
    return expr


def prefer_timed(rows: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """Return ``rows`` without its aggregated rows when it also has timed ones, and how many were dropped.

    Call it on the rows of one kind: when timed events of that kind exist,
    the aggregated rows summarize the same calls and would count them twice.
    A table of only aggregated (or only timed) rows is returned unchanged.
    """
    timed = pl.col("start_ns").is_not_null()
    n_timed = int(rows.select(timed.sum()).item() or 0)
    if n_timed == 0 or n_timed == rows.height:
        return rows, 0
    return rows.filter(timed), rows.height - n_timed


def calls_expr() -> pl.Expr:
    """``calls`` with a missing count read as 1 (one event)."""
    return pl.col("calls").fill_null(1)


def is_copy_kind(kinds) -> pl.Expr:
    """True for rows whose ``copy_kind`` is one of ``kinds`` (false when unknown)."""
    return pl.col("copy_kind").cast(pl.String).is_in(list(kinds)).fill_null(False)


def pct(part: float | int | None, whole: float | int | None) -> float | None:
    """100 × part / whole rounded to 4 decimals, or None when whole is 0 or unknown."""
    if part is None or not whole:
        return None
    return round(100.0 * part / whole, 4)


def gbps(nbytes: int | None, ns: int | None) -> float | None:
    """Bytes per nanosecond, i.e. GB/s with 1 GB = 10⁹ bytes, rounded to 4 decimals; None without time."""
    if nbytes is None or not ns:
        return None
    return round(nbytes / ns, 4)


def ignored_note(ignored_aggregated: int) -> str:
    """The sentence a copy rule adds when it left out aggregated rows that its timed copies already count."""
    if not ignored_aggregated:
        return ""
    return (f" {ignored_aggregated} aggregated memcpy rows ignored: the trace's timed copies "
            "already count those calls.")
