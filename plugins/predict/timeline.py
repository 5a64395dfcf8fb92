"""The two sides of a step, host and device, and a replay that combines them at another batch size.

A training step is a host that issues GPU work (one launch API call per
kernel, copy or memset) and a GPU that runs it, in order, as soon as it is
both launched and the GPU is free. The host waits for the GPU only in
blocking calls (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``,
``cudaEventSynchronize``, a synchronous ``cudaMemcpy``, a copy into pageable
host memory). So, per step:

* **host time** = step time − the time the host spent *waiting* in blocking
  calls (a blocking call waits from its start until the GPU finishes the work
  launched before it returns; the rest of the call, the wake-up, is host
  time). It is launch and framework overhead, nearly constant in the batch.
* **device time** = Σ duration of the step's GPU activities (one queue).
* **hidden device time** (the overlap) = device time − wait: GPU work that ran
  while the host was busy. A step is host-bound while the GPU work hides
  under the host's; each side bounds the step from below:
  step ≥ host time and step ≥ device time.

:func:`replay` recomputes every step of a measured trace with other GPU
durations (the per-layer models' prediction at another batch) by the replay
engine ``traceparse whatif`` uses (:class:`traceparse.measures.replay.Replayer`
over the trace's dependency graph, docs/critical_path.md): each GPU activity
weighs its new duration, the host's own time (its ``thread`` edges but the
synchronisations' own time, which is waiting) is multiplied by the host
scale, and every other edge keeps its measured weight: launch latencies,
queue gaps on each stream, the wake-up of a blocking call after the GPU work
it waited for, cross-stream waits. A step ends at its annotation's replayed
end, or when the GPU work launched in it ends if that is later. Replayed with
the measured durations it gives back the measured steps (the *replay error*,
reported by ``predict fit``, is how far it does not).

Assumptions: launches do not block (CUDA's launch queue is deep enough); the
host's own time does not depend on the GPU durations; the graph's edges are
the only dependencies (what the trace does not show is replayed as measured).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from traceparse.measures.critical_path import dependency_graph
from traceparse.measures.replay import Replayer
from traceparse.trace import Trace

GPU_KINDS = ("kernel", "memcpy", "memset")
#: API calls in which the host waits for the GPU.
BLOCKING = r"Synchronize|^cudaMemcpy$|^cudaMemcpy2D$|^cuMemcpyDtoH|^cuCtxSynchronize"
STEP_MARKER = r"^ProfilerStep#\d+$"


@dataclass
class GraphReplay:
    """A trace's dependency graph prepared for the step replays of :func:`replay`: the engine, the graph row of
    each activity's own edge (-1: none), its end node, the rows of the host's own time, each step's end nodes."""

    replayer: Replayer
    activity_edge: np.ndarray
    activity_end: np.ndarray
    host_edges: np.ndarray
    step_first: np.ndarray
    step_last: np.ndarray


@dataclass
class Timeline:
    """One trace's host events and GPU activities, per step window, as numpy arrays (times in ns)."""

    #: step windows: start, end (host annotations; one window spanning the trace when there are none)
    step_start: np.ndarray
    step_end: np.ndarray
    #: GPU activities in the order they ran: launch time (their API call's start), start, duration, top_id
    #: (-1: unattributed), index of their step window (-1: outside every window)
    launch: np.ndarray
    start: np.ndarray
    duration: np.ndarray
    top_id: np.ndarray
    window: np.ndarray
    #: blocking API calls: start, end, measured wait, index of the last activity launched before they return
    block_start: np.ndarray
    block_end: np.ndarray
    block_wait: np.ndarray
    block_after: np.ndarray
    #: per activity: its event id; the trace's dependency graph prepared for replays (None without one)
    event_id: np.ndarray
    graph: GraphReplay | None = None

    @property
    def steps(self) -> int:
        return len(self.step_start)

    def per_step(self) -> pl.DataFrame:
        """Measured per step: step_ns, device_ns (Σ activity durations), wait_ns, host_ns, hidden_ns."""
        rows = []
        for w in range(self.steps):
            step = float(self.step_end[w] - self.step_start[w])
            inside = (self.block_start >= self.step_start[w]) & (self.block_start < self.step_end[w])
            wait = float(self.block_wait[inside].sum())
            device = float(self.duration[self.window == w].sum())
            rows.append((w, step, device, wait, step - wait, max(0.0, device - wait)))
        return pl.DataFrame(rows, schema={"window": pl.Int64, "step_ns": pl.Float64, "device_ns": pl.Float64,
                                          "wait_ns": pl.Float64, "host_ns": pl.Float64, "hidden_ns": pl.Float64},
                            orient="row")


