"""Step windows: the ``ProfilerStep#N`` annotations torch.profiler writes around each step."""

from __future__ import annotations

import polars as pl

from traceparse.measures.base import Measure, keyed, rows_of, unkeyed

#: The name of a step annotation; the group is the step number.
STEP_NAME = r"^ProfilerStep#(\d+)$"


class Steps(Measure):
    """One window per step: the rows named ``ProfilerStep#N`` (of ``kinds``, default any) with a duration.

    Per (``trace_id``, ``step`` = N, ``on_host``: the annotation has a ``pid``,
    as the host-side ones do; the device-side copies have none): ``start_ns``
    (first start), ``end_ns`` (last end), ``duration_ns`` (the longest
    annotation of the step), ``annotations`` (how many). Sorted by trace,
    side and step.

    Part: those figures per partition; combine: min, max, max and sum of
    them. Valid partitions: device, trace, row chunks.
    """

    name = "steps"
    per_trace = True

    def part(self, events: pl.DataFrame, kinds=None) -> pl.DataFrame:
        rows = events if kinds is None else rows_of(events, kinds)
        rows = keyed(rows.filter(pl.col("name").str.contains(STEP_NAME) & pl.col("duration_ns").is_not_null()))
        return (rows.group_by("trace_id", step=pl.col("name").str.extract(STEP_NAME, 1).cast(pl.Int64),
                              on_host=pl.col("pid").is_not_null())
                .agg(start_ns=pl.col("start_ns").min(), end_ns=(pl.col("start_ns") + pl.col("duration_ns")).max(),
                     duration_ns=pl.col("duration_ns").max(), annotations=pl.len().cast(pl.Int64)))

    def combine(self, parts: list[pl.DataFrame], kinds=None) -> pl.DataFrame:
        out = (pl.concat(parts).group_by("trace_id", "on_host", "step")
               .agg(pl.col("start_ns").min(), pl.col("end_ns").max(), pl.col("duration_ns").max(),
                    pl.col("annotations").sum())
               .sort("trace_id", "on_host", "step", descending=[False, True, False]))
        return unkeyed(out).select("trace_id", "on_host", "step", "start_ns", "end_ns", "duration_ns", "annotations")


steps = Steps()
