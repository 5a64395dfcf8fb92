"""Command ``traceparse whatif TRACE|RUN``: each step's dependency graph replayed with changed durations.

Definition (docs/critical_path.md, "What if"): the graph of :data:`traceparse.measures.dependency_graph` (host
threads in order, launches, stream order, synchronisations, collectives across ranks) is run forwards by the replay
engine (:mod:`traceparse.measures.replay`, the one the step-time predictor uses) with the edited weights
(:mod:`traceparse.measures.whatif`): ``--drop NAME[@RANK]`` (a host op or annotation takes no time: its self time
removed, its children kept; NAME exactly or a glob), ``--scale KIND_OR_CATEGORY=FACTOR`` (``kernel``, ``memcpy``,
``memset``, ``comm``, or a kernel category of kernel-share: ``gemm=0.5``), ``--balance`` (every rank behaves like
the median rank: per name, a rank's excess time per step over the median rank's removed). Edits combine.

Per step of each rank: the measured step, the predicted one (the replayed time between the step's two ends) and
the gain (measured − predicted); then the mean per rank and over every step, and the predicted critical path's
largest parts per step. With no edit the prediction is the measured step. What the trace does not show (untraced
time on the path, edges the format lacks) is said, and kept as measured rather than guessed.
"""

from __future__ import annotations

import argparse

from rich.text import Text

from traceparse import expr
from traceparse.command import Command
from traceparse.errors import InputError
from traceparse.figures import ends_early, fmt_count, fmt_ns, fmt_pct
from traceparse.measures.whatif import BALANCE_MIN_EXCESS, parse_drop, parse_scale, slowest_step, what_if
from traceparse.meta import incomplete_ranks
from traceparse.plugins import hookimpl
from traceparse.report import TABLE_ROWS, fitted_table, fold_rows, trace_label
from traceparse.run import cut_rank_traces
from traceparse.rule import RuleOptions
from traceparse.threads import thread_names
from traceparse.text import literal
from traceparse.verdict import Column

STEP_COLUMNS = [Column("step", "step", "text"), Column("rank", "rank", "text"),
                Column("measured_ns", "measured", "ns"), Column("predicted_ns", "predicted", "ns"),
                Column("gain_ns", "gain", "ns"), Column("gain_pct", "gain %", "pct")]
PATH_COLUMNS = [Column("rank", "rank", "text"), Column("lane", "thread / stream", "text"),
                Column("kind", "kind", "text"), Column("name", "name", "name"),
                Column("per_step_ns", "per step", "ns"), Column("share_pct", "share", "pct")]


class WhatIfCommand(Command):
    name = "whatif"
    help = "replay each step with changed durations: predicted step time per rank, gain, new critical path"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """TRACE (a trace or a run), the edits (``--drop``, ``--scale``, ``--balance``), ``--top``,
        ``--align-clocks`` and the common options."""
        self.add_common_options(parser, traces="?", json=True, fmt=True,
                                trace_help="a store id (or prefix), a run's name, a path, or a rank directory "
                                           "(default: the last ingested trace or run)")
        parser.add_argument("--drop", action="append", default=[], metavar="NAME[@RANK]",
                            help="a host op or annotation takes no time (its self time removed, its children kept); "
                                 "NAME exactly or as a glob; @RANK: on that rank only (repeatable)")
        parser.add_argument("--scale", action="append", default=[], metavar="KIND_OR_CATEGORY=FACTOR",
                            help="GPU work of a kind (kernel, memcpy, memset), a kernel category (gemm, "
                                 "convolution, ...) or all communication (comm) takes FACTOR times as long, "
                                 "e.g. gemm=0.5 (repeatable)")
        parser.add_argument("--balance", action="store_true",
                            help="every rank behaves like the median rank: per name, a rank's time per step above "
                                 "the median rank's removed, never below the median rank's total")
        parser.add_argument("--top", type=int, default=8, metavar="N",
                            help="largest parts of the predicted critical path shown (default 8)")
        parser.add_argument("--rows", type=int, default=TABLE_ROWS, metavar="N",
                            help=f"ranks (steps, of a trace without ranks) of the step table shown, those of "
                                 f"largest gain (default {TABLE_ROWS}; the rest are one row)")
        parser.add_argument("--all", action="store_true", help="show every rank's (every step's) rows")
        parser.add_argument("--align-clocks", action="store_true",
                            help="ranks on several hosts: align their clocks on collective end times")

    def run(self, args: argparse.Namespace, session) -> int:
        """Parse the edits, resolve the trace, replay, print."""
        if args.top < 1:
            raise InputError(f"--top {args.top}: expected a number of rows, at least 1")
        if args.rows < 1:
            raise InputError(f"--rows {args.rows}: expected a number of rows, at least 1")
        drops = [parse_drop(d) for d in args.drop]
        scales = [parse_scale(s) for s in args.scale]
        if args.trace is None:  # as analyze: the trace (or run) ingested last
            args.trace = session.store.last_id()
        trace = session.resolve_one(args.trace, args.format, "whatif")
        label = _label(trace)
        try:
            cut = cut_rank_traces(trace)  # their work after the cut is missing: not work to even out
            result = what_if(trace.events, drops, scales, args.balance, args.align_clocks, args.top,
                             names=thread_names(trace.meta), cut=frozenset(cut))
        except InputError as e:
            raise InputError(f"{label}: {e}") from None
        doc = document(trace, label, result)
        if ranks := incomplete_ranks(trace.meta):
            said = ends_early(ranks)
            note = (f"{said[0].upper()}{said[1:]}: the replay is of what was read"
                    + (f", and --balance leaves {'it' if len(ranks) == 1 else 'them'} as "
                       f"{'it is' if len(ranks) == 1 else 'they are'} (work after the cut is missing, not undone)"
                       if args.balance and cut else "") + ".")
            doc["notes"].insert(0, note)
        if args.balance:
            note = _straggler_kept(session, trace, doc)
            if note:
                doc["edit_notes"] = [note]
                doc["notes"].insert(0, note)
        if args.json:
            self.print_json(doc)
        else:
            render(session.out, doc, None if args.all else args.rows)
        return 0


