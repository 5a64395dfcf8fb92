"""Rule ``api-share``: where the host's CUDA API time goes, by call and by class of call.

As nvprof's "API calls" section shows it, with the calls grouped by what
they do. Definition: the rows of kind ``api`` (CUDA
runtime and driver calls), timed events and aggregated rows alike, grouped
by name: calls = Σ calls, time_ns = Σ duration_ns, share_pct = 100 ×
time_ns / api_time_ns, where api_time_ns is the total time of all API rows
(so shares add up to 100, like nvprof's Time(%) column of "API calls"). When
the trace has timed API events, aggregated API rows are ignored (they
summarize the same calls). Calls that nest, e.g. a driver call inside a
runtime call where a tool records both, count in both.

Each name gets the first class whose names it starts with (so version
suffixes such as ``_v11060`` or ``_ptsz`` still match): graph_launch
(cudaGraphLaunch, cuGraphLaunch, hipGraphLaunch), launch (cudaLaunch*,
cuLaunch*, hip*Launch*, CUDA 8's cudaConfigureCall and cudaSetupArgument),
memcpy (cudaMemcpy*, prefetches, and their cu/hip twins), memset (cudaMemset*,
cuMemset*, hipMemset*),
synchronize (cudaDeviceSynchronize, cudaStreamSynchronize,
cudaEventSynchronize, cudaStreamWaitEvent, ...), allocation (cudaMalloc*,
cudaFree*, cudaHostAlloc, host registration, memory pools, ...); names
matching none are "other".

Metrics: ``api_time_ns``, ``api_calls``, ``api_names`` (distinct names),
``context_creation_ns`` (where the CUDA context was made by an allocation call,
:func:`_context_creation`: left out of the allocation time that warns and is at stake),
``startup_allocation_ns`` (the other allocation calls a process made before it first gave the GPU work,
:func:`_before_first_work`: start-up, left out too),
``classes`` ({class: {calls, time_ns, share_pct}}), and one
``<class>_share_pct`` per class (graph_launch, launch, memcpy, memset, synchronize,
allocation, other). HIP calls (ROCm builds of PyTorch write them under
the same categories) have the same classes as their CUDA counterparts. A
graph launch (``cudaGraphLaunch``, ``hipGraphLaunch``) is its own class:
one call replays a whole captured graph of kernels. Items: the names with the most time: ``name``, ``class``, ``calls``,
``time_ns``, ``share_pct``, ``shown_pct`` (the share as the table shows it: every call's rounded within its
class's share as shown, so that a class of one call and that call read the same).

On a run, names and classes are merged across the ranks (one row each, its
calls and time summed over the ranks): shares are of the run's total API
time, and items gain ``ranks`` (how many ranks have the name) and
``rank_imbalance`` (the most loaded rank's time over the mean rank's).

Severity: warning when a class's share reaches its ``<class>_warning_pct``
and the class takes at least ``min_class_time_us`` (1 ms: ten launches
taking 80 us in all are 100% of a tiny profile's API time and nothing at
stake).
By default only launch (80%: the host does little but launch kernels,
typical of launch-bound small kernels) and allocation (20%:
allocation in the steady state can be avoided) warn; a host blocked in a
synchronize or a synchronous copy is waiting for the GPU, which is normal
when the GPU is the bottleneck, so those are off (101) unless set lower.
Launch calls (launch, graph_launch) cost the GPU no more than its idle time (gpu-idle's, where the trace times
GPU work): on a busy GPU a launch call waits for room in a full launch queue. Where they take longer, their time
at stake is that idle time (shared between the two classes as their times are), it is what must reach
``min_class_time_us`` to warn, and the message says so.
"""

from __future__ import annotations

import polars as pl

from traceparse import expr, measures
from traceparse.measures.base import picked
from traceparse.plugins import hookimpl
from traceparse.rule import Column, Finding, Rule, RuleOptions, grade
from traceparse.figures import fmt_count, fmt_ns, fmt_pct, share_as_shown, shares_shown, shares_within
from traceparse.run import rank_labels, trace_ranks
from traceparse.trace import Trace
from traceparse.verdict import aggregated_note

CLASSES = expr.API_CLASS_NAMES
FIGURES = {"context_creation_ns": "ns", "startup_allocation_ns": "ns", "api_time_ns": "ns", "api_calls": "count", "api_names": "count",
           **{f"{c}_share_pct": "pct" for c in CLASSES}}
COLUMNS = [Column("name", "name", "name"), Column("class", "class", "text"), Column("calls", "calls", "count"),
           Column("time_ns", "time", "ns"), Column("share_pct", "share %", "pct", shown="shown_pct")]
