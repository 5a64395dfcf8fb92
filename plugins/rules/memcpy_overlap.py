"""Rule ``low-memcpy-overlap``: how much host-device copy time overlaps kernel execution.

Definition (the Visual Profiler's "Low Memcpy/Compute Overlap"): per device,
overlapped = sum over memcpy events of |memcpy interval ∩ union of the kernel
intervals on the same device|; overlap_pct = 100 × overlapped / total memcpy
time, over all devices. Only timed events count (aggregated rows have no
start). Metrics: ``memcpy_time_ns``, ``overlapped_ns``, ``overlap_pct``.
"""

from __future__ import annotations

import polars as pl

from traceparse import intervals
from traceparse.plugins import hookimpl
from traceparse.rule import Finding, Rule, RuleOptions
from traceparse.trace import Trace


class LowMemcpyOverlap(Rule):
    name = "low-memcpy-overlap"
    description = "Share of memcpy time that runs while kernels run on the same device"
    definition = __doc__
    thresholds = {
        "warning_below_pct": 50.0,      # overlap under this is a warning ...
        "critical_below_pct": 10.0,     # ... and under this critical ...
        "min_memcpy_share_pct": 5.0,    # ... when copies take at least this % of kernel busy time
    }
    kinds = ("memcpy",)

    def check(self, trace: Trace, options: RuleOptions) -> list[Finding]:
        t = options.thresholds
        events = trace.events
        copies = events.filter((pl.col("kind") == "memcpy") & pl.col("start_ns").is_not_null())
        kernels = events.filter((pl.col("kind") == "kernel") & pl.col("start_ns").is_not_null())
        if copies.height == 0:
            return [Finding(self.name, "info", "No timed memcpy events",
                            "The trace has memcpy totals only (no start times), so overlap cannot be measured.",
                            metrics={"memcpy_time_ns": 0, "overlapped_ns": 0, "overlap_pct": None})]
        by = ["device_id"]
        copies = copies.with_columns(overlap_ns=intervals.overlap_with(copies, kernels, by))
        memcpy_ns = int(copies["duration_ns"].sum())
        overlapped_ns = int(copies["overlap_ns"].sum())
        pct = 100.0 * overlapped_ns / memcpy_ns if memcpy_ns else None
        busy_ns = intervals.union_length(kernels, by)
        share = 100.0 * memcpy_ns / busy_ns if busy_ns else 100.0
        per_device = (copies.group_by("device_id").agg(
            memcpy_time_ns=pl.col("duration_ns").sum(), overlapped_ns=pl.col("overlap_ns").sum(),
            copies=pl.len()).sort("device_id"))
        devices = {
            str(d): {"copies": n, "memcpy_time_ns": m, "overlapped_ns": o,
                     "overlap_pct": round(100.0 * o / m, 2) if m else None}
            for d, m, o, n in per_device.select("device_id", "memcpy_time_ns", "overlapped_ns", "copies").iter_rows()
        }
        items = []
        worst = (copies.with_columns(exposed_ns=pl.col("duration_ns") - pl.col("overlap_ns"))
                 .group_by("copy_kind", "src_memory", "dst_memory")
                 .agg(copies=pl.len(), time_ns=pl.col("duration_ns").sum(), exposed_ns=pl.col("exposed_ns").sum(),
                      bytes=pl.col("bytes").sum())
                 .sort("exposed_ns", descending=True))
        for row in worst.head(5).iter_rows(named=True):
            items.append({"copy": f"{row['copy_kind'] or '?'} ({row['src_memory'] or '?'} -> {row['dst_memory'] or '?'})",
                          "copies": row["copies"], "time_ns": row["time_ns"], "exposed_ns": row["exposed_ns"],
                          "bytes": row["bytes"]})
        severity = "info"
        if pct is not None and share >= t["min_memcpy_share_pct"]:
            if pct < t["critical_below_pct"]:
                severity = "critical"
            elif pct < t["warning_below_pct"]:
                severity = "warning"
        message = (f"{pct:.1f}% of {memcpy_ns / 1e6:.3f} ms of memcpy time overlaps kernel execution "
                   f"({overlapped_ns / 1e6:.3f} ms); copies take {share:.1f}% of the kernel busy time.")
        suggestion = ("Use pinned host memory (pin_memory=True / cudaHostAlloc) and asynchronous copies "
                      "(non_blocking=True / cudaMemcpyAsync) on a stream other than the compute stream, "
                      "so copies run while kernels do." if severity != "info" else "")
        return [Finding(self.name, severity, "Low memcpy/compute overlap" if severity != "info"
                        else "Memcpy/compute overlap", message, suggestion,
                        metrics={"memcpy_time_ns": memcpy_ns, "overlapped_ns": overlapped_ns,
                                 "overlap_pct": None if pct is None else round(pct, 4),
                                 "memcpy_share_of_busy_pct": round(share, 4), "devices": devices},
                        items=items)]


@hookimpl
def traceparse_rules():
    return [LowMemcpyOverlap()]
