"""How much of a device's busy time has several intervals running at once (time at depth)."""

from __future__ import annotations

import polars as pl

from traceparse import intervals
from traceparse.measures.base import DEVICE, Measure, keyed, placed, rows_of, unkeyed


class Concurrency(Measure):
    """Per device, the time with at least one and at least ``at_least`` intervals of ``kinds`` running.

    Timed rows of ``kinds`` (default kernels) as half-open intervals, so one
    starting exactly when another ends is not concurrent. Per (``trace_id``,
    ``device_id``): ``count`` (rows), ``time_ns`` (Σ durations), ``busy_ns`` =
    time with depth ≥ 1 (the union's length), ``concurrent_ns`` = time with
    depth ≥ ``at_least`` (default 2), ``max_depth``, ``streams`` and
    ``stream_ids`` (the distinct ``stream_id`` values, null included).

    The parts are interval edges per device and stream, which add up.
    Valid partitions: device, trace, row chunks.
    """

    name = "concurrency"
    per_trace = True

    def part(self, events: pl.DataFrame, kinds=("kernel",), at_least: int = 2) -> pl.DataFrame:
        return intervals.edges(keyed(rows_of(events, kinds).filter(placed())), [*DEVICE, "stream_id"])

    def combine(self, parts: list[pl.DataFrame], kinds=("kernel",), at_least: int = 2) -> pl.DataFrame:
        edges = intervals.combine_edges(parts, [*DEVICE, "stream_id"])
        per_stream = edges.group_by(DEVICE).agg(
            count=pl.col("opens").sum(), stream_ids=pl.col("stream_id").unique().sort(nulls_last=False))
        depth = intervals.depth_segments(intervals.combine_edges([edges.drop("stream_id")], DEVICE), DEVICE)
        length = pl.col("end") - pl.col("start")
        sums = depth.group_by(DEVICE).agg(
            time_ns=(pl.col("depth") * length).sum(),
            busy_ns=length.filter(pl.col("depth") >= 1).sum(),
            concurrent_ns=length.filter(pl.col("depth") >= at_least).sum(),
            max_depth=pl.col("depth").max())
        out = (per_stream.join(sums, on=DEVICE, how="left")
               .with_columns(pl.col("time_ns", "busy_ns", "concurrent_ns").fill_null(0).cast(pl.Int64),
                             pl.col("max_depth").fill_null(0).cast(pl.Int64),
                             streams=pl.col("stream_ids").list.len().cast(pl.Int64))
               .sort(DEVICE))
        return unkeyed(out).select(*DEVICE, "count", "time_ns", "busy_ns", "concurrent_ns", "max_depth", "streams",
                                   "stream_ids")


concurrency = Concurrency()
