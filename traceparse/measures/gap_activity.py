"""What the host was doing while a GPU stream waited for it: the host activity in each host-wait gap."""

from __future__ import annotations


import numpy as np
import polars as pl

from traceparse import expr
from traceparse.measures.base import Measure, PartitionedEvents, keyed, picked, unkeyed
from traceparse.measures.launches import KERNEL_WAIT_NS, _projection, stream_gaps
from traceparse.measures.nesting import climb, innermost_open
from traceparse.schema import STEP_NAME

#: Host rows that can be what a thread is doing: operators, annotations, runtime calls, regions, syncs.
HOST_KINDS = ("op", "marker", "api", "region", "sync")
#: The name given to gap time when the launching thread recorded nothing then (Python without ops, another
#: thread's work, a profiler that records no host events).
NOTHING = "(no traced call)"
#: The name given to host-wait gap time whose next activity has no launch in the trace.
NO_LAUNCH = "(no launch in the trace)"
_HOST_COLUMNS = ["trace_id", "tid", "kind", "name", "start_ns", "duration_ns"]


class GapActivity(Measure):
    """The host activity during the host-wait gaps of every stream (:class:`~traceparse.measures.launches.StreamIdle`).

    A host-wait gap is a stream's idle time before an activity whose launch
    call started after the stream went idle: nothing was queued, so what the
    launching thread did in the meantime is what kept the GPU waiting. Each
    moment of such a gap is given to the innermost host row (kinds
    :data:`HOST_KINDS`: the op, annotation, runtime call or region that
    started last among those running) on the thread of that launch; moments
    when the thread ran no recorded row go to :data:`NOTHING` (a step's
    ``ProfilerStep#N`` annotation brackets the step and is no activity: time
    inside it that no other row covers is the thread running what the trace
    does not show, Python between operators), gaps whose activity has no
    launch in the trace to :data:`NO_LAUNCH`.

    Columns: ``trace_id``, ``kind`` (null for the two placeholders), ``name``,
    ``wait_ns`` (the gap time given to it, summed over the gaps; several
    streams waiting at once each count theirs), ``gaps`` (the gaps it had a
    part in). Sorted by trace, then ``wait_ns`` descending, then name.

    Part: the projection of the launches plus the host rows of the threads
    (row by row, so every partition is valid: device, trace, row chunks);
    combine: the gaps and a sweep of each launching thread's rows.
    """

    name = "gap_activity"
    per_trace = True

    def part(self, events: pl.DataFrame, kernel_wait_ns: int = KERNEL_WAIT_NS) -> pl.DataFrame:
        launches = _projection(events, expr.GPU_KINDS)
        return pl.concat([launches.with_columns(host=pl.lit(False)),
                          _host_rows(events).with_columns(host=pl.lit(True))], how="diagonal_relaxed")

    def combine(self, parts: list[pl.DataFrame], kernel_wait_ns: int = KERNEL_WAIT_NS) -> pl.DataFrame:
        rows = pl.concat(parts, how="diagonal_relaxed")
        return _activity(stream_gaps(rows.filter(~pl.col("host")).select(pl.exclude("host")), kernel_wait_ns),
                         rows.filter(pl.col("host")).select(_HOST_COLUMNS))

    def _measure(self, events: pl.DataFrame, params: dict) -> pl.DataFrame:
        """A table in memory: its stream gaps are the ones :class:`~traceparse.measures.launches.StreamIdle` works
        out on the same projection (shared), not worked out again from the projection packed into the part."""
        if isinstance(events, PartitionedEvents):
            return super()._measure(events, params)
        return _activity(stream_gaps(_projection(events, expr.GPU_KINDS),
                                     params.get("kernel_wait_ns", KERNEL_WAIT_NS)), _host_rows(events))


def _host_rows(events: pl.DataFrame) -> pl.DataFrame:
    """The timed host rows of :data:`HOST_KINDS` on a thread (their kind as text), but the steps' annotations
    (``ProfilerStep#N``: a bracket around the step, no activity; it read as 7.5% of what ResNet18's host ran
    while its GPU waited)."""
    kind = pl.col("kind").cast(pl.String)
    step = expr.kind_is("marker") & pl.col("name").str.contains(STEP_NAME).fill_null(False)
    return keyed(picked(events, expr.kind_is(*HOST_KINDS) & pl.col("tid").is_not_null() & ~step
                        & pl.col("device_id").is_null() & expr.timed() & pl.col("duration_ns").is_not_null(),
                        *[kind if c == "kind" else pl.col(c) for c in _HOST_COLUMNS]))


def _activity(stream: pl.DataFrame, host: pl.DataFrame) -> pl.DataFrame:
    """The measure's rows from every activity's gap before it (:func:`stream_gaps`) and the host rows."""
    gaps = (stream.filter(pl.col("category") == "host_wait")
            .select("trace_id", tid="launch_tid", start="prev_end", end="start_ns"))
    out: list[dict] = []
    for (trace_id,), trace_gaps in gaps.partition_by("trace_id", as_dict=True, maintain_order=True).items():
        totals: dict[tuple, list[int]] = {}
        no_launch = trace_gaps.filter(pl.col("tid").is_null())
        if no_launch.height:
            totals[(None, NO_LAUNCH)] = [int((no_launch["end"] - no_launch["start"]).sum()), no_launch.height]
        launched = trace_gaps.filter(pl.col("tid").is_not_null())
        own = host.filter(pl.col("trace_id") == trace_id)
        for (tid,), thread_gaps in launched.partition_by("tid", as_dict=True).items():
            rows_of = own.filter(pl.col("tid") == tid)
            _attribute(thread_gaps["start"].to_numpy(), thread_gaps["end"].to_numpy(), rows_of, totals)
        out += [{"trace_id": trace_id, "kind": kind, "name": name, "wait_ns": ns, "gaps": n}
                for (kind, name), (ns, n) in totals.items()]
    schema = {"trace_id": pl.String, "kind": pl.String, "name": pl.String, "wait_ns": pl.Int64, "gaps": pl.Int64}
    frame = pl.DataFrame(out, schema=schema) if out else pl.DataFrame(schema=schema)
    return unkeyed(frame).sort(["trace_id", "wait_ns", "name"], descending=[False, True, False], nulls_last=True)


