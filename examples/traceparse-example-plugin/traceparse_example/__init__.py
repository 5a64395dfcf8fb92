"""An example third-party plugin: two rules.

``short-kernels`` reads the event table itself; ``long-gaps`` is written on a
public measure (:mod:`traceparse.measures`) and the core's ``grade()``.

Rule ``short-kernels``: how much of the GPU's kernel work comes in launches too short to hide launch overhead.

Definition: a kernel call is short when its duration is under
``max_duration_us`` (default 10 us, about twice a typical launch latency);
short_pct = 100 × short calls / all timed kernel calls. Many short kernels
mean the GPU waits on the CPU to launch them: fuse operations or use CUDA
graphs. Metrics: ``short_calls``, ``calls``, ``short_pct``, ``short_time_ns``.
"""

import polars as pl

from traceparse import hookimpl, measures
from traceparse.rule import Finding, Rule, grade


class ShortKernels(Rule):
    name = "short-kernels"
    description = "Share of kernel launches shorter than a launch overhead can hide"
    definition = __doc__
    thresholds = {"max_duration_us": 10.0, "warning_above_pct": 50.0}
    kinds = ("kernel",)

    def check(self, trace, options):
        t = options.thresholds
        kernels = trace.events.filter((pl.col("kind") == "kernel") & pl.col("start_ns").is_not_null())
        short = kernels.filter(pl.col("duration_ns") < t["max_duration_us"] * 1000)
        calls = kernels.height
        pct = 100.0 * short.height / calls if calls else 0.0
        severity = "warning" if pct > t["warning_above_pct"] else "info"
        return [Finding(
            self.name, severity, "Short kernels",
            f"{short.height} of {calls} kernel calls ({pct:.1f}%) are shorter than {t['max_duration_us']} us.",
            "Fuse small operations (torch.compile) or capture the step in a CUDA graph." if severity != "info" else "",
            metrics={"short_calls": short.height, "calls": calls, "short_pct": round(pct, 4),
                     "short_time_ns": int(short["duration_ns"].sum() or 0)},
        )]


class LongGaps(Rule):
    """Rule ``long-gaps``: idle gaps of a device (between its kernels, copies, memsets) of at least ``min_gap_us``."""

    name = "long-gaps"
    description = "Idle gaps on a device at least min_gap_us long"
    definition = __doc__
    thresholds = {"min_gap_us": 100.0, "warning_gaps": 10}
    kinds = ("kernel", "memcpy", "memset")

    def check(self, trace, options):
        t = options.thresholds
        long = measures.gaps(trace.events).filter(pl.col("length") >= t["min_gap_us"] * 1000)
        total = int(long["length"].sum() or 0)
        return [Finding(self.name, grade(long.height, warning=t["warning_gaps"]), "Long idle gaps",
                        f"{long.height} gaps of at least {t['min_gap_us']} us, {total / 1e6:.3f} ms in all.",
                        metrics={"long_gaps": long.height, "long_gap_ns": total},
                        figures={"long_gaps": "count", "long_gap_ns": "ns"})]


@hookimpl
def traceparse_rules():
    return [ShortKernels(), LongGaps()]
