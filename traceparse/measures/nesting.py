"""Self time of host-side events that nest on a thread (torch operators, annotations, API calls, regions)."""

from __future__ import annotations

from typing import Callable

import numpy as np
import polars as pl

from traceparse.expr import sort_rows
from traceparse.measures.base import Measure, keyed, picked, unkeyed

#: Host-side kinds whose events nest on their thread.
HOST_KINDS = ("op", "marker", "api", "region")
_THREAD = ["trace_id", "pid", "tid"]


class SelfTime(Measure):
    """Self (exclusive) time of every timed host event: its duration minus that of its direct children.

    Rows: the timed rows of ``kinds`` (default op, marker, api, region) with a
    ``pid``, a ``tid``, a start and a duration, and no ``exclusive_ns`` of
    their own (a source that gives exclusive time, TAU, keeps it). Per thread
    (``trace_id``, ``pid``, ``tid``), events of every kind nest together (an
    API call inside an operator inside an annotation), as intervals
    ``[start, start + duration)`` ordered by start, longer first on equal
    starts, then by ``event_id``. As a sweep with a stack of open events (worked out for all rows at once,
    :func:`innermost_open`): an
    event's parent is the innermost open event once every event ending at or
    before its start is closed. A child covers its parent from its start to
    its *reach*, the last end of the child and everything under it; a child
    that outlasts its parent (rounded timestamps, a Python stack cut at the
    trace's end) counts only up to the parent's end, and what runs after that
    is its own or its children's time, not a grandparent's. ``self_ns`` =
    duration − Σ over direct children of (min(child reach, parent end) − child
    start), never below 0: each moment of a thread is the self time of one
    event, the innermost open one (the latest started), so a thread's self
    times add up to the union of its events, never more.

    Columns: ``trace_id``, ``event_id``, ``self_ns``, ``parent_event_id``
    (null at the top of a thread), ``depth`` (0 at the top), ``children``.

    Part: the rows that take part (a projection); combine: the sweep over
    every partition's rows. Valid partitions: device, trace, row chunks.
    """

    name = "self_time"
    per_trace = True

    def part(self, events: pl.DataFrame, kinds=HOST_KINDS) -> pl.DataFrame:
        return keyed(picked(events, _nests(kinds), "trace_id", "event_id", "pid", "tid", "start_ns", "duration_ns"))

    def combine(self, parts: list[pl.DataFrame], kinds=HOST_KINDS) -> pl.DataFrame:
        rows, start, end, parent = _nested(pl.concat(parts), _THREAD)
        child = parent >= 0
        depth = _depth(parent)
        own = _own_time(start, end, parent, depth)
        out = rows.select("trace_id", "event_id").with_columns(
            self_ns=pl.Series(own, dtype=pl.Int64),
            parent_event_id=pl.when(pl.Series(child)).then(
                rows["event_id"].gather(pl.Series(np.where(child, parent, 0)))).cast(pl.Int64),
            depth=pl.Series(depth, dtype=pl.Int64),
            children=pl.Series(np.bincount(parent[child], minlength=len(start)), dtype=pl.Int64),
        )
        return unkeyed(sort_rows(out, ["trace_id", "event_id"]))


self_time = SelfTime()


def _nests(kinds=HOST_KINDS) -> pl.Expr:
    """The rows :class:`SelfTime` nests: timed rows of ``kinds`` on a thread, without an exclusive time of their own."""
    return (pl.col("kind").is_in(list(kinds)) & pl.col("start_ns").is_not_null() & pl.col("duration_ns").is_not_null()
            & pl.col("pid").is_not_null() & pl.col("tid").is_not_null() & pl.col("exclusive_ns").is_null())