#: On a run, each call's ranks: on how many it was made, and its most loaded rank's time over the mean rank's.
RUN_COLUMNS = [Column("ranks", "ranks", "count"), Column("rank_imbalance", "rank max/mean", "ratio")]
TABLE = [Column("class", "class", "text"), Column("calls", "calls", "count"), Column("time_ns", "time", "ns"),
         Column("share_pct", "share %", "pct")]

SUGGESTIONS = {
    "graph_launch": ("Most API time is in graph launches: a graph launch replays many kernels, so this is "
                     "usually the cheap side already; check that the graphs are large (kernels_per_graph_launch in "
                     "launch-stats) and launched once per step."),
    "launch": ("The host spends its API time launching kernels: with many short kernels the GPU waits for the "
               "launches. Launch fewer, larger kernels: CUDA graphs (torch.cuda.graphs, torch.compile "
               "mode='reduce-overhead'), kernel fusion (torch.compile), larger batches."),
    "memcpy": ("Synchronous copies block the host: use cudaMemcpyAsync / non_blocking=True from pinned memory, "
               "and fewer, larger copies."),
    "memset": ("Memset calls take a large share: fill buffers once outside the loop, or zero gradients with "
               "optimizer.zero_grad(set_to_none=True) rather than filling them."),
    "synchronize": ("The host often waits for the GPU: remove synchronisations from the step (.item(), .cpu(), "
                    "printing tensors, torch.cuda.synchronize) or move them to the end of the step."),
    "allocation": ("Allocation and release calls take a large share: reuse buffers (a caching allocator or "
                   "memory pool, cudaMallocAsync), allocate once outside the loop, avoid cudaFree in the loop."),
    "other": "Look at the top calls: queries and attribute calls in the loop can usually be hoisted out of it.",
}



