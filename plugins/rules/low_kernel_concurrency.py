"""Rule ``low-kernel-concurrency``: how much of the kernel busy time has two or more kernels running.

Definition: per device, kernel_busy = |union of kernel intervals| and
concurrent = |time with two or more kernels running|, each summed over
devices; concurrency_pct = 100 × concurrent / kernel_busy. Intervals are
half-open, so a kernel starting exactly when another ends is not concurrent.
Metrics: ``kernel_busy_ns``, ``concurrent_ns``, ``concurrency_pct``, and
per device ``devices``.

Low concurrency matters only when the kernels are too small to fill the GPU
on their own: one stream of large kernels is normal. So the rule also
measures (communication kernels left out) the SM time the kernels leave unused: a kernel with fewer blocks than
the GPU has SMs (Nsight Compute's "small grid") leaves ``1 − blocks / SMs``
of the GPU without work for its whole duration; a kernel whose grid is not
in the trace counts whole when it is shorter than ``short_kernel_us``.
``underused_pct`` = 100 × (idle SM time + such short kernels' time) /
kernel time. The SM count is the trace's (``numSms``), else the GPU
catalog's, else ``sm_count``.

Severity: warning when ``concurrency_pct`` is under ``warning_below_pct``,
the trace has at least two kernels, ``underused_pct`` is at least
``warning_underused_pct`` and the mean kernel lasts at least
``min_mean_kernel_us``.
"""

from __future__ import annotations

from traceparse import expr, measures
from traceparse.catalog import gpu_for_trace
from traceparse.errors import InputError
from traceparse.figures import fmt_ns, fmt_pct
from traceparse.plugins import hookimpl
from traceparse.run import device_label, in_rank_order, rank_labels
from traceparse.rule import Column, Finding, Rule, RuleOptions, grade
from traceparse.trace import Trace

FIGURES = {"kernel_busy_ns": "ns", "concurrent_ns": "ns", "concurrency_pct": "pct", "underused_pct": "pct",
           "sm_count": "count"}
DEVICES = [Column("device", "device", "text"), Column("kernels", "kernels", "count"),
           Column("streams", "streams", "count"), Column("kernel_busy_ns", "kernel busy", "ns"),
           Column("concurrent_ns", "concurrent", "ns"), Column("concurrency_pct", "concurrency %", "pct"),
           Column("max_concurrent", "max concurrent", "count"), Column("underused_pct", "SM time unused %", "pct")]


class LowKernelConcurrency(Rule):
    name = "low-kernel-concurrency"
    description = "Share of kernel busy time during which two or more kernels run at once"
    definition = __doc__
    thresholds = {
        "warning_below_pct": 5.0,       # concurrency under this is a warning ...
        "warning_underused_pct": 30.0,  # ... when kernels leave at least this % of the SM time unused ...
        "min_mean_kernel_us": 0.0,      # ... and the mean kernel lasts at least this long (0: always)
        "short_kernel_us": 10.0,        # a kernel without a grid in the trace and shorter than this is unused time
        "sm_count": 0,                  # > 0: the GPU's SMs, overriding the trace and the catalog
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
        devices = {device_label(ranks, r.get("trace_id"), r["device_id"]): {"kernels": r["count"], "streams": r["streams"],
                                         "kernel_busy_ns": r["busy_ns"], "concurrent_ns": r["concurrent_ns"],
                                         "concurrency_pct": expr.pct(r["concurrent_ns"], r["busy_ns"]),
                                         "max_concurrent": r["max_depth"]}
                   for r in in_rank_order(per_device, ranks).iter_rows(named=True)}
        sms = _sm_count(trace, options, t)
        fill = measures.grid_fill(trace.events, sm_count=sms, short_ns=int(t["short_kernel_us"] * 1000))
        fill_by = {(r["trace_id"], r["device_id"]): r for r in fill.iter_rows(named=True)}
        for r in in_rank_order(per_device, ranks).iter_rows(named=True):
            f = fill_by.get((r["trace_id"], r["device_id"]))
            label = device_label(ranks, r.get("trace_id"), r["device_id"])
            devices[label]["underused_pct"] = expr.pct(f["idle_sm_ns"] + f["short_ns"], f["time_ns"]) if f else None
        fill_ns = int(fill["time_ns"].sum() or 0)
        underused_ns = int((fill["idle_sm_ns"].sum() or 0) + (fill["short_ns"].sum() or 0))
        underused = 100.0 * underused_ns / fill_ns if fill_ns else 0.0
        low = (n_kernels >= 2 and mean_us >= t["min_mean_kernel_us"] and underused >= t["warning_underused_pct"]
               and grade(pct, warning=t["warning_below_pct"], higher_is_worse=False) != "info")
        n_streams = len({s for ids in per_device["stream_ids"].to_list() for s in ids})
        message = (f"Two or more kernels run during {fmt_pct(pct)} of the {fmt_ns(busy)} the GPU runs kernels "
                   f"({n_kernels:,} kernels on {n_streams} stream(s), mean {mean_us:.1f} us).")
        small = int(fill["small_grid"].sum() or 0)
        short = int(fill["short"].sum() or 0)
        message += (f" The kernels leave {fmt_pct(underused)} of the SM time unused"
                    + (f" ({small:,} kernels have fewer blocks than the {sms} SMs" if sms else " (SM count unknown")
                    + (f"; {short:,} without a grid are shorter than {t['short_kernel_us']:g} us" if short else "")
                    + ").")
        if n_kernels < 2:
            message += " One kernel cannot overlap another."
        elif pct < t["warning_below_pct"] and underused < t["warning_underused_pct"]:
            message += (f" Low concurrency is not a problem here: under {t['warning_underused_pct']:g}% unused, "
                        "the kernels fill the GPU one at a time.")
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
                                 "concurrency_pct": round(pct, 4), "underused_pct": round(underused, 4),
                                 "idle_sm_ns": int(fill["idle_sm_ns"].sum() or 0),
                                 "short_kernel_ns": int(fill["short_ns"].sum() or 0),
                                 "small_grid_kernels": small, "sm_count": sms, "devices": devices},
                        figures=FIGURES, tables={"devices": DEVICES}, worst={"devices": "-concurrency_pct"})]


def _sm_count(trace: Trace, options: RuleOptions, t: dict) -> int | None:
    """The GPU's SM count: the ``sm_count`` threshold, else the trace's devices, else the GPU catalog."""
    if t["sm_count"]:
        return int(t["sm_count"])
    counts = [d.sm_count for d in trace.meta.devices if d.sm_count]
    if counts:
        return int(counts[0])
    try:
        spec, _ = gpu_for_trace(trace, options.gpu)
    except InputError:
        return None
    value = (spec or {}).get("sm_count")
    return int(value) if isinstance(value, (int, float)) and value > 0 else None


@hookimpl
def traceparse_rules():
    return [LowKernelConcurrency()]
