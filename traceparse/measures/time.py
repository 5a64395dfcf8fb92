"""Calls and time per name, and per category of names (kernel categories, API classes)."""

from __future__ import annotations

import polars as pl

from traceparse import expr
from traceparse.measures.base import Measure, keyed, rows_of, unkeyed

_KEYS = ["trace_id", "kind", "name"]


class TimeByName(Measure):
    """Calls and time per (``trace_id``, ``kind``, ``name``) of the rows of ``kinds`` (default: every kind).

    Timed events and aggregated rows alike: ``calls`` = Σ calls (a missing
    count is 1), ``time_ns`` = Σ duration_ns (null when no row of the name
    has a duration), ``rows``. With ``prefer_timed`` (the default), when a
    trace has both timed events and aggregated rows of one kind, the
    aggregated ones summarize the same calls and are left out;
    ``ignored_rows`` gives, on every row of that trace and kind, how many
    were. Names keep their rows' order of first appearance only by accident:
    sort the result.

    Part: sums per name, timed and aggregated apart; combine: the sums, and
    the choice of rows per trace and kind. Valid partitions: device, trace,
    row chunks.
    """

    name = "time_by_name"
    per_trace = True

    def part(self, events: pl.DataFrame, kinds=None, prefer_timed: bool = True) -> pl.DataFrame:
        rows = events if kinds is None else rows_of(events, kinds)
        return (keyed(rows.select("trace_id", pl.col("kind").cast(pl.String), "name", "start_ns", "duration_ns",
                                  "calls"))
                .group_by(*_KEYS, aggregated=~expr.timed())
                .agg(rows=pl.len().cast(pl.Int64), calls=expr.calls().sum(), time_ns=pl.col("duration_ns").sum(),
                     durations=pl.col("duration_ns").count()))

    def combine(self, parts: list[pl.DataFrame], kinds=None, prefer_timed: bool = True) -> pl.DataFrame:
        sums = (pl.concat(parts).group_by(*_KEYS, "aggregated")
                .agg(pl.col("rows", "calls", "time_ns", "durations").sum()))
        per_kind = ["trace_id", "kind"]
        if prefer_timed:
            timed_rows = pl.col("rows").filter(~pl.col("aggregated")).sum().over(per_kind)
            drop = pl.col("aggregated") & (timed_rows > 0)
        else:
            drop = pl.lit(False)
        sums = sums.with_columns(drop=drop).with_columns(
            ignored_rows=pl.col("rows").filter(pl.col("drop")).sum().over(per_kind))
        ignored = sums.group_by(per_kind).agg(pl.col("ignored_rows").first())
        out = (sums.filter(~pl.col("drop")).group_by(_KEYS)
               .agg(calls=pl.col("calls").sum(), time_ns=pl.col("time_ns").sum(), durations=pl.col("durations").sum(),
                    rows=pl.col("rows").sum())
               .join(ignored, on=per_kind, how="left")
               .with_columns(time_ns=pl.when(pl.col("durations") > 0).then(pl.col("time_ns")),
                             ignored_rows=pl.col("ignored_rows").fill_null(0))
               .sort(_KEYS, nulls_last=False))
        return unkeyed(out).select(*_KEYS, "calls", "time_ns", "rows", "ignored_rows")


class TimeByCategory(Measure):
    """Calls and time per category of names: :class:`TimeByName` with each name classified by a pattern table.

    ``table`` is a list of (category, regex) pairs, the first match wins
    (:func:`traceparse.expr.first_match`); names matching none get
    ``default``; ``lowercase`` matches the lower-cased name. Columns:
    ``trace_id``, ``kind``, ``category``, ``calls``, ``time_ns`` (null when no
    name of the category has a duration), ``names`` (distinct names),
    ``ignored_rows`` (as in :class:`TimeByName`). The defaults are the
    kernel categories of kernels (:func:`traceparse.expr.kernel_categories`:
    plugins' rows, then :data:`traceparse.expr.KERNEL_CATEGORIES`;
    timed and aggregated rows alike); :data:`api_classes` is this measure
    with the API classes of API calls. Valid partitions: device, trace, row
    chunks.
    """

    name = "time_by_category"

    per_trace = True

    def __init__(self, name: str = "time_by_category", **defaults):
        self.name = name
        self.defaults = {"kinds": ("kernel",), "table": None, "default": expr.OTHER_CATEGORY,
                         "lowercase": True, "prefer_timed": False, **defaults}

    def part(self, events: pl.DataFrame, **params) -> pl.DataFrame:
        p = {**self.defaults, **params}
        return time_by_name.part(events, kinds=p["kinds"], prefer_timed=p["prefer_timed"])

    def combine(self, parts: list[pl.DataFrame], **params) -> pl.DataFrame:
        p = {**self.defaults, **params}
        by_name = time_by_name.combine(parts, kinds=p["kinds"], prefer_timed=p["prefer_timed"])
        table = expr.kernel_categories() if p["table"] is None else p["table"]
        category = expr.first_match(pl.col("name").fill_null(""), table, p["default"], lowercase=p["lowercase"])
        return (by_name.with_columns(category=category)
                .group_by("trace_id", "kind", "category")
                .agg(calls=pl.col("calls").sum(),
                     time_ns=pl.when(pl.col("time_ns").count() > 0).then(pl.col("time_ns").sum()),
                     names=pl.len().cast(pl.Int64), ignored_rows=pl.col("ignored_rows").first())
                .sort("trace_id", "kind", "category", nulls_last=False))


time_by_name = TimeByName()
time_by_category = TimeByCategory()
#: CUDA API calls by class (launch, memcpy, synchronize, allocation, other), timed events preferred.
api_classes = TimeByCategory("api_classes", kinds=("api",), table=expr.API_CLASSES, default=expr.OTHER_CLASS,
                             lowercase=False, prefer_timed=True)
