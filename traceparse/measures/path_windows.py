"""The critical paths of one large trace, a group of its steps at a time: the graph of the whole trace is never
in memory at once.

:func:`traceparse.measures.critical_path.critical_paths` walks the dependency graph of the whole table. On a
trace of millions of events that graph (two edges or more per event) and the work of building it are most of
``analyze``'s peak memory: a 1 GB trace's graph took 4.5 million edges and 2 GB more than its table while it
was built. A step's path only ever visits nodes inside the step (every edge runs forwards in time, and the
walk stops at the step's start), and a node's critical edge is chosen among its in-edges alone; so the paths
of a group of steps come out the same from the graph of the events that can give an in-edge to a node of
those steps. :func:`window_events` picks them; :func:`windowed_critical_paths` builds the graph of each group
of steps from them, walks it and returns what ``critical_paths`` on the whole graph returns. A test checks
that the two agree on every real trace with steps, with groups of one step each.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import polars as pl

from traceparse import expr
from traceparse.measures.base import LARGE_TABLE_ROWS, PartitionedEvents, placed, table_rows
from traceparse.measures.critical_path import (
    MAX_WAKE_NS, MIN_WAIT_NS, PATH_SCHEMA, SEGMENT_SCHEMA, SYNC_CALLS, DependencyGraph, critical_paths,
    on_a_thread, shared_instances,
)
from traceparse.measures.steps import step_series

#: The events one group of steps may take (about): its graph is built from that many rows at most, unless one
#: step alone has more.
WINDOW_ROWS = LARGE_TABLE_ROWS // 4

_END = pl.col("start_ns") + pl.col("duration_ns")
#: A null id among ids (correlation, external): no id is this.
_NONE = np.iinfo(np.int64).min


def windowed(events) -> bool:
    """Whether ``events`` is one large trace whose critical paths are found a group of steps at a time: a table
    in memory of more than :data:`~traceparse.measures.base.LARGE_TABLE_ROWS` rows, of one trace and at most one
    rank, whose collectives join no other member (one process driving two GPUs does: an instance's members may
    have joined anywhere before it), without the execution trace's tensor edges (``data_from``: a producer may
    lie anywhere before its consumer)."""
    if isinstance(events, PartitionedEvents) or table_rows(events) <= LARGE_TABLE_ROWS:
        return False
    if "trace_id" in events.columns and events["trace_id"].n_unique() > 1:
        return False
    if "rank" in events.columns and events["rank"].drop_nulls().n_unique() > 1:
        return False
    if "data_from" in events.columns and events["data_from"].null_count() < events.height:
        return False
    return shared_instances(events) == 0


def windowed_steps(events) -> pl.DataFrame | None:
    """The step windows by which ``events`` is read a group at a time (:func:`windowed`, and the trace marks
    steps), else None: ``trace_id``, ``rank``, ``step``, ``start_ns``, ``end_ns``, as
    :func:`traceparse.measures.step_paths.step_windows` gives them (one rank, no clock moved), without a graph."""
    if not windowed(events):
        return None
    steps = step_series(events)
    if steps.height == 0:
        return None
    rank = events["rank"].drop_nulls()
    return steps.select(pl.col("trace_id").cast(pl.String), rank=pl.lit(rank[0] if rank.len() else None,
                                                                        dtype=pl.Int32),
                        step="step", start_ns="start_ns", end_ns="end_ns").sort("trace_id", "step", nulls_last=False)


class WindowIndex:
    """The timed rows of one trace as sorted numpy arrays, from which :meth:`rows` picks the rows a window's graph
    needs (:func:`window_events`) in time proportional to what it picks, not a pass of polars over the whole
    table per window."""

    def __init__(self, events: pl.DataFrame):
        host = on_a_thread()
        gpu = expr.kind_is(*expr.GPU_KINDS)
        timed = (events.lazy().with_row_index("_row").filter(placed())
                 .select("_row", "event_id", "start_ns", end=_END, gpu=gpu, host=host,
                         api=pl.col("kind") == "api", op=expr.kind_is("op", "marker"), name="name",
                         correlation="correlation_id", external="external_id",
                         a=pl.when(host).then(pl.col("pid")).otherwise(pl.col("device_id").cast(pl.Int64)),
                         b=pl.when(host).then(pl.col("tid")).otherwise(pl.col("stream_id")))
                 .collect())
        self.row = timed["_row"].to_numpy().astype(np.int64)
        self.start = timed["start_ns"].to_numpy()
        self.end = timed["end"].to_numpy()
        self.gpu = timed["gpu"].to_numpy()
        calls = timed.filter("api")
        names = calls["name"].drop_nulls().unique()  # each distinct name matched once, not every call's
        sync = calls.filter(pl.col("name").is_in(names.filter(names.str.contains(SYNC_CALLS)).implode()))
        self.sync_start, self.sync_end = sync["start_ns"].to_numpy(), sync["end"].to_numpy()
        # each lane (a host thread, a GPU stream) in its order (start, end, event id): a row's place there
        lanes = timed.filter(pl.col("host") | pl.col("gpu")).select("_row", "event_id", "start_ns", "end", "gpu", "a",
                                                                    "b")
        in_order = lanes.sort("gpu", "a", "b", "start_ns", "end", "event_id", nulls_last=False)
        new_lane = (pl.col("gpu").ne_missing(pl.col("gpu").shift(1)) | pl.col("a").ne_missing(pl.col("a").shift(1))
                    | pl.col("b").ne_missing(pl.col("b").shift(1)))
        in_order = in_order.with_columns(lane=new_lane.cum_sum() - 1)
        lane = in_order["lane"].to_numpy().astype(np.int64)
        self.lane_bounds = np.searchsorted(lane, np.arange(lane[-1] + 2 if len(lane) else 1), side="left")
        place = np.arange(len(lane), dtype=np.int64) - self.lane_bounds[lane]
        self.place_row = in_order["_row"].to_numpy().astype(np.int64)  # the row of each (lane, place)
        self.place_lane_gpu = in_order["gpu"].to_numpy()
        # a stream's activity that ended last so far, in its order (the one a later activity queues behind: the
        # latest of those ending at the running maximum, as the graph's stream edges take it)
        held = pl.when(pl.col("end") == pl.col("end").cum_max()).then(pl.col("place")).forward_fill()
        self.place_held = (in_order.with_columns(place=pl.Series(place)).select(held.over("lane")).to_series()
                           .to_numpy().astype(np.int64))
        # then each lane in order of end (then start, event id): a host thread's events that ended last before a span
        by_end = (pl.DataFrame({"lane": lane, "_row": self.place_row, "end": in_order["end"],
                                "start_ns": in_order["start_ns"], "event_id": in_order["event_id"]})
                  .sort("lane", "end", "start_ns", "event_id"))
        self.lane_end = by_end["end"].to_numpy()
        self.lane_row = by_end["_row"].to_numpy().astype(np.int64)
        calls = timed.filter(pl.col("api") & pl.col("correlation").is_not_null()).sort("correlation")
        self.call_key, self.call_row = calls["correlation"].to_numpy(), calls["_row"].to_numpy().astype(np.int64)
        self.call_start = calls["start_ns"].to_numpy()
        ops = timed.filter(pl.col("op") & pl.col("external").is_not_null()).sort("external")
        self.op_key, self.op_row = ops["external"].to_numpy(), ops["_row"].to_numpy().astype(np.int64)
        self.op_start = ops["start_ns"].to_numpy()
        self.correlation = timed["correlation"].fill_null(_NONE).to_numpy()
        self.external = timed["external"].fill_null(_NONE).to_numpy()
        self.position = np.full(events.height, -1, dtype=np.int64)  # table row -> index of the timed arrays
        self.position[self.row] = np.arange(len(self.row), dtype=np.int64)

    def rows(self, lo: int, hi: int) -> np.ndarray:
        """The table rows of :func:`window_events` for the span ``[lo, hi]`` (margin included), sorted."""
        near = (self.sync_start <= hi) & (self.sync_end >= lo)
        gpu_lo = min(lo, int(self.sync_start[near].min())) if near.any() else lo
        inside = (self.start <= hi) & (self.end >= np.where(self.gpu, gpu_lo, lo))
        taken = [self.row[inside]]
        inside_place = inside[self.position[self.place_row]]  # each lane's rows, in its order: taken or not
        bounds = self.lane_bounds
        for k in range(len(bounds) - 1):
            first, stop = int(bounds[k]), int(bounds[k + 1])
            if first == stop:
                continue
            if self.place_lane_gpu[first]:
                taken.append(self._stream_before(first, stop, inside_place))
                continue
            ends = self.lane_end[first:stop]
            before = int(np.searchsorted(ends, lo, side="left"))  # the thread's events ending before the span
            if before:  # those that ended last (ties too): the point before the span's first
                tied = int(np.searchsorted(ends, ends[before - 1], side="left"))
                taken.append(self.lane_row[first + tied:first + before])
        rows = self._sorted(taken)
        at = self.position[rows]
        work = at[self.gpu[at]]
        calls = _matching(self.call_key, self.correlation[work])
        ops = _matching(self.op_key, self.external[work])
        partners = [self.call_row[calls[self.call_start[calls] <= hi]], self.op_row[ops[self.op_start[ops] <= hi]]]
        return self._sorted([rows, *partners])

    def _stream_before(self, first: int, stop: int, inside_place: np.ndarray) -> np.ndarray:
        """The rows of one stream (its places ``[first, stop)``) that the activities taken queue behind or overlap:
        before the first one taken, the activity just before it and the one that had ended last; between the
        first and the last taken, every one not taken (it started after an activity still running, and ended
        before the span: a later one may overlap it)."""
        taken = np.flatnonzero(inside_place[first:stop])
        if len(taken) == 0:
            return np.zeros(0, dtype=np.int64)
        q, last = int(taken[0]), int(taken[-1])
        rows = []
        if q > 0:
            rows += [self.place_row[first + q - 1], self.place_row[first + self.place_held[first + q - 1]]]
        between = np.arange(q, last + 1, dtype=np.int64)
        between = between[~inside_place[first + q:first + last + 1]]
        return np.concatenate([np.asarray(rows, dtype=np.int64), self.place_row[first + between]])

    def _sorted(self, parts: list[np.ndarray]) -> np.ndarray:
        """The distinct table rows of ``parts``, in order (a mark per table row: numpy's unique hashes, 7x dearer)."""
        marked = np.zeros(len(self.position), dtype=bool)
        for part in parts:
            marked[part] = True
        return np.flatnonzero(marked)


def _matching(keys: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """The positions in ``keys`` (sorted) of every key of ``wanted`` (:data:`_NONE`: no key)."""
    wanted = np.sort(wanted[wanted != _NONE])  # repeats find their keys again: np.unique hashes, dearer
    if len(wanted) == 0 or len(keys) == 0:
        return np.zeros(0, dtype=np.int64)
    left = np.searchsorted(keys, wanted, side="left")
    right = np.searchsorted(keys, wanted, side="right")
    counts = right - left
    starts = np.repeat(left - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
    return (np.arange(counts.sum(), dtype=np.int64) + starts).astype(np.int64)


def window_events(events: pl.DataFrame, start_ns: int, end_ns: int, margin_ns: int = MAX_WAKE_NS,
                  index: WindowIndex | None = None) -> pl.DataFrame:
    """The events of one trace that can give an in-edge to a node of ``[start_ns, end_ns]`` (module docstring),
    in table order:

    - every timed event that overlaps ``[start_ns - margin_ns, end_ns + margin_ns]`` (the margin: an inferred
      wake-up or stream wait follows the event it waited for by at most ``max_wake_ns``);
    - on each host thread, the events that ended last before that span (the point before its first: a thread
      idle for a second still has its edge into the span); on each stream, the activity just before the first
      one taken and the one that had ended last by then (what it queues behind), and those that started
      among the ones taken but ended before the span (activities that overlap, as a programmatic dependent
      launch does, queue behind them);
    - GPU work that ended inside a blocking call reaching into the span (its ``sync`` edge);
    - the launch calls of the GPU work taken (correlation id), and the operators of the same external id (an
      activity whose call is not in the trace is linked to its operator).

    ``index``: the :class:`WindowIndex` of ``events``, made once for many windows.
    """
    index = WindowIndex(events) if index is None else index
    rows = index.rows(start_ns - margin_ns, end_ns + margin_ns)
    return events.select(pl.all().gather(pl.Series(rows, dtype=pl.Int64)))


def windowed_critical_paths(events: pl.DataFrame, windows: pl.DataFrame, min_wait_ns: int = MIN_WAIT_NS,
                            max_wake_ns: int = MAX_WAKE_NS, rows: int = WINDOW_ROWS,
                            keep: Callable[[pl.DataFrame], pl.DataFrame] | None = None,
                            texts: pl.DataType = pl.String) -> tuple[pl.DataFrame, pl.DataFrame]:
    """What ``critical_paths(dependency_graph(events), windows)`` returns, for a table of one trace
    (:func:`windowed`), found a group of consecutive windows at a time: each group holds about ``rows`` events at
    most (one window at least), and its graph is built from :func:`window_events` of its span and dropped
    before the next group's. ``keep``: what to keep of each group's segments (a rule's own columns; they must
    keep ``index``), else all of them. ``texts``: as :func:`critical_paths`'s."""
    windows = windows.sort("trace_id", "step", nulls_last=False, maintain_order=True).with_row_index("_w")
    if "rank" not in windows.columns:
        windows = windows.with_columns(rank=pl.lit(None, dtype=pl.Int32))
    starts = events.select(pl.col("start_ns").drop_nulls().sort()).to_series().to_numpy()
    by_start = windows.sort("start_ns", "end_ns", "_w")
    bounds = by_start.select("start_ns", "end_ns").to_numpy()
    groups, first = [], 0
    while first < len(bounds):
        last = first
        lo, hi = bounds[first]
        while last + 1 < len(bounds):
            nlo, nhi = min(lo, bounds[last + 1][0]), max(hi, bounds[last + 1][1])
            inside = np.searchsorted(starts, nhi + max_wake_ns, side="right") - np.searchsorted(
                starts, nlo - max_wake_ns, side="left")
            if inside > rows:
                break
            lo, hi, last = nlo, nhi, last + 1
        groups.append((first, last + 1, int(lo), int(hi)))
        first = last + 1
    paths, segments = [], []
    builder = DependencyGraph()
    index = WindowIndex(events)
    for first, stop, lo, hi in groups:
        part = window_events(events, lo, hi, max_wake_ns, index)
        graph = builder._graph(*builder._own(part, min_wait_ns, max_wake_ns), False)
        del part
        mine = by_start.slice(first, stop - first)
        p, s = critical_paths(graph, mine.drop("_w"), texts=texts)
        del graph
        order = mine.sort("trace_id", "step", nulls_last=False, maintain_order=True)["_w"]
        paths.append(p.with_columns(_w=order))
        counts = p["segments"].to_numpy()
        s = s if keep is None else keep(s)
        segments.append(s.with_columns(_w=pl.Series(np.repeat(order.to_numpy(), counts), dtype=pl.UInt32)))
    if not paths:
        return pl.DataFrame(schema=PATH_SCHEMA), pl.DataFrame(schema=SEGMENT_SCHEMA)
    paths = pl.concat(paths)
    segments = pl.concat(segments)
    if not paths["_w"].is_sorted():  # steps out of time order: the windows' order, each path's segments kept together
        paths = paths.sort("_w")
        segments = segments.sort("_w", "index")
    return paths.drop("_w"), segments.drop("_w")