def _straggler_kept(session, trace, doc: dict) -> str | None:
    """Where ``--balance`` cannot remove what the run's straggler makes the others wait (its excess is time the
    trace does not show), a sentence saying so, to be read before the prediction; None where it can or there is
    no straggler. A trimmed run whose rank 2 the others wait for 74 ms a step predicted "gain 0.3%" from
    evening another rank's operators, with no word of why."""
    rule = session.registry.rules.get("stragglers")
    if rule is None or trace.meta.format != "run":
        return None
    found = rule.check(trace, RuleOptions(thresholds=dict(rule.thresholds)))
    m = next((f.metrics for f in found if f.metrics.get("straggler_rank") is not None), None)
    if m is None or not m.get("wait_caused_per_step_ns"):
        return None
    rank, wait = m["straggler_rank"], m["wait_caused_per_step_ns"]
    removed = sum(max(0, e["removed_per_step_by_rank"].get(str(rank), 0)) for e in doc["edits"]
                  if e["edit"] == "--balance")
    if removed >= wait / 2:
        return None
    taken = "nothing" if not removed else f"only {fmt_ns(removed)} a step"
    return (f"--balance evens the work the trace records, and takes {taken} off rank {rank}, which the others wait "
            f"for {fmt_ns(wait)} a step (stragglers): what makes it late is time its trace does not show, or work "
            "that takes as long on the other ranks, and the prediction keeps that wait")


def _label(trace) -> str:
    """A run by its name (``run NAME``), a trace by its file's name (:func:`traceparse.report.trace_label`)."""
    run = (trace.meta.extra or {}).get("run") or {}
    return f"run {run['name']}" if trace.meta.format == "run" and run.get("name") else trace_label(trace.meta)


def _rank(value) -> str:
    return "-" if value is None else str(value)


def document(trace, label: str, result) -> dict:
    """The what-if as the ``--json`` document (and what :func:`render` prints)."""
    steps = result.steps
    rows = [{"step": r["step"], "rank": r["rank"], "measured_ns": r["measured_ns"],
             "predicted_ns": r["predicted_ns"], "gain_ns": r["gain_ns"],
             "gain_pct": expr.pct(r["gain_ns"], r["measured_ns"])}
            for r in steps.iter_rows(named=True)]
    per_rank = []
    for (rank,), g in steps.group_by("rank", maintain_order=True):
        m, p = float(g["measured_ns"].mean()), float(g["predicted_ns"].mean())
        per_rank.append({"rank": rank, "steps": g.height, "measured_ns": round(m), "predicted_ns": round(p),
                         "gain_ns": round(m - p), "gain_pct": expr.pct(m - p, m)})
    per_rank.sort(key=lambda r: (r["rank"] is None, r["rank"] if r["rank"] is not None else 0))
    m, p = float(steps["measured_ns"].mean()), float(steps["predicted_ns"].mean())
    return {"trace": {"id": trace.id, "label": label, "format": trace.meta.format},
            **({"slowest": slowest} if (slowest := slowest_step(steps)) else {}),
            "edits": [{"edit": a.text, "calls": a.calls, "calls_in_steps": a.in_steps, "step_windows": a.windows,
                       "ranks": a.ranks, "names": a.names,
                       "removed_per_step_ns": a.removed_ns,
                       "removed_per_step_by_rank": {_rank(r): ns for r, ns in a.by_rank.items()}}
                      for a in result.applied],
            "steps": rows, "ranks": per_rank,
            "mean": {"paths": steps.height, "steps": steps["step"].n_unique(), "measured_ns": round(m),
                     "predicted_ns": round(p), "gain_ns": round(m - p), "gain_pct": expr.pct(m - p, m)},
            "path": {"length_ns": round(result.path_ns), "top": result.top},
            "cannot_replay": result.cannot, "missing": result.missing, "notes": result.notes}


