"""Exclusive time per routine and thread: what the hotspots rule ranks, measured trace by trace.

A run's ranks are measured one at a time (a
:class:`traceparse.measures.base.PartitionedEvents`); the choices that
depend on the whole table (leave out call-path rows, leave out aggregated
rows of a kind that also has timed ones) are made first, by
:func:`routine_choices`, from a few counts over the whole table, and passed to
every rank's part.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from traceparse.expr import calls, kind_is, timed
from traceparse.measures.base import Measure, keyed, picked, unkeyed
from traceparse.measures.nesting import self_times

#: Key of :data:`routine_time`: a routine (name, kind) on one thread of one trace.
ROUTINE = ["trace_id", "name", "kind", "pid", "device_id", "tid"]
#: The columns of a row that :class:`RoutineTime` uses (the key, its times, and what self time needs).
_ROW_COLUMNS = [*ROUTINE, "event_id", "start_ns", "duration_ns", "exclusive_ns", "calls"]
#: Host kinds whose rows count with their inclusive time when the source gives no exclusive time.
_HOST = ["op", "region", "api", "marker"]
#: The ``pid`` a device lane's rows nest under (:func:`_lanes_nested`): no process has it.
_LANE_PID = -(2 ** 62)


def device_lane() -> pl.Expr:
    """Rows on a device lane: an operator or range of a device that is on no stream and no host thread (xprof's
    ``XLA Modules``, ``XLA Ops``, ``Steps``, ``XLA TraceMe`` lines of a TPU or GPU: ``tid`` the line). The lanes
    are views of one device's work at several levels (a module runs its ops), not work side by side."""
    return (pl.col("kind").is_in(["region", "op"]) & pl.col("pid").is_null() & pl.col("tid").is_not_null()
            & pl.col("device_id").is_not_null())


def _nested() -> pl.Expr:
    return pl.col("call_path").fill_null("").str.contains(" => ", literal=True)


