"""Rule ``low-memcpy-overlap``: how much host-device copy time overlaps kernel execution.

Definition (the Visual Profiler's "Low Memcpy/Compute Overlap"): per device,
overlapped = sum over memcpy events of |memcpy interval ∩ union of the kernel
intervals on the same device|; overlap_pct = 100 × overlapped / total memcpy
time, over all devices. Only timed events count (aggregated rows have no
start). Metrics: ``memcpy_time_ns``, ``overlapped_ns``, ``overlap_pct``,
``memcpy_to_kernel_ratio`` = memcpy time / kernel busy time (a ratio, not a
share: copies on their own engines may take longer than the kernels), and
per device ``devices``. Items: the copy directions and memory kinds with the
most exposed (not overlapped) time.

Severity: when copy time is at least ``min_memcpy_to_kernel_ratio`` × the
kernel busy time, warning under ``warning_below_pct``, critical under
``critical_below_pct``; info when no kernel runs (nothing to overlap with).
Time at stake (whatever the severity, where kernels run): the time some
copy runs while no kernel runs on its device (copies that overlap each
other count once); none without kernels.
"""

from __future__ import annotations

import polars as pl

from traceparse import expr, measures
from traceparse.plugins import hookimpl
from traceparse.run import device_label, rank_labels, rank_of
from traceparse.figures import fmt_ns, fmt_pct, fmt_ratio
from traceparse.rule import Column, Finding, Rule, RuleOptions, grade
from traceparse.trace import Trace

FIGURES = {"memcpy_time_ns": "ns", "overlapped_ns": "ns", "overlap_pct": "pct", "memcpy_to_kernel_ratio": "ratio"}
#: Screen labels where the key's words would read like another figure: the copies' overlap, not the communication's
#: (comm-compute-overlap).
LABELS = {"overlapped_ns": "memcpy overlapped", "overlap_pct": "memcpy overlap"}
COLUMNS = [Column("copy", "copy", "text"), Column("copies", "copies", "count"), Column("time_ns", "time", "ns"),
           Column("exposed_ns", "exposed", "ns"), Column("bytes", "bytes", "bytes")]
DEVICES = [Column("device", "device", "text"), Column("copies", "copies", "count"),
           Column("memcpy_time_ns", "memcpy time", "ns"), Column("overlapped_ns", "overlapped", "ns"),
           Column("overlap_pct", "overlap %", "pct")]
GROUP = ("copy_kind", "src_memory", "dst_memory")


