"""What every ncu input form is parsed into before it becomes events.

Each form (CSV details page, CSV raw page, plain text, .ncu-rep) yields the
same three tables of *strings as the tool wrote them*; :mod:`.events` then
converts values and units once, the same way for all forms.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

#: Columns of :attr:`Parsed.kernels` (one row per profiled kernel launch, in file order).
#: ``invocations``: the launches one row of ``--print-summary per-kernel`` stands for (its metrics are their means).
KERNEL_COLUMNS = ("key", "line", "id", "name", "pid", "process", "host", "context", "stream", "device", "cc",
                  "block", "grid", "kernel_time", "invocations")
#: Columns of :attr:`Parsed.metrics` (one row per kernel × metric).
METRIC_COLUMNS = ("key", "line", "group", "name", "unit", "raw")
#: Extra metric columns of ``--print-summary per-kernel`` text (its Minimum and Maximum; ``raw`` holds the Average).
SUMMARY_METRIC_COLUMNS = METRIC_COLUMNS + ("raw_min", "raw_max")
#: Columns of :attr:`Parsed.rules` (one row per kernel × rule result).
RULE_COLUMNS = ("key", "line", "group", "name", "type", "speedup_type", "speedup", "description")


@dataclass
class Parsed:
    """One ncu output parsed into string tables.

    ``key`` joins the three tables (the result ID, prefixed by the process ID
    where known); ``line`` is where the row starts in the source (for
    error messages; for .ncu-rep the result index). ``form`` names the input
    form for the trace metadata.
    """

    form: str
    kernels: pl.DataFrame
    metrics: pl.DataFrame
    rules: pl.DataFrame = field(default_factory=lambda: empty(RULE_COLUMNS))
    tool_version: str | None = None
    notes: list[str] = field(default_factory=list)


def empty(columns: tuple[str, ...]) -> pl.DataFrame:
    """An empty string table with ``columns`` (``line`` as Int64)."""
    return pl.DataFrame({c: pl.Series(c, [], dtype=pl.Int64 if c == "line" else pl.String) for c in columns})


def frame(columns: tuple[str, ...], data: dict[str, list]) -> pl.DataFrame:
    """A string table from column lists (missing columns become nulls)."""
    n = len(next(iter(data.values()))) if data else 0
    return pl.DataFrame({c: pl.Series(c, data.get(c, [None] * n), dtype=pl.Int64 if c == "line" else pl.String)
                         for c in columns})
