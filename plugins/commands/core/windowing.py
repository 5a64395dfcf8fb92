"""``analyze --step N|all``, ``--window START:END``, ``--nvtx NAME``: analyse a part of each trace.

The traces are cut with :mod:`traceparse.window` before any rule runs, so
every rule sees a normal trace that holds only the chosen time. ``--step
all`` also prints (and puts in the JSON as ``steps``) one row per step: its
time, GPU busy %, idle time and top kernel category.

With ``--scheduler``, a cut run is measured in this process: the cluster's
workers read whole ranks from the store, not the cut.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any

from traceparse.errors import InputError
from traceparse.report import fitted_table, fmt_ns
from traceparse.text import literal
from traceparse.verdict import Column


def add_options(parser: argparse.ArgumentParser) -> None:
    """``--step``, ``--window``, ``--nvtx`` (``--window`` goes with neither of the others)."""
    parser.add_argument("--step", metavar="N|all",
                        help="analyse only step N (as the trace numbers its steps: ProfilerStep#N, a range "
                             "named like 'step N', else the Nth optimizer step; with --nvtx, the range's Nth "
                             "instance or the one numbered N), or all steps with a per-step table first")
    parser.add_argument("--window", metavar="START:END",
                        help="analyse only this window, in ms from the trace's start (either side may be empty)")
    parser.add_argument("--nvtx", metavar="NAME",
                        help="analyse only inside the instances of this NVTX range / user annotation "
                             "(glob patterns allowed), laid end to end")


@dataclass
class View:
    """The traces to analyse (cut, or as they were), and what to print about the cut."""

    traces: list
    label: str | None = None
    steps: list[dict[str, Any]] | None = None
    source: str | None = None  # what marks the steps (--step without --nvtx), as the summary says it
    cuts: list[dict[str, Any]] = field(default_factory=list)
    origins: dict[str, int] = field(default_factory=dict)  # each trace's (a run's) first start, for the start column

    def json(self) -> dict[str, Any]:
        """The keys ``analyze --json`` gains: ``window`` when a window was chosen, ``steps`` with ``--step all``."""
        out: dict[str, Any] = {}
        if self.label:
            out["window"] = {"label": self.label, "windows": self.cuts}
            if self.source:
                out["window"]["step_source"] = self.source
        if self.steps is not None:
            out["steps"] = self.steps
        return out

    def render(self, console) -> None:
        """Before the findings: what was cut, and with ``--step all`` the per-step table."""
        if not self.label:
            return
        for trace in self.traces:
            w = trace.meta.extra.get("window", {})
            per: dict[Any, int] = {}
            for x in w.get("windows", []):
                per[x["trace"]] = per.get(x["trace"], 0) + x["end_ns"] - x["start_ns"]
            inside = sum(per.values()) / max(len(per), 1)
            console.print(literal(f"{w.get('label')}: {fmt_ns(inside)} analysed{' per rank' if len(per) > 1 else ''} "
                                  f"of {Path(_name(trace)).name}"), highlight=False)
        if self.steps:
            for part in steps_table(self.steps, self.origins, self.source, console.width):
                console.print(part)


def steps_table(rows: list[dict[str, Any]], origins: dict[str, int], source: str | None = None,
                width: int = 80) -> list[Any]:
    """The per-step table: step, start (from the trace's start), time, GPU busy (of the step's time), idle, top kernel
    category, as renderables that fit ``width`` (:func:`traceparse.report.fitted_table`: each time column in one
    unit, no figure ever cut: "135.2 …" above "47.39 …" read as starts going backwards).

    ``source`` (what marks the steps, as the summary says it) goes in the title.
    """
    ranks = any(r["rank"] is not None for r in rows)
    several = not ranks and len({r["trace"] for r in rows}) > 1
    first = ([Column("rank", "rank", "number")] if ranks else [Column("trace", "trace", "text")] if several else [])
    # of the step's time: not the summary's "GPU busy", which is of the GPU's span (first to last activity) inside it
    columns = [*first, Column("step", "step", "number"), Column("start_ns", "start", "ns"),
               Column("dur_ns", "time", "ns"), Column("gpu_busy_pct", "GPU busy of step", "pct"),
               Column("idle_ns", "idle", "ns"), Column("top_category", "top category", "text")]
    table = [{"rank": r["rank"], "trace": str(r["trace"])[:8], "step": r["step"],
              "start_ns": r["start_ns"] - origins.get(r["trace"] or "", r["start_ns"]), "dur_ns": r["dur_ns"],
              "gpu_busy_pct": r["gpu_busy_pct"], "idle_ns": r["idle_ns"], "top_category": r["top_category"] or "-"}
             for r in rows]
    return fitted_table(columns, table, width, title=f"steps ({source})" if source else "steps")


def apply(args: argparse.Namespace, traces: list) -> View:
    """Cut ``traces`` as ``--step`` / ``--window`` / ``--nvtx`` ask; one-line errors for values that select nothing."""
    if args.step is None and args.window is None and args.nvtx is None:
        return View(traces)
    from traceparse import window  # here: the cut's modules load only when a window is asked for
    if args.window is not None and (args.step is not None or args.nvtx is not None):
        raise InputError("--window cannot be combined with --step or --nvtx (a window is a part of the trace; "
                         "steps and ranges are others)")
    number = _step_number(args.step) if args.step is not None else None
    source = None
    if args.window is not None:
        lo, hi = window.parse_window(args.window)
        label = f"window {args.window} ms"
        chosen = [(t, window.offset_windows(t, lo, hi)) for t in traces]
    elif args.nvtx is not None:
        label = f"range {args.nvtx}" + ("" if args.step is None else
                                        " (all instances)" if number is None else f" instance {number}")
        chosen = [(t, window.range_windows(t, args.nvtx, number)) for t in traces]
    else:
        label = "all steps" if number is None else f"step {number}"
        chosen = [(t, window.step_windows(t, number)) for t in traces]
        source = next((s for t in traces if (s := window.step_source(t))), None)
    for trace, wins in chosen:
        if wins.height == 0:
            raise InputError(_nothing(args, trace))
    cut = [window.cut(t, wins, label) for t, wins in chosen]
    for before, after in zip(traces, cut):
        if after.events.filter(after.events["start_ns"].is_not_null()).height == 0:
            raise InputError(_nothing(args, before))
    cuts = [{"trace": t.id, **{k: v for k, v in w.items() if k != "trace"}}
            for t in cut for w in t.meta.extra["window"]["windows"]]
    steps, origins = None, {}
    if args.step is not None and number is None:
        steps = [row for trace, wins in chosen for row in window.step_table(trace, wins)]
        origins = {k: v for trace in traces for k, v in window.trace_origins(trace).items()}
    return View(cut, label, steps, source, cuts, origins)


def _step_number(text: str) -> int | None:
    if text.strip().lower() == "all":
        return None
    try:
        return int(text)
    except ValueError:
        raise InputError(f"--step {text!r}: expected a step number (as in ProfilerStep#N) or all") from None


def _nothing(args: argparse.Namespace, trace) -> str:
    """The one-line error for a window that selects nothing in ``trace``, naming what it has instead."""
    from traceparse import window

    name = _name(trace)
    if args.nvtx is not None and args.step is not None and window.range_windows(trace, args.nvtx).height:
        count = window.range_windows(trace, args.nvtx).height
        return (f"--step {args.step}: {name} has {count:,} instance{'s' * (count != 1)} of range {args.nvtx}, "
                f"no {args.step}")
    if args.nvtx is not None:
        names = window.range_names(trace)
        have = f"its ranges: {', '.join(names)}" if names else "it has no timed ranges"
        return f"--nvtx {args.nvtx!r}: {name} has no range named {args.nvtx} ({have})"
    if args.window is not None:
        ev = trace.events.filter(trace.events["start_ns"].is_not_null())
        if ev.height == 0:
            return f"--window {args.window!r}: {name} has no timed events to cut a window from"
        span = (ev["start_ns"] + ev["duration_ns"].fill_null(0)).max() - ev["start_ns"].min()
        return f"--window {args.window!r}: {name} has no event in that window (it spans {fmt_ns(span)} from its start)"
    steps = window.step_windows(trace)["step"].unique().sort().to_list()
    if not steps:
        return (f"--step {args.step}: {name} has no steps (no ProfilerStep#N annotations, ranges named like steps "
                "or optimizer annotations); use --nvtx NAME or --window START:END")
    return (f"--step {args.step}: {name} has no step {args.step} "
            f"(its steps, from {window.step_source(trace)}: {_numbers(steps)})")


def _numbers(steps: list[int]) -> str:
    """``1, 2, 3`` or, for many, ``1-60`` where they run without a gap (an error message stays one short line)."""
    if len(steps) > 6 and steps == list(range(steps[0], steps[0] + len(steps))):
        return f"{steps[0]}-{steps[-1]}"
    return ", ".join(map(str, steps))


def _name(trace) -> str:
    run = (trace.meta.extra or {}).get("run") or {}
    return run.get("name") or trace.meta.path or trace.id or "the trace"