def timeline(trace: Trace, activities: pl.DataFrame | None = None) -> Timeline:
    """The timeline of ``trace``; ``activities`` (event_id, top_id) from the attribution gives each its layer call."""
    events = trace.events
    gpu = (events.filter(pl.col("kind").is_in(GPU_KINDS) & pl.col("start_ns").is_not_null()
                         & pl.col("duration_ns").is_not_null())
           .select("event_id", "kind", "start_ns", "duration_ns", "correlation_id", "copy_kind", "dst_memory"))
    if activities is not None:
        gpu = gpu.join(activities.select("event_id", "top_id"), on="event_id", how="left")
    else:
        gpu = gpu.with_columns(top_id=pl.lit(None, dtype=pl.Int64))
    api = (events.filter((pl.col("kind") == "api") & pl.col("start_ns").is_not_null()
                         & pl.col("duration_ns").is_not_null())
           .select("name", pl.col("start_ns").alias("a_start"), (pl.col("start_ns") + pl.col("duration_ns")).alias("a_end"),
                   "correlation_id"))
    launches = api.filter(pl.col("correlation_id").is_not_null()).unique("correlation_id", keep="first")
    gpu = gpu.join(launches.select("correlation_id", "a_start", pl.col("name").alias("a_name"), "a_end"),
                   on="correlation_id", how="left").sort("start_ns")
    start = gpu["start_ns"].to_numpy().astype(np.int64)
    duration = gpu["duration_ns"].to_numpy().astype(np.int64)
    launch_col = gpu["a_start"]
    # an activity whose launch call is missing: launched when it started (it cannot have been later)
    launch = np.where(launch_col.is_null().to_numpy(), start, launch_col.fill_null(0).to_numpy()).astype(np.int64)
    launch = np.minimum(launch, start)
    top = gpu["top_id"].fill_null(-1).to_numpy().astype(np.int64)

    # blocking calls: synchronisations, and copies into pageable host memory (synchronous)
    pageable_copy = gpu.filter((pl.col("kind") == "memcpy") & (pl.col("copy_kind") == "DtoH")
                               & (pl.col("dst_memory") == "pageable") & pl.col("a_start").is_not_null())
    blocking = pl.concat([
        api.filter(pl.col("name").str.contains(BLOCKING)).select("a_start", "a_end"),
        pageable_copy.select("a_start", "a_end")]).unique().sort("a_start")
    b_start = blocking["a_start"].to_numpy().astype(np.int64)
    b_end = blocking["a_end"].to_numpy().astype(np.int64)

    # step windows
    markers = (events.filter((pl.col("kind") == "marker") & pl.col("name").str.contains(STEP_MARKER)
                             & pl.col("pid").is_not_null() & pl.col("duration_ns").is_not_null())
               .group_by("name").agg(pl.col("start_ns").min(), (pl.col("start_ns") + pl.col("duration_ns")).max()
                                     .alias("end_ns")).sort("start_ns"))
    if markers.height:
        s_start = markers["start_ns"].to_numpy().astype(np.int64)
        s_end = markers["end_ns"].to_numpy().astype(np.int64)
    else:
        first = int(min(launch.min(initial=start.min(initial=0)), b_start.min(initial=launch.min(initial=0))))
        last = int(max((start + duration).max(initial=0), b_end.max(initial=0)))
        s_start, s_end = np.array([first]), np.array([last])
    window = np.full(len(start), -1, dtype=np.int64)
    for w in range(len(s_start)):
        window[(launch >= s_start[w]) & (launch < s_end[w])] = w

    end = start + duration
    # a blocking call waits until the GPU has finished what was launched before it returns
    after = np.searchsorted(np.sort(launch), b_end, side="right") - 1
    order = np.argsort(launch, kind="stable")
    done_by = np.maximum.accumulate(end[order]) if len(end) else end
    gpu_done = np.where(after >= 0, done_by[np.clip(after, 0, None)] if len(end) else 0, np.iinfo(np.int64).min)
    wait = np.clip(np.minimum(b_end, gpu_done) - b_start, 0, None)
    event_id = gpu["event_id"].to_numpy().astype(np.int64)
    return Timeline(s_start, s_end, launch, start, duration, top, window, b_start, b_end, wait.astype(float),
                    after, event_id, prepare(events, event_id, s_start, s_end))


