"""Rule ``launch-stats``: how long the host takes to launch each kernel, and how long the kernel waits to start.

Definition: each timed kernel is linked to the API call that launched it by
correlation id. A kernel launched by a launch call (cudaLaunchKernel, cuLaunchKernel,
hipLaunchKernel, hipExtModuleLaunchKernel, ...) is a *direct* launch; one
replayed by a graph launch (``cudaGraphLaunch``, ``hipGraphLaunch``) shares
that call with every kernel of the graph. For each linked kernel: launch_ns =
the launch call's duration, kernel_ns = the kernel's duration, delay_ns =
kernel start − launch call start (the launch delay: from the host issuing the
launch to the kernel running).

Metrics: ``kernels`` (timed kernels), ``linked_kernels``, ``direct_kernels``,
``launches`` (distinct direct launch calls), ``launch_time_ns`` (Σ of their
durations), ``graph_launches``, ``graph_kernels`` (kernels replayed by them),
``kernels_per_graph_launch`` (mean), ``graph_launch_time_ns``;
``launch_ns_p50``/``_p90``/``_max`` over direct launch calls;
``delay_ns_min``/``_p50``/``_p90``/``_p99``/``_max`` over every linked kernel
that starts after its launch call (``clock_inconsistent`` counts those that
start before it: the host and GPU clocks disagree there, the message says so)
(quantiles by the nearest-rank rule: the value at position ⌈p·n⌉ of the
sorted values); ``short_kernel_pct`` = 100 × direct kernels whose duration
is under their launch call's / direct kernels (a kernel shorter than its
launch: the host cannot launch fast enough to keep the GPU busy);
``launch_outliers`` = direct launch calls lasting at least
``launch_outlier_ns``; ``delay_outliers`` = linked kernels starting at least
``delay_outlier_ns`` after their launch began. Items: the kernels with the
longest launch delay, at most ``top``.

The rule applies to traces with both kernels and API calls.

Time at stake: how much the direct launch calls outlast their kernels (Σ of launch − kernel duration where
positive), but no more than the GPU was idle (``gpu_idle_ns``, gpu-idle's idle time): on a busy GPU the
launch queue is full, and a launch call that waits for room costs the GPU nothing.

Severity: warning when ``short_kernel_pct`` ≥ ``short_kernel_warning_pct``
(with at least ``min_kernels`` direct kernels).
"""

from __future__ import annotations

import math

import polars as pl

from traceparse import expr, measures
from traceparse.figures import fmt_count, fmt_ns, fmt_pct
from traceparse.plugins import hookimpl
from traceparse.rule import Column, Finding, Rule, RuleOptions, grade
from traceparse.run import rank_labels, rank_of
from traceparse.trace import Trace

FIGURES = {"kernels": "count", "linked_kernels": "count", "direct_kernels": "count", "launches": "count",
           "launch_time_ns": "ns", "graph_launches": "count", "graph_kernels": "count",
           "kernels_per_graph_launch": "number", "graph_launch_time_ns": "ns", "launch_ns_p50": "ns",
           "launch_ns_p90": "ns", "launch_ns_max": "ns", "delay_ns_min": "ns", "delay_ns_p50": "ns",
           "delay_ns_p90": "ns", "delay_ns_p99": "ns", "delay_ns_max": "ns", "short_kernel_pct": "pct",
           "launch_outliers": "count", "delay_outliers": "count", "gpu_idle_ns": "ns"}
#: The items' columns, most important first (a narrow screen drops the last): the delay the items are sorted by
#: comes right after the names, so that it is the last figure left out.
COLUMNS = [Column("name", "kernel", "name"), Column("launch_name", "launched by", "name"),
           Column("delay_ns", "delay", "ns"), Column("launch_ns", "launch", "ns"),
           Column("kernel_ns", "kernel time", "ns"), Column("device_id", "device", "number"),
           Column("stream_id", "stream", "number"), Column("graph_kernels", "kernels in launch", "count")]
RANK = Column("rank", "rank", "number")