class LowMemcpyOverlap(Rule):
    name = "low-memcpy-overlap"
    description = "Share of memcpy time that runs while kernels run on the same device"
    definition = __doc__
    thresholds = {
        "warning_below_pct": 50.0,      # overlap under this is a warning ...
        "critical_below_pct": 10.0,     # ... and under this critical ...
        "min_memcpy_to_kernel_ratio": 0.05,  # ... when copy time is at least this × the kernel busy time
    }
    kinds = ("memcpy",)

    def check(self, trace: Trace, options: RuleOptions) -> list[Finding]:
        t = options.thresholds
        events = trace.events
        groups = measures.overlap(events, a=("memcpy",), b=("kernel",), group=GROUP)
        if groups.height == 0:
            return [Finding(self.name, "info", "No timed memcpy events",
                            "The trace has memcpy totals only (no start times), so overlap cannot be measured.",
                            metrics={"memcpy_time_ns": 0, "overlapped_ns": 0, "overlap_pct": None},
                            figures={"memcpy_time_ns": "ns", "overlapped_ns": "ns", "overlap_pct": "pct"},
                            labels=LABELS)]
        memcpy_ns = int(groups["time_ns"].sum())
        overlapped_ns = int(groups["overlapped_ns"].sum())
        pct = 100.0 * overlapped_ns / memcpy_ns if memcpy_ns else None
        busy_ns = int(measures.device_busy(events, kinds=("kernel",))["busy_ns"].sum() or 0)
        ratio = memcpy_ns / busy_ns if busy_ns else None
        ranks = rank_labels(trace)
        by = ["trace_id", "device_id"] if ranks else ["device_id"]  # a run: each rank's devices apart
        per_device = groups.group_by(by).agg(
            memcpy_time_ns=pl.col("time_ns").sum(), overlapped_ns=pl.col("overlapped_ns").sum(), copies=pl.col("count").sum())
        if ranks:
            per_device = per_device.with_columns(_rank=rank_of(ranks))
        devices = {device_label(ranks, r.get("trace_id"), r["device_id"]): {"copies": r["copies"], "memcpy_time_ns": r["memcpy_time_ns"],
                                         "overlapped_ns": r["overlapped_ns"],
                                         "overlap_pct": expr.pct(r["overlapped_ns"], r["memcpy_time_ns"])}
                   for r in per_device.sort([*(["_rank"] if ranks else []), "device_id"],
                                            nulls_last=False).iter_rows(named=True)}
        bytes_ = measures.copy_stats(events, prefer_timed=False).filter(~pl.col("aggregated"))
        # unknown where any copy of the group has no size: a sum of the others would be less than they moved
        bytes_ = bytes_.group_by(*GROUP).agg(bytes=pl.when(pl.col("bytes").null_count() == 0).then(pl.col("bytes").sum()))
        worst = (groups.group_by(*GROUP).agg(copies=pl.col("count").sum(), time_ns=pl.col("time_ns").sum(),
                                             exposed_ns=pl.col("exposed_ns").sum())
                 .join(bytes_, on=list(GROUP), how="left", nulls_equal=True)
                 .sort(["exposed_ns", *GROUP], descending=[True, False, False, False], nulls_last=False))
        items = [{"copy": f"{r['copy_kind'] or '?'} ({r['src_memory'] or '?'} -> {r['dst_memory'] or '?'})",
                  "copies": r["copies"], "time_ns": r["time_ns"], "exposed_ns": r["exposed_ns"],
                  "bytes": r["bytes"]}  # None where the trace gives no size (a rocprofv3 copy row), not 0
                 for r in worst.head(5).iter_rows(named=True)]
        severity = "info"
        if ratio is not None and ratio >= t["min_memcpy_to_kernel_ratio"]:  # no kernel: nothing to overlap with
            severity = grade(pct, warning=t["warning_below_pct"], critical=t["critical_below_pct"],
                             higher_is_worse=False)
        message = (f"{fmt_pct(pct)} of {fmt_ns(memcpy_ns)} of memcpy time overlaps kernel execution "
                   f"({fmt_ns(overlapped_ns)}); "
                   + (f"copy time is {fmt_ratio(ratio)} the kernel busy time." if ratio is not None
                      else "no kernel runs, so there is nothing for the copies to overlap with."))
        # pinned memory is advice only where the exposed copies are not already from or to it (a capture whose
        # copies were all "pinned -> device" was told to use pinned memory)
        # (a side whose memory the trace does not name is not pinned as far as anyone knows: nsys's summary tables
        # and rocprofv3's copy rows name none, and were told their copies were pinned already)
        pageable = worst.filter((pl.col("exposed_ns") > 0) & ~(
            pl.col("src_memory").is_in(["pinned", "device"]) & pl.col("dst_memory").is_in(["pinned", "device"])
        ).fill_null(False))
        suggestion = ("" if severity == "info" else
                      "Use pinned host memory (pin_memory=True / cudaHostAlloc) and asynchronous copies "
                      "(non_blocking=True / cudaMemcpyAsync) on a stream other than the compute stream, "
                      "so copies run while kernels do." if pageable.height else
                      "The exposed copies are from and to pinned or device memory already: issue them "
                      "asynchronously (non_blocking=True / cudaMemcpyAsync) on a stream other than the compute "
                      "stream, ahead of the kernels that need them (prefetch the next batch while this one "
                      "computes), so copies run while kernels do.")
        return [Finding(self.name, severity, "Low memcpy/compute overlap" if severity != "info"
                        else "Memcpy/compute overlap", message, suggestion,
                        metrics={"memcpy_time_ns": memcpy_ns, "overlapped_ns": overlapped_ns,
                                 "overlap_pct": None if pct is None else round(pct, 4),
                                 "memcpy_to_kernel_ratio": ratio,
                                 "devices": devices},
                        items=items, items_title="copies, most exposed first", columns=COLUMNS, figures=FIGURES, labels=LABELS, tables={"devices": DEVICES},
                        worst={"devices": "-overlap_pct"},
                        impact_ns=_exposed(events) if ratio is not None else None)]


def _exposed(events) -> int:
    """The time some copy runs while no kernel runs on its device: copies at once on two streams count once, so
    the time at stake is never longer than the device's span (the summed copy time is)."""
    return int(measures.overlap(events, a=("memcpy",), b=("kernel",))["busy_exposed_ns"].sum() or 0)


@hookimpl
def traceparse_rules():
    return [LowMemcpyOverlap()]
