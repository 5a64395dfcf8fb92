"""Rule ``short-kernels``: how much of the GPU's kernel work comes in launches too short to hide launch overhead.

Definition: a kernel call is short when its duration is under
``max_duration_us`` (default 10 us, about twice a typical launch latency);
short_pct = 100 × short calls / all timed kernel calls. Many short kernels
mean the GPU waits on the CPU to launch them: fuse operations or use CUDA
graphs. Metrics: ``short_calls``, ``calls``, ``short_pct``, ``short_time_ns``.
"""

import polars as pl

from traceparse import hookimpl
from traceparse.rule import Finding, Rule


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


@hookimpl
def traceparse_rules():
    return [ShortKernels()]