def edit_line(e: dict, after_others: bool = False) -> str:
    """One edit in words: what it matched and the time it took out of (or added to) each rank's steps; why
    nothing, where it matched nothing (``--balance``: no rank exceeds the median rank by enough in any name).
    ``after_others``: edits before it were applied first, so the time it finds is what they left (``--scale
    kernel=0 --scale gemm=0.5``: the GEMMs have none left)."""
    balance = e["edit"] == "--balance"
    if not e["calls"]:
        return (f"--balance: nothing to even out: no rank spends {BALANCE_MIN_EXCESS:.0%} of its mean step or "
                "more longer than the median rank in any name" if balance else f"{e['edit']}: matched no event")
    what = fmt_count(e["calls"], "name") if balance else _events_said(e)
    by = {k: v for k, v in e["removed_per_step_by_rank"].items() if v}
    if not by:
        return f"{e['edit']}: {what}, no time {'left ' if after_others else ''}in the steps" + (
            " after the edits before it (edits apply in the order given)" if after_others else "")
    word = lambda ns: f"{fmt_ns(abs(ns))} {'less' if ns > 0 else 'more'}"  # noqa: E731
    if list(by) == ["-"]:
        return f"{e['edit']}: {what}, {word(by['-'])} work per step"
    order = sorted(by, key=lambda k: -abs(by[k]))
    parts = ", ".join(f"rank {k} {word(by[k])}" for k in order[:4])
    more = f" (and {len(order) - 4:,} more ranks)" if len(order) > 4 else ""
    return f"{e['edit']}: {what}; work per step: {parts}{more}"


def _events_said(e: dict) -> str:
    """The events an edit matched, counted over what its time per step covers: those inside the steps
    (``372 events in 1 step``, ``192 events in 1 step of each of 8 ranks``), and how many the whole trace holds
    where that is more (an nsys capture's kernels outside its one step)."""
    inside, windows = e["calls_in_steps"], e["step_windows"]
    if not windows:
        return f"{fmt_count(e['calls'], 'event')}, none in the steps"
    ranks = len(e["ranks"])
    # 8 windows of 8 ranks are one step of each, not "8 steps" (the title says 1 step × 8 ranks)
    where = (fmt_count(windows, "step") if ranks <= 1
             else f"{fmt_count(windows // ranks, 'step')} of each of {ranks:,} ranks" if windows % ranks == 0
             else f"{fmt_count(windows, 'step window')} of {ranks:,} ranks")
    whole = f" ({e['calls']:,} in the whole trace)" if e["calls"] > inside else ""
    return f"{fmt_count(inside, 'event')} in {where}{whole}"


def steps_said(doc: dict) -> str:
    """What was replayed: ``3 steps × 4 ranks`` where every rank has as many steps, else the windows the table
    lists and how many each rank has: ``9 step windows over 4 ranks, 1 to 3 steps each``."""
    counts = [r["steps"] for r in doc["ranks"]]
    if len(counts) < 2:
        return fmt_count(doc["mean"]["paths"], "step")
    if min(counts) == max(counts):
        return f"{fmt_count(counts[0], 'step')} × {len(counts):,} ranks"
    return (f"{fmt_count(doc['mean']['paths'], 'step window')} over {len(counts):,} ranks, "
            f"{min(counts):,} to {max(counts):,} steps each")


