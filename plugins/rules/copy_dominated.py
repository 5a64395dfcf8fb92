"""Rule ``copy-dominated``: copies take most of the GPU's time.

Definition: GPU time = Σ durations of kernels, copies (memcpy) and memsets,
per part (timed events in preference to aggregated rows of the same kind, so
nvprof's summary and nsys's
``*_sum`` reports count with their totals); ``copy_pct`` = 100 × copy time /
GPU time, ``host_device_pct`` the same for HtoD and DtoH copies only.
Overlaps are counted twice, as summary reports count them (nvprof's "GPU
activities" Time(%)).

Time at stake (the summary's bottleneck): where copies take at least
``warning_pct`` of GPU time, the copy time that no kernel hides: the
time some copy runs while no kernel runs on the same device (copies that
overlap each other count once). Aggregated rows (a summary report) cannot
say what ran at once, so there it is unknown (``exposed_copy_ns`` null)
and no time is at stake: their summed copy time can be longer than the
program (copies on four streams at once).
Under ``warning_pct``: none (the copies are not
what the GPU mostly does).

Metrics: ``gpu_time_ns``, ``copy_time_ns``, ``copy_pct``,
``host_device_time_ns``, ``host_device_pct``, ``kernel_time_ns``,
``exposed_copy_ns``, ``aggregated`` (true when the copy time comes from
summary rows). Items, one per part of GPU time: ``part``, ``time_ns``,
``share_pct``.

Severity: warning when ``copy_pct`` is at or above ``warning_pct``,
critical from ``critical_pct``.
"""

from __future__ import annotations

import polars as pl

from traceparse import expr, measures
from traceparse.figures import fmt_ns, fmt_pct, shares_shown
from traceparse.plugins import hookimpl
from traceparse.rule import Column, Finding, Rule, RuleOptions, grade
from traceparse.trace import Trace

FIGURES = {"gpu_time_ns": "ns", "copy_time_ns": "ns", "copy_pct": "pct", "host_device_time_ns": "ns",
           "host_device_pct": "pct", "kernel_time_ns": "ns", "exposed_copy_ns": "ns"}
COLUMNS = [Column("part", "part", "text"), Column("time_ns", "time", "ns"), Column("share_pct", "share %", "pct")]
NOT_COPIES = ("kernels", "memset")


class CopyDominated(Rule):
    name = "copy-dominated"
    description = "Share of the GPU's time spent copying (HtoD, DtoH, DtoD, ...) rather than running kernels"
    definition = __doc__
    thresholds = {
        "warning_pct": 50.0,     # copies at or above this % of GPU time: warning (and time at stake)
        "critical_pct": 80.0,    # ... at or above this %: critical
    }
    kinds = ("memcpy",)

    def check(self, trace: Trace, options: RuleOptions) -> list[Finding]:
        t = options.thresholds
        events = trace.events
        parts = measures.gpu_time_parts(events)
        gpu_ns = int(parts["time_ns"].sum() or 0)
        copies = parts.filter(~pl.col("part").is_in(NOT_COPIES))
        copy_ns = int(copies["time_ns"].sum() or 0)
        host_ns = int(copies.filter(pl.col("part").is_in(expr.HOST_DEVICE))["time_ns"].sum() or 0)
        kernel_ns = int(parts.filter(pl.col("part") == "kernels")["time_ns"].sum() or 0)
        aggregated = bool(copies.height and copies["aggregated"].all())
        copy_pct = expr.pct(copy_ns, gpu_ns)
        host_pct = expr.pct(host_ns, gpu_ns)
        items = [{"part": r["part"], "time_ns": r["time_ns"], "share_pct": expr.pct(r["time_ns"], gpu_ns)}
                 for r in parts.iter_rows(named=True)]
        # summary rows sum copies that may have run at once (four streams: 3.3 s of copies in a 2.1 s loop) and
        # say nothing of what ran beside them: what no kernel hid is unknown, and no time is put at stake
        exposed = None if aggregated else _exposed(events, copy_ns)
        severity = grade(copy_pct, warning=t["warning_pct"], critical=t["critical_pct"]) if gpu_ns else "info"
        if not copy_ns:
            message = "No copy with a known duration."
        else:
            # the kernels' share as the table of parts shows it (its shares add up to 100 as shown)
            shown = dict(zip((i["part"] for i in items), shares_shown([i["share_pct"] for i in items])))
            message = (f"Copies take {fmt_ns(copy_ns)} of {fmt_ns(gpu_ns)} of GPU time ({fmt_pct(copy_pct)}; "
                       f"host-device {fmt_pct(host_pct)}), kernels {fmt_ns(kernel_ns)} "
                       f"({fmt_pct(shown.get('kernels', expr.pct(kernel_ns, gpu_ns)) or 0)}). ")
            message += ("The copy time comes from summary rows, so what kernels hid of it is unknown."
                        if aggregated else f"For {fmt_ns(exposed)} the GPU copies while no kernel runs on "
                        "its device.")
        suggestion = ""
        if severity != "info":
            suggestion = ("Keep data on the GPU between steps, copy less (smaller dtypes, only what changed), and "
                          "overlap what must be copied with compute: pinned host memory and non_blocking copies on "
                          "their own stream (see low-memcpy-throughput and pageable-memcpy).")
        return [Finding(self.name, severity, "Copy-dominated GPU" if severity != "info" else "Copies in GPU time",
                        message, suggestion,
                        metrics={"gpu_time_ns": gpu_ns, "copy_time_ns": copy_ns, "copy_pct": copy_pct,
                                 "host_device_time_ns": host_ns, "host_device_pct": host_pct,
                                 "kernel_time_ns": kernel_ns, "exposed_copy_ns": exposed, "aggregated": aggregated},
                        items=items, columns=COLUMNS, figures=FIGURES,
                        impact_ns=exposed if severity != "info" and exposed is not None else None)]


def _exposed(events: pl.DataFrame, copy_ns: int) -> int:
    """The time copies run while no kernel runs on the same device (timed copies), at most ``copy_ns``: copies
    at once on two streams count once (their summed time ran to 157% of the trace's span)."""
    overlap = measures.overlap(events, a=("memcpy",), b=("kernel",))
    exposed = int(overlap["busy_exposed_ns"].sum() or 0) if overlap.height else copy_ns
    return min(exposed, copy_ns)


@hookimpl
def traceparse_rules():
    return [CopyDominated()]
