"""Rule ``hotspots``: routines ranked by exclusive time, per thread and over all threads (pprof's first table).

Definition: the rows of the kinds in ``thresholds["kinds"]`` (routines of
profiles, operators, kernels, API calls, copies). A row's time is its
``exclusive_ns`` where the source gives it (TAU); else, for a timed
host-side event that nests on its thread (operators, annotations, API
calls, Python regions), its self time: its duration minus that of its
direct children on the same (pid, tid), as torch's ``key_averages()``
self time; else its ``duration_ns`` (kernels and copies, where the two are
the same, and aggregated summaries). A profile with call paths (TAU) holds each routine both
flat and once per call path (``call_path`` containing `` => ``); only the
flat rows count, as in pprof's totals. When a kind has both timed events
and aggregated rows (a trace and its summary), only the timed ones count.
A GPU stream's sync spans (``sync`` rows with no thread id: the stream
waiting on an event) are no work of the device and are left out.

A thread is (``pid``, ``device_id``, ``tid``): TAU's node, context, thread;
shown as ``pid/tid (name)`` where the trace names its threads.
Threads are compared only with their peers: threads of the same role (``main``
for a thread whose id is its process id, else the thread's name without a
trailing number: ``pt_autograd_0`` and ``pt_autograd_1`` are peers; the main
thread and the autograd thread, which runs the backward pass by design, are
not; a thread the trace does not name is a ``gpu`` thread when it has GPU
activity (kernels, copies, memsets: TAU's CUDA and OpenCL threads), else one
of the unnamed threads, all peers as in pprof). Per routine (name and kind):
``time_ns`` = sum over threads; ``threads`` = threads where it ran; per
role, over the T threads of that role that have rows of its kind (GPU
devices for kernels, host threads for operators), mean = time in the role /
T, min and max (0 on a thread where it did not run, as pprof's mean counts
it) and max/mean (1 = even, T = all on one thread); ``mean_ns``, ``min_ns``,
``max_ns``, ``imbalance`` and ``peers`` (T) are those of the role that holds
most of the routine's time, named in ``role`` (``mean_ns`` is per thread of
that role, shown as "mean in role"; the mean of one call is ``per_call_ns`` =
time_ns / calls, nvprof's Avg).
``share_pct`` = 100 × time_ns / the total. The second finding
lists each thread's top routines with their share of that thread's time.
Severity is warning when a routine holding at least
``imbalance_min_share_pct`` of the time has ``imbalance`` ≥
``imbalance_warning`` among several peers and runs on at least two threads
(a routine on one thread alone, ``main``, ``MPI_Finalize`` on an OpenMP
master thread, a serial section, is where it is by design: its imbalance is
listed, not warned of); copies and memsets are listed but never warn (they
run on the device their data goes to; the copy rules judge them).

On a run whose collectives run as communication kernels (NCCL, RCCL), a
communication kernel's time is partly waiting: the kernel starts when its
stream reaches it and spins until every rank's kernel of the same
collective has started. Each such kernel listed has ``waiting_ns``: over
its instances, min(last member's kernel start − its start, its duration)
(the collectives matched across ranks as stragglers matches them), and ``comm_waiting_ns``
sums it over every communication kernel. Where the leader is one, the
message says how much of it is waiting: a kernel that leads the table
because it waits for a late rank points at that rank (stragglers), not at
itself. So does a leader that is a blocking wait on the host (a functional
collective's ``wait_tensor`` over gloo, which runs the exchange on a worker
thread): all of its time is waiting.
"""

from __future__ import annotations

import polars as pl

from traceparse import expr, measures
from traceparse.expr import GPU_KINDS
from traceparse.measures.comm import BLOCKING_WAITS, kernel_spin
from traceparse.measures.routines import routine_choices, routine_time
from traceparse.measures.steps import step_free
from traceparse.plugins import hookimpl
from traceparse.figures import fmt_count, fmt_ns, fmt_pct, fmt_ratio, shares_shown
from traceparse.meta import OUTSIDE_ROUTINES, SUMMED_THREADS
from traceparse.summary import trace_span
from traceparse.verdict import QUIET_SHARE
from traceparse.rule import Column, Finding, Rule, RuleOptions, grade
from traceparse.run import rank_labels, rank_of
from traceparse.schema import ASYNC_GROUP
from traceparse.meta import device_nouns
from traceparse.threads import thread_label, thread_names, thread_role
from traceparse.trace import Trace