def render(console, doc: dict, rows: int | None = TABLE_ROWS) -> None:
    """The terminal view: what was replayed with which edits, the steps table, the means, the predicted path.

    The steps table shows ``rows`` ranks (of a trace without ranks, ``rows`` steps), those the edits change most,
    and one row for the rest (:func:`step_table`); None: every row. JSON keeps them all.
    """
    width = console.width
    mean = doc["mean"]
    head = Text("whatif ", style="bold")
    head.append(literal(f"{doc['trace']['label']}  {doc['trace']['id']}  ({steps_said(doc)})"))
    console.print(head)
    if not doc["edits"]:
        console.print(Text("no edit: the replay of the measured durations (the prediction is the measured step)",
                           style="dim"))
    for i, e in enumerate(doc["edits"]):
        console.print(literal(edit_line(e, after_others=i > 0)))
    for line in doc.get("edit_notes", []):  # read before the prediction it qualifies
        console.print(literal(f"note: {line}", style="yellow"))
    ranked = any(r["rank"] is not None for r in doc["ranks"])
    columns = STEP_COLUMNS if ranked else [c for c in STEP_COLUMNS if c.key != "rank"]
    title = "step time per rank: measured and predicted" if ranked else "step time: measured and predicted"
    table, folded = step_table(doc, rows, columns)
    for part in fitted_table(columns, table, width, title=title):
        console.print(part)
    if folded:
        console.print(literal(folded, style="dim"))
    console.print(f"[bold]mean step[/bold]: {fmt_ns(mean['measured_ns'])} measured, {fmt_ns(mean['predicted_ns'])} "
                  f"predicted: gain {fmt_ns(mean['gain_ns'])} ({fmt_pct(mean['gain_pct'])})")
    slow = doc.get("slowest")
    if slow:
        # ranks that meet at collectives step together, at the slowest one's pace (docs/critical_path.md)
        # each step's slowest rank, not one rank: "slowest rank: 202.6 ms" read as a rank beside a table whose
        # slowest rank's mean was 198.7 ms
        n = slow["steps"]
        console.print(f"[bold]job's pace[/bold]: {fmt_ns(slow['measured_ns'])} measured, "
                      f"{fmt_ns(slow['predicted_ns'])} predicted: gain {fmt_ns(slow['gain_ns'])} "
                      f"({fmt_pct(slow['gain_pct'])})")
        console.print(literal(f"  (each step's slowest rank, the mean over the {n:,} step{'s' if n != 1 else ''} "
                              "every rank has)", style="dim"))
    top = [{**t, "rank": _rank(t["rank"])} for t in doc["path"]["top"]]
    if top:
        for part in fitted_table(PATH_COLUMNS if ranked else PATH_COLUMNS[1:], top, width,
                                 title=f"predicted critical path: {fmt_ns(doc['path']['length_ns'])} per step, its "
                                       "largest parts"):
            console.print(part)
    for line in doc["cannot_replay"]:
        console.print(literal(f"cannot replay: {line}", style="yellow"))
    for line in doc.get("notes", []):
        if line not in doc.get("edit_notes", []):
            console.print(literal(f"note: {line}", style="yellow"))
    for line in doc["missing"]:
        console.print(literal(f"the trace has {line}", style="yellow"))


def step_table(doc: dict, rows: int | None, columns: list[Column]) -> tuple[list[dict], str]:
    """The steps table's rows (each step of each rank, then the mean of each rank of several steps) and a line saying
    what is folded.

    Of a run of more than ``rows + 1`` ranks, the rows of the ``rows`` ranks whose mean gain is largest (in
    size: a slower prediction counts too), those ranks first, then one row for the other ranks' steps and one for
    their means (:func:`traceparse.report.fold_rows`): 64 ranks make 34 rows, not 256, and the rank the edits
    change most is never folded away. A trace without ranks keeps the ``rows`` steps of largest gain so. The line
    returned says which rows are kept, to print below the table ("" where nothing is folded).
    """
    steps = [{**r, "step": str(r["step"]), "rank": _rank(r["rank"])} for r in doc["steps"]]
    every = [{"step": "mean", "rank": _rank(r["rank"]), **{k: r[k] for k in ("measured_ns", "predicted_ns",
                                                                               "gain_ns", "gain_pct")}}
             for r in doc["ranks"]]
    # a rank of one step has no mean row: it would repeat that step's row (a run of one step printed each rank twice)
    means = [m for m, r in zip(every, doc["ranks"]) if r["steps"] > 1]
    ranked = any(r["rank"] is not None for r in doc["ranks"])
    if rows is None or len(doc["ranks"] if ranked else steps) <= rows + 1:
        return steps + means, ""
    largest = lambda r: -abs(r["gain_ns"] or 0)  # noqa: E731 - the rows the edits change most first
    if not ranked:
        return fold_rows(sorted(steps, key=largest), "step", columns[1:], rows) + means, \
            f"{rows} of {len(steps)} steps shown, largest gain first (--rows N, --all)"
    kept = [r["rank"] for r in sorted(every, key=largest)[:rows]]
    order = {rank: i for i, rank in enumerate(kept)}
    shown = sorted((r for r in steps if r["rank"] in order), key=lambda r: order[r["rank"]])
    return (fold_rows(shown + [r for r in steps if r["rank"] not in order], "step", columns[1:], len(shown))
            + (fold_rows(sorted(means, key=largest), "step", columns[1:], rows) if means else []),
            f"{rows} of {len(every)} ranks shown, largest gain first (--rows N, --all)")


@hookimpl
def traceparse_commands():
    return [WhatIfCommand()]
