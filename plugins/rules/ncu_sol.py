"""Rule ``ncu-sol``: how close each profiled kernel gets to the GPU's peak compute and memory throughput.

Source: Nsight Compute's "GPU Speed Of Light Throughput" section (SOL), as
the ncu reader stores it: ``counter`` rows whose ``parent_id`` is the
profiled launch, named as the details page and the text output label them
("Compute (SM) Throughput", "Memory Throughput", "DRAM Throughput", in %
of the device's peak) or as the raw page names them
(``sm__throughput.avg.pct_of_peak_sustained_elapsed``,
``gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed``,
``gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed``).

Per launch: ``compute_pct``, ``memory_pct``, ``dram_pct`` and its bound,
classified as ncu's own SOLBottleneck rule words it: the larger of compute
and memory at or above ``high_pct`` (80) is "compute at peak" / "memory at
peak"; at or above ``low_pct`` (60) "compute" / "memory"; both under
``low_pct`` is "latency" (ncu: "achieved compute throughput and/or memory
bandwidth below 60.0% of peak typically indicate latency issues"). Per
kernel name: launches, time_ns (Σ duration), the three percentages as
duration-weighted means over its launches (plain means where a launch has
no duration), and the bound of those means.

Metrics: ``kernel_time_ns`` (Σ duration of the launches with SOL figures),
``launches``, ``compute_pct``, ``memory_pct``, ``dram_pct`` (duration-weighted
over every launch), ``compute_bound_ns``, ``memory_bound_ns``,
``latency_bound_ns`` (Σ duration of the launches of each bound, "at peak"
included in its unit) and ``latency_bound_pct`` = 100 × latency_bound_ns /
kernel_time_ns. Items: the ``top`` kernels by time.

Severity: warning when ``latency_bound_pct`` is at or above
``warning_latency_pct``, critical from ``critical_latency_pct``. No time at
stake: SOL says where a kernel stands against the peaks, not what a change
would win.
"""

from __future__ import annotations

import polars as pl

from traceparse import expr
from traceparse.figures import fmt_ns, fmt_pct
from traceparse.names import short_name
from traceparse.plugins import hookimpl
from traceparse.rule import Column, Finding, Rule, RuleOptions, grade
from traceparse.trace import Trace

#: Figure -> the counter names that carry it (details page / text label, raw page metric).
#: ncu 2019.x-2020.x named them "SM [%]", "Memory [%]" and "SOL FB" (or "SOL DRAM").
SOL = {
    "compute_pct": ("Compute (SM) Throughput", "sm__throughput.avg.pct_of_peak_sustained_elapsed", "SM [%]"),
    "memory_pct": ("Memory Throughput", "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
                   "Memory [%]"),
    "dram_pct": ("DRAM Throughput", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", "SOL FB",
                 "SOL DRAM"),
}
SOL_NAMES = {name: figure for figure, names in SOL.items() for name in names}
FIGURES = {"kernel_time_ns": "ns", "launches": "count", "compute_pct": "pct", "memory_pct": "pct",
           "dram_pct": "pct", "compute_bound_ns": "ns", "memory_bound_ns": "ns", "latency_bound_ns": "ns",
           "latency_bound_pct": "pct"}
#: Screen labels where the key's words would read like another figure: the share apart from the time.
LABELS = {"latency_bound_pct": "latency bound share"}
COLUMNS = [Column("name", "kernel", "name"), Column("time_ns", "time", "ns"),
           Column("compute_pct", "compute %", "pct"), Column("memory_pct", "memory %", "pct"),
           Column("bound", "bound", "text"), Column("dram_pct", "DRAM %", "pct"), Column("launches", "launches", "count")]


def bound(compute: float | None, memory: float | None, low: float, high: float) -> str | None:
    """ncu's SOL verdict for a compute and a memory throughput (% of peak): which unit, at peak or not, or latency."""
    if compute is None and memory is None:
        return None
    c, m = compute or 0.0, memory or 0.0
    unit = "compute" if c >= m else "memory"
    top = max(c, m)
    if top >= high:
        return f"{unit} at peak"
    return unit if top >= low else "latency"


def sol_per_launch(events: pl.DataFrame) -> pl.DataFrame:
    """One row per profiled launch with SOL figures: launch (event_id), name, duration_ns, compute/memory/dram_pct."""
    counters = events.filter(expr.kind_is("counter") & pl.col("name").is_in(list(SOL_NAMES))
                             & pl.col("value").is_not_null() & pl.col("parent_id").is_not_null())
    if counters.height == 0:
        return pl.DataFrame(schema={"trace_id": pl.String, "launch": pl.Int64, "name": pl.String,
                                    "duration_ns": pl.Int64, **{f: pl.Float64 for f in SOL}})
    wide = (counters.with_columns(figure=pl.col("name").replace_strict(SOL_NAMES, return_dtype=pl.String))
            .group_by("trace_id", "parent_id", "figure").agg(pl.col("value").first())
            .pivot(on="figure", index=["trace_id", "parent_id"], values="value"))
    for figure in SOL:
        if figure not in wide.columns:
            wide = wide.with_columns(pl.lit(None, pl.Float64).alias(figure))
    kernels = events.filter(expr.kind_is("kernel")).select("trace_id", launch="event_id", name="name",
                                                           duration_ns="duration_ns")
    return (wide.rename({"parent_id": "launch"}).join(kernels, on=["trace_id", "launch"], how="inner")
            .select("trace_id", "launch", "name", "duration_ns", *SOL).sort("trace_id", "launch"))