#: What makes a thread: its rank on a run (null in one trace: ranks' processes may share ids), process, device, id.
THREAD = ["rank", "pid", "device_id", "tid"]
#: Kinds whose spread over threads is placement, not load: a copy runs on the device its data goes to.
PLACED_KINDS = ("memcpy", "memset")
#: The kind of annotations (record_function, NVTX ranges, ProfilerStep#N): ranked in a table of their own.
MARKER = "marker"
#: The row counts of how self time was had (the source's exclusive times, nesting, inclusive only) are said only
#: where nonzero (``problem_count``): a torch trace has no exclusive times, and "exclusive rows 0" said nothing.
FIGURES = {"time_ns": "ns", "threads": "count", "routines": "count", "callpath_rows_skipped": "problem_count",
           "aggregated_rows_skipped": "problem_count", "exclusive_rows": "problem_count",
           "self_time_rows": "problem_count", "inclusive_only_rows": "problem_count"}
#: Screen labels where the key's words would read like another figure: the routines' self time over all threads (not
#: another rule's time); ``threads`` counts a device's lanes too, which the message names apart ("on 2 threads and
#: 1 GPU": 3).
LABELS = {"time_ns": "self time", "threads": "threads and device lanes",
          # kernels and copies too, whose duration is their own time: "inclusive only rows 9" beside the
          # sentence's "6 operator/region/API rows have no exclusive time" read as two counts of one thing
          "inclusive_only_rows": "rows ranked by their duration"}
COLUMNS = [Column("name", "name", "name"), Column("kind", "kind", "text"), Column("calls", "calls", "count"),
           Column("time_ns", "time", "ns"), Column("per_call_ns", "per call", "ns"),
           Column("inclusive_ns", "inclusive", "ns"),
           Column("share_pct", "share %", "pct"), Column("threads", "threads", "count"),
           Column("role", "role", "text"), Column("peers", "role's threads", "count"),
           Column("mean_ns", "mean in role", "ns"), Column("min_ns", "min", "ns"), Column("max_ns", "max", "ns"),
           Column("imbalance", "imbalance", "ratio")]
#: The columns of a routine's spread over threads: not shown where no row has a thread (a summary's totals).
PER_THREAD = {"threads", "role", "mean_ns", "min_ns", "max_ns", "imbalance", "peers"}
#: A communication kernel's time spent waiting for the other ranks (a column only where an item has it).
WAITING = Column("waiting_ns", "waiting", "ns")
THREAD_COLUMNS = [Column("thread", "thread", "text"), Column("name", "name", "name"), Column("kind", "kind", "text"),
                  Column("calls", "calls", "count"), Column("time_ns", "time", "ns"),
                  Column("inclusive_ns", "inclusive", "ns"), Column("share_pct", "share %", "pct")]