class ApiShare(Rule):
    name = "api-share"
    description = "CUDA/HIP API time by call and by class (graph launch, launch, memcpy, memset, synchronize, allocation, other)"
    definition = __doc__
    thresholds = {
        "top": 15,                          # items listed
        "launch_warning_pct": 80.0,         # a class's share of API time at or above its value is a warning
        "graph_launch_warning_pct": 101.0,  # (101: off)
        "memcpy_warning_pct": 101.0,        # (101: off)
        "memset_warning_pct": 101.0,
        "synchronize_warning_pct": 101.0,
        "allocation_warning_pct": 20.0,
        "other_warning_pct": 101.0,
        "min_class_time_us": 1000.0,        # a class taking less time than this never warns
    }
    kinds = ("api",)

    def check(self, trace: Trace, options: RuleOptions) -> list[Finding]:
        t = options.thresholds
        run = bool(rank_labels(trace))
        per_trace = measures.time_by_name(trace.events, kinds=("api",), prefer_timed=True)
        ignored_aggregated = int(per_trace.group_by("trace_id").agg(pl.col("ignored_rows").max())["ignored_rows"].sum()
                                 or 0)
        # a run's ranks are separate traces: every call once, its time summed over the ranks
        api = measures.merge_ranks(per_trace, ["name"], ["calls", "time_ns"], spread="time_ns")
        by_name = (api.select("name", "calls", pl.col("time_ns").fill_null(0), "ranks", "rank_imbalance")
                   .with_columns(**{"class": expr.api_class(pl.col("name"))})
                   .sort(["time_ns", "name"], descending=[True, False]))
        total = int(by_name["time_ns"].sum() or 0)
        calls = int(by_name["calls"].sum() or 0)
        by_class = (measures.merge_ranks(measures.api_classes(trace.events), ["category"], ["calls", "time_ns"])
                    .select("category", "calls", pl.col("time_ns").fill_null(0)))
        per_class = {r["category"]: r for r in by_class.iter_rows(named=True)}
        classes = {c: {"calls": per_class.get(c, {}).get("calls", 0), "time_ns": per_class.get(c, {}).get("time_ns", 0),
                       "share_pct": expr.pct(per_class.get(c, {}).get("time_ns", 0), total)} for c in CLASSES}
        # each share as its table shows it (rounded so that a table of one whole adds up to 100): the title, the
        # sentence and the tables give one value, not "launch (88.1%)" over "launch 88.2%" and a row of 88.2%
        class_shown = dict(zip(CLASSES, shares_shown([classes[c]["share_pct"] for c in CLASSES])))
        # every call's share rounded within its class's as shown: a class of one call and that call read alike
        # (memcpy 7.6% above its only call, cudaMemcpyAsync, at 7.7%), and the calls add up as the classes do
        top = by_name.head(int(t["top"]))
        shown = shares_within([expr.pct(x, total) for x in by_name["time_ns"]], by_name["class"].to_list(),
                              class_shown)
        items = [{"name": r["name"], "class": r["class"], "calls": r["calls"], "time_ns": r["time_ns"],
                  "share_pct": expr.pct(r["time_ns"], total), "shown_pct": None if seen is None else float(seen),
                  **({"ranks": r["ranks"], "rank_imbalance": r["rank_imbalance"]} if run else {})}
                 for r, seen in zip(top.iter_rows(named=True), shown)]
        # the CUDA context is created by a process's first CUDA call, often a cudaMalloc: a one-off, not time lost
        # to allocating (a 5.5 s cudaMalloc in a program with 3.3 ms of GPU time was "allocation, 5.519 s lost")
        calls_classed = _classed_calls(trace.events)
        startup, first, from_summary = _context_creation(calls_classed)
        early_ns, early_calls = _before_first_work(calls_classed) if not from_summary else (0, 0)
        steady = {c: classes[c]["time_ns"] - (startup + early_ns if c == "allocation" else 0) for c in CLASSES}
        # launches cost the GPU its idle time at most: on a busy GPU a launch call waits for room in a full queue
        # (a JAX trace 93.6% busy read "API time in launch, 3.087 ms lost" beside 823.6 us of idle GPU)
        launching = [c for c in _LAUNCH_CLASSES if steady[c]]
        busy = measures.device_busy(trace.events) if launching else None
        idle = int(busy["idle_ns"].sum() or 0) if busy is not None and busy.height else None
        launch_ns = sum(steady[c] for c in launching)
        capped = ({c: round(idle * steady[c] / launch_ns) for c in launching}  # shared as their times are
                  if idle is not None and launch_ns > idle else {})
        steady.update(capped)
        flagged = [c for c in CLASSES
                   if grade(expr.pct(steady[c], total), warning=t[f"{c}_warning_pct"]) != "info"
                   and steady[c] >= t["min_class_time_us"] * 1000]
        if total:
            ranked = sorted(CLASSES, key=lambda c: -classes[c]["time_ns"])
            over = f" over {trace_ranks(trace)} ranks" if run else ""
            top_shown = share_as_shown(items[0]["share_pct"], items[0]["shown_pct"])
            message = (f"{fmt_count(calls, 'API call')} ({by_name.height:,} distinct) "
                       f"take{'s' if calls == 1 else ''} {fmt_ns(total)}{over}; "
                       + ", ".join(f"{c} {fmt_pct(class_shown[c])}" for c in ranked if classes[c]["time_ns"])
                       + f". The top call is {items[0]['name']} ({fmt_pct(top_shown)}).")
        else:
            message = f"{fmt_count(calls, 'API call')}, with no recorded time."
        message += aggregated_note(ignored_aggregated, "API", "API events")
        if capped:
            message += (f" The GPU was idle only {fmt_ns(idle)}: launch calls cost it no more than that (on a busy GPU "
                        "a launch call waits for room in a full launch queue), so that is the most at stake.")
        runtime = "HIP" if first and first.startswith("hip") else "CUDA"  # the runtime whose context it made
        if startup and from_summary:  # a summary keeps no order of calls: the longest one, most likely
            message += (f" The longest {first} ({fmt_ns(startup)}, the summary's Max) most likely made the {runtime} "
                        f"context (the first {runtime} call does; a summary keeps no order): a one-off, left out of "
                        "the allocation time at stake.")
        elif startup:
            message += (f" {first} ({fmt_ns(startup)}) is the first {runtime} call"
                        f"{' of each process' if run else ''}, which creates the {runtime} context: a one-off, left "
                        "out of the allocation time at stake.")
        if early_ns >= t["min_class_time_us"] * 1000:
            message += (f" {'Another ' if startup else ''}{fmt_count(early_calls, 'allocation call')} "
                        f"({fmt_ns(early_ns)}) came before {'each' if run else 'the'} process first gave the GPU "
                        "work (a kernel launch or a copy): start-up, such as a library made ready on its first use "
                        "(cuBLAS, cuDNN), a one-off, left out of the allocation time at stake.")
        metrics = {"api_time_ns": total, "api_calls": calls, "api_names": by_name.height, "classes": classes,
                   **({"context_creation_ns": startup} if startup else {}),
                   **({"startup_allocation_ns": early_ns} if early_ns else {})}
        metrics.update({f"{c}_share_pct": classes[c]["share_pct"] for c in CLASSES})
        return [Finding(self.name, "warning" if flagged else "info",
                        ("API time in " + " and ".join(f"{c} ({fmt_pct(class_shown[c])})" for c in flagged)
                         if flagged else "Where the API time goes"),
                        message, " ".join(SUGGESTIONS[c] for c in flagged), metrics=metrics, items=items, items_title="top calls",
                        columns=COLUMNS + (RUN_COLUMNS if run else []), figures=FIGURES, tables={"classes": TABLE},
                        impact_ns=sum(steady[c] for c in flagged) if flagged else None)]


