"""Cutting a trace to time windows: a step, a named range's instances, or START:END from the trace's start.

The result of :func:`cut` is a normal :class:`~traceparse.trace.Trace` (same
schema, the same id, re-validated when its events are read), so every rule
and measure runs on it unchanged.

**Clipping.** Windows are half-open ``[start, end)`` on each trace's own
clock (a run's ranks each have their own windows, keyed by ``trace_id``).
An event fully inside is kept as it is; an event that straddles an edge is
*clipped* to the window (its start moved in, its duration shortened), not
kept whole or dropped: kept whole, a 30 ms kernel crossing the edge of a 1 ms
window would make the GPU busier than the window is long; dropped, the busy
time inside the window would be missing. A clipped event's ``bytes`` and
``flops`` are scaled by the fraction of its time kept, so a copy's throughput
(bytes / duration) and a kernel's FLOP rate stay what they were;
``exclusive_ns``, ``min_ns`` and ``max_ns`` are capped at the new duration.
Instants (counter samples, marks: no duration or duration 0) are kept when
they fall inside a window. Rows with no time (aggregated summaries) cannot
be placed in a window and are left out, with one warning, except rows whose
``parent_id`` is a kept event (a kernel's counters), which stay with it.

**Several windows** (every instance of a named range, every step) are
merged where they overlap or touch and laid end to end: the time between
two windows is removed, shifting later windows' events earlier by the gaps
before them (the first window keeps its timestamps). So the trace's span is
the time inside the windows, and no rule counts the setup or the pauses
between instances as idle time. A run's ranks share one clock: each keeps
what is inside its own windows, but the time removed is the time inside no
rank's window, the same for every rank, so their cross-rank figures are
those of the uncut run (:func:`cut`).
"""

from __future__ import annotations

import dataclasses
import fnmatch

import polars as pl

from traceparse import intervals, units
from traceparse.errors import InputError
from traceparse.expr import GPU_KINDS
from traceparse.measures.base import placed
from traceparse.run import rank_labels
from traceparse.trace import Trace
from traceparse.validate import INT64_MAX

#: Kinds whose named, timed rows are ranges ``--nvtx NAME`` can select (NVTX ranges, user annotations, regions).
RANGE_KINDS = ("marker", "region")
_KEY = "__window_trace"  # trace_id with nulls as "", so a trace not in the store has windows too
_W = pl.Schema({_KEY: pl.String, "start": pl.Int64, "end": pl.Int64})