class Hotspots(Rule):
    name = "hotspots"
    cost = 2  # the nesting of every host event
    description = "Routines ranked by exclusive time, per thread and over threads (mean, min, max, imbalance)"
    definition = __doc__
    thresholds = {
        "top": 15,                          # routines listed
        "per_thread_top": 5,                # routines listed per thread
        "max_threads": 16,                  # threads listed in the per-thread finding (those with most time)
        "imbalance_warning": 2.0,           # max/mean at or above this is a warning ...
        "imbalance_min_share_pct": 10.0,    # ... for a routine with at least this share of the time
        "kinds": ["region", "kernel", "op", "api", "marker", "memcpy", "memset", "sync"],
    }
    kinds = ("region", "kernel", "op")

    def check(self, trace: Trace, options: RuleOptions) -> list[Finding]:
        t = options.thresholds
        events = trace.events  # a run's events are read rank by rank: the rows are summed per routine and thread
        # asynchronous spans overlap on their lane: no exclusive time is theirs. A table with none is taken as it is
        # (one column looked at): a filter that keeps every row still copied all fifty-odd columns of it
        if "group" in events.columns and (not isinstance(events, pl.DataFrame)
                                          or events.select((pl.col("group") == ASYNC_GROUP).any()).item()):
            events = events.filter(pl.col("group").ne_missing(ASYNC_GROUP))
        chosen = routine_choices(events, t["kinds"])
        nested, dropped = chosen["nested"], chosen["dropped"]
        routines = routine_time(events, kinds=tuple(t["kinds"]), drop_nested=chosen["drop_nested"],
                                drop_aggregated=tuple(chosen["drop_aggregated"]))
        ranks = rank_labels(trace)
        routines = routines.with_columns(rank=rank_of(ranks))
        every = routines.group_by(["name", "kind", *THREAD]).agg(pl.col("time_ns", "inclusive_ns", "calls").sum())
        names = thread_names(trace.meta)
        every = every.join(_roles(every, names), on=THREAD, how="left", nulls_equal=True)
        marker = pl.col("kind") == MARKER  # annotations: a table of their own (what runs inside them is elsewhere)
        # instants (a Chrome trace's "i" events, markers of no duration) are no annotation of any span: left out
        # a GPU stream's sync spans (Kineto's cuda_sync: the stream waiting on an event) are no work of the device
        gpu_wait = (pl.col("kind") == "sync") & pl.col("tid").is_null()
        per_thread, marks = every.filter(~marker & ~gpu_wait), every.filter(marker & (pl.col("inclusive_ns") > 0))
        routines = routines.filter(pl.col("kind") != MARKER)
        # where no row has a thread, device or thread id (a summary's totals) they ran on no thread the source names
        placed = bool(per_thread.select(pl.any_horizontal(pl.col("pid", "device_id", "tid").is_not_null()).any())
                      .item())
        n_threads = per_thread.select(THREAD).unique().height if placed else 0
        n_processes = per_thread.filter(pl.col("pid").is_not_null()).select("rank", "pid").unique().height
        per_kind = per_thread.select("kind", *THREAD).unique().group_by("kind").agg(kind_threads=pl.len()).sort("kind")
        total = int(per_thread["time_ns"].sum() or 0)
        by_name, items = _ranked(per_thread, total, int(t["top"]))
        imbalanced = [i for i in items if i["imbalance"] is not None and i["peers"] > 1 and i["threads"] > 1
                      and i["kind"] not in PLACED_KINDS
                      and i["share_pct"] is not None and i["share_pct"] >= t["imbalance_min_share_pct"]
                      and grade(i["imbalance"], warning=t["imbalance_warning"]) != "info"]
        metrics = {"time_ns": total, "threads": n_threads, "processes": n_processes, "routines": by_name.height,
                   "threads_per_kind": dict(zip(per_kind["kind"], per_kind["kind_threads"])),
                   "thread_roles": sorted(r for r in per_thread["role"].unique().to_list() if r),
                   "callpath_rows_skipped": nested, "aggregated_rows_skipped": dropped,
                   "exclusive_rows": int(routines["exclusive_rows"].sum()),
                   "self_time_rows": int(routines["self_time_rows"].sum()),
                   "inclusive_only_rows": int(routines["inclusive_only_rows"].sum())}
        comm = [i["name"] for i in items if i["kind"] == "kernel"]  # listed kernels that are communication
        comm = pl.select(expr.collective(pl.lit(pl.Series(comm, dtype=pl.String)))).to_series().drop_nulls() \
            if comm else []
        waiting = _waiting(events) if len(comm) else {}
        for item in items:
            if item["kind"] == "kernel" and item["name"] in waiting:
                item["waiting_ns"] = waiting[item["name"]]
        summed_over = (trace.meta.extra or {}).get(SUMMED_THREADS)  # rows with no thread: totals over these
        nouns = device_nouns(trace.meta)
        places = _places(per_thread)  # each thread key: a thread, a device's lane or a process's rows
        # each share as the table shows it (rounded so that the shares of the whole add up to 100): the sentence
        # and the summary's line give the table's value, not "97.5%" above a row of 97.6%
        shown = shares_shown([i["share_pct"] for i in items])
        if items:
            top = items[0]
            summed = _busiest(per_thread, places, nouns, _streams(events)) if n_threads > 1 else ""
            where = " " + _threads_and_lanes(places, n_processes, nouns)
            if not n_threads:  # a summary's totals: on no thread the source names
                where, summed = "", (f" (summed over {summed_over:,} threads: the source gives their total only)"
                                     if summed_over and summed_over > 1 else " (totals: the source names no thread)")
            # a host call and the GPU work it waits for, summed into one whole, are not "the time": said so (an
            # nvprof summary's cudaMemcpy "led with 47.0%" of 2.85 s of calls and kernels that overlap)
            kinds = set(per_thread["kind"].unique().to_list())
            lanes_said = n_threads > 1 and bool((places["place"] == "device").any())  # "over the threads and devices"
            mixed = (" (the host's calls and the GPU's work summed: they overlap in time)"
                     if kinds & set(GPU_KINDS) and kinds - set(GPU_KINDS) and not lanes_said else "")
            message = (f"{fmt_count(by_name.height, 'routine')}{where}, {fmt_ns(total)} in all"
                       f"{summed}{mixed}; "
                       f"{top['name']!r} leads with {fmt_pct(shown[0])} ({fmt_ns(top['time_ns'])}"
                       f"{', imbalance ' + fmt_ratio(top['imbalance']) if n_threads > 1 else ''}).")
            if top["name"] == (trace.meta.extra or {}).get(OUTSIDE_ROUTINES):
                message += (f" {top['name']!r} is the time in no instrumented routine: code the profile did not "
                            "instrument, or threads idle between parallel regions (worker threads waiting for "
                            "work); the routines after it are where the instrumented time went.")
            if top["name"] in BLOCKING_WAITS:
                message += (f" {top['name']!r} is a wait: it blocks its thread until a collective is done, so "
                            "its time is the exchange and the other ranks' lateness (stragglers says whose), not "
                            "work of its own.")
            if top.get("waiting_ns"):
                message += (f" {fmt_ns(top['waiting_ns'])} of its time "
                            f"({fmt_pct(expr.pct(top['waiting_ns'], top['time_ns']))}) is the kernel spinning until "
                            "the other ranks' kernels of the same collective start: time lost waiting for a later "
                            "rank (stragglers says which), not work of its own.")
        else:
            message = "No routine time in this trace." + _counters_only(events)
        nested_inclusive = int(routines["host_inclusive_rows"].sum())
        if metrics["self_time_rows"]:
            lanes = bool(chosen["device_lane_rows"])
            nested_where = "host and device-lane" if lanes else "host"
            how = " (a device's XLA lanes nest as one thread: a module over its ops)" if lanes else ""
            message += (f" Self time of {metrics['self_time_rows']:,} nested {nested_where} events computed from "
                        f"their nesting on each thread{how}.")
        if nested_inclusive:
            message += (f" {nested_inclusive} operator/region/API rows have no exclusive time in this source and count "
                        "with their inclusive time (nested calls also count in their callers).")
        suggestion = ""
        if imbalanced:
            worst = max(imbalanced, key=lambda i: i["imbalance"])
            message += (f" {len(imbalanced):,} of the top routines {'is' if len(imbalanced) == 1 else 'are'} unevenly "
                        "spread over threads; "
                        f"{worst['name']!r}: max/mean {fmt_ratio(worst['imbalance'])}.")
            suggestion = ("Balance the work of the imbalanced routines across threads/ranks, or overlap the waiting "
                          "it causes; then optimise the top routine, which bounds any speed-up elsewhere.")
        if waiting:
            metrics["comm_waiting_ns"] = sum(waiting.values())
        columns = ([c for c in COLUMNS if c.key not in PER_THREAD] if not n_threads else COLUMNS) \
            + ([WAITING] if any("waiting_ns" in i for i in items) else [])
        # a trace with no GPU work has no "top kernels" line: its summary names the routines that hold its time,
        # where they hold a part of it worth naming (not 4 us of aten::empty in a 1.3 s trace of annotations)
        span = trace_span(events)
        # no GPU work and no device's lanes (a TPU's ops: the summary names those itself)
        cpu_only = (bool(items) and not per_thread["kind"].is_in(list(GPU_KINDS)).any()
                    and not (places["place"] == "device").any() and not (span and total < QUIET_SHARE * span))
        over = (" summed over the threads" if n_threads > 1 else
                f" summed over {summed_over:,} threads" if not n_threads and (summed_over or 0) > 1 else "")
        top_line = (("top routines", ", ".join(f"{i['name']} {fmt_pct(v)}" for i, v in zip(items[:3], shown))
                     + f" of {fmt_ns(total)}{over}") if cpu_only else None)
        findings = [Finding(self.name, "warning" if imbalanced else "info", "Hotspots: routines by exclusive time",
                            message, suggestion, metrics=metrics, items=items, columns=columns, summary=top_line,
                            figures={**{k: v for k, v in FIGURES.items() if n_threads or k != "threads"},
                                     **({"comm_waiting_ns": "ns"} if waiting else {})},
                            labels={**LABELS, "comm_waiting_ns": "comm kernels waiting, summed per kernel"})]
        if n_threads:  # a table per thread where there are threads
            findings.append(self._per_thread(per_thread, t, names, nouns))
        if marks.height:
            findings.append(self._annotations(marks, t))
        return findings

    def _annotations(self, marks: pl.DataFrame, t: dict) -> Finding:
        """The annotations' own table: their self time by name over all threads, as the routines'."""
        # ProfilerStep#3, an NVTX range "step 3": every step's one row
        marks = marks.with_columns(name=step_free(pl.col("name")).str.replace(r"#\d+$", "#N"))
        marks = marks.group_by(["name", "kind", *THREAD, "role"]).agg(pl.col("time_ns", "inclusive_ns", "calls").sum())
        total = int(marks["time_ns"].sum() or 0)
        by_name, items = _ranked(marks, total, int(t["top"]))
        threads = marks.select(THREAD).unique().height
        message = (f"{by_name.height:,} annotations (record_function, NVTX, step ranges) on {threads:,} thread(s), "
                   f"{fmt_ns(total)} of self time: the time inside an annotation that no operator, runtime call or "
                   "nested annotation accounts for (a step annotation's is what its thread did untraced or waited).")
        uneven = [i for i in items if i["peers"] > 1 and i["imbalance"] is not None
                  and grade(i["imbalance"], warning=t["imbalance_warning"]) != "info"]
        if uneven:
            worst = max(uneven, key=lambda i: (i["max_ns"] - i["mean_ns"], i["name"]))
            message += (f" {worst['name']!r} is uneven: {fmt_ns(worst['max_ns'])} on its busiest thread against "
                        f"{fmt_ns(worst['mean_ns'])} on the mean of its {worst['peers']} peers "
                        f"({fmt_ratio(worst['imbalance'])}).")
        return Finding(self.name, "info", "Hotspots: annotations by self time", message,
                       metrics={"time_ns": total, "annotations": by_name.height, "threads": threads}, items=items,
                       columns=[c for c in COLUMNS if c.key != "kind"],
                       figures={"time_ns": "ns", "annotations": "count", "threads": "count"},
                       labels={"time_ns": "annotation self time", "threads": "annotated threads"})

    def _per_thread(self, per_thread: pl.DataFrame, t: dict, names: dict, nouns: dict) -> Finding:
        totals = per_thread.group_by(THREAD).agg(thread_ns=pl.col("time_ns").sum())
        chosen = totals.sort(["thread_ns", *THREAD], descending=[True] + [False] * len(THREAD),
                             nulls_last=True).head(int(t["max_threads"]))
        ranked = (per_thread.join(chosen, on=THREAD, how="inner", nulls_equal=True)
                  .sort(["thread_ns", *THREAD, "time_ns", "name"],
                        descending=[True] + [False] * len(THREAD) + [True, False], nulls_last=True)
                  .group_by(THREAD, maintain_order=True).head(int(t["per_thread_top"])))
        items = [
            {"thread": (f"rank {r['rank']}: " if r["rank"] is not None else "")
             + thread_label(r["pid"], r["device_id"], r["tid"], names, nouns),
             **({"rank": r["rank"]} if r["rank"] is not None else {}), "pid": r["pid"],
             **({"device_id": r["device_id"]} if r["device_id"] is not None else {}), "tid": r["tid"],
             "thread_name": names.get((r["pid"], r["tid"])), "name": r["name"], "kind": r["kind"],
             "calls": r["calls"], "time_ns": r["time_ns"], "inclusive_ns": r["inclusive_ns"],
             "share_pct": _round(100.0 * r["time_ns"] / r["thread_ns"]) if r["thread_ns"] else None}
            for r in ranked.iter_rows(named=True)
        ]
        message = (f"Top {t['per_thread_top']} routines of each of {chosen.height:,} of {totals.height:,} threads "
                   "(threads with the most time first).")
        return Finding(self.name, "info", "Hotspots per thread", message,
                       metrics={"threads": totals.height, "threads_listed": chosen.height}, items=items,
                       columns=THREAD_COLUMNS, figures={"threads": "count", "threads_listed": "count"})