def _classed_calls(events) -> pl.DataFrame:
    """The API calls with a duration, each with its class (``_class``) and whether it is a runtime call
    (``_runtime``: ``cuda*``, ``hip*``): picked once for both start-up checks below."""
    # only the columns used: an eager filter copies all fifty of the table's (20 ms on 100,000 calls)
    api = picked(events, expr.kind_is("api") & pl.col("duration_ns").is_not_null(),
                 *[c for c in ("trace_id", "pid", "name", "start_ns", "duration_ns", "max_ns") if c in events.columns])
    return api.with_columns(_class=expr.api_class(pl.col("name")),
                            _runtime=pl.col("name").str.starts_with("cuda") | pl.col("name").str.starts_with("hip"))


def _processes(api: pl.DataFrame) -> list[str]:
    """The columns that tell one process from another (a run's ranks are traces)."""
    return [c for c in ("trace_id", "pid") if c in api.columns]


def _context_creation(api: pl.DataFrame) -> tuple[int, str | None, bool]:
    """The time of the calls that created a CUDA context, where they are allocations, the first one's name, and
    whether it was told from summary rows (which keep no order of calls: the longest allocation is taken).

    ``api``: :func:`_classed_calls`. Timed calls: each process's first runtime call when it is an allocation
    (``cudaMalloc``, ``cudaFree(0)``, ``cudaMallocManaged``): the context is made by the runtime's first call.
    Summary rows (no start times): the longest allocation call when it holds at least half of all allocation
    time (nvprof's Max column: 5.518 s of a 5.519 s cudaMalloc total over 3 calls)."""
    if api.height == 0:
        return 0, None, False
    timed = api.filter(pl.col("start_ns").is_not_null())
    if timed.height:  # the runtime's first call makes the context (a driver query such as cuModuleGetLoadingMode
        # before it does not)
        first = (timed.filter(pl.col("_runtime")).sort("start_ns")
                 .group_by(*_processes(timed), maintain_order=True).first()
                 .filter(pl.col("_class") == "allocation"))
        return int(first["duration_ns"].sum() or 0), (first["name"][0] if first.height else None), False
    if "max_ns" not in api.columns:
        return 0, None, False
    allocation = api.filter(pl.col("_class") == "allocation")
    longest = allocation.filter(pl.col("max_ns").is_not_null()).sort("max_ns", descending=True).head(1)
    if longest.height and 2 * longest["max_ns"][0] >= int(allocation["duration_ns"].sum() or 0):
        return int(longest["max_ns"][0]), longest["name"][0], True
    return 0, None, False


#: API classes that give the GPU work: a process's first call of one of them ends its start-up.
_WORK_CLASSES = ("launch", "graph_launch", "memcpy", "memset")
#: The classes whose time the GPU can lose only while it is idle.
_LAUNCH_CLASSES = ("launch", "graph_launch")


def _before_first_work(api: pl.DataFrame) -> tuple[int, int]:
    """The time and number of a process's allocation calls made before it first gave the GPU work (its first
    launch, graph launch or copy call), less the first runtime call (:func:`_context_creation`'s). That is
    start-up: a library made ready on first use (cuBLAS's handle and workspace inside the first ``aten::mm``:
    two cudaFree calls of 7.95 s in a 9.1 s trace whose GPU work was 3 ms), not allocation in a loop. Processes
    that never give the GPU work keep every call (a trace of allocations alone is about allocation).
    ``api``: :func:`_classed_calls`."""
    timed = api.filter(pl.col("start_ns").is_not_null())
    if timed.height == 0:
        return 0, 0
    process = _processes(timed)
    first_runtime = pl.col("start_ns").filter(pl.col("_runtime")).min().over(process)
    first_work = pl.col("start_ns").filter(pl.col("_class").is_in(list(_WORK_CLASSES))).min().over(process)
    early = timed.filter((pl.col("_class") == "allocation") & (pl.col("start_ns") < first_work)
                         & ~(pl.col("_runtime") & (pl.col("start_ns") == first_runtime)))
    return int(early["duration_ns"].sum() or 0), early.height


@hookimpl
def traceparse_rules():
    return [ApiShare()]
