"""How long each rank's steps could wait for its GPU: the most step time a GPU that waited at collectives can cost.

A rank whose communication kernels spin for a late rank's (NCCL, RCCL) waits on its device. Its step is measured
on its host, and grows only where the host waits for that GPU: in a blocking call (a synchronisation, a
synchronous copy), in a call the driver holds (a launch whose queue is full), in a collective call, or with the
step's GPU work ending after the step (the next step then starts behind). Where the host runs on without waiting,
the wait is hidden behind the host's own work: an 8-rank Megatron run whose hosts issue 130 ms of GPU compute in
600 ms steps had its GPUs wait 210 ms a step for the slowest rank while no step would have been shorter for it.
This measure bounds that from above, so that a straggler's cost to the others' steps is never larger than the
time their steps waited for their GPUs at all.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from traceparse import expr, intervals
from traceparse.measures.base import PartitionedEvents, placed
from traceparse.measures.critical_path import SYNC_CALLS

#: A runtime call at least this long held the host (a full launch queue, an implicit synchronisation): launches
#: take microseconds, and nothing on the host between them waits that long but for the device.
LONG_CALL_NS = 1_000_000


def host_held(events: Any, windows: dict[Any, list[tuple[int, int]]]) -> dict[int, int]:
    """Per rank (the keys of ``windows`` that are ranks), the most time its steps (``windows``, as
    :func:`traceparse.measures.comm.member_windows` gives them) could have waited for its GPU: per window, the
    union of its host's blocking runtime calls (:data:`~traceparse.measures.critical_path.SYNC_CALLS`), calls of
    :data:`LONG_CALL_NS` or more and collective calls inside the window, plus the time the GPU work started in the
    window runs past its end, at most the window. Ranks whose trace has no runtime calls are left out: nothing
    says whether their host waited."""
    wanted = {m: w for m, w in windows.items() if isinstance(m, int) and w}
    if not wanted:
        return {}
    if isinstance(events, PartitionedEvents):
        found: dict[int, int] = {}
        for part in events.map(_held_of_group, wanted):
            found.update(part)
        return found
    return _held_of_group(events, wanted)


def _held_of_group(events: pl.DataFrame, windows: dict[int, list[tuple[int, int]]]) -> dict[int, int]:
    """:func:`host_held` of the ranks of one table (a run's group of ranks, or a whole trace)."""
    ranks = pl.col("rank").cast(pl.Int32)
    rows = (events.lazy().filter(placed() & pl.col("rank").is_not_null()
                                 & ranks.is_in(list(windows)) & expr.kind_is("api", "op", "marker", "region",
                                                                             "kernel", "memcpy", "memset"))
            .select(rank=ranks, kind=pl.col("kind").cast(pl.String), start_ns="start_ns", duration_ns="duration_ns",
                    blocking=(expr.kind_is("api") & (pl.col("name").str.contains(SYNC_CALLS)
                                                      | (pl.col("duration_ns") >= LONG_CALL_NS)))
                    | (expr.kind_is("op", "marker", "region") & expr.collective_of().is_not_null()))
            .collect())
    with_calls = set(rows.filter(pl.col("kind") == "api")["rank"].unique().to_list())
    cover = pl.DataFrame([{"rank": r, "start_ns": a, "duration_ns": b - a, "window": i}
                          for r, w in windows.items() if r in with_calls for i, (a, b) in enumerate(w)],
                         schema={"rank": pl.Int32, "start_ns": pl.Int64, "duration_ns": pl.Int64, "window": pl.Int64})
    if cover.height == 0:
        return {}
    blocked = intervals.union(rows.filter(pl.col("blocking") & pl.col("rank").is_in(list(with_calls)))
                              .select("rank", "start_ns", "duration_ns"), ["rank"])
    inside = cover.with_columns(intervals.overlap_with(cover, blocked, ["rank"], merged=True).alias("blocked_ns"))
    gpu = (rows.filter(pl.col("kind").is_in(["kernel", "memcpy", "memset"]))
           .select("rank", "start_ns", end_ns=pl.col("start_ns") + pl.col("duration_ns")).sort("rank", "start_ns"))
    ends = (cover.select("rank", "window", "start_ns", end=pl.col("start_ns") + pl.col("duration_ns"))
            .sort("rank", "start_ns"))
    # each window's GPU work: what started in it (after its start, before its end), and how far past its end it ran
    tails = (gpu.join_asof(ends, on="start_ns", by="rank", strategy="backward", check_sortedness=False)
             .filter(pl.col("window").is_not_null() & (pl.col("start_ns") < pl.col("end")))
             .group_by("rank", "window").agg(tail_ns=(pl.col("end_ns").max() - pl.col("end").first()).clip(0)))
    held = (inside.join(tails, on=["rank", "window"], how="left")
            .select("rank", held=pl.min_horizontal(pl.col("blocked_ns") + pl.col("tail_ns").fill_null(0),
                                                   pl.col("duration_ns")))
            .group_by("rank").agg(pl.col("held").sum()))
    return {int(r): int(ns) for r, ns in held.iter_rows()}