def _counters_only(events) -> str:
    """Where routines carry counters but no time (a TAU profile of PAPI counters alone): a sentence naming them,
    so that "no routine time" is not read as "nothing measured"; else nothing."""
    on_routines = ((pl.col("kind") == "counter") & pl.col("parent_id").is_not_null() & pl.col("value").is_not_null()
                   & ~pl.col("name").str.ends_with(" (inc)"))  # a routine's own count, not its inclusive one
    counters = events.filter(on_routines).select(pl.col("name").drop_nulls().unique().sort())
    names = counters.to_series().to_list() if counters.height else []
    if not names:
        return ""
    listed = ", ".join(names[:6]) + (f" and {len(names) - 6:,} more" if len(names) > 6 else "")
    return (f" Its routines carry counters ({listed}) but no time: the profile measured no time metric, and "
            "routines are ranked here by their time.")


def _places(threaded: pl.DataFrame) -> pl.DataFrame:
    """Each thread key of ``threaded`` (:data:`THREAD`) with ``place``: ``device`` (a device's lane: GPU activity
    with no thread id, or a device's line that is no process's, XLA's TPU ops), ``process`` (a process's rows with
    no thread: an nvprof summary's API totals) or ``thread``."""
    keys = threaded.group_by(THREAD).agg(gpu=pl.col("kind").is_in(list(GPU_KINDS)).all())
    no_tid = pl.col("tid").is_null()
    lane = (no_tid & pl.col("gpu")) | (pl.col("pid").is_null() & pl.col("device_id").is_not_null())
    return keys.with_columns(place=pl.when(lane).then(pl.lit("device"))
                             .when(no_tid & pl.col("device_id").is_null()).then(pl.lit("process"))
                             .otherwise(pl.lit("thread")))


