"""How much of one set of intervals runs while another runs: copy vs kernels, communication vs compute."""

from __future__ import annotations

import polars as pl

from traceparse import intervals
from traceparse.measures.base import DEVICE, Measure, keyed, placed, rows_of, shared, unkeyed

_SIDE = "side"


class Overlap(Measure):
    """Per device, the time of side ``a`` and the part of it that runs while side ``b`` runs.

    ``a`` and ``b`` are kind names (a tuple) or boolean polars expressions
    selecting rows (default: memcpy against kernels; communication against
    compute is ``a=expr.kernel_category(pl.col("name")) == "communication"``
    and its negation for ``b``, both with ``kind_is("kernel")``). Only timed
    rows count. Per (``trace_id``, ``device_id``, *``group``*): ``count`` (a
    rows), ``time_ns`` = Σ durations of the a rows, ``overlapped_ns`` = Σ over
    a rows of |row ∩ union of the device's b intervals| (an a row overlapping
    another a row counts in full each time, as its own time does),
    ``exposed_ns`` = time − overlapped; ``busy_ns`` = the time at least one
    a row runs (the union: a rows that overlap each other count once) and
    ``busy_exposed_ns`` the part of it while no b row runs, which is never
    longer than the device's span (two streams' copies at once are one
    stretch of copying, not two). ``group`` names columns of the a rows to
    break the figures down by (e.g. ``copy_kind``).

    The parts are interval edges (:func:`traceparse.intervals.edges`): Σ over
    a rows of |row ∩ U| = ∫ depth_a(t) · [t ∈ U] dt, and edges of partitions
    add up. Valid partitions: device, trace, row chunks.
    """

    name = "overlap"
    per_trace = True

    def part(self, events: pl.DataFrame, a=("memcpy",), b=("kernel",), group=()) -> pl.DataFrame:
        group = list(group)
        edges_a = _edges(events, a, group)
        edges_b = _edges(events, b, ()).with_columns(pl.lit(None, pl.String).alias(g) for g in group)
        return pl.concat([edges_a.with_columns(pl.lit("a").alias(_SIDE)),
                          edges_b.with_columns(pl.lit("b").alias(_SIDE)).select(edges_a.columns + [_SIDE])])

    def combine(self, parts: list[pl.DataFrame], a=("memcpy",), b=("kernel",), group=()) -> pl.DataFrame:
        group = list(group)
        keys = [*DEVICE, *group]
        side_a, side_b = _sides(parts, keys, group)
        covered = intervals.depth_segments(side_b, DEVICE).filter(pl.col("depth") > 0)
        covered = intervals.merge(covered, DEVICE)
        segments = (intervals.depth_segments(side_a, keys).filter(pl.col("depth") > 0)
                    .with_columns(start_ns=pl.col("start"), duration_ns=pl.col("end") - pl.col("start")))
        segments = segments.with_columns(overlap=intervals.overlap_with(segments, covered, DEVICE, merged=True))
        counts = side_a.group_by(keys).agg(count=pl.col("opens").sum())
        sums = segments.group_by(keys).agg(
            time_ns=(pl.col("depth") * pl.col("duration_ns")).sum(),
            overlapped_ns=(pl.col("depth") * pl.col("overlap")).sum(),
            busy_ns=pl.col("duration_ns").sum(), busy_overlapped_ns=pl.col("overlap").sum())
        out = (counts.join(sums, on=keys, how="left", nulls_equal=True)
               .with_columns(pl.col("time_ns", "overlapped_ns", "busy_ns", "busy_overlapped_ns").fill_null(0)
                             .cast(pl.Int64))
               .with_columns(exposed_ns=pl.col("time_ns") - pl.col("overlapped_ns"),
                             busy_exposed_ns=pl.col("busy_ns") - pl.col("busy_overlapped_ns"))
               .sort(keys, nulls_last=False))
        return unkeyed(out).select(*keys, "count", "time_ns", "overlapped_ns", "exposed_ns", "busy_ns",
                                   "busy_exposed_ns")


def _edges(events: pl.DataFrame, kinds, group) -> pl.DataFrame:
    """:func:`traceparse.intervals.edges` of the timed rows of ``kinds`` per device and ``group`` (as text); of
    kind names, shared by the measures of one analysis (the kernels' edges, side b of every copy overlap)."""
    def compute() -> pl.DataFrame:
        rows = keyed(rows_of(events, kinds).filter(placed()))
        return intervals.edges(rows.with_columns(pl.col(g).cast(pl.String) for g in group), [*DEVICE, *group])

    if isinstance(kinds, pl.Expr):
        return compute()
    kinds = (kinds,) if isinstance(kinds, str) else tuple(sorted(set(kinds)))
    return shared(events, "overlap_edges", compute, (kinds, tuple(group)))


def _sides(parts: list[pl.DataFrame], keys: list[str], group: list[str]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The parts' edges of side a (per ``keys``) and of side b (per device), each summed per instant and sorted.

    Each side apart: summing both together keyed by the side's text as well cost 45 ms of the 65 ms of a
    combine on 87,000 kernel edges. One part's sides are :func:`traceparse.intervals.edges` already (summed per
    instant, sorted): they are taken as they are.
    """
    a = [p.filter(pl.col(_SIDE) == "a").drop(_SIDE) for p in parts]
    b = [p.filter(pl.col(_SIDE) == "b").drop(_SIDE, *group) for p in parts]
    if len(parts) == 1:
        return a[0], b[0]
    return intervals.combine_edges(a, keys), intervals.combine_edges(b, DEVICE)


overlap = Overlap()
