"""The critical path of every step of a trace or run, as the ``critical-path`` rule, ``traceparse whatif``, the Chrome
export and the HTML report all take it: the dependency graph (:data:`traceparse.measures.dependency_graph`), each
trace's step windows (:func:`traceparse.measures.steps.step_series`) and the path of each
(:func:`traceparse.measures.critical_path.critical_paths`); of one large trace, a group of steps at a time
(:mod:`traceparse.measures.path_windows`). docs/critical_path.md defines them."""

from __future__ import annotations

import polars as pl

from traceparse.measures.critical_path import INSTANCE_TRACE, critical_paths, dependency_graph, on_a_thread
from traceparse.measures.path_windows import windowed_critical_paths, windowed_steps
from traceparse.measures.steps import step_series


def step_windows(events: pl.DataFrame, graph: pl.DataFrame, spans: bool = False) -> pl.DataFrame:
    """Each trace's steps with its rank, on the graph's clock: ``trace_id``, ``rank``, ``step``, ``start_ns``,
    ``end_ns``. A trace without steps has none, or with ``spans`` one window (step null) over its graph's span,
    where no trace of the graph marks steps: one rank's whole span beside the others' steps made it a "step"
    three times as long (a run whose rank 1 recorded no ProfilerStep read "175.4 ms of a 175.4 ms step" where the
    steps are 146.2 ms)."""
    traces = (graph.filter(pl.col("dst_trace") != INSTANCE_TRACE).group_by(trace_id="dst_trace")
              .agg(rank=pl.col("rank").first(), offset_ns=pl.col("offset_ns").first(),
                   first=pl.col("src_ns").min(), last=pl.col("dst_ns").max()))
    steps = step_series(events).select(pl.col("trace_id").cast(pl.String), "step", "start_ns", "end_ns")
    found = traces.join(steps, on="trace_id", how="inner", nulls_equal=True).select(
        "trace_id", "rank", "step", start_ns=pl.col("start_ns") - pl.col("offset_ns"),
        end_ns=pl.col("end_ns") - pl.col("offset_ns"))
    if spans and found.height == 0:
        rest = traces.join(steps, on="trace_id", how="anti", nulls_equal=True).select(
            "trace_id", "rank", step=pl.lit(None, dtype=pl.Int64), start_ns="first", end_ns="last")
        found = pl.concat([found, rest])
    return found.sort("trace_id", "step", nulls_last=False)


def step_critical_paths(events: pl.DataFrame, align_clocks: bool = False
                        ) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """``(graph, paths, segments)``: the dependency graph of ``events`` and the critical path of every step of
    each trace (of its span where it marks no step), as :func:`~traceparse.measures.critical_path.critical_paths`
    returns them; all empty without a timeline."""
    graph = dependency_graph(events, align_clocks=align_clocks)
    if graph.height == 0:
        empty = critical_paths(graph, pl.DataFrame(schema={"trace_id": pl.String, "rank": pl.Int32,
                                                           "step": pl.Int64, "start_ns": pl.Int64,
                                                           "end_ns": pl.Int64}))
        return graph, *empty
    paths, segments = critical_paths(graph, step_windows(events, graph, spans=True))
    return graph, paths, segments


def step_paths(events: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame, bool]:
    """``(paths, segments, on_threads)``: the critical path of every step as :func:`step_critical_paths` gives
    them, and whether the graph follows host threads (host events on a thread: without them only the GPU
    streams' order, no path worth showing). Of one large trace with steps
    (:func:`~traceparse.measures.path_windows.windowed`), a group of steps at a time: the same paths, without the
    whole trace's graph in memory."""
    windows = windowed_steps(events)
    if windows is not None:
        paths, segments = windowed_critical_paths(events, windows)
        return paths, segments, bool(events.select(on_a_thread().any()).item())
    graph, paths, segments = step_critical_paths(events)
    return paths, segments, bool(graph.height and (graph["edge"] == "thread").any())
