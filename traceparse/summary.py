"""The figures ``analyze`` opens with: span, steps, GPU busy, the bottleneck and the top kernel categories.

Computed from the measures (:mod:`traceparse.measures`) and the findings
the rules gave, so the summary of a trace says nothing a rule or a measure
does not; it knows no format and no rule.
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any, Iterable

import polars as pl

from traceparse import expr, measures
from traceparse.expr import GPU_KINDS
from traceparse.figures import shares_shown
from traceparse.measures.base import exact_sum
from traceparse.measures.routines import device_lane
from traceparse.measures.steps import step_series
from traceparse.meta import UNREAD, device_noun, device_nouns, gpu_processes, incomplete_notes
from traceparse.rule import Finding, severity_rank
from traceparse.run import trace_ranks, whole_ranks_only
from traceparse.schema import ASYNC_GROUP
from traceparse.verdict import QUIET_SHARE, is_quiet
from traceparse.trace import Trace

#: GPU busy share from which the summary calls the GPU's own work the bottleneck (``gpu_bound``) rather than the
#: remainder an info finding has at stake (an 8% idle GPU is not held back by its idle time).
GPU_BOUND_PCT = 90.0

#: Kernel categories listed in the summary.
TOP_CATEGORIES = 3


def summarize(trace: Trace, findings: Iterable[Finding] = ()) -> dict[str, Any]:
    """One trace's summary: what a reader needs before the findings, as a JSON-ready dict.

    Keys: ``trace`` (id), ``span_ns`` (first start to last end of any timed
    row), ``steps`` (how many), ``step_windows`` (how many windows their
    figures are over: in a run, each rank's), ``step_time_ns`` (the windows'
    mean duration),
    ``step_min_ns``, ``step_max_ns``, ``step_stdev_ns`` (the sample standard
    deviation, n - 1, as pandas' ``std()`` and ``nsys stats``' StdDev; None
    for one step),
    ``step_source`` (see :func:`step_windows`), ``gpu_bound`` (the GPU busy at
    least :data:`GPU_BOUND_PCT` % and no warning or worse at stake: its own
    work sets the pace), ``gpu_busy_pct`` (100 × Σ busy
    / Σ span over devices, as measure ``device_busy`` gives them, so it is 100
    minus gpu-idle's idle %, and like it of a run's whole ranks where some were
    cut short, :func:`~traceparse.run.whole_ranks_only` (``gpu_left_out_ranks``:
    which); None without timed GPU work; ``gpu_span_ns`` the span it is of (a
    device's first to last activity; of several, their mean); ``gpu_spin_pct``
    the part of it that is communication kernels spinning for a later rank
    while no compute kernel runs (None where none does), ``gpu_work_pct`` busy
    less spin (what ``gpu_bound`` grades; ``gpu_spin_unknown_ranks``: the
    ranks whose collectives' kernels were lost, a rank cut short: where there
    are any, the spin is a floor, the work a ceiling, and ``gpu_bound`` false); then
    ``gpu_totals_only`` is true where the trace gives GPU time as totals
    (nvprof's and nsys's summaries, TAU's and APEX's GPU routines) and
    ``gpu_launches_unseen`` counts the kernel launch calls whose GPU work the
    trace did not record at all, 0 otherwise; ``gpu_untimed``: ``{kind: rows}`` of the GPU rows it records
    without times, as a metrics-only log does; ``gpus_listed``: the names of the GPUs its header lists, where it
    has no GPU activity), ``other_devices``
    (:func:`other_devices`: the accelerators the trace lists that are no GPU, as
    ``{"TPU": 4}``, so that "GPU busy -" is not read as an idle GPU; there,
    :func:`lane_busy` adds ``lane_busy_pct``, ``lane_devices`` and ``top_lane_ops``:
    the device's ops with the most time, as shares of its ops' time), ``unread_events``
    (``{category: count}`` of the events the reader did not read, an MTIA's say:
    their time is in no figure), ``gpu_devices``
    (how many devices that is over: of several, the share is of the mean
    device's span, as gpu-idle's whole says), ``gpu_time``
    (:func:`gpu_time`: GPU time split into kernels, each copy direction and
    memsets; measure ``gpu_time_parts``), ``bottleneck`` (:func:`bottleneck`;
    on a run its time at stake is per rank), ``ranks`` (1 for a single
    trace), ``highlights`` (:func:`highlights`: e.g. a run's straggler) and
    ``top_categories`` (the kernel categories with the most time: category,
    time_ns, share_pct of kernel time) and ``incomplete`` (why the input was
    cut short, as its reader said: the figures cover what was read; empty
    for a whole input).
    """
    events = trace.events
    steps = step_windows(events)
    durations = steps["duration_ns"].to_list() if steps is not None else []
    # as gpu-idle: the whole ranks' GPUs, a cut rank's record being partial
    busy, left = whole_ranks_only(trace, measures.device_busy(events))
    span_sum = exact_sum(busy["span_ns"]) if busy.height else 0
    span_ns = trace_span(events)
    split = gpu_time(events)
    others = other_devices(trace.meta)
    busy_pct = round(100.0 * exact_sum(busy["busy_ns"]) / span_sum, 4) if span_sum else None
    # one GPU waits for no other: the collectives' waits are measured only where there are two or more
    spin_pct = (_spin_pct(events, exact_sum(busy["busy_ns"]), span_sum, set(left.values()))
                if span_sum and busy.height > 1 else None)
    work_pct = round(busy_pct - spin_pct, 4) if spin_pct else busy_pct
    # members that lost their collectives' kernels: their waits, and the others' for them, are not in the spin
    unknown = _arrivals_unknown(events) if spin_pct else []
    worst = bottleneck(findings, span_ns, totals_only=not span_sum and split is not None)
    return {
        "trace": trace.id,
        "span_ns": span_ns,
        "steps": steps["step"].n_unique() if durations else 0,
        "step_windows": len(durations),
        "step_time_ns": round(statistics.fmean(durations)) if durations else None,
        "step_min_ns": min(durations) if durations else None,
        "step_max_ns": max(durations) if durations else None,
        "step_stdev_ns": round(statistics.stdev(durations)) if len(durations) > 1 else None,
        "step_source": steps["source"][0] if durations else None,
        # steps a --window (or a range's instances) cut: their times are those of their parts inside it
        "steps_cut": int(((trace.meta.extra or {}).get("window") or {}).get("steps_cut") or 0) if durations else 0,
        # from the first step's start to the last one's end: against the span, how much of the capture is steps
        "steps_span_ns": int(steps["end_ns"].max() - steps["start_ns"].min()) if durations else None,
        "gpu_busy_pct": busy_pct,
        "gpu_spin_pct": spin_pct,
        "gpu_work_pct": work_pct,
        "gpu_spin_unknown_ranks": unknown,
        "gpu_devices": busy.height,
        "gpu_left_out_ranks": sorted(left.values()),
        "gpu_span_ns": span_sum // busy.height if busy.height else None,
        "gpu_launches_unseen": _launches(events) if not span_sum and split is None else 0,
        "gpu_untimed": _untimed_gpu(events) if not span_sum and split is None else {},
        "gpu_totals_only": not span_sum and split is not None,
        "gpus_listed": listed_gpus(trace.meta) if not span_sum and split is None else [],
        "other_devices": others,
        "unread_events": dict((trace.meta.extra or {}).get(UNREAD) or {}),
        **(lane_busy(events) if not span_sum and others else {}),
        "gpu_time": split,
        "bottleneck": worst,
        # a busy GPU's own work sets the pace: the info finding with most at stake is a remainder, not the cause
        # (its own work: communication kernels spinning for another rank keep a GPU busy, not bound)
        "gpu_bound": ((work_pct or 0) >= GPU_BOUND_PCT and not unknown
                      and (worst is None or worst["severity"] == "info")),
        "ranks": trace_ranks(trace),
        "highlights": highlights(findings),
        "top_categories": top_categories(events),
        "incomplete": incomplete_notes(trace.meta),
        # one trace of several processes' GPU work (one nsys report of a whole job): not ranks, said on screen
        "gpu_processes": (procs if len(procs := gpu_processes(trace.meta)) > 1 and trace_ranks(trace) == 1 else {}),
    }


def _arrivals_unknown(events) -> list:
    """The ranks (devices) whose collectives' arrivals are unknown (:func:`traceparse.measures.comm.arrivals_unknown`):
    where there are any, ``gpu_spin_pct`` is a floor and ``gpu_work_pct`` a ceiling."""
    from traceparse.measures.comm import arrivals_unknown

    return [m for m in arrivals_unknown(events) if m is not None]


def _spin_pct(events, busy_ns: int, span_sum: int, left: set = frozenset()) -> float | None:
    """100 × the time communication kernels spin for a later rank's while no compute kernel runs
    (:func:`traceparse.measures.comm.device_spin`, summed over the members but the ranks ``left`` out of the
    span) / Σ span over devices: the part of "GPU busy" that is waiting for another rank, not work. None where no
    kernel waits so."""
    from traceparse.measures.comm import device_spin

    spin = sum(ns for member, ns in device_spin(events).items() if member not in left)
    return round(100.0 * min(spin, busy_ns) / span_sum, 4) if spin > 0 else None


def other_devices(meta) -> dict[str, int]:
    """How many devices of each kind that is no GPU the trace lists (``{"TPU": 4}``); empty for GPUs alone."""
    return dict(Counter(device_nouns(meta).values()))


def listed_gpus(meta) -> list[str]:
    """The names of the GPUs a trace's header lists (Kineto's ``deviceProperties``), for a trace with no GPU
    activity read: a file cut before its GPU events still names the H100 it ran on, and "recorded no GPU
    activity" would say the run used none."""
    return [d.name or f"GPU {d.id}" for d in (getattr(meta, "devices", None) or [])
            if device_noun(d) == "GPU" and (d.name or d.id is not None)]


def lane_busy(events) -> dict[str, Any]:
    """For devices that are no GPU (a TPU: its work is on device lanes, no stream): ``lane_busy_pct``, 100 × Σ
    busy / Σ span over the devices of the union of their lanes' synchronous rows (a module over its ops counts
    once; asynchronous copies, which overlap the work, not at all), ``lane_devices``, and ``top_lane_ops``
    (the ops of those lanes with the most time, {name, time_ns, share_pct} of the ops' time: what a TPU spent
    itself on, where a GPU's summary names kernel categories); empty where no lane has timed rows."""
    lanes = device_lane()
    if "group" in events.columns:
        lanes = lanes & pl.col("group").ne_missing(ASYNC_GROUP)
    busy = measures.device_busy(events, kinds=lanes)
    span = exact_sum(busy["span_ns"]) if busy.height else 0
    if not span:
        return {}
    ops = (events.filter(lanes & (pl.col("kind") == "op") & pl.col("duration_ns").is_not_null())
           .group_by("name").agg(time_ns=pl.col("duration_ns").sum())
           .sort(["time_ns", "name"], descending=[True, False]))
    total = int(ops["time_ns"].sum() or 0)
    top = [{"name": r["name"], "time_ns": int(r["time_ns"]), "share_pct": round(100.0 * r["time_ns"] / total, 4)}
           for r in ops.head(TOP_CATEGORIES).iter_rows(named=True)] if total else []
    return {"lane_busy_pct": round(100.0 * exact_sum(busy["busy_ns"]) / span, 4), "lane_devices": busy.height,
            "top_lane_ops": top}


def _launches(events: pl.DataFrame) -> int:
    """The kernel launch calls of a trace whose GPU activity was not recorded (no timed GPU work): an API trace
    without a GPU trace (nsys where the GPU could not be traced), which a bare "GPU busy -" would not explain."""
    classes = measures.api_classes(events)
    return int(classes.filter(pl.col("category").is_in(["launch", "graph_launch"]))["calls"].sum() or 0)


def _untimed_gpu(events: pl.DataFrame) -> dict[str, int]:
    """``{kind: rows}`` of a trace's GPU rows (kernels, copies, memsets) that have no time (an nvprof metrics log
    lists its kernels by name with their metrics, never when they ran): "recorded no GPU activity" would deny
    the kernels the same screen lists."""
    rows = events.filter(expr.kind_is(*GPU_KINDS)).group_by("kind").len()
    return {str(kind): int(n) for kind, n in rows.sort("kind").iter_rows()}


def trace_span(events: pl.DataFrame) -> int | None:
    """Nanoseconds from the first start to the last end of the trace's rows, as ``ingest`` and ``show`` give it.

    The first ``start_ns`` of any row to the last ``start_ns + duration_ns``
    of any row, an instant (a counter sample, a marker without a duration)
    ending where it starts (the store's ``span_ns``); None when nothing is
    timed. Counting instants at the start but not at the end gave a span
    that was neither the slices' nor every event's.
    """
    first, last = events.select(first=pl.col("start_ns").min(),
                                last=(pl.col("start_ns") + pl.col("duration_ns").fill_null(0)).max()).row(0)
    return None if first is None or last is None else int(last - first)


def step_windows(events: pl.DataFrame) -> pl.DataFrame | None:
    """The trace's iterations: one row per step and rank (``step``, ``start_ns``, ``end_ns``, ``duration_ns``,
    ``source``), or None.

    :func:`traceparse.measures.steps.step_series`, the steps ``analyze --step``
    cuts and its per-step table lists: ``ProfilerStep#N``, else ranges named
    like steps (keeping their numbers), else one step per optimizer annotation.
    """
    steps = step_series(events)
    return steps.select("step", "start_ns", "end_ns", "duration_ns", "source") if steps.height else None


def highlights(findings: Iterable[Finding]) -> list[dict[str, Any]]:
    """The lines rules asked the summary to show (:attr:`Finding.summary`), worst finding first: {rule, label, text}."""
    found = [f for f in findings if f.summary]
    found.sort(key=lambda f: (-severity_rank(f.severity), -(f.impact_ns or 0), f.rule))
    return [{"rule": f.rule, "label": f.summary[0], "text": f.summary[1]} for f in found]


def gpu_time(events: pl.DataFrame) -> dict[str, Any] | None:
    """GPU time split by what the GPU did: kernels, each copy direction, memsets; or None without GPU time.

    ``{"total_ns", "parts": [{"part", "time_ns", "share_pct"}, ...]}``, parts
    largest first, as :func:`traceparse.measures.gpu_time_parts` gives them
    (kernels, each copy direction, memset: Σ durations, overlaps counted
    twice); the shares are of their total and add up to 100. It is what a
    trace without a timeline (nvprof or nsys summary reports) says about
    where the GPU's time went, copies included.
    """
    parts = measures.gpu_time_parts(events)
    total = int(parts["time_ns"].sum() or 0)
    if not total:
        return None
    return {"total_ns": total,
            "parts": [{"part": r["part"], "time_ns": r["time_ns"], "share_pct": round(100.0 * r["time_ns"] / total, 4)}
                      for r in parts.iter_rows(named=True)]}


def bottleneck(findings: Iterable[Finding], span_ns: int | None = None,
               totals_only: bool = False) -> dict[str, Any] | None:
    """The finding with the most time at stake: {rule, impact_ns, title, severity, whole, whole_ns, share_pct, range,
    said}, or None (``range``: the finding's :attr:`~traceparse.rule.Finding.impact_range`, where its time is a mean;
    ``said``: its :attr:`~traceparse.rule.Finding.impact_said`, "lost" unless the time is an estimated saving).

    The largest ``impact_ns`` (> 0) of any severity: an info finding with
    more time at stake than a warning is the bottleneck, and the panel shows
    its severity beside it; ties go to the worse severity, then the rule name.
    A finding with nothing to report (:func:`traceparse.verdict.is_quiet`:
    an info finding with under 1% of ``span_ns`` at stake) is no bottleneck:
    the summary would name what its own tally counts as nothing to report;
    nor is a warning with under 1% of ``span_ns`` at stake.
    ``share_pct`` is the time at stake's share of ``whole_ns``: the whole the finding says it is part of
    (:attr:`Finding.impact_whole`, e.g. the GPU's span), else the trace's span, so that the summary and the
    finding give one percentage for one figure.

    On a trace that gives GPU time as totals only (``totals_only``), where a finding with no time at stake
    is a warning or critical (a summary report's copies: their time summed over streams that ran at once cannot
    be said to be lost), the worst of those is the bottleneck with ``impact_ns`` None, unless a finding with
    time at stake is as severe: named, with no figure the trace cannot give.
    """
    findings = list(findings)
    # under 1% of the span at stake is no bottleneck at any severity: a warning of 3 ms in a 10 s trace named as
    # the headline read "0.0% of the span" (it stays a warning among the findings)
    timed = [f for f in findings if f.impact_ns and not is_quiet(f, span_ns)
             and not (span_ns and f.impact_ns < QUIET_SHARE * span_ns)]
    worst = _untimed(findings) if totals_only else None
    if worst is not None and (not timed or severity_rank(worst["severity"]) > max(
            severity_rank(f.severity) for f in timed)):
        return worst
    if not timed:
        return None
    best = min(timed, key=lambda f: (-f.impact_ns, -severity_rank(f.severity), f.rule))
    whole, whole_ns = best.impact_whole or ("the span", span_ns)
    share = min(100.0, round(100.0 * best.impact_ns / whole_ns, 4)) if whole_ns else None
    return {"rule": best.rule, "impact_ns": int(best.impact_ns), "title": best.title, "severity": best.severity,
            "whole": whole, "whole_ns": whole_ns, "share_pct": share, "range": best.impact_range,
            "said": best.impact_said}


def _untimed(findings: list[Finding]) -> dict[str, Any] | None:
    """The worst warning or critical finding, as a bottleneck with no time at stake; None without one."""
    flagged = [f for f in findings if not f.impact_ns and severity_rank(f.severity) >= severity_rank("warning")]
    if not flagged:
        return None
    best = min(flagged, key=lambda f: (-severity_rank(f.severity), f.rule, f.title))
    return {"rule": best.rule, "impact_ns": None, "title": best.title, "severity": best.severity,
            "whole": None, "whole_ns": None, "share_pct": None, "range": None, "said": best.impact_said}


def top_categories(events: pl.DataFrame, n: int = TOP_CATEGORIES) -> list[dict[str, Any]]:
    """The ``n`` kernel categories with the most time (measure ``time_by_category``), with their share of kernel time:
    exact (``share_pct``) and as shown (``shown_pct``, to 0.1: rounded with every category, so that the summary,
    kernel-share's sentence and its table say one figure)."""
    cats = measures.time_by_category(events).filter(pl.col("time_ns").is_not_null())
    cats = cats.group_by("category").agg(pl.col("time_ns").sum()).sort(["time_ns", "category"],
                                                                         descending=[True, False])
    total = int(cats["time_ns"].sum() or 0)
    shares = [round(100.0 * t / total, 4) if total else None for t in cats["time_ns"]]
    shown = shares_shown(shares)  # with every category, as kernel-share's table and sentence round them
    return [{"category": r["category"], "time_ns": int(r["time_ns"]), "share_pct": share,
             "shown_pct": None if seen is None else float(seen)}
            for r, share, seen in zip(cats.head(n).iter_rows(named=True), shares, shown)]