def _own_time(start: np.ndarray, end: np.ndarray, parent: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """Each row's self time: its duration less its direct children's time, each child's up to the parent's end
    (:class:`SelfTime`), never below 0."""
    child = parent >= 0
    reach = _reach(end, parent, depth)
    inner = np.zeros(len(start), dtype=np.int64)  # time of the direct children, each clipped to the parent's end
    np.add.at(inner, parent[child], np.minimum(reach[child], end[parent[child]]) - start[child])
    return np.maximum(end - start - inner, 0)


def self_times(rows: pl.DataFrame) -> pl.Series:
    """:class:`SelfTime`'s ``self_ns`` of each of ``rows`` in their own order, null where a row does not nest (not a
    host kind, not timed, off any thread, or with an exclusive time of its own): for a caller that has the rows
    already (hotspots' routines), without the measure's sort by event id and a join back on it (80 ms of the
    139 MB trace's hotspots)."""
    mask = rows.select(_nests()).to_series().fill_null(False)
    count = int(mask.sum())
    values = np.zeros(rows.height, dtype=np.int64)
    if count:
        ordered, start, end, parent = _nested(
            keyed(rows.filter(mask).select(*_THREAD, "event_id", "start_ns", "duration_ns")).with_row_index("_at"),
            _THREAD)
        own = np.empty(count, dtype=np.int64)
        own[ordered["_at"].to_numpy()] = _own_time(start, end, parent, _depth(parent))
        values[np.flatnonzero(mask.to_numpy())] = own
    return pl.select(pl.when(mask).then(pl.Series(values, dtype=pl.Int64))).to_series().alias("self_ns")


def _nested(rows: pl.DataFrame, thread: list[str]) -> tuple[pl.DataFrame, np.ndarray, np.ndarray, np.ndarray]:
    """``rows`` in :class:`SelfTime`'s order (per ``thread``, by start, longer first, then event id), their starts,
    their ends and each one's parent: the row (in that order) of the innermost event open at its start, -1 if
    none."""
    rows = sort_rows(rows, [*thread, "start_ns", "duration_ns", "event_id"],
                     descending=[False] * len(thread) + [False, True, False])
    start = rows["start_ns"].to_numpy()
    end = start + rows["duration_ns"].to_numpy()
    threads = rows.select(t=pl.struct(thread).rle_id())["t"].to_numpy()
    return rows, start, end, innermost_open(start, end, threads)


def parents(rows: pl.DataFrame, thread: list[str]) -> pl.DataFrame:
    """Each of ``rows``' parent (``parent_event_id``: the event id of the innermost event open at its start on its
    ``thread``, null at the top) and ``depth`` (0 at the top), in ``rows``' own order: the nesting of
    :class:`SelfTime` without its self times, for a caller that has the rows already (the critical path's host
    points: no self-time sums, no join back on the event ids). ``rows``: ``thread``'s columns, ``event_id``,
    ``start_ns`` and ``duration_ns``, none null."""
    ordered, _, _, parent = _nested(rows.select(*thread, "event_id", "start_ns", "duration_ns")
                                    .with_row_index("_at"), thread)
    at = ordered["_at"].to_numpy()
    has = parent >= 0
    ids = ordered["event_id"].to_numpy()
    parent_id = np.zeros(len(at), dtype=np.int64)
    parent_id[at] = np.where(has, ids[np.where(has, parent, 0)], 0)
    orphan = np.zeros(len(at), dtype=bool)
    orphan[at] = ~has
    depth = np.empty(len(at), dtype=np.int64)
    depth[at] = _depth(parent)
    return pl.DataFrame({"parent_event_id": pl.Series(parent_id, dtype=pl.Int64),
                         "depth": pl.Series(depth, dtype=pl.Int64)}).with_columns(
        parent_event_id=pl.when(pl.Series(orphan)).then(None).otherwise(pl.col("parent_event_id")))


def innermost_open(start: np.ndarray, end: np.ndarray, thread: np.ndarray) -> np.ndarray:
    """For rows sorted by thread, then start: the innermost open row at each row's start (its parent), -1 if none.

    What a sweep with a stack of open rows gives (close every row ending at or before the start, take the top)
    is the last earlier row of the thread still open, ``max{j < i : end_j > start_i}``: a row under the top
    that has ended is never the answer, and one still open is never closed before.

    Found by pointer jumping (:func:`climb`): each row's candidate starts as the row before it; while the
    candidate ended by the row's start, the row takes the candidate's own candidate. Every row between a
    candidate's candidate and the candidate ended by the candidate's start, so by the row's (rows go by start):
    none is skipped that could be the answer (a few rounds: 22 on the 139 MB trace's 250,000 host rows, 12 ms
    where a descent through a table of block maxima took 32 ms).
    """
    n = len(start)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    cand = np.arange(-1, n - 1, dtype=np.int64)
    if n > 1:
        cand[1:][thread[1:] != thread[:-1]] = -1  # a thread's first row has no earlier row
    return climb(cand, lambda c, row: end[c] <= start[row])


def climb(pointer: np.ndarray, moves: Callable[[np.ndarray, np.ndarray], np.ndarray],
          up: np.ndarray | None = None) -> np.ndarray:
    """``pointer`` (a row per entry, -1: none) moved, in place, while ``moves(rows, entries)`` says the row an
    entry points at is not its answer yet: to ``up`` of that row, or without ``up`` to the row's own pointer
    (pointer jumping). Every entry steps at once, from the same state each round, those still moving only: the
    nesting of rows (:func:`innermost_open`), gpu-idle's innermost rows, the operators' formula owners."""
    step = pointer if up is None else up
    looking = np.flatnonzero(pointer >= 0)
    while len(looking):
        at = pointer[looking]
        moving = moves(at, looking)
        looking = looking[moving]
        pointer[looking] = step[at[moving]]  # the right side is read before any is written
        looking = looking[pointer[looking] >= 0]
    return pointer


def _reach(end: np.ndarray, parent: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """Each row's reach: the last end of the row and of every row under it (its subtree covers [start, reach)),
    the deepest rows first, one numpy step per level."""
    reach = end.copy()
    # deepest first, ties in row order: as 16-bit keys where the nesting is that shallow (every trace's), numpy's
    # stable sort is a radix sort (3 ms for 250,000 host rows where the 64-bit keys' merge sort took 15)
    order = np.argsort(-depth.astype(np.int16) if len(depth) and depth.max() < 2 ** 15 else -depth, kind="stable")
    levels = np.flatnonzero(np.diff(depth[order])) + 1  # where the next (shallower) level starts
    for rows in np.split(order, levels):
        rows = rows[parent[rows] >= 0]
        if len(rows):
            np.maximum.at(reach, parent[rows], reach[rows])
    return reach


def _depth(parent: np.ndarray) -> np.ndarray:
    """Each row's number of ancestors (0 at the top), by pointer jumping over ``parent`` (-1: none): the rows
    still below a top row only, each round (every row at once, from the same state)."""
    depth = (parent >= 0).astype(np.int64)
    up = parent.copy()
    below = np.flatnonzero(up >= 0)
    while len(below):
        u = up[below]
        depth[below] += depth[u]  # the right side is read before any is written
        up[below] = up[u]
        below = below[up[below] >= 0]
    return depth


#: Kinds of :class:`StepTimeByName`: host events by their self time, GPU work by its duration.
_STEP_KINDS = (*HOST_KINDS, "kernel", "memcpy", "memset")
_STEP_COLUMNS = ["trace_id", "event_id", "kind", "name", "pid", "tid", "start_ns", "duration_ns", "exclusive_ns",
                 "device_id"]


class StepTimeByName(Measure):
    """Per trace, the time each name takes inside the trace's steps: host events by self time, GPU work by duration.

    Steps are :func:`traceparse.measures.steps.step_series` (``ProfilerStep#N``, step ranges, optimizer
    marks), else one window over the trace's timed rows. An event counts when it starts inside a step. Host
    events (kinds op, marker, api, region) count their self time (:class:`SelfTime`, so an annotation that
    only holds operators has little of its own); kernels, copies and memsets count their duration. Columns:
    ``trace_id``, ``kind``, ``name``, ``steps`` (the trace's steps, 1 without steps), ``calls`` (events inside
    them), ``time_ns``. Sorted by trace, kind and name. What the straggler does that the median rank does not
    (rule ``stragglers``) compares these per step across a run's ranks.

    Part: the rows that take part (a projection); combine: steps, nesting and sums. Valid partitions: device,
    trace, row chunks.
    """

    name = "step_time_by_name"
    per_trace = True

    def part(self, events: pl.DataFrame) -> pl.DataFrame:
        ok = pl.col("kind").is_in(list(_STEP_KINDS)) & pl.col("start_ns").is_not_null() \
            & pl.col("duration_ns").is_not_null()
        return keyed(picked(events, ok, *_STEP_COLUMNS))

    def combine(self, parts: list[pl.DataFrame]) -> pl.DataFrame:
        from traceparse.measures.steps import step_series

        schema = {"trace_id": pl.String, "kind": pl.String, "name": pl.String, "steps": pl.Int64,
                  "calls": pl.Int64, "time_ns": pl.Int64}
        rows = unkeyed(pl.concat(parts)) if parts else pl.DataFrame()
        if rows.height == 0:
            return pl.DataFrame(schema=schema)
        # every trace at once (a group of a run's small ranks: a fixed number of queries, not a few per rank),
        # each with its own steps as if alone
        key = pl.col("trace_id").fill_null("")
        rows = rows.with_columns(__k=key)
        steps = step_series(rows, by_trace=True).select(__k=key, w_start="start_ns", w_end="end_ns")
        counts = steps.group_by("__k").agg(steps=pl.len().cast(pl.Int64))
        spans = (rows.join(counts, on="__k", how="anti")
                 .group_by("__k").agg(w_start=pl.col("start_ns").min(),
                                      w_end=(pl.col("start_ns") + pl.col("duration_ns")).max()))
        windows = pl.concat([steps, spans]).sort("w_start")
        host = pl.col("kind").is_in(list(HOST_KINDS))
        own = keyed(self_time.combine([self_time.part(rows.filter(host))])).select(
            __k="trace_id", event_id="event_id", self_ns="self_ns")
        timed = (rows.join(own, on=["__k", "event_id"], how="left")
                 .with_columns(time=pl.when(host).then(pl.col("self_ns")).otherwise(pl.col("duration_ns")))
                 .filter(pl.col("time").is_not_null()).sort("start_ns"))
        inside = (timed.join_asof(windows, left_on="start_ns", right_on="w_start", by="__k", strategy="backward",
                                  check_sortedness=False)
                  .filter(pl.col("w_end").is_not_null() & (pl.col("start_ns") < pl.col("w_end"))))
        out = (inside.group_by("__k", kind=pl.col("kind").cast(pl.String), name=pl.col("name"))
               .agg(trace_id=pl.col("trace_id").first(), calls=pl.len().cast(pl.Int64),
                    time_ns=pl.col("time").sum().cast(pl.Int64))
               .join(counts, on="__k", how="left").with_columns(pl.col("steps").fill_null(1)))
        return (out.select(list(schema)).cast(schema)
                .sort("trace_id", "kind", "name", nulls_last=False))


step_time_by_name = StepTimeByName()


def over_median(table: pl.DataFrame, traces) -> list[tuple]:
    """Each (trace, kind, name) of ``table`` (:data:`step_time_by_name` rows) on one of ``traces`` (a run's ranks),
    with its time per step there and the median over ``traces`` of that name's time per step (0 on a trace that
    never runs it; of an even number of traces the lower middle one, a rank's own figure: of two, the other
    rank, not their mean): ``(trace_id, kind, name, own_ns, median_ns)``, floats. What a rank does longer than
    the median rank, which stragglers lists, critical-path caps a rank's hold with and ``whatif --balance``
    takes out."""
    import statistics

    traces = list(traces)
    wanted = set(traces)
    cells: dict[tuple, dict] = {}
    for tr, kind, name, t, n in table.select("trace_id", "kind", "name", "time_ns", "steps").iter_rows():
        if tr in wanted and n:
            cells.setdefault((kind, name), {})[tr] = t / n
    out = []
    for (kind, name), by_trace in cells.items():
        median = statistics.median_low([by_trace.get(tr, 0.0) for tr in traces])
        out += [(tr, kind, name, own, median) for tr, own in by_trace.items()]
    return out