def _busiest(per_thread: pl.DataFrame, places: pl.DataFrame, nouns: dict[int, str],
             streams: pl.DataFrame | None = None) -> str:
    """`` (summed over the threads; the busiest thread 17.53 ms)``: the busiest host thread, and the busiest device
    where devices' lanes are counted too (a TPU's 79 s was "the busiest thread"); ``places``: :func:`_places`;
    ``streams``: per ``rank`` and ``device_id``, its GPU activities' ``streams``, whose times run at once and add up
    past the trace's length (said so)."""
    keyed = (per_thread.group_by(THREAD).agg(pl.col("time_ns").sum())
             .join(places, on=THREAD, how="left", nulls_equal=True))
    threads = keyed.filter(pl.col("place") != "device")
    devices = keyed.filter(pl.col("place") == "device").group_by("rank", "device_id").agg(pl.col("time_ns").sum())
    if streams is not None and devices.height:  # (a TPU's lanes nest as one thread: their times do not add up)
        devices = devices.join(streams, on=["rank", "device_id"], how="left", nulls_equal=True)
    parts = []
    if threads.height:
        parts.append(f"the busiest thread {fmt_ns(int(threads['time_ns'].max() or 0))}")
    if devices.height:
        top = devices.sort(["time_ns", "rank", "device_id"], descending=[True, False, False],
                           nulls_last=True).row(0, named=True)  # of equal ones, the first rank's
        noun = nouns.get(top["device_id"], "GPU")
        name = ((f"rank {top['rank']} " if top["rank"] is not None else "")
                + (noun if top["device_id"] is None else f"{noun} {top['device_id']}"))
        # a device's streams run at once: their sum can be longer than the trace ("rank 3 GPU 3, 564.3 ms" in a
        # 405 ms trace), so it is said to be a sum
        lanes = f" summed over its {top['streams']} streams" if (top.get("streams") or 0) > 1 else ""
        parts.append(f"{name} {fmt_ns(int(top['time_ns'] or 0))}{lanes}" if devices.height == 1
                     else f"the busiest {noun}, {name}, {fmt_ns(int(top['time_ns'] or 0))}{lanes}")
    over = "the threads" + (" and devices" if devices.height else "") if threads.height else "the devices"
    return f" (summed over {over}; " + ", ".join(parts) + ")"