def nearest_rank(sorted_values: list[int] | pl.Series, p: float) -> int | None:
    """The value at position ⌈p·n⌉ (1-based) of ``sorted_values``; None when empty.

    >>> nearest_rank([10, 20, 30, 40], 0.5), nearest_rank([10, 20, 30, 40], 0.9), nearest_rank([], 0.5)
    (20, 40, None)
    """
    if len(sorted_values) == 0:
        return None
    return sorted_values[max(1, math.ceil(p * len(sorted_values))) - 1]


class LaunchStats(Rule):
    name = "launch-stats"
    description = "Kernel launches: CPU launch time vs kernel time, launch delay distribution, graph launches, outliers"
    definition = __doc__
    thresholds = {
        "short_kernel_warning_pct": 50.0,   # kernels shorter than their launch call at or above this %: warning
        "min_kernels": 100,                 # ... with at least this many directly launched kernels
        "launch_outlier_ns": 50000,         # a launch call lasting this long is an outlier
        "delay_outlier_ns": 100000,         # a kernel starting this long after its launch began is an outlier
        "top": 10,                          # kernels listed (longest launch delay first)
    }
    kinds = ("kernel", "api")
    needs_all_kinds = True  # a kernel table alone (ncu, a summary) has no launches to link

    def check(self, trace: Trace, options: RuleOptions) -> list[Finding]:
        t = options.thresholds
        # per trace (a run: per rank, where the rank is): counts, sums, the sorted launch and delay figures and
        # the top items; the quantiles over every launch of the run are taken here, exactly, from the numbers
        per_trace = measures.launch_summary(trace.events, kinds=("kernel",), top=int(t["top"]))
        total = {c: int(per_trace[c].sum()) for c in ("rows", "linked", "direct", "graph", "short",
                                                       "launch_excess_ns", "graph_launches", "graph_launch_time_ns")}
        launch_ns = per_trace["launch_ns"].explode().drop_nulls().sort()
        delays = per_trace["delay_ns"].explode().drop_nulls().sort()
        # a kernel cannot start before the call that launched it: such delays say the clocks disagree
        inconsistent = int((delays < 0).sum())
        delays = delays.filter(delays >= 0)
        n_linked, n_direct, n_graph, n_calls = total["linked"], total["direct"], total["graph"], launch_ns.len()
        metrics = {
            "kernels": total["rows"], "linked_kernels": n_linked, "direct_kernels": n_direct,
            "launches": n_calls, "launch_time_ns": int(launch_ns.sum() or 0),
            "graph_launches": total["graph_launches"], "graph_kernels": n_graph,
            "kernels_per_graph_launch": (round(n_graph / total["graph_launches"], 4) if total["graph_launches"]
                                         else None),
            "graph_launch_time_ns": total["graph_launch_time_ns"],
            "launch_ns_p50": nearest_rank(launch_ns, 0.5), "launch_ns_p90": nearest_rank(launch_ns, 0.9),
            "launch_ns_max": launch_ns[-1] if n_calls else None,
            "clock_inconsistent": inconsistent,
            "delay_ns_min": delays[0] if delays.len() else None, "delay_ns_p50": nearest_rank(delays, 0.5),
            "delay_ns_p90": nearest_rank(delays, 0.9), "delay_ns_p99": nearest_rank(delays, 0.99),
            "delay_ns_max": delays[-1] if delays.len() else None,
            "short_kernel_pct": expr.pct(total["short"], n_direct),
            "launch_outliers": int((launch_ns >= int(t["launch_outlier_ns"])).sum()),
            "delay_outliers": int((delays >= int(t["delay_outlier_ns"])).sum()),
        }
        # each trace's top items, in trace order, then the same sort as over every linked kernel: the run's top
        # (on a run, each item says its rank, and kernels delayed alike as shown come in rank order)
        ranks = rank_labels(trace)
        candidates = (per_trace.select("trace_id", "top").explode("top").drop_nulls("top").unnest("top")
                      .filter(pl.col("delay_ns") >= 0)
                      .with_columns(_rank=rank_of(ranks)))
        items = [{**({"rank": r["_rank"]} if ranks else {}), "name": r["name"], "launch_name": r["launch_name"],
                  "device_id": r["device_id"], "stream_id": r["stream_id"], "launch_ns": r["launch_duration_ns"],
                  "kernel_ns": r["duration_ns"], "delay_ns": r["delay_ns"], "graph_kernels": r["launch_gpu_rows"]}
                 for r in candidates.with_columns(_shown=expr.as_shown("delay_ns"))
                 .sort(["_shown", "_rank", "delay_ns", "event_id"], descending=[True, False, True, False],
                       nulls_last=True, maintain_order=True)
                 .head(int(t["top"])).iter_rows(named=True)]
        enough = n_direct >= int(t["min_kernels"])
        severity = grade(metrics["short_kernel_pct"] if enough else None, warning=t["short_kernel_warning_pct"])
        if not total["rows"]:  # kernels given as totals (nvprof's, nsys's summaries): nothing to link
            message = ("No timed kernel: the trace gives its kernels as totals, without a timeline, so no launch "
                       "call can be linked to its kernel.")
        elif not n_linked:
            message = (f"{total['rows']:,} kernels, none linked to a launch call: the trace has no API calls with "
                       "matching correlation ids.")
        else:
            message = f"{n_linked:,} of {total['rows']:,} kernels linked to their launch call."
            if n_direct:
                message += (f" {n_direct:,} launched one by one by {n_calls:,} calls taking "
                            f"{fmt_ns(metrics['launch_time_ns'])} (median {fmt_ns(metrics['launch_ns_p50'])}); "
                            f"{fmt_pct(metrics['short_kernel_pct'])} of them run shorter than their launch call.")
            if n_graph:
                message += (f" {n_graph:,} replayed by {metrics['graph_launches']:,} graph launches "
                            f"({metrics['kernels_per_graph_launch']:g} kernels per launch, "
                            f"{fmt_ns(metrics['graph_launch_time_ns'])} of launch calls).")
            message += (f" Launch delay: median {fmt_ns(metrics['delay_ns_p50'])}, p99 "
                        f"{fmt_ns(metrics['delay_ns_p99'])}, max {fmt_ns(metrics['delay_ns_max'])}; "
                        f"{fmt_count(metrics['launch_outliers'], 'launch call')} ≥ "
                        f"{int(t['launch_outlier_ns']) / 1e3:g} us, {fmt_count(metrics['delay_outliers'], 'kernel')} "
                        f"delayed ≥ {int(t['delay_outlier_ns']) / 1e3:g} us.")
            if inconsistent:
                message += (f" {inconsistent:,} kernels start before their launch call: the host and GPU clocks "
                            "disagree there, so their delays are left out.")
        suggestion = ("Most kernels finish faster than the host launches them: the GPU starves. Capture the step in a "
                      "CUDA graph (torch.compile mode='reduce-overhead', torch.cuda.graphs), fuse kernels "
                      "(torch.compile), or give each kernel more work (larger batches)." if severity != "info" else "")
        # at stake: how much the launch calls outlast their kernels, but no more than the GPU was idle: on a busy
        # GPU the launch queue is full and a launch call waits for room (a trace 98.4% busy read "145.8 ms lost")
        # (the summary and gpu-idle ask the same measure: shared, not computed again; it read 0 where there was no
        # excess to cap, beside gpu-idle's 10.08 ms)
        idle = int(measures.device_busy(trace.events)["idle_ns"].sum() or 0)
        at_stake = min(int(total["launch_excess_ns"]), idle)
        metrics["gpu_idle_ns"] = idle
        if at_stake < total["launch_excess_ns"] and n_direct:
            message += (f" The launch calls outlast their kernels by {fmt_ns(total['launch_excess_ns'])}, but the "
                        f"GPU was idle only {fmt_ns(at_stake)}: the time at stake is no more than that (launch "
                        "calls that wait for room in a full launch queue cost the GPU nothing).")
        return [Finding(self.name, severity, "Kernel launches", message, suggestion, metrics=metrics, items=items,
                        columns=([RANK] if ranks else []) + COLUMNS, figures=FIGURES, impact_ns=at_stake)]


@hookimpl
def traceparse_rules():
    return [LaunchStats()]
