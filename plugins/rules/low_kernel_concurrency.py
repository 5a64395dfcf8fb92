"""Rule ``low-kernel-concurrency``: how much of the kernel busy time has two or more kernels running.

Definition: per device, kernel_busy = |union of kernel intervals| and
concurrent = |time with two or more kernels running|, each summed over
devices; concurrency_pct = 100 × concurrent / kernel_busy. Intervals are
half-open, so a kernel starting exactly when another ends is not concurrent.
Metrics: ``kernel_busy_ns``, ``concurrent_ns``, ``concurrency_pct``, and
per device ``devices``.

Severity: warning when ``concurrency_pct`` is under ``warning_below_pct``
and the mean kernel lasts at least ``min_mean_kernel_us``.
"""

from __future__ import annotations

from traceparse import expr, measures
from traceparse.plugins import hookimpl
from traceparse.run import device_label, in_rank_order, rank_labels
from traceparse.rule import Column, Finding, Rule, RuleOptions, grade
from traceparse.trace import Trace

FIGURES = {"kernel_busy_ns": "ns", "concurrent_ns": "ns", "concurrency_pct": "pct"}
DEVICES = [Column("device", "device", "text"), Column("kernels", "kernels", "count"),
           Column("streams", "streams", "count"), Column("kernel_busy_ns", "kernel busy", "ns"),
           Column("concurrent_ns", "concurrent", "ns"), Column("concurrency_pct", "concurrency %", "pct"),
           Column("max_concurrent", "max concurrent", "count")]


class LowKernelConcurrency(Rule):
    name = "low-kernel-concurrency"
    description = "Share of kernel busy time during which two or more kernels run at once"
    definition = __doc__
    thresholds = {
        "warning_below_pct": 5.0,   # concurrency under this is a warning ...
        "min_mean_kernel_us": 0.0,  # ... when the mean kernel lasts at least this long (0: always)
    }
    kinds = ("kernel",)

    def check(self, trace: Trace, options: RuleOptions) -> list[Finding]:
        t = options.thresholds
        per_device = measures.concurrency(trace.events, kinds=("kernel",), at_least=2)
        if per_device.height == 0:
            return [Finding(self.name, "info", "No timed kernels",
                            "The trace has kernel totals only (no start times), so concurrency cannot be measured.",
                            metrics={"kernel_busy_ns": 0, "concurrent_ns": 0, "concurrency_pct": None},
                            figures=FIGURES)]
        busy = int(per_device["busy_ns"].sum())
        concurrent = int(per_device["concurrent_ns"].sum())
        pct = 100.0 * concurrent / busy if busy else 0.0
        n_kernels = int(per_device["count"].sum())
        mean_us = int(per_device["time_ns"].sum()) / n_kernels / 1e3
        ranks = rank_labels(trace)
        devices = {device_label(ranks, r["trace_id"], r["device_id"]) if ranks else str(r["device_id"]): {"kernels": r["count"], "streams": r["streams"],
                                         "kernel_busy_ns": r["busy_ns"], "concurrent_ns": r["concurrent_ns"],
                                         "concurrency_pct": expr.pct(r["concurrent_ns"], r["busy_ns"]),
                                         "max_concurrent": r["max_depth"]}
                   for r in in_rank_order(per_device, ranks).iter_rows(named=True)}
        low = mean_us >= t["min_mean_kernel_us"] and grade(pct, warning=t["warning_below_pct"],
                                                           higher_is_worse=False) != "info"
        n_streams = len({s for ids in per_device["stream_ids"].to_list() for s in ids})
        message = (f"Two or more kernels run during {pct:.1f}% of the {busy / 1e6:.3f} ms the GPU runs kernels "
                   f"({n_kernels} kernels on {n_streams} stream(s), mean {mean_us:.1f} us).")
        suggestion = ""
        if low:
            suggestion = ("Kernels run one at a time. If they are small (few blocks, short), issue independent "
                          "work on separate CUDA streams, batch small operations, or use CUDA graphs so the GPU "
                          "can overlap them." if n_streams == 1 else
                          "Kernels are spread over several streams yet rarely overlap: check for synchronisation "
                          "between streams (events, default-stream work) and for kernels that fill the whole GPU.")
        return [Finding(self.name, "warning" if low else "info",
                        "Low kernel concurrency" if low else "Kernel concurrency", message, suggestion,
                        metrics={"kernel_busy_ns": busy, "concurrent_ns": concurrent,
                                 "concurrency_pct": round(pct, 4), "devices": devices},
                        figures=FIGURES, tables={"devices": DEVICES})]


@hookimpl
def traceparse_rules():
    return [LowKernelConcurrency()]