def _streams(events) -> pl.DataFrame:
    """Per ``rank`` and ``device_id``: how many ``streams`` its GPU activities ran on."""
    return (events.filter(pl.col("kind").is_in(list(GPU_KINDS)) & pl.col("device_id").is_not_null())
            .group_by("rank", "device_id").agg(streams=pl.col("stream_id").n_unique().cast(pl.Int64)))


def _threads_and_lanes(places: pl.DataFrame, processes: int, nouns: dict[int, str]) -> str:
    """Where the routines ran, as a reader counts, from :func:`_places`: "3 threads of 2 processes and 1 GPU" (GPU
    activity with no thread id, a device's kernels, is a lane of that device: ``TPU`` where the trace says the
    device is one; a process's rows with no thread, a summary's, are of that process)."""
    hosts = places.filter(pl.col("place") == "thread").height
    lanes = places.filter(pl.col("place") == "device")
    bare = places.filter(pl.col("place") == "process").height
    words = []
    if hosts:
        words.append("on " + fmt_count(hosts, "thread") + (f" of {processes:,} processes" if processes > 1 else ""))
    if lanes.height:
        devices = lanes.select("rank", "device_id").unique()
        kinds = {nouns.get(d, "GPU") for d in devices["device_id"].to_list()}
        words.append(("on " if not words else "") + fmt_count(devices.height, kinds.pop() if len(kinds) == 1
                                                             else "device"))
    if bare:
        words.append(f"of {fmt_count(bare, 'process', 'processes')} (no thread given)")
    return " and ".join(words)


