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
durations (the per-layer models' prediction at another batch): the host's
own times are kept, each activity starts at max(its launch + launch latency,
the previous activity's end + queue gap), and each blocking call waits until
the GPU has finished the work launched before it. Replayed with the measured
durations it gives back the measured steps (the *replay error*, reported by
``predict fit``, is how far it does not).

Assumptions: one in-order GPU queue (the activities of all streams in the
order they ran: true of these single-stream training loops, conservative
where streams overlap); launches do not block (CUDA's launch queue is deep
enough); the host's own time does not depend on the GPU durations.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from traceparse.trace import Trace

GPU_KINDS = ("kernel", "memcpy", "memset")
#: API calls in which the host waits for the GPU.
BLOCKING = r"Synchronize|^cudaMemcpy$|^cudaMemcpy2D$|^cuMemcpyDtoH|^cuCtxSynchronize"
STEP_MARKER = r"^ProfilerStep#\d+$"


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
    #: per activity: launch latency to use when launch-bound, queue gap to use when queued
    latency: np.ndarray
    queue_gap: np.ndarray

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

    # order of execution: as measured (one queue)
    end = start + duration
    prev_end = np.concatenate([[np.iinfo(np.int64).min // 4], end[:-1]])
    running_end = np.maximum.accumulate(prev_end)
    gap = start - running_end
    latency = start - launch
    queued = gap < latency  # started closer to the previous activity's end than to its own launch
    lat_bound = latency[~queued & (np.arange(len(start)) > 0)]
    gaps_q = gap[queued]
    lat_med = float(np.median(lat_bound)) if lat_bound.size else 0.0
    gap_med = float(np.median(gaps_q)) if gaps_q.size else 0.0
    lat = np.where(queued, lat_med, latency).astype(float)
    qgap = np.where(queued, np.maximum(gap, 0), gap_med).astype(float)

    # a blocking call waits until the GPU has finished what was launched before it returns
    after = np.searchsorted(np.sort(launch), b_end, side="right") - 1
    order = np.argsort(launch, kind="stable")
    done_by = np.maximum.accumulate(end[order]) if len(end) else end
    gpu_done = np.where(after >= 0, done_by[np.clip(after, 0, None)] if len(end) else 0, np.iinfo(np.int64).min)
    wait = np.clip(np.minimum(b_end, gpu_done) - b_start, 0, None)
    return Timeline(s_start, s_end, launch, start, duration, top, window, b_start, b_end, wait.astype(float),
                    after, lat, qgap)


def replay(tl: Timeline, duration: np.ndarray, host_scale: float = 1.0) -> pl.DataFrame:
    """Each step again with GPU durations ``duration`` (per activity, ns): window, step_ns, device_ns.

    ``host_scale`` multiplies the host's own time (the time between host events that is not waiting).
    Activities run in their measured order; each starts at max(launch + latency, previous end + queue gap);
    a blocking call returns when the GPU has finished what ran before it, plus its measured wake-up.
    """
    n = len(tl.start)
    # host events in host order; at equal times a launch comes before a blocking call (a synchronous copy
    # launches its own copy first)
    times = np.concatenate([tl.launch, tl.block_start]).astype(float)
    kinds = np.concatenate([np.zeros(n, dtype=np.int8), np.ones(len(tl.block_start), dtype=np.int8)])
    index = np.concatenate([np.arange(n), np.arange(len(tl.block_start))])
    order = np.lexsort((kinds, times))
    sim_end = np.full(n, np.nan)
    launch_at = np.zeros(n)
    launched = np.zeros(n, dtype=bool)
    shift = 0.0  # predicted minus measured host time so far (waits, scaled host time)
    last_t = float(tl.step_start[0]) if len(tl.step_start) else 0.0
    gpu_free = -np.inf
    next_exec = 0  # the next activity the GPU takes (arrays are in execution order)
    bounds = np.sort(np.concatenate([tl.step_start, tl.step_end]).astype(float))
    marks: dict[float, float] = {}  # host time of a step boundary -> shift at that time
    b_i = 0

    def run_ready() -> None:
        nonlocal next_exec, gpu_free
        while next_exec < n and launched[next_exec]:
            k = next_exec
            begin = max(launch_at[k] + tl.latency[k], gpu_free + tl.queue_gap[k])
            sim_end[k] = begin + duration[k]
            gpu_free = sim_end[k]
            next_exec += 1

    for pos in order:
        t = times[pos]
        while b_i < len(bounds) and bounds[b_i] <= t:
            marks[bounds[b_i]] = shift + (host_scale - 1.0) * (bounds[b_i] - last_t)
            b_i += 1
        shift += (host_scale - 1.0) * (t - last_t)
        last_t = t
        i = index[pos]
        if kinds[pos] == 0:
            launch_at[i] = t + shift
            launched[i] = True
            run_ready()
        else:
            run_ready()
            done = gpu_free if tl.block_after[i] >= 0 else -np.inf
            wait = max(0.0, done - (t + shift))
            shift += wait - tl.block_wait[i]
    while b_i < len(bounds):
        marks[bounds[b_i]] = shift + (host_scale - 1.0) * (bounds[b_i] - last_t)
        b_i += 1
    run_ready()
    rows = []
    for w in range(len(tl.step_start)):
        s0 = tl.step_start[w] + marks.get(float(tl.step_start[w]), shift)
        s1 = tl.step_end[w] + marks.get(float(tl.step_end[w]), shift)
        mine = tl.window == w
        if mine.any():
            s1 = max(s1, float(np.nanmax(sim_end[mine])))
        device = float(duration[mine].sum())
        rows.append((w, max(float(s1 - s0), device), device))
    return pl.DataFrame(rows, schema={"window": pl.Int64, "step_ns": pl.Float64, "device_ns": pl.Float64},
                        orient="row")