def _attribute(gap_starts: np.ndarray, gap_ends: np.ndarray, rows: pl.DataFrame, totals: dict) -> None:
    """Add to ``totals`` ((kind, name) -> [ns, gaps]) each gap's time by the innermost row running then."""
    order = np.argsort(gap_starts, kind="stable")
    starts, ends = gap_starts[order], gap_ends[order]
    # only rows overlapping a gap matter (a row's ancestors overlap whatever it overlaps, so nesting survives)
    merged_ends = np.maximum.accumulate(ends)
    r_start = rows["start_ns"].to_numpy()
    r_end = r_start + rows["duration_ns"].to_numpy()
    i = np.searchsorted(starts, r_end, side="left") - 1  # the last gap starting before the row ends
    keep = (i >= 0) & (merged_ends[np.clip(i, 0, None)] > r_start)
    kept = rows.filter(pl.Series(keep)).with_columns(end_ns=pl.col("start_ns") + pl.col("duration_ns")).sort(
        ["start_ns", "end_ns"], descending=[False, True])
    seg_a, seg_b, seg_row = _innermost(kept["start_ns"].to_numpy(), kept["end_ns"].to_numpy())
    _share(starts, ends, seg_a, seg_b, kept.select("kind", "name")[seg_row], totals)


def _share(starts: np.ndarray, ends: np.ndarray, seg_a: np.ndarray, seg_b: np.ndarray, seg_keys: pl.DataFrame,
           totals: dict) -> None:
    """Add to ``totals`` each gap's time by the segment ``[seg_a, seg_b)`` (named by its row of ``seg_keys``:
    kind, name) it overlaps, the rest to :data:`NOTHING`; gaps sorted by start, segments in time order and
    apart. Vectorized: each gap's segments are a range found by two binary searches, the (gap, segment) pairs
    one flat array summed by polars."""
    n_gaps = len(starts)
    first = np.searchsorted(seg_b, starts, side="right")  # the first segment ending after the gap starts
    last = np.searchsorted(seg_a, ends, side="left")  # past the last segment starting before the gap ends
    counts = np.clip(last - first, 0, None)
    gap = np.repeat(np.arange(n_gaps, dtype=np.int64), counts)
    seg = (np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
           + np.repeat(first, counts))
    part = np.minimum(seg_b[seg], ends[gap]) - np.maximum(seg_a[seg], starts[gap])
    pairs = seg_keys[seg].with_columns(gap=pl.Series(gap), part=pl.Series(part)).filter(pl.col("part") > 0)
    covered = np.zeros(n_gaps, dtype=np.int64)
    by_gap = pairs.group_by("gap").agg(pl.col("part").sum())
    covered[by_gap["gap"].to_numpy()] = by_gap["part"].to_numpy()
    # names in the order the gaps first reach them (as the loop this replaces added them), the gaps' uncovered
    # rest after the names of the first gap that has some
    named = pairs.group_by("kind", "name", maintain_order=True).agg(
        ns=pl.col("part").sum(), gaps=pl.col("gap").n_unique(), first=pl.col("gap").first())
    order = [(first_gap, 0, (kind, name), ns, n) for kind, name, ns, n, first_gap in named.iter_rows()]
    rest = ends - starts - covered
    uncovered = rest > 0
    if uncovered.any():
        order.append((int(np.argmax(uncovered)), 1, (None, NOTHING), int(rest[uncovered].sum()),
                      int(uncovered.sum())))
    for _, _, key, ns, n in sorted(order, key=lambda o: (o[0], o[1])):
        entry = totals.setdefault(key, [0, 0])
        entry[0] += int(ns)
        entry[1] += int(n)


def _innermost(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The thread's time cut into segments, each named by the innermost row running then (the one that
    started last among the running ones), from rows sorted by start (longest first on ties): the segments'
    starts, ends and rows, in time order and apart.

    Between two consecutive starts or ends nothing starts or ends, so the innermost row there is the last row
    started by the segment's start and still open after it (what a sweep with a stack of open rows has on
    top); moments with no row open are in no segment. Found by walking up from the last row started: while the
    row has ended, its parent (:func:`~traceparse.measures.nesting.innermost_open`: every row between a row and
    its parent ended by the row's start, so by the segment's), all segments at once
    (:func:`~traceparse.measures.nesting.climb`), as many rounds as rows nest.
    """
    points = np.sort(np.concatenate([start, end]), kind="stable")  # two nearly sorted runs: one merge
    points = points[np.concatenate(([True], points[1:] != points[:-1]))] if len(points) else points
    seg_a, seg_b = points[:-1], points[1:]
    parent = innermost_open(start, end, np.zeros(len(start), dtype=np.int64))
    row = np.searchsorted(start, seg_a, side="right").astype(np.int64) - 1  # the last row started by then
    row = climb(row, lambda r, segment: end[r] <= seg_a[segment], up=parent)
    running = row >= 0
    return seg_a[running], seg_b[running], row[running]


gap_activity = GapActivity()