def _waiting(events) -> dict[str, int]:
    """Per communication kernel name, the time its instances spun waiting for the last member of their
    collective to start its kernel (:data:`traceparse.measures.collective_waits` on device arrivals: an NCCL
    kernel starts when its stream reaches it and spins until every rank's has started); {} where the
    collectives are not matched to kernels (gloo, a single GPU)."""
    waits = measures.collective_waits(events, align_clocks=False)  # stragglers' parameters: measured once
    if waits.height == 0 or "kernel_name" not in waits.columns:
        return {}
    rows = (waits.filter((pl.col("arrival") == "device") & pl.col("kernel_name").is_not_null()
                         & (pl.col("members") > 1))
            .group_by("kernel_name").agg(kernel_spin().sum()))
    return {name: int(ns) for name, ns in rows.iter_rows()}


def _roles(per_thread: pl.DataFrame, names: dict) -> pl.DataFrame:
    """Each thread of ``per_thread`` with its role: its name's (:func:`traceparse.threads.thread_role`), else
    ``gpu`` for a thread of GPU activity only (a TAU CUDA/OpenCL thread, a stream), else ``""``: an nvprof
    summary's rows on no thread, API calls and kernels together, are no GPU's (cuLaunchKernel read "role gpu")."""
    threads = per_thread.group_by(THREAD).agg(gpu=pl.col("kind").is_in(list(GPU_KINDS)).all())
    roles = [thread_role(p, t, names) or ("gpu" if g else "") for p, t, g in
             zip(threads["pid"].to_list(), threads["tid"].to_list(), threads["gpu"].to_list())]
    return threads.select(THREAD).with_columns(role=pl.Series(roles, dtype=pl.String))