def prepare(events: pl.DataFrame, event_id: np.ndarray, step_start: np.ndarray,
            step_end: np.ndarray) -> GraphReplay | None:
    """The trace's dependency graph (:data:`traceparse.measures.dependency_graph`) prepared for :func:`replay`:
    None when it has no host thread to replay (no ``thread`` edge)."""
    graph = dependency_graph(events)
    if graph.height == 0 or not (graph["edge"] == "thread").any():
        return None
    trace = graph.filter(pl.col("dst_trace") != "(collective)")["dst_trace"][0]
    replayer = Replayer(graph)
    own = ((pl.col("edge") == "stream") & (pl.col("src_node") == 2 * pl.col("event_id"))
           & (pl.col("dst_node") == 2 * pl.col("event_id") + 1))
    rows = graph.with_row_index("_row").filter(own).select("event_id", "_row")
    row_of = dict(zip(rows["event_id"].to_list(), rows["_row"].to_list()))
    activity_edge = np.array([row_of.get(int(e), -1) for e in event_id], dtype=np.int64)
    activity_end = np.array([replayer.index.get((trace, 2 * int(e) + 1), -1) for e in event_id], dtype=np.int64)
    host = ((graph["edge"] == "thread") & (graph["segment"] != "sync")).to_numpy()
    windows = pl.DataFrame({"trace_id": [trace] * len(step_start), "start_ns": step_start, "end_ns": step_end},
                           schema={"trace_id": pl.String, "start_ns": pl.Int64, "end_ns": pl.Int64})
    first, last = replayer.window_nodes(graph, windows)
    return GraphReplay(replayer, activity_edge, activity_end, np.flatnonzero(host), first, last)


def replay(tl: Timeline, duration: np.ndarray, host_scale: float = 1.0) -> pl.DataFrame:
    """Each step again with GPU durations ``duration`` (per activity, ns): window, step_ns, device_ns.

    The trace's dependency graph replayed (:class:`traceparse.measures.replay.Replayer`, the engine of
    ``traceparse whatif``): each activity weighs its new duration, the host's own time (``thread`` edges but a
    synchronisation's own time, which is waiting) ``host_scale`` times its measured weight, every other edge its
    measured weight. A step runs from its start's replayed time to its end's, or to the replayed end of the last
    GPU work launched in it if that is later; never shorter than that GPU work.
    """
    rows = []
    g = tl.graph
    at = None
    if g is not None:
        w = g.replayer.default.astype(float)
        mapped = g.activity_edge >= 0
        w[g.activity_edge[mapped]] = np.asarray(duration, dtype=float)[mapped]
        w[g.host_edges] = w[g.host_edges] * host_scale
        at = g.replayer.run(w)
        measured = g.replayer.measured
    for k in range(len(tl.step_start)):
        mine = tl.window == k
        device = float(np.asarray(duration, dtype=float)[mine].sum())
        step = float(tl.step_end[k] - tl.step_start[k])
        first, last = (g.step_first[k], g.step_last[k]) if g is not None else (-1, -1)
        if at is not None and first >= 0 and last >= 0:
            # each end moves as far as the node at it moved; the end no earlier than its GPU work's
            s0 = float(tl.step_start[k] + (at[first] - measured[first]))
            s1 = float(tl.step_end[k] + (at[last] - measured[last]))
            ends = g.activity_end[mine]
            ends = ends[ends >= 0]
            if ends.size:
                s1 = max(s1, float(at[ends].max()))
            step = s1 - s0
        rows.append((k, max(step, device), device))
    return pl.DataFrame(rows, schema={"window": pl.Int64, "step_ns": pl.Float64, "device_ns": pl.Float64},
                        orient="row")