def _key(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.with_columns(pl.col("trace_id").cast(pl.String).fill_null("").alias(_KEY))


def _trace_key(trace: Trace) -> str:
    return trace.id or ""


# -- choosing windows ---------------------------------------------------------
def parse_window(text: str) -> tuple[int | None, int | None]:
    """``START:END`` in ms from the trace's start (either side may be empty) as (start, end) ns offsets.

    Raises :class:`InputError` with a one-line message for anything else, a
    negative edge, or an end not after the start.
    """
    head, colon, tail = text.partition(":")
    if not colon:
        raise InputError(f"--window {text!r}: expected START:END in ms from the trace's start, e.g. 100:250 or 100:")
    edges = []
    for side in (head, tail):
        if not side.strip():
            edges.append(None)
            continue
        try:
            edges.append(units.to_int(side, "ms"))
        except ValueError:
            if _is_number(side):  # a number, past Int64 ns
                raise InputError(f"--window {text!r}: {side.strip()!r} ms is past the largest time a trace holds "
                                 f"({INT64_MAX // 10**6:,} ms)") from None
            raise InputError(f"--window {text!r}: {side.strip()!r} is not a number of ms") from None
    lo, hi = edges
    if (lo is not None and lo < 0) or (hi is not None and hi < 0):
        raise InputError(f"--window {text!r}: the edges are ms from the trace's start and cannot be negative")
    if lo is not None and hi is not None and hi <= lo:
        raise InputError(f"--window {text!r}: the end must be after the start")
    return lo, hi


def _is_number(text: str) -> bool:
    try:
        units.parse(text)
    except ValueError:
        return False
    return True


def origins(events: pl.DataFrame) -> dict[str, int]:
    """Per trace (key: trace id, "" for none), the first start of any timed row: where ``--window`` counts from."""
    rows = _key(events).filter(pl.col("start_ns").is_not_null()).group_by(_KEY).agg(pl.col("start_ns").min())
    return dict(rows.iter_rows())


def trace_origins(trace: Trace) -> dict[str, int]:
    """:func:`origins` of ``trace``'s events; of a run, the run's first start for every rank (its ranks share one
    clock: a step's start is said from the run's start, not from each rank's own first event)."""
    found = origins(trace.events)
    if rank_labels(trace) and found:
        first = min(found.values())
        found = dict.fromkeys(found, first)
    return found


def offset_windows(trace: Trace, lo: int | None, hi: int | None) -> pl.DataFrame:
    """The window ``[origin + lo, origin + hi)`` of each trace in ``trace``; of a run, the same window for every
    rank, from the run's first event (its ranks share one clock: each rank's own origin would analyse the ranks
    over different times, and pair a rank's collective with another's a skew away).

    An empty side means the trace's (the run's) first start / last end.
    """
    ev = _key(trace.events).filter(pl.col("start_ns").is_not_null())
    per = ev.group_by(_KEY).agg(first=pl.col("start_ns").min(),
                                last=(pl.col("start_ns") + pl.col("duration_ns").fill_null(0)).max())
    if rank_labels(trace):  # the run's ranks share one clock: one window of the run, from its first event
        per = per.with_columns(pl.col("first").min(), pl.col("last").max())
    # in Int128, then held at Int64's end: a window starting 9223372036854 ms after the trace's start is past
    # its end (it selects nothing), never wrapped to before its start (the whole trace)
    first, last = pl.col("first").cast(pl.Int128), pl.col("last").cast(pl.Int128)
    start = first + (lo or 0)
    # +1: an instant at the very end is in; a window past the trace's end ends with it (0:2000 ms of an 847 ms
    # trace said "2 s analysed")
    end = pl.min_horizontal(first + hi, last + 1) if hi is not None else last + 1
    end = pl.max_horizontal(start, end)
    return per.select(_KEY, start=start.clip(upper_bound=INT64_MAX),
                      end=end.clip(upper_bound=INT64_MAX)).cast(dict(_W))


def step_windows(trace: Trace, step: int | None = None) -> pl.DataFrame:
    """The windows of the trace's steps (``step`` N only, or all), one row per trace and step.

    The steps are :func:`traceparse.measures.steps.step_series`, the ones the
    summary counts: ``ProfilerStep#N``, else ranges named like steps (keeping
    their numbers: ``step 3`` is step 3), else one step per optimizer
    annotation. Columns ``__window_trace``, ``step``, ``start``, ``end``.
    """
    from traceparse.measures.steps import step_series

    s = step_series(trace.events).with_columns(pl.col("trace_id").fill_null("").alias(_KEY))
    if step is not None:
        s = s.filter(pl.col("step") == step)
    return s.select(_KEY, "step", start=pl.col("start_ns"), end=pl.col("end_ns")).sort(_KEY, "start")


def step_source(trace: Trace) -> str | None:
    """What marks the trace's steps (``ProfilerStep#N``, ``range step N``, ``one per Optimizer.step#SGD.step``), or None."""
    from traceparse.measures.steps import step_series

    s = step_series(trace.events)
    return s["source"][0] if s.height else None


def range_windows(trace: Trace, name: str, instance: int | None = None) -> pl.DataFrame:
    """The windows of every instance of the range ``name`` (NVTX range, user annotation; glob patterns allowed).

    Timed rows of :data:`RANGE_KINDS` with a positive duration whose name
    matches; per trace, the host-side instances (rows with a ``pid``) where
    there are any, as for steps (torch also copies annotations onto the GPU
    timeline). Instances are numbered from 1 in order of start per trace
    (column ``step``, so they serve as steps), except where the matching names
    differ only by a trailing number (``step 2`` .. ``step 5``, as
    :func:`traceparse.measures.steps.series_numbers` says): then each keeps its
    own number. ``instance`` keeps only that one.
    """
    from traceparse.measures.steps import series_numbers

    rows = _key(_ranges(trace.events))
    names = [n for n in rows["name"].unique().to_list() if fnmatch.fnmatchcase(n, name)]  # Python's glob, exact
    rows = rows.filter(pl.col("name").is_in(names))
    rows = rows.filter(pl.col("pid").is_not_null() == pl.col("pid").is_not_null().max().over(_KEY))
    numbers = series_numbers(rows["name"].unique().sort().to_list())
    rows = rows.select(_KEY, "name", start=pl.col("start_ns"), end=pl.col("start_ns") + pl.col("duration_ns"))
    if numbers is None:
        rows = rows.sort(_KEY, "start", "end").with_columns(step=pl.int_range(1, pl.len() + 1, dtype=pl.Int64).over(_KEY))
    else:  # one series: each instance keeps its number (two of one number, on two threads say, are one window)
        rows = (rows.with_columns(step=pl.col("name").replace_strict(numbers, return_dtype=pl.Int64))
                .group_by(_KEY, "step").agg(pl.col("start").min(), pl.col("end").max()).sort(_KEY, "start", "end"))
    rows = rows.select(_KEY, "start", "end", "step")
    return rows if instance is None else rows.filter(pl.col("step") == instance)


def range_names(trace: Trace, limit: int = 8) -> list[str]:
    """The most frequent range names of the trace (for an error message that says what there is)."""
    counts = _ranges(trace.events).group_by("name").len().sort(["len", "name"], descending=[True, False])
    return counts["name"].head(limit).to_list()


def _ranges(events: pl.DataFrame) -> pl.DataFrame:
    return events.filter(pl.col("kind").is_in(RANGE_KINDS) & placed()
                         & (pl.col("duration_ns") > 0) & pl.col("name").is_not_null())


# -- cutting ------------------------------------------------------------------
def _laid_end_to_end(windows: pl.DataFrame) -> pl.DataFrame:
    """``windows`` merged per trace, each with ``base`` (its trace's first window's start) and ``before`` (the
    window time before it): where an instant inside it lands once the windows are laid end to end."""
    merged = intervals.merge(windows.select(_KEY, "start", "end").cast(dict(_W)), [_KEY])
    return merged.filter(pl.col("end") > pl.col("start")).sort(_KEY, "start").with_columns(
        base=pl.col("start").min().over(_KEY),
        before=(pl.col("end") - pl.col("start")).cum_sum().over(_KEY) - (pl.col("end") - pl.col("start")))


def clip(events: pl.DataFrame, windows: pl.DataFrame, shared: bool = False) -> tuple[pl.DataFrame, int]:
    """``events`` (a normalized table) cut to ``windows`` (``__window_trace``, ``start``, ``end``), as the module says.

    Returns the cut table (rows in their order, ``event_id`` kept) and the
    number of rows with no time that were left out. Rows of a trace with no
    window are all left out. ``shared`` (a run's ranks, on one clock): each trace keeps what is inside its own
    windows, but the time removed is only the time inside no trace's window, the same for every trace, so that
    their clocks stay together (:func:`cut` says why).
    """
    merged = _laid_end_to_end(windows)
    timeline = None
    if shared:
        timeline = _laid_end_to_end(windows.with_columns(pl.lit("").alias(_KEY)))
    ev = _key(events).with_row_index("__row")
    timed = ev.filter(pl.col("start_ns").is_not_null()).with_columns(
        __end=pl.col("start_ns") + pl.col("duration_ns").fill_null(0))
    start = _compact(timed, "start_ns", merged, timeline)
    end = _compact(timed, "__end", merged, timeline)
    timed = timed.with_columns(__s=start["mapped"], __inside=start["inside"], __e=end["mapped"])
    duration = pl.col("duration_ns")
    new = pl.col("__e") - pl.col("__s")
    keep = (new > 0) | ((duration.is_null() | (duration == 0)) & pl.col("__inside"))
    timed = timed.filter(keep)
    clipped = duration.is_not_null() & (new < duration)
    scale = new.cast(pl.Float64) / duration.cast(pl.Float64)

    def scaled(col: str, dtype) -> pl.Expr:
        value = (pl.col(col).cast(pl.Float64) * scale)
        value = value.round().cast(dtype) if dtype == pl.Int64 else value
        return pl.when(clipped).then(value).otherwise(pl.col(col)).alias(col)

    def capped(col: str) -> pl.Expr:
        return pl.when(clipped).then(pl.min_horizontal(pl.col(col), new)).otherwise(pl.col(col)).alias(col)

    timed = timed.with_columns(
        scaled("bytes", pl.Int64), scaled("flops", pl.Float64), capped("exclusive_ns"), capped("min_ns"),
        capped("max_ns"), pl.col("__s").alias("start_ns"),
        pl.when(duration.is_not_null()).then(new).alias("duration_ns"))
    kept = timed.select(_KEY, "event_id")
    untimed = ev.filter(pl.col("start_ns").is_null())
    with_parent = untimed.join(kept.rename({"event_id": "parent_id"}), on=[_KEY, "parent_id"], how="semi")
    left_out = untimed.height - with_parent.height
    out = pl.concat([timed.select(ev.columns), with_parent.select(ev.columns)]).sort("__row")
    return out.drop("__row", _KEY), left_out


def _compact(timed: pl.DataFrame, at: str, merged: pl.DataFrame, timeline: pl.DataFrame | None = None
             ) -> pl.DataFrame:
    """Per row of ``timed``: ``mapped``, the instant ``at`` on the windows laid end to end, and ``inside``.

    The map is the first window's start plus the window time before the
    instant: increasing, the identity inside the first window, and constant
    across the time between windows (so that time vanishes). With a ``timeline`` (:func:`_laid_end_to_end` of
    every trace's windows together, one key), the instant is first held to its trace's own windows, then laid on
    that timeline: every trace loses the same time.
    """
    points = timed.select("__row", _KEY, pl.col(at).alias("t")).sort("t")
    hit = points.join_asof(merged.sort("start"), left_on="t", right_on="start", by=_KEY, strategy="backward",
                          check_sortedness=False)  # both sorted by time above; polars cannot check within groups
    first = merged.group_by(_KEY).agg(pl.col("start").min().alias("first"))
    hit = hit.join(first, on=_KEY, how="left")
    length = pl.col("end") - pl.col("start")
    inside = pl.col("start").is_not_null() & (pl.col("t") < pl.col("end"))
    if timeline is not None:  # held to the trace's own windows, then laid on the shared timeline
        held = (pl.when(pl.col("start").is_null()).then(pl.col("first"))
                .otherwise(pl.col("start") + pl.min_horizontal(pl.col("t") - pl.col("start"), length)))
        hit = hit.select("__row", "first", _inside=inside, t=held).sort("t").join_asof(
            timeline.select("start", "end", "base", "before").sort("start"), left_on="t", right_on="start",
            strategy="backward", check_sortedness=False)
        mapped = (pl.when(pl.col("start").is_null()).then(pl.col("t"))  # no window at all: left out below
                  .otherwise(pl.col("base") + pl.col("before")
                             + pl.min_horizontal(pl.col("t") - pl.col("start"), length)))
        return (hit.with_columns(mapped=mapped).sort("__row")
                .select("mapped", pl.col("_inside").fill_null(False).alias("inside")))
    mapped = (pl.when(pl.col("start").is_null()).then(pl.col("first"))  # before the first window (or no window)
              .otherwise(pl.col("base") + pl.col("before") + pl.min_horizontal(pl.col("t") - pl.col("start"), length)))
    return (hit.with_columns(mapped=mapped, inside=inside)
            .sort("__row").select("mapped", pl.col("inside").fill_null(False)))


def cut(trace: Trace, windows: pl.DataFrame, label: str) -> Trace:
    """``trace`` cut to ``windows`` (clipped and laid end to end): a new, normal trace with the same id.

    Of a run, each rank keeps what is inside its own windows, and the time removed is the time inside no rank's
    window, the same for every rank. A run's ranks share one clock, and their cross-rank figures (a collective's
    waits, the critical path's crossings) compare their times: laid end to end each on its own, each rank lost
    its own gaps between steps (tp2_nccl: 95 us on rank 0, 159 us on rank 1), the ranks' clocks then differed by
    the difference, collectives' last arrivals changed rank, and the critical path of `--step all` held "70.23
    ms (53.3%)" where the same steps uncut held 82.85 ms (62.8%).

    ``label`` says what the windows are (``step 3``, ``range train_step``,
    ``window 100:250 ms``); it is kept in ``meta.extra["window"]`` with the
    windows themselves, merged where they overlap or touch (the time analysed). The whole trace's summary figures are dropped (they
    describe the whole), and a warning counts the rows with no time left out.
    """
    events, left_out = clip(trace.events, windows, shared=bool(rank_labels(trace)))
    mine = intervals.merge(windows.filter(pl.col(_KEY).is_in(list(origins(trace.events))))
                           .select(_KEY, "start", "end").cast(dict(_W)), [_KEY]).sort(_KEY, "start")
    extra = {**trace.meta.extra, "window": {
        "label": label, "windows": [{"trace": k or None, "start_ns": s, "end_ns": e}
                                    for k, s, e in mine.select(_KEY, "start", "end").iter_rows()],
        "steps_cut": _steps_cut(trace, mine)}}
    warnings = list(trace.meta.warnings)
    if left_out:
        warnings.append(f"{trace.meta.path or trace.id}: {label}: {left_out} rows with no time (aggregated summaries) "
                        "cannot be placed in the window and were left out")
    meta = dataclasses.replace(trace.meta, extra=extra, warnings=warnings, summary={}, event_count=events.height)
    return Trace(events, meta, stamp_trace_id=False)


def _steps_cut(trace: Trace, merged: pl.DataFrame) -> int:
    """How many of the trace's steps (:func:`~traceparse.measures.steps.step_series`, one per rank and step) the
    windows cut: a step partly inside a window, whose part inside is all the cut trace has of it (``--window
    100:200`` over steps of 181.6 and 123.9 ms kept 81.71 and 18.23 ms of them, which the summary gave as the
    steps' times)."""
    from traceparse.measures.steps import step_series

    steps = step_series(trace.events)
    if steps.height == 0 or merged.height == 0:
        return 0
    steps = _key(steps).select(_KEY, "start_ns", "end_ns")
    pairs = steps.with_row_index("_step").join(merged.select(_KEY, "start", "end"), on=_KEY, how="inner").filter(
        (pl.col("start_ns") < pl.col("end")) & (pl.col("end_ns") > pl.col("start")))
    inside = (pl.col("start_ns") >= pl.col("start")) & (pl.col("end_ns") <= pl.col("end"))
    return int(pairs.group_by("_step").agg(whole=inside.any()).filter(~pl.col("whole")).height)


# -- per-step figures ---------------------------------------------------------
def step_table(trace: Trace, windows: pl.DataFrame | None = None) -> list[dict]:
    """Per step of ``trace``: its time, GPU busy %, idle time and top kernel category.

    The steps are ``windows`` (columns ``__window_trace``, ``step``,
    ``start``, ``end``, e.g. :func:`range_windows`), by default
    :func:`step_windows`.

    ``gpu_busy_pct`` is the union of the GPU activity (kernels, copies,
    memsets) clipped to the step, per GPU, over the step's duration, averaged
    over the trace's GPUs (those with any activity); ``idle_ns`` is the step's
    duration minus that busy time (per GPU, averaged); ``top_category`` the
    kernel category with the most kernel time inside the step. No GPU: both
    None. One dict per step: ``trace``, ``rank`` (of a run's rank; else
    None), ``step``, ``start_ns``, ``dur_ns``, ``gpu_busy_pct``, ``idle_ns``,
    ``top_category``.
    """
    from traceparse.measures import device_busy, time_by_category

    events = trace.events
    gpu = events.filter(pl.col("kind").is_in(GPU_KINDS) & placed())
    devices = _key(gpu).group_by(_KEY).agg(pl.col("device_id").n_unique().alias("n"))
    n_devices = dict(devices.iter_rows())
    ranks = dict(_key(events).filter(pl.col("rank").is_not_null()).group_by(_KEY).agg(pl.col("rank").first()).iter_rows())
    rows = []
    windows = step_windows(trace) if windows is None else windows
    for key, step, start, end in windows.select(_KEY, "step", "start", "end").iter_rows():
        one = pl.DataFrame({_KEY: [key], "start": [start], "end": [end]})
        near = gpu.filter((pl.col("trace_id").fill_null("") == key) & (pl.col("start_ns") < end)
                          & (pl.col("start_ns") + pl.col("duration_ns") > start))  # cheap: clip only these
        inside, _ = clip(near, one)
        dur = end - start
        n = n_devices.get(key, 0)
        busy = int(device_busy(inside)["busy_ns"].sum()) if inside.height else 0
        cats = time_by_category(inside).filter(pl.col("time_ns").is_not_null()).sort(
            ["time_ns", "category"], descending=[True, False])
        rows.append({
            "trace": key or None, "rank": ranks.get(key), "step": step, "start_ns": start, "dur_ns": dur,
            "gpu_busy_pct": 100.0 * busy / (dur * n) if n and dur else None,
            "idle_ns": round(dur - busy / n) if n else None,
            "top_category": cats["category"][0] if cats.height else None,
        })
    return sorted(rows, key=lambda r: (r["rank"] is None, r["rank"] or 0, r["trace"] or "", r["step"]))
