"""Rule ``comm-compute-overlap``: how much communication-kernel time runs while compute kernels run.

Definition. Communication kernels are the NCCL and RCCL kernels of every NCCL version (``ncclKernel_*``,
``ncclDevKernel_*`` including ``Generic``, ``ncclSendRecvKernel_*``, ...); compute kernels are the other
kernels. Per rank and device (a trace without ranks: per device), overlapped = Σ over
communication kernels of |kernel ∩ union of the same device's compute kernels|; ``overlap_pct`` = 100 ×
overlapped / communication time, over all ranks. Only timed kernels count.

Metrics: ``comm_time_ns``, ``overlapped_ns``, ``overlap_pct``, ``comm_share_pct`` = 100 × the time
communication kernels run / the time any kernel runs (both unions per rank and device, summed: two
collectives in flight at once on two streams count once, so the share is at most 100), ``members`` (``rank`` or ``device``), ``ranks`` ({rank or
device: kernels, comm_time_ns, overlapped_ns, overlap_pct}). Items per rank (device), least overlapped
first: ``rank``, ``device``, ``kernels``, ``comm_time_ns``, ``overlapped_ns``, ``exposed_ns``,
``overlap_pct``.

Severity: when communication takes at least ``min_comm_share_pct`` of the kernel busy time, warning under
``warning_below_pct`` overlap, critical under ``critical_below_pct``.
"""

from __future__ import annotations

import polars as pl

from traceparse import expr, measures
from traceparse.figures import fmt_ns
from traceparse.plugins import hookimpl
from traceparse.rule import Column, Finding, Rule, RuleOptions, grade
from traceparse.trace import Trace

FIGURES = {"comm_time_ns": "ns", "overlapped_ns": "ns", "overlap_pct": "pct", "comm_share_pct": "pct"}
#: Screen labels where the key's words would read like another figure: the communication's overlap, not the copies'
#: (low-memcpy-overlap).
LABELS = {"overlapped_ns": "comm overlapped", "overlap_pct": "comm overlap"}
COLUMNS = [Column("rank", "rank", "number"), Column("device", "device", "number"),
           Column("kernels", "kernels", "count"), Column("comm_time_ns", "comm time", "ns"),
           Column("overlapped_ns", "overlapped", "ns"), Column("exposed_ns", "exposed", "ns"),
           Column("overlap_pct", "overlap %", "pct")]
RANKS = [Column("rank", "rank / device", "text"), Column("kernels", "kernels", "count"),
         Column("comm_time_ns", "comm time", "ns"), Column("overlapped_ns", "overlapped", "ns"),
         Column("overlap_pct", "overlap %", "pct")]


class CommComputeOverlap(Rule):
    name = "comm-compute-overlap"
    description = "Share of communication-kernel time during which compute kernels run on the same device"
    definition = __doc__
    thresholds = {
        "warning_below_pct": 50.0,   # overlap under this is a warning ...
        "critical_below_pct": 10.0,  # ... and under this critical ...
        "min_comm_share_pct": 5.0,   # ... when communication takes at least this % of the kernel busy time
    }
    kinds = ("kernel",)

    def applies_to(self, trace: Trace) -> bool:
        return bool(trace.events.select((expr.kind_is("kernel") & expr.is_communication()).any()).item())

    def check(self, trace: Trace, options: RuleOptions) -> list[Finding]:
        t = options.thresholds
        events = trace.events
        per = measures.comm_overlap(events)
        if per.height == 0:
            return [Finding(self.name, "info", "No timed communication kernels",
                            "The trace's communication kernels have no start times, so overlap cannot be measured.",
                            metrics={"comm_time_ns": 0, "overlapped_ns": 0, "overlap_pct": None},
                            figures=FIGURES, labels=LABELS)]
        ranked = per["rank"].is_not_null().any()
        label = "rank" if ranked else "device"
        comm_ns = int(per["comm_time_ns"].sum())
        overlapped_ns = int(per["overlapped_ns"].sum())
        pct = expr.pct(overlapped_ns, comm_ns)
        # unions per rank and device: collectives in flight at once on two streams count once
        layers = measures.rank_time(events)
        comm_union = int(layers["comm_ns"].sum() or 0)
        busy_ns = int((layers["compute_ns"] + layers["comm_exposed_ns"]).sum() or 0)
        exposed_ns = int(layers["comm_exposed_ns"].sum() or 0)
        share = expr.pct(comm_union, busy_ns) if busy_ns else 100.0
        items = [{"rank": r["rank"], "device": r["device_id"], "kernels": r["kernels"],
                  "comm_time_ns": r["comm_time_ns"], "overlapped_ns": r["overlapped_ns"],
                  "exposed_ns": r["exposed_ns"], "overlap_pct": r["overlap_pct"]}
                 for r in per.sort(["overlap_pct", "rank", "device_id"], nulls_last=True).iter_rows(named=True)]
        ranks: dict = {}
        for r in per.iter_rows(named=True):
            key = str(r["rank"] if ranked else r["device_id"])
            agg = ranks.setdefault(key, {"kernels": 0, "comm_time_ns": 0, "overlapped_ns": 0})
            for k in agg:
                agg[k] += r[k]
        for agg in ranks.values():
            agg["overlap_pct"] = expr.pct(agg["overlapped_ns"], agg["comm_time_ns"])
        severity = "info"
        if share is not None and share >= t["min_comm_share_pct"]:
            severity = grade(pct, warning=t["warning_below_pct"], critical=t["critical_below_pct"],
                             higher_is_worse=False)
        n = len(ranks)
        message = (f"{pct or 0:.1f}% of {fmt_ns(comm_ns)} of communication-kernel time "
                   f"({n} {label}{'s' if n != 1 else ''}) runs while compute kernels run "
                   f"({fmt_ns(overlapped_ns)}); communication runs during {share or 0:.1f}% of the time kernels run.")
        if n == 1:
            message += f" One {label} alone: the figure is that {label}'s."
        suggestion = ("Overlap communication with compute: DistributedDataParallel buckets (bucket_cap_mb) so "
                      "gradients reduce during the backward pass, FSDP prefetching (forward_prefetch, "
                      "backward_prefetch), communication on its own stream, and no synchronisation between "
                      "the backward pass and the collectives." if severity != "info" else "")
        return [Finding(self.name, severity, "Low communication/compute overlap" if severity != "info"
                        else "Communication/compute overlap", message, suggestion,
                        metrics={"comm_time_ns": comm_ns, "overlapped_ns": overlapped_ns, "overlap_pct": pct,
                                 "comm_share_pct": share, "members": label, "ranks": ranks},
                        items=items, columns=COLUMNS, figures=FIGURES, labels=LABELS, tables={"ranks": RANKS},
                        impact_ns=exposed_ns)]


@hookimpl
def traceparse_rules():
    return [CommComputeOverlap()]