def _main_role(per_thread: pl.DataFrame) -> pl.DataFrame:
    """Per routine, the role that holds most of its time, with mean/min/max over that role's peers and max/mean.

    The peers of a role are its threads that have rows of the routine's kind;
    a routine counts 0 on a peer where it did not run. Ties go to the more
    uneven role, then to the role's name. (The most uneven role, chosen
    before, was often one where the routine ran microseconds: a TPU trace's
    MapDmaBuffer read "max 0.01 s, imbalance 70×" of 35.7 s, 4.51 s of it on
    one thread of another role.)
    """
    peers = per_thread.select("kind", "role", *THREAD).unique().group_by("kind", "role").agg(peers=pl.len())
    return (per_thread.group_by(["name", "kind", "role"]).agg(
        role_ns=pl.col("time_ns").sum(), present=pl.len(), max_ns=pl.col("time_ns").max(),
        min_present=pl.col("time_ns").min(),
    ).join(peers, on=["kind", "role"]).with_columns(
        min_ns=pl.when(pl.col("present") == pl.col("peers")).then(pl.col("min_present")).otherwise(0),
        mean_ns=pl.col("role_ns") / pl.col("peers"),
    ).with_columns(
        imbalance=pl.when(pl.col("mean_ns") > 0).then(pl.col("max_ns") / pl.col("mean_ns")),
    ).sort(["role_ns", "imbalance", "role"], descending=[True, True, False], nulls_last=True)
     .group_by(["name", "kind"], maintain_order=True).first()
     .select("name", "kind", "role", "mean_ns", "min_ns", "max_ns", "imbalance", "peers"))


def _ranked(per_thread: pl.DataFrame, total: int, top: int) -> tuple[pl.DataFrame, list[dict]]:
    """Per name and kind over the threads of ``per_thread`` (with their roles): time, calls, share of ``total``,
    the spread in the role that holds most of its time; the frame, most time first, and its ``top`` rows as items."""
    by_name = per_thread.group_by(["name", "kind"]).agg(
        time_ns=pl.col("time_ns").sum(), inclusive_ns=pl.col("inclusive_ns").sum(), calls=pl.col("calls").sum(),
        threads=pl.len(),
    ).join(_main_role(per_thread), on=["name", "kind"]).with_columns(
        share_pct=(100.0 * pl.col("time_ns") / total) if total else pl.lit(None, pl.Float64),
    ).sort(["time_ns", "name", "kind"], descending=[True, False, False])
    items = [
        {"name": r["name"], "kind": r["kind"], "calls": r["calls"], "time_ns": r["time_ns"],
         "per_call_ns": round(r["time_ns"] / r["calls"]) if r["calls"] else None,
         "inclusive_ns": r["inclusive_ns"], "share_pct": _round(r["share_pct"]), "threads": r["threads"],
         "mean_ns": _round(r["mean_ns"], 1), "min_ns": r["min_ns"], "max_ns": r["max_ns"],
         "imbalance": _round(r["imbalance"]), "role": r["role"], "peers": r["peers"]}
        for r in by_name.head(top).iter_rows(named=True)
    ]
    return by_name, items


def _round(value, digits: int = 4):
    return None if value is None else round(value, digits)


@hookimpl
def traceparse_rules():
    return [Hotspots()]
