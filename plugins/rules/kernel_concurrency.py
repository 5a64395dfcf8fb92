"""Rule ``low-kernel-concurrency``: how much of the kernel busy time has two or more kernels running.

Definition: per device, kernel_busy = |union of kernel intervals| and
concurrent = |time with two or more kernels running|, each summed over
devices; concurrency_pct = 100 × concurrent / kernel_busy. Intervals are
half-open, so a kernel starting exactly when another ends is not concurrent.
Metrics: ``kernel_busy_ns``, ``concurrent_ns``, ``concurrency_pct``.
"""

from __future__ import annotations

import polars as pl

from traceparse import intervals
from traceparse.plugins import hookimpl
from traceparse.rule import Finding, Rule, RuleOptions
from traceparse.trace import Trace


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
        kernels = trace.events.filter((pl.col("kind") == "kernel") & pl.col("start_ns").is_not_null())
        if kernels.height == 0:
            return [Finding(self.name, "info", "No timed kernels",
                            "The trace has kernel totals only (no start times), so concurrency cannot be measured.",
                            metrics={"kernel_busy_ns": 0, "concurrent_ns": 0, "concurrency_pct": None})]
        by = ["device_id"]
        profile = intervals.depth_profile(kernels, by)
        per_device = profile.group_by("device_id").agg(
            kernel_busy_ns=pl.col("length").filter(pl.col("depth") >= 1).sum(),
            concurrent_ns=pl.col("length").filter(pl.col("depth") >= 2).sum(),
            max_concurrent=pl.col("depth").max(),
        ).sort("device_id")
        streams = kernels.group_by("device_id").agg(streams=pl.col("stream_id").n_unique(), kernels=pl.len())
        per_device = per_device.join(streams, on="device_id", how="left")
        busy = int(per_device["kernel_busy_ns"].sum())
        concurrent = int(per_device["concurrent_ns"].sum())
        pct = 100.0 * concurrent / busy if busy else 0.0
        mean_us = float(kernels["duration_ns"].mean()) / 1e3
        devices = {str(r["device_id"]): {"kernels": r["kernels"], "streams": r["streams"],
                  "kernel_busy_ns": r["kernel_busy_ns"], "concurrent_ns": r["concurrent_ns"],
                  "concurrency_pct": round(100.0 * r["concurrent_ns"] / r["kernel_busy_ns"], 2)
                  if r["kernel_busy_ns"] else None, "max_concurrent": r["max_concurrent"]}
                   for r in per_device.iter_rows(named=True)}
        low = pct < t["warning_below_pct"] and mean_us >= t["min_mean_kernel_us"]
        n_streams = int(kernels["stream_id"].n_unique())
        message = (f"Two or more kernels run during {pct:.1f}% of the {busy / 1e6:.3f} ms the GPU runs kernels "
                   f"({kernels.height} kernels on {n_streams} stream(s), mean {mean_us:.1f} us).")
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
                                 "concurrency_pct": round(pct, 4), "devices": devices})]


@hookimpl
def traceparse_rules():
    return [LowKernelConcurrency()]
