"""Device busy and idle time, and the idle gaps between a device's activities."""

from __future__ import annotations

import polars as pl

from traceparse import intervals
from traceparse.expr import GPU_KINDS, by_id
from traceparse.measures.base import DEVICE, Measure, keyed, placed, rows_of, shared, unkeyed


def _activity(events: pl.DataFrame, kinds) -> pl.DataFrame:
    """The timed rows of ``kinds``, keyed (shared by the measures of one analysis)."""
    if isinstance(kinds, pl.Expr):
        return keyed(rows_of(events, kinds).filter(placed()))
    kinds = (kinds,) if isinstance(kinds, str) else tuple(sorted(set(kinds)))
    return shared(events, "activity", lambda: keyed(rows_of(events, kinds).filter(placed())), kinds)


def _union(events: pl.DataFrame, kinds) -> pl.DataFrame:
    """:func:`traceparse.intervals.union` of the timed rows of ``kinds`` per device (:func:`_activity`): the part of
    :class:`DeviceBusy` and of :class:`Gaps` alike, so shared as the rows are."""
    if isinstance(kinds, pl.Expr):
        return intervals.union(_activity(events, kinds), DEVICE)
    kinds = (kinds,) if isinstance(kinds, str) else tuple(sorted(set(kinds)))
    return shared(events, "activity_union", lambda: intervals.union(_activity(events, kinds), DEVICE), kinds)


class DeviceBusy(Measure):
    """Per device, the span from its first to its last activity, the time it is busy, and the idle rest.

    Activity is the timed rows of ``kinds`` (default kernel, memcpy, memset)
    as half-open intervals; aggregated rows have no start and are left out.
    Per (``trace_id``, ``device_id``; a null device is one group):
    ``first_ns`` / ``last_ns`` = first start / last end, ``span_ns`` = last −
    first, ``busy_ns`` = length of the union of the intervals (nested and
    overlapping ones merge, touching ones leave no gap), ``idle_ns`` = span −
    busy, ``gaps`` = the number of idle gaps.

    Part: the union of a partition's intervals per device; combine: the union
    of the parts' unions, which is the union of the whole. Valid partitions:
    device, trace, row chunks.

    >>> ev = pl.DataFrame({"trace_id": ["t"] * 3, "device_id": [0, 0, 0], "kind": ["kernel"] * 3,
    ...                    "start_ns": [0, 5, 20], "duration_ns": [10, 2, 5]})
    >>> device_busy(ev).select("span_ns", "busy_ns", "idle_ns", "gaps").row(0)
    (25, 15, 10, 1)
    """

    name = "device_busy"
    per_trace = True

    def part(self, events: pl.DataFrame, kinds=GPU_KINDS) -> pl.DataFrame:
        return _union(events, kinds)

    def combine(self, parts: list[pl.DataFrame], kinds=GPU_KINDS) -> pl.DataFrame:
        # one part is a union already (merged, sorted): merging it again gives it back (9 ms a call)
        merged = parts[0] if len(parts) == 1 else intervals.merge(pl.concat(parts), DEVICE)
        out = (merged.group_by(DEVICE).agg(
            first_ns=pl.col("start").min(), last_ns=pl.col("end").max(),
            busy_ns=(pl.col("end") - pl.col("start")).sum(), gaps=(pl.len() - 1).cast(pl.Int64))
            .with_columns(span_ns=pl.col("last_ns") - pl.col("first_ns"))
            .with_columns(idle_ns=pl.col("span_ns") - pl.col("busy_ns"))
            .sort(DEVICE))
        return unkeyed(out).select(*DEVICE, "first_ns", "last_ns", "span_ns", "busy_ns", "idle_ns", "gaps")


class Gaps(Measure):
    """Every idle gap of every device, with the activities on either side.

    Activity as in :class:`DeviceBusy`. Columns: ``trace_id``, ``device_id``,
    ``start``, ``end``, ``length`` (ns) of each gap between the device's merged
    intervals, ``before`` / ``after``: the name of the activity on that device
    that ends where the gap starts / starts where it ends (of several, the
    first in the trace's order, by ``event_id``). Sorted by device and start.
    With ``longest`` = N, only the N longest gaps of each trace (by length,
    then start and device): what a rule listing the longest gaps needs, N
    rows per rank of a run instead of every gap.

    Part: the union per device, each merged interval with the first activity
    ending at its end and starting at its start; combine: the merged union,
    which takes those names from the parts' intervals sharing its ends. Valid
    partitions: device, trace, row chunks.
    """

    name = "gaps"
    per_trace = True

    def part(self, events: pl.DataFrame, kinds=GPU_KINDS, longest: int | None = None) -> pl.DataFrame:
        rows = _activity(events, kinds).with_columns(end=pl.col("start_ns") + pl.col("duration_ns"))
        union = _union(events, kinds)
        ends = _first_at(rows, "end", "end_event", "end_name")
        starts = _first_at(rows.with_columns(start=pl.col("start_ns")), "start", "start_event", "start_name")
        return (union.join(ends, on=[*DEVICE, "end"], how="left")
                .join(starts, on=[*DEVICE, "start"], how="left"))

    def combine(self, parts: list[pl.DataFrame], kinds=GPU_KINDS, longest: int | None = None) -> pl.DataFrame:
        if len(parts) == 1:  # one part's union is merged already, each interval with its names (30 ms a call)
            merged = parts[0].sort([*DEVICE, "start"])
        else:
            every = pl.concat(parts)
            merged = intervals.merge(every, DEVICE)
            ends = _first_of(every, "end", "end_event", "end_name")
            starts = _first_of(every, "start", "start_event", "start_name")
            merged = (merged.join(ends, on=[*DEVICE, "end"], how="left")
                      .join(starts, on=[*DEVICE, "start"], how="left").sort([*DEVICE, "start"]))
        prev_end, prev_name = pl.col("end").shift(1).over(DEVICE), pl.col("end_name").shift(1).over(DEVICE)
        gaps = (merged.with_columns(gap_start=prev_end, before=prev_name)
                .filter(pl.col("gap_start").is_not_null())
                .select(*DEVICE, pl.col("gap_start").alias("start"), pl.col("start").alias("end"),
                        (pl.col("start") - pl.col("gap_start")).alias("length"), "before",
                        pl.col("start_name").alias("after")))
        if longest is not None:
            gaps = (gaps.sort(["length", "start", "device_id"], descending=[True, False, False])
                    .group_by("trace_id", maintain_order=True).head(max(0, int(longest))).sort([*DEVICE, "start"]))
        return unkeyed(gaps)


def _first_at(rows: pl.DataFrame, at: str, event: str, name: str) -> pl.DataFrame:
    """Per device and instant ``at``: the first row (by event_id) with that value, its event_id and name. Rows
    in event-id order already (a stored table's are) are not sorted again (the names along: 4 ms a call)."""
    return (by_id(rows).group_by([*DEVICE, at])
            .agg(pl.col("event_id").first().alias(event), pl.col("name").first().alias(name)))


def _first_of(parts: pl.DataFrame, at: str, event: str, name: str) -> pl.DataFrame:
    """Of the parts' candidates for one instant, the one with the lowest event_id."""
    return (parts.filter(pl.col(event).is_not_null()).sort(event).group_by([*DEVICE, at])
            .agg(pl.col(event).first(), pl.col(name).first()))


device_busy = DeviceBusy()
gaps = Gaps()