class NcuSol(Rule):
    name = "ncu-sol"
    description = "Compute and memory throughput of each profiled kernel, % of the GPU's peak (ncu Speed Of Light)"
    definition = __doc__
    thresholds = {
        "low_pct": 60.0,                # both compute and memory under this % of peak: latency-bound (ncu's 60%)
        "high_pct": 80.0,               # the larger at or above this: at peak (ncu's 80%)
        "warning_latency_pct": 50.0,    # latency-bound launches take at least this % of kernel time: warning
        "critical_latency_pct": 80.0,   # ... at least this %: critical
        "top": 10,                      # kernels listed
    }
    kinds = ("counter",)
    needs = "ncu's Speed-of-Light figures (the SpeedOfLight section or its raw metrics)"

    def applies_to(self, trace: Trace) -> bool:
        """Only traces with SOL counters (an ncu report with the SpeedOfLight section or its raw metrics)."""
        return trace.events.filter(expr.kind_is("counter") & pl.col("name").is_in(list(SOL_NAMES))).height > 0

    def check(self, trace: Trace, options: RuleOptions) -> list[Finding]:
        t = options.thresholds
        low, high = float(t["low_pct"]), float(t["high_pct"])
        launches = sol_per_launch(trace.events)
        weight = pl.col("duration_ns").cast(pl.Float64).fill_null(1.0)
        launches = launches.with_columns(weight=weight).with_columns(
            bound=pl.struct("compute_pct", "memory_pct").map_elements(
                lambda r: bound(r["compute_pct"], r["memory_pct"], low, high), return_dtype=pl.String))
        time_ns = int(launches["duration_ns"].sum() or 0)

        def mean(frame: pl.DataFrame, figure: str) -> float | None:
            known = frame.filter(pl.col(figure).is_not_null())
            total = float(known["weight"].sum() or 0)
            return round(float((known[figure] * known["weight"]).sum()) / total, 4) if total else None

        def bound_ns(*bounds: str) -> int:
            return int(launches.filter(pl.col("bound").is_in(list(bounds)))["duration_ns"].sum() or 0)

        per_name = []
        for (name,), group in launches.group_by("name", maintain_order=True):
            figures = {f: mean(group, f) for f in SOL}
            per_name.append({"name": name, "launches": group.height,
                             "time_ns": int(group["duration_ns"].sum() or 0), **figures,
                             "bound": bound(figures["compute_pct"], figures["memory_pct"], low, high)})
        per_name.sort(key=lambda r: (-r["time_ns"], r["name"]))
        latency_ns = bound_ns("latency")
        latency_pct = expr.pct(latency_ns, time_ns)
        metrics = {"kernel_time_ns": time_ns, "launches": launches.height,
                   **{f: mean(launches, f) for f in SOL},
                   "compute_bound_ns": bound_ns("compute", "compute at peak"),
                   "memory_bound_ns": bound_ns("memory", "memory at peak"),
                   "latency_bound_ns": latency_ns, "latency_bound_pct": latency_pct}
        severity = grade(latency_pct, warning=t["warning_latency_pct"], critical=t["critical_latency_pct"])
        counts = launches.group_by("bound").len().sort(["len", "bound"], descending=[True, False])
        spread = ", ".join(f"{r['bound']} {r['len']}" for r in counts.iter_rows(named=True))
        top = per_name[0] if per_name else None
        message = (f"{launches.height:,} profiled launches ({fmt_ns(time_ns)}): compute "
                   f"{_p(metrics['compute_pct'])} and memory {_p(metrics['memory_pct'])} of the GPU's peak, "
                   f"DRAM {_p(metrics['dram_pct'])} (duration-weighted). By launch: {spread}; latency-bound "
                   f"launches (both under {low:g}%) take {_p(latency_pct)} of the kernel time.")
        if top:
            message += (f" The longest kernel, {short_name(top['name'], 60)}, reaches compute {_p(top['compute_pct'])}, "
                        f"memory {_p(top['memory_pct'])}: {top['bound']}.")
        suggestion = ""
        if severity != "info":
            suggestion = ("Kernels far from both peaks wait on latency: too few warps in flight (occupancy, the "
                          "launch's grid), dependent loads, synchronisation. See ncu-speedups and ncu's Occupancy "
                          "and Launch Statistics sections; small kernels gain most from fusion or larger batches.")
        return [Finding(self.name, severity, "Kernels far from the GPU's peaks" if severity != "info"
                        else "Speed Of Light per kernel", message, suggestion, metrics=metrics,
                        items=per_name[:int(t["top"])], columns=COLUMNS, figures=FIGURES,
                        labels=LABELS, impact_ns=None)]


def _p(value: float | None) -> str:
    return fmt_pct(value)


@hookimpl
def traceparse_rules():
    return [NcuSol()]