def routine_choices(events: Any, kinds: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """What to leave out of the rows of ``kinds``, decided on the whole table (a DataFrame or a run's partitions).

    As :func:`traceparse.expr.flat_rows` then :func:`traceparse.expr.prefer_timed` per kind do on the
    whole table: ``drop_nested`` when some but not all rows are call-path rows (``nested``: how many);
    ``drop_aggregated``: the kinds with both timed and aggregated rows (``dropped``: their aggregated rows);
    ``device_lane_rows``: the rows on device lanes (:func:`device_lane`).
    One aggregate over the table (for a run, a lazy scan of three columns).
    """
    kinds = list(kinds)
    ours = kind_is(*kinds)
    nested = _nested()
    exprs = [ours.sum().alias("rows"), (ours & nested).sum().alias("nested"),
             (ours & device_lane()).sum().alias("lanes")]
    for i, k in enumerate(kinds):
        mine = pl.col("kind") == k
        exprs += [mine.sum().alias(f"r{i}"), (mine & timed()).sum().alias(f"t{i}"),
                  (mine & ~nested).sum().alias(f"rf{i}"), (mine & ~nested & timed()).sum().alias(f"tf{i}")]
    counts = events.select(exprs).row(0, named=True)
    drop_nested = 0 < counts["nested"] < counts["rows"]
    drop, dropped = [], 0
    for i, k in enumerate(kinds):
        n, t = (counts[f"rf{i}"], counts[f"tf{i}"]) if drop_nested else (counts[f"r{i}"], counts[f"t{i}"])
        if 0 < t < n:
            drop.append(k)
            dropped += n - t
    return {"drop_nested": drop_nested, "nested": counts["nested"] if drop_nested else 0,
            "drop_aggregated": drop, "dropped": dropped, "device_lane_rows": counts["lanes"]}


class RoutineTime(Measure):
    """Per routine and thread (``trace_id``, ``name``, ``kind``, ``pid``, ``device_id``, ``tid``): exclusive and inclusive time.

    Rows: those of ``kinds``, less call-path rows when ``drop_nested`` and less the aggregated rows of the
    kinds in ``drop_aggregated`` (see :func:`routine_choices`), less markers without a thread (``pid``,
    ``tid``: a device-side range spans the kernels under it, it is no work). A row's time is its ``exclusive_ns``, else
    its self time from its nesting on its thread (:data:`traceparse.measures.self_time`), else its
    duration; rows with none are left out. Columns: the key, ``time_ns``, ``inclusive_ns`` (the time the
    routine was running on the thread: the union of its timed calls, so a recursive call (nn.Module's
    ``_call_impl`` inside itself) is not counted again inside its caller, plus Σ duration of its aggregated
    rows),
    ``calls``, and counts of the rows by where their time came from: ``exclusive_rows``,
    ``self_time_rows``, ``inclusive_only_rows``, ``host_inclusive_rows`` (inclusive-only rows of a host
    kind: op, region, api, marker). Sorted by the key.

    Part: the sums of one partition (the self time needs whole threads); combine: their sums. Valid
    partitions: trace.
    """

    name = "routine_time"
    per_trace = True
    partitions = ("trace_id",)

    def part(self, events: pl.DataFrame, kinds=("region", "kernel", "op"), drop_nested: bool = False,
             drop_aggregated=()) -> pl.DataFrame:
        keep = kind_is(*kinds)
        if drop_nested:
            keep = keep & ~_nested()
        if drop_aggregated:
            keep = keep & ~(kind_is(*drop_aggregated) & ~timed())
        # a marker off any thread (a device-side range over the kernels under it) is no routine's own time
        keep = keep & ~(kind_is("marker") & (pl.col("pid").is_null() | pl.col("tid").is_null()))
        # only the columns used, not the forty others; the names as categoricals: grouped on integers, not on the
        # texts of a million rows (the 1 GB trace's hotspots: 1.11 -> 0.85 GB above the table)
        rows = picked(events, keep, *(pl.col(c).cast(pl.Categorical) if c == "name" else c for c in _ROW_COLUMNS))
        if rows.select(device_lane().any()).item():
            rows = _lanes_nested(rows)
        else:
            rows = rows.with_columns(self_times(rows))
        rows = rows.with_columns(time_ns=pl.coalesce("exclusive_ns", "self_ns", "duration_ns"), calls=calls(),
                                 kind=pl.col("kind").cast(pl.String)).filter(pl.col("time_ns").is_not_null())
        inclusive_only = pl.col("exclusive_ns").is_null() & pl.col("self_ns").is_null()
        rows = _with_own_span(keyed(rows))
        return rows.group_by(ROUTINE).agg(
            time_ns=pl.col("time_ns").sum(), inclusive_ns=pl.col("own_span_ns").sum(), calls=pl.col("calls").sum(),
            exclusive_rows=pl.col("exclusive_ns").is_not_null().sum().cast(pl.Int64),
            self_time_rows=pl.col("self_ns").is_not_null().sum().cast(pl.Int64),
            inclusive_only_rows=inclusive_only.sum().cast(pl.Int64),
            host_inclusive_rows=(inclusive_only & pl.col("kind").is_in(_HOST)).sum().cast(pl.Int64)
        ).with_columns(pl.col("name").cast(pl.String))

    def combine(self, parts: list[pl.DataFrame], **params: Any) -> pl.DataFrame:
        sums = ["time_ns", "inclusive_ns", "calls", "exclusive_rows", "self_time_rows", "inclusive_only_rows",
                "host_inclusive_rows"]
        out = pl.concat(parts).group_by(ROUTINE).agg(pl.col(sums).sum()).sort(ROUTINE, nulls_last=False)
        return unkeyed(out)


def _lanes_nested(rows: pl.DataFrame) -> pl.DataFrame:
    """``rows`` with their ``self_ns``, a device's lanes (:func:`device_lane`) one thread of that device.

    A module's time is its ops' time: summed as lanes side by side, a TPU's time counted twice or three times
    (``jit_f`` 31.5% of the total and "unevenly spread" over its device's lanes, its ``copy-done`` ops beside
    it). The lanes of a device nest as one thread's events do (a step over its modules over their ops), so
    each row counts its self time, and the device is one thread (``tid`` null, as its streams' kernels are).
    On a device with timed kernels the lanes are views of those kernels, which hotspots already ranks: they
    are left out."""
    lane = device_lane()
    kernels = rows.filter((pl.col("kind") == "kernel") & pl.col("start_ns").is_not_null()
                          & pl.col("duration_ns").is_not_null()).select("trace_id", "device_id").unique()
    if kernels.height:
        on_kernels = pl.struct("trace_id", "device_id").is_in(kernels.select(pl.struct("trace_id", "device_id"))
                                                              .to_series().implode())
        rows = rows.filter(~(lane & on_kernels))
    nesting = rows.with_columns(pid=pl.when(lane).then(pl.lit(_LANE_PID, pl.Int64)).otherwise("pid"),
                                tid=pl.when(lane).then(-1 - pl.col("device_id").cast(pl.Int64)).otherwise("tid"))
    return rows.with_columns(self_times(nesting), tid=pl.when(lane).then(None).otherwise("tid"))


def _with_own_span(rows: pl.DataFrame) -> pl.DataFrame:
    """``rows`` with ``own_span_ns``: for a timed host row (one that nests on its thread), the part of its interval
    that no earlier call of the same routine on the same thread covers (their sum per routine is the union of its
    calls); for any other row its duration (a kernel's time is its own, however its streams overlap: its inclusive
    time is never less than its exclusive)."""
    timed = (pl.col("start_ns").is_not_null() & pl.col("duration_ns").is_not_null() & pl.col("kind").is_in(_HOST)
             & pl.col("tid").is_not_null())
    # on the timed host rows alone, narrow (the key, the interval, the row): sorted, then scattered back; the
    # routine and thread as one 64-bit hashed key, a sort on two integers rather than six columns (a collision,
    # vanishingly unlikely among a trace's routines, would only merge two routines' calls into one union)
    # (the rows' hash and numpy's lexsort: 15 ms where the struct's hash and polars' sort by two keys took 58 ms;
    # calls of a routine starting together may come in either order, their own spans add up alike)
    narrow = rows.with_row_index("_row").filter(timed)
    narrow = narrow.select("_row", "start_ns", "duration_ns").with_columns(_key=narrow.select(ROUTINE).hash_rows())
    if narrow.height:
        narrow = narrow[np.lexsort((narrow["start_ns"].to_numpy(), narrow["_key"].to_numpy()))]
    end = pl.col("start_ns") + pl.col("duration_ns")
    covered = end.cum_max().shift(1).over("_key")  # the latest end of the routine's earlier calls on the thread
    own = narrow.select("_row", own=(end - pl.max_horizontal(pl.col("start_ns"), covered.fill_null(pl.col("start_ns"))))
                        .clip(lower_bound=0))
    spans = rows["duration_ns"].scatter(own["_row"], own["own"])
    return rows.with_columns(own_span_ns=spans)


routine_time = RoutineTime()
