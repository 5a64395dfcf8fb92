"""The figures behind the HTML report's charts, computed from the measures (no plotly here).

Every function takes a :class:`~traceparse.trace.Trace` (or its events) and
returns plain Python data (lists and dicts of numbers and raw, unescaped
names), so the figures can be tested without a browser and the charts
(:mod:`.charts`) only draw them. A *member* is one device of one trace: in a
run, one rank's GPU (``rank 2 GPU 0``); elsewhere the trace's GPU
(``GPU 0``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from traceparse import expr, intervals, measures
from traceparse.measures.base import placed

#: Union of GPU activity per member: a trace's (or a rank's) device.
MEMBER = ["trace_id", "rank", "device_id"]
#: Bins of the busy timeline.
DEFAULT_BINS = 200
#: Kernel names shown by name; the rest are summed in one bar.
TOP_NAMES = 15
#: The most critical-path segments the report draws: a browser opens a chart of this many bars; the 1 GB
#: benchmark trace's 420 steps have 3.2 million (a 290 MB page that no browser drew). Beyond it, the slowest
#: steps' paths are drawn, as many as fit.
MAX_PATH_SEGMENTS = 50_000


def member_label(rank: Any, device: Any) -> str:
    """How the report names a member: ``rank 2 GPU 0`` in a run, ``GPU 0`` otherwise (``GPU ?``: no device id)."""
    gpu = f"GPU {device}" if device is not None else "GPU ?"
    return f"rank {rank} {gpu}" if rank is not None else gpu


def gpu_unions(events: pl.DataFrame) -> dict[tuple, tuple[np.ndarray, np.ndarray]]:
    """Per member (trace_id, rank, device_id): the merged busy intervals of its timed kernels, copies and memsets,
    as sorted, disjoint (starts, ends) arrays in ns."""
    rows = events.filter(expr.kind_is(*expr.GPU_KINDS) & placed())
    union = intervals.union(rows, MEMBER).sort([*MEMBER, "start"], nulls_last=False)
    out = {}
    for key, part in union.group_by(MEMBER, maintain_order=True):
        out[tuple(key)] = (part["start"].to_numpy().astype(np.int64), part["end"].to_numpy().astype(np.int64))
    def order(key):
        trace_id, rank, device = key
        return (rank is None, rank or 0, device is None, device or 0, trace_id or "")

    return {key: out[key] for key in sorted(out, key=order)}


def busy_until(starts: np.ndarray, ends: np.ndarray, t: np.ndarray) -> np.ndarray:
    """B(t): the busy time of sorted disjoint intervals before each instant of ``t`` (ns), exact in integers.

    The busy time inside any window [a, b) is B(b) − B(a).
    """
    t = np.asarray(t, dtype=np.int64)
    if starts.size == 0:
        return np.zeros_like(t)
    before = np.concatenate(([0], np.cumsum(ends - starts)))  # busy time of the first i intervals
    i = np.searchsorted(starts, t, side="right")  # intervals starting at or before t
    last = np.maximum(i - 1, 0)
    inside = np.where(i > 0, np.clip(t - starts[last], 0, ends[last] - starts[last]), 0)
    return before[last] + inside


def timeline(events: pl.DataFrame, bins: int = DEFAULT_BINS) -> dict | None:
    """GPU busy % per member in ``bins`` equal bins from the first to the last GPU activity of the trace.

    Returns ``{"origin_ns", "width_ns", "x_ms" (bin centres from the origin), "members": [{"label",
    "busy_pct": [...], "busy_ns", "span_ns"}]}``, or None when no GPU activity is timed.
    """
    unions = gpu_unions(events)
    if not unions:
        return None
    t0 = min(int(s[0]) for s, _ in unions.values())
    t1 = max(int(e[-1]) for _, e in unions.values())
    width = max(1, -(-(t1 - t0) // bins))  # ceiling: the last bin ends at or after t1
    edges = t0 + width * np.arange(bins + 1, dtype=np.int64)
    members = []
    for (trace_id, rank, device), (starts, ends) in unions.items():
        busy = np.diff(busy_until(starts, ends, edges))
        members.append({"label": member_label(rank, device), "trace_id": trace_id,
                        "busy_pct": [round(100.0 * float(b) / width, 3) for b in busy],
                        "busy_ns": int(np.sum(ends - starts)), "span_ns": int(ends[-1] - starts[0])})
    centres = (edges[:-1] - t0 + width / 2) / 1e6
    return {"origin_ns": t0, "width_ns": width, "x_ms": [round(float(x), 6) for x in centres], "members": members}


def host_steps(events: pl.DataFrame) -> pl.DataFrame:
    """The trace's step windows per trace, as the summary and ``analyze --step`` find them
    (:func:`traceparse.measures.steps.step_series`: ``ProfilerStep#N``, else step ranges, else optimizer marks)."""
    from traceparse.measures.steps import step_series

    return step_series(events)


def step_busy(events: pl.DataFrame) -> dict | None:
    """Per step and member: the step's duration and the member's GPU busy and idle time inside the step's window.

    Returns ``{"steps": [N, ...], "members": [{"label", "step": [...], "duration_ns": [...], "busy_ns": [...],
    "idle_ns": [...]}]}`` or None when the trace has no step annotations or no timed GPU activity.
    """
    s = host_steps(events)
    unions = gpu_unions(events)
    if s.height == 0 or not unions:
        return None
    members = []
    for (trace_id, rank, device), (starts, ends) in unions.items():
        own = s.filter(pl.col("trace_id") == trace_id) if trace_id is not None else s
        if own.height == 0:
            continue
        a, b = own["start_ns"].to_numpy(), own["end_ns"].to_numpy()
        busy = busy_until(starts, ends, b) - busy_until(starts, ends, a)
        window = b - a
        members.append({"label": member_label(rank, device), "step": own["step"].to_list(),
                        "duration_ns": own["duration_ns"].to_list(), "busy_ns": [int(x) for x in busy],
                        "idle_ns": [int(w - x) for w, x in zip(window, busy)]})
    if not members:
        return None
    return {"steps": sorted({n for m in members for n in m["step"]}), "members": members}


def kernel_categories(events: pl.DataFrame) -> list[dict]:
    """Kernel time per category (:func:`traceparse.measures.time_by_category`), largest first: ``[{"category",
    "time_ns", "calls"}]``; categories without a duration are left out."""
    by = (measures.time_by_category(events).filter(pl.col("time_ns").is_not_null())
          .group_by("category").agg(pl.col("time_ns").sum(), pl.col("calls").sum())
          .filter(pl.col("time_ns") > 0).sort(["time_ns", "category"], descending=[True, False]))
    return by.to_dicts()


def kernel_names(events: pl.DataFrame, top: int = TOP_NAMES) -> dict:
    """Kernel time per name (timed events preferred over aggregated rows): the ``top`` names, largest first,
    and the rest summed: ``{"names": [{"name", "time_ns", "calls"}], "rest_ns", "rest_names", "total_ns"}``."""
    by = (measures.time_by_name(events, kinds=("kernel",)).filter(pl.col("time_ns").is_not_null())
          .group_by("name").agg(pl.col("time_ns").sum(), pl.col("calls").sum())
          .filter(pl.col("time_ns") > 0).sort(["time_ns", "name"], descending=[True, False]))
    head, rest = by.head(top), by.slice(top)
    return {"names": head.to_dicts(), "rest_ns": int(rest["time_ns"].sum() or 0), "rest_names": rest.height,
            "total_ns": int(by["time_ns"].sum() or 0)}


def copies(events: pl.DataFrame) -> list[dict]:
    """Copies per direction (:func:`traceparse.measures.copy_stats`): ``[{"direction", "copies", "bytes",
    "time_ns"}]``, most time first; a direction the trace does not say is ``unknown``."""
    stats = measures.copy_stats(events)
    if stats.height == 0:
        return []
    by = (stats.group_by(direction=pl.col("copy_kind").fill_null("unknown"))
          .agg(pl.col("copies").sum(), pl.col("bytes").sum(), pl.col("time_ns").sum())
          .sort(["time_ns", "direction"], descending=[True, False], nulls_last=True))
    return by.to_dicts()


def _member_name(waits: pl.DataFrame):
    """How the collective charts name a member: ``rank N`` in a run, ``GPU N`` for the devices of one process."""
    word = "rank" if waits["rank"].is_not_null().any() else "GPU"
    return lambda member: f"{word} {member}" if member is not None else "process"


def collective_lateness(events: pl.DataFrame) -> dict | None:
    """At each collective (in the order they complete), how late each member arrived and the wait that caused.

    From :data:`traceparse.measures.collective_waits` (the stragglers rule's measure): a member's lateness
    at an instance is its arrival − the first member's arrival; the wait caused there is Σ over the other
    members of their wait for the last to arrive, put down to that last member, each moment of a member's
    waiting counted once and inside its steps
    (:func:`~traceparse.measures.comm.waiting_by_instance`), so the instances add up to the time the members
    waited (:func:`rank_steps`), not more.
    Returns ``{"collectives": [{"label", "last", "caused_ns"}], "members": [{"member", "label",
    "late_ns": [...]}]}`` (``late_ns`` in the order of ``collectives``, None where the member lacks the
    instance), or None with fewer than two members or no instance that two share.
    """
    waits = measures.collective_waits(events)
    if waits.height == 0 or waits["member"].n_unique() < 2:
        return None
    shared = waits.filter(pl.col("members") > 1)
    if shared.height == 0:
        return None
    from traceparse.measures.comm import member_compute, member_windows, waiting_by_instance

    name = _member_name(waits)
    inst = ["process_group", "instance"]
    waited = waiting_by_instance(waits, member_windows(events, waits), member_compute(events, waits))
    caused = waited.group_by(inst).agg(caused=pl.col("waited_ns").sum())
    order = (shared.group_by(inst, maintain_order=True)
             .agg(first=pl.col("arrival_ns").min(), last_arrival=pl.col("last_arrival_ns").first(),
                  last=pl.col("last_member").first(), collective=pl.col("collective").first())
             .join(caused, on=inst, how="left", nulls_equal=True)
             .with_columns(pl.col("caused").fill_null(0))
             .sort(["last_arrival", "process_group", "instance"], nulls_last=False))
    groups = order["process_group"].drop_nulls().n_unique()
    collectives = [{"label": f"#{i} {r['collective']}" + (f" (group {r['process_group']})" if groups > 1 else ""),
                    "last": name(r["last"]), "caused_ns": int(r["caused"])}
                   for i, r in enumerate(order.iter_rows(named=True), 1)]
    position = {(r["process_group"], r["instance"]): i for i, r in enumerate(order.iter_rows(named=True))}
    first = {(r["process_group"], r["instance"]): r["first"] for r in order.iter_rows(named=True)}
    members = []
    for member in sorted(shared["member"].unique().to_list(), key=lambda m: (m is None, m or 0)):
        late: list[int | None] = [None] * len(collectives)
        mine = shared.filter(pl.col("member") == member) if member is not None else shared.filter(
            pl.col("member").is_null())
        for r in mine.iter_rows(named=True):
            key = (r["process_group"], r["instance"])
            late[position[key]] = int(r["arrival_ns"] - first[key])
        members.append({"member": member, "label": name(member), "late_ns": late})
    return {"collectives": collectives, "members": members}


def rank_steps(events: pl.DataFrame) -> list[dict] | None:
    """Per member of the collectives (a run's ranks): its step time, and how much of it it spent waiting at
    collectives for the last member to arrive, as the stragglers rule counts them
    (:func:`traceparse.measures.comm.member_windows`, :func:`~traceparse.measures.comm.waiting_time`: each
    wait counted once, inside the member's steps, so ``waited_ns`` ≤ ``step_ns``; a device's wait where its
    compute kernels run nothing). ``[{"member", "label",
    "steps", "step_ns", "waited_ns"}]`` by member, or None with fewer than two members."""
    from traceparse.measures.comm import member_compute, member_windows, waiting_time

    waits = measures.collective_waits(events)
    if waits.height == 0 or waits["member"].n_unique() < 2:
        return None
    name = _member_name(waits)
    windows = member_windows(events, waits)
    busy = member_compute(events, waits)
    waited = dict(waiting_time(waits, windows, busy).iter_rows())
    rows = []
    for member in sorted(windows, key=lambda m: (m is None, m or 0)):
        spans = windows[member]
        rows.append({"member": member, "label": name(member), "steps": len(spans),
                     "step_ns": int(sum(b - a for a, b in spans)), "waited_ns": int(waited.get(member, 0))})
    return rows


def roofline_points(trace, gpu: str | None = None) -> dict | None:
    """The roofline by kernel name (:func:`traceparse.measures.roofline.roofline`) with the GPU's roofs, or None
    when the trace has no FLOP counts: ``{"gpu", "gpu_source", "peaks", "points": [{"name", "ai", "gflops",
    "time_ns", "precision", "bound"}]}`` (points with both an intensity and a rate only)."""
    from traceparse.catalog import gpu_for_trace
    from traceparse.measures.roofline import roofline

    spec, how = gpu_for_trace(trace, gpu)
    result = roofline(trace, spec, group="name")
    if result["source"] == "none":
        return None
    points = [{"name": i["name"], "ai": i.get("arithmetic_intensity"), "gflops": i.get("achieved_gflops"),
               "time_ns": i.get("time_ns"), "precision": i.get("precision"), "bound": i.get("bound")}
              for i in result["items"]]
    points = [p for p in points if p["ai"] and p["gflops"] and p["ai"] > 0 and p["gflops"] > 0]
    if not points:
        return None
    precisions = ["fp32"] + sorted({p["precision"] for p in points if p["precision"]}
                                   | set(result["extra"].get("flops_by_precision", {})))
    peaks = result["peaks"] or {}
    roofs = [(p, peaks[p]) for p in dict.fromkeys(precisions) if p in peaks] if "dram" in peaks else []
    return {"gpu": spec["name"] if spec else None, "gpu_source": how, "dram_gbps": peaks.get("dram"),
            "roofs": sorted(roofs, key=lambda r: r[1]), "points": points, "source": result["source"]}


def critical_path(events: pl.DataFrame, names: dict | None = None) -> dict | None:
    """Each step's critical path over a per-rank timeline (docs/critical_path.md).

    Per step, the path of the rank whose step took longest (it holds the step; the others' paths join it at the
    collectives they waited at), from :func:`traceparse.measures.step_paths.step_paths`. Rows: a run's
    ranks (``rank N``); for one trace, its threads and streams (``thread T``, ``stream S``). Returns
    ``{"t0_ns", "ranks", "rows": [labels], "steps": [{"row", "step", "start_ns", "end_ns"}], "segments": [{"row",
    "step", "kind", "name", "lane", "start_ns", "end_ns"}], "crossings": [{"step", "at_ns", "from_row",
    "to_row"}], "paths_drawn", "paths"}`` (segments in time order, zero-length ones left out; crossings: where the
    path moves to another rank), or None without host events on a thread (the GPU streams' order alone) or
    without a path. Every step is drawn; the segments of at most :data:`MAX_PATH_SEGMENTS`, those of the slowest
    steps' paths that fit (``paths_drawn`` of ``paths``; at least the slowest one).
    """
    from traceparse.measures.step_paths import step_paths

    paths, segments, on_threads = step_paths(events)
    if not on_threads or paths.height == 0:
        return None
    ranked = paths["rank"].is_not_null().any()
    chosen = (paths.with_columns(_k=pl.col("step").fill_null(-1), _len=pl.col("end_ns") - pl.col("start_ns"))
              .sort(["_k", "_len", "rank"], descending=[False, True, False], nulls_last=True)
              .group_by("_k", maintain_order=True).first())
    mine = segments.join(chosen.select("trace_id", "step"), on=["trace_id", "step"], how="semi", nulls_equal=True)
    lane = expr.lane_label(names)
    mine = mine.filter(pl.col("duration_ns") > 0)
    if mine.height == 0:  # paths of zero length only (a step's end at an instant marker): nothing to draw
        return None
    drawn = _slowest_that_fit(mine, chosen)
    mine = (mine.join(drawn, on=["trace_id", "step"], how="semi", nulls_equal=True).with_columns(lane=lane)
            .sort("step", "start_ns", nulls_last=False))
    if ranked:
        ranks = sorted(set(paths["rank"].to_list()) | set(mine["segment_rank"].to_list()),
                       key=lambda r: (r is None, r or 0))
        rows = [f"rank {r}" for r in ranks]
        row_of = lambda r: f"rank {r['segment_rank']}"  # noqa: E731
        steps = [{"row": f"rank {r}", "step": s, "start_ns": a, "end_ns": b}
                 for r, s, a, b in paths.select("rank", "step", "start_ns", "end_ns").sort("rank", "step").iter_rows()]
    else:
        lanes = mine.select("lane", host=pl.col("tid").is_not_null(), n=pl.coalesce("tid", "stream_id")).unique()
        rows = [r[0] for r in sorted(lanes.rows(), key=lambda r: (not r[1], r[2] if r[2] is not None else 0))]
        row_of = lambda r: r["lane"]  # noqa: E731
        steps = [{"row": row, "step": s, "start_ns": a, "end_ns": b} for row in rows
                 for s, a, b in paths.select("step", "start_ns", "end_ns").sort("step").iter_rows()]
    out_segments = [{"row": row_of(r), "step": r["step"], "kind": r["segment"], "name": r["name"], "lane": r["lane"],
                     "start_ns": r["start_ns"], "end_ns": r["end_ns"]} for r in mine.iter_rows(named=True)]
    crossings = [{"step": b["step"], "at_ns": b["start_ns"], "from_row": a["row"], "to_row": b["row"]}
                 for a, b in zip(out_segments, out_segments[1:])
                 if ranked and a["step"] == b["step"] and a["row"] != b["row"]]
    t0 = min(s["start_ns"] for s in steps)
    return {"t0_ns": t0, "ranks": ranked, "rows": rows, "steps": steps, "segments": out_segments,
            "crossings": crossings, "paths_drawn": drawn.height, "paths": chosen.height}


def _slowest_that_fit(segments: pl.DataFrame, chosen: pl.DataFrame) -> pl.DataFrame:
    """``trace_id``, ``step`` of the paths of ``chosen`` (one per step) whose ``segments`` are drawn: all of them
    within :data:`MAX_PATH_SEGMENTS`, else the slowest steps' (by ``_len``) as long as they fit, at least one."""
    counts = segments.group_by("trace_id", "step").agg(_n=pl.len())
    paths = (chosen.select("trace_id", "step", "_len").join(counts, on=["trace_id", "step"], how="left",
                                                          nulls_equal=True)
             .with_columns(pl.col("_n").fill_null(0)).sort(["_len", "step"], descending=[True, False], nulls_last=True))
    fits = (pl.col("_n").cum_sum() <= MAX_PATH_SEGMENTS) | (pl.int_range(pl.len()) == 0)
    return paths.filter(fits).select("trace_id", "step")
