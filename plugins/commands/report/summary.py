"""The report's summary of one trace or run: span, steps, GPU busy %, the worst findings, the top categories.

Kept in one function (:func:`summarize`) with the same keys as ``analyze
--json``'s ``summary`` rows (issue 11), so a core summary module can take
its place without touching the page.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from traceparse import expr, measures
from traceparse.rule import Finding, severity_rank

#: Findings named in the summary's "worst findings".
WORST = 3
#: Kernel categories named in the summary.
TOP_CATEGORIES = 3


def impact(finding: Finding) -> int | None:
    """The time a finding has at stake (``Finding.impact_ns`` where the rule gives one), else None."""
    value = getattr(finding, "impact_ns", None)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def ordered(findings: list[Finding]) -> list[Finding]:
    """Findings most severe first, then most time at stake first; otherwise in the rules' order."""
    return sorted(findings, key=lambda f: (-severity_rank(f.severity), -(impact(f) or 0)))


def summarize(trace, findings: list[Finding]) -> dict[str, Any]:
    """The summary of ``trace`` given its ``findings``.

    Keys: ``trace``, ``span_ns`` (first start to last end of the timed events),
    ``steps`` (host ``ProfilerStep#N`` annotations: distinct step numbers),
    ``step_time_ns`` (their mean duration; a run: over every rank's steps),
    ``step_min_ns`` / ``step_max_ns``, ``gpu_busy_pct`` (Σ busy / Σ span of
    every device's timed GPU activity, :func:`traceparse.measures.device_busy`;
    None without any), ``bottleneck`` ({rule, title, severity, impact_ns} of
    the first finding in :func:`ordered` order that is not info; None when all
    are), ``worst`` (up to :data:`WORST` such findings, as the bottleneck), and
    ``top_categories`` ([{category, time_ns, share_pct}] of kernel time).
    """
    events = trace.events
    timed = events.filter(expr.timed() & pl.col("duration_ns").is_not_null())
    span = (timed.select((pl.col("start_ns") + pl.col("duration_ns")).max() - pl.col("start_ns").min()).item()
            if timed.height else (trace.meta.summary or {}).get("span_ns"))
    steps = measures.steps(events)
    if steps.height and steps["on_host"].any():
        steps = steps.filter(pl.col("on_host"))
    durations = steps["duration_ns"] if steps.height else None
    busy = measures.device_busy(events)
    total_span = int(busy["span_ns"].sum() or 0) if busy.height else 0
    busy_pct = 100.0 * int(busy["busy_ns"].sum()) / total_span if total_span else None
    serious = [f for f in ordered(findings) if f.severity != "info"]
    worst = [{"rule": f.rule, "title": f.title, "severity": f.severity, "impact_ns": impact(f)}
             for f in serious[:WORST]]
    categories = (measures.time_by_category(events).filter(pl.col("time_ns").is_not_null())
                  .group_by("category").agg(pl.col("time_ns").sum())
                  .sort(["time_ns", "category"], descending=[True, False]))
    kernel_ns = int(categories["time_ns"].sum() or 0)
    top = [{"category": r["category"], "time_ns": int(r["time_ns"]),
            "share_pct": 100.0 * r["time_ns"] / kernel_ns if kernel_ns else None}
           for r in categories.head(TOP_CATEGORIES).iter_rows(named=True)]
    return {
        "trace": trace.id,
        "span_ns": int(span) if span is not None else None,
        "steps": steps["step"].n_unique() if steps.height else 0,
        "step_time_ns": float(durations.mean()) if durations is not None else None,
        "step_min_ns": int(durations.min()) if durations is not None else None,
        "step_max_ns": int(durations.max()) if durations is not None else None,
        "gpu_busy_pct": busy_pct,
        "bottleneck": worst[0] if worst else None,
        "worst": worst,
        "top_categories": top,
    }
