"""``traceparse analyze``: run the rules on traces and report their findings.

A run (a rank directory, or a run id) is analysed as one trace of all its
ranks (:meth:`traceparse.store.Store.load_run`): every rule gives its
run-level figure, and rules with device tables name each rank's devices
(``rank 2:0``). The run's events stay in the store and are read rank by rank
(``lazy=True``), so memory does not grow with the ranks. ``--scheduler``
computes the measures' per-rank steps on a Dask cluster
(:mod:`traceparse.distributed`); the findings are the same. The findings of
each stored trace or run are kept beside it (``findings.parquet``, replaced by
the next analysis): ``traceparse sql`` reads them as the ``findings`` view.
"""

from __future__ import annotations

import argparse
import math
from contextlib import ExitStack, nullcontext

from traceparse.command import Command, gpu_choice
from traceparse.errors import StoreError
from traceparse.figures import set_digits
from traceparse.meta import RANK_HOSTS, hosts
from traceparse.report import TABLE_ROWS, render_findings, trace_label
from traceparse.verdict import SEVERITIES, severity_rank
from traceparse_plugins.commands.core import windowing

# the analysis (the rules' machinery, polars) is imported when ``analyze`` is configured or run: loading this
# plugin for ``traceparse list`` does not load it


class AnalyzeCommand(Command):
    name = "analyze"
    help = "run rules on traces (default: the last ingested)"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """TRACE..., ``--rule``, ``--set``, ``--fail-on``, ``--gpu`` and the common options."""
        from traceparse.analysis import CRITICAL_FLOOR_PCT, RULE_THREADS
        from traceparse.measures.base import LARGE_TABLE_ROWS

        self.add_common_options(parser, traces="*", json=True, fmt=True)
        parser.add_argument("--rule", action="append", metavar="NAME", help="run only this rule (repeatable)")
        parser.add_argument("--set", action="append", metavar="RULE.PARAM=VALUE", help="override a rule threshold")
        parser.add_argument("--fail-on", choices=SEVERITIES,
                            help="exit 1 if a finding at or above this severity exists")
        self.add_gpu_options(parser)
        parser.add_argument("--min-severity", choices=SEVERITIES, help="show only findings at or above this severity")
        parser.add_argument("--top", type=_positive, metavar="N", help="show the N worst findings of each trace")
        parser.add_argument("--all", action="store_true", help="show findings with nothing to report in full")
        parser.add_argument("--rows", type=_positive, metavar="N", default=TABLE_ROWS,
                            help=f"rows of a per-rank, per-device or per-stream table shown (default {TABLE_ROWS}; "
                                 "the rest are one row)")
        parser.add_argument("--critical-floor", type=_percent, metavar="PCT", default=CRITICAL_FLOOR_PCT,
                            help="a finding with less time at stake than PCT%% of the span is never critical "
                                 f"(default {CRITICAL_FLOOR_PCT:g})")
        parser.add_argument("--digits", type=_digits, metavar="N",
                            help="significant figures of the figures shown (default 4)")
        parser.add_argument("--threads", type=_positive, metavar="N",
                            help=f"rules run N at a time (default {RULE_THREADS} on a table of at most "
                                 f"{LARGE_TABLE_ROWS:,} rows, one on a larger one; the findings are the same)")
        parser.add_argument("--scheduler", metavar="ADDRESS",
                            help="measure each rank of a run on a Dask cluster: a scheduler address, or local[:N] "
                                 "(default: $TRACEPARSE_SCHEDULER, else in-process)")
        windowing.add_options(parser)  # --step, --window, --nvtx

    def run(self, args: argparse.Namespace, session) -> int:
        """Analyze each trace; exit 1 when ``--fail-on`` is given and a finding reaches it."""
        from traceparse.analysis import analyze, parse_settings, select_findings, worst_severity
        from traceparse.measures.base import sharing
        from traceparse.summary import summarize

        settings = parse_settings(args.set or [], session.registry)
        set_digits(args.digits)
        for name in args.rule or []:
            session.registry.rule(name)  # unknown rule names fail before any work
        from traceparse.distributed import connected, measures_on, scheduler_from

        scheduler = scheduler_from(args.scheduler)
        # a capture's files are one trace, as ingest groups them; a run's ranks stay in the store
        view = windowing.apply(args, session.resolve_all(args.traces, fmt=args.format, group=True, lazy_runs=True))
        traces = view.traces
        findings, summaries = [], {}
        with ExitStack() as stack:
            client = None
            if scheduler and any(t.meta.format == "run" for t in traces):
                client = stack.enter_context(connected(scheduler))
            for trace in traces:
                on_cluster = (measures_on(client, session.store, trace)
                              if client is not None and trace.meta.format == "run" else nullcontext())
                rules = args.rule or list(session.registry.rules)
                with on_cluster, sharing(), session.steps(f"analyze {trace_label(trace.meta)}", len(rules) + 1,
                                                          "rules") as advance:
                    found = analyze(trace, rules=args.rule, settings=settings, gpu=gpu_choice(args), reg=session.registry,
                                    critical_floor_pct=args.critical_floor, on_rule=advance, threads=args.threads)
                    findings.extend(found)
                    advance("summary")
                    summaries[trace.id] = summarize(trace, found)
                _keep(session, trace, found, view.label)
        worst = worst_severity(findings)  # --fail-on judges every finding, whatever is shown
        findings = select_findings(findings, args.min_severity, args.top)
        if args.json:
            self.print_json({
                "traces": [_trace_row(t) for t in traces],
                "summary": list(summaries.values()),
                "findings": [f.to_dict() for f in findings],
                **view.json(),
            })
        else:
            view.render(session.out)
            render_findings(session.out, findings, {t.id: t.meta for t in traces}, summaries,
                            full=args.all or bool(args.rule), rows=args.rows)  # else quiet rules in one line
        if args.fail_on and worst and severity_rank(worst) >= severity_rank(args.fail_on):
            return 1
        return 0


def _keep(session, trace, found, scope: str | None) -> None:
    """Keep the trace's findings in the store beside it (the ``findings`` view of ``traceparse sql``); a store
    that cannot be written to costs a warning, never the analysis."""
    from traceparse.analysis import findings_frame

    try:
        session.store.save_findings(trace.id, findings_frame(found, scope))
    except StoreError as exc:
        session.warn(f"findings not kept in the store: {exc}")


def _positive(text: str) -> int:
    """``--top N``: a whole number (ASCII digits) of at least 1; a huge one means all."""
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return min(int(text), MAX_COUNT)


#: ``--top``/``--rows`` above this are this: all there is (a Python index cannot be larger).
MAX_COUNT = 2**31 - 1
#: Significant figures a float has: ``--digits`` above this would only print noise.
MAX_DIGITS = 17


def _digits(text: str) -> int:
    """``--digits N``: a whole number from 1 to :data:`MAX_DIGITS`."""
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_DIGITS:
        raise argparse.ArgumentTypeError(f"expected a whole number from 1 to {MAX_DIGITS}, got {text[:40]!r}")
    return int(text)


def _percent(text: str) -> float:
    """``--critical-floor PCT``: a finite number from 0 to 100."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 100:  # NaN fails too
        raise argparse.ArgumentTypeError(f"expected a percentage from 0 to 100, got {text[:40]!r}")
    return value


def _trace_row(trace) -> dict:
    """A trace of ``analyze --json``'s ``traces``; a run adds ``run``: its name, world size and {rank: trace id};
    ``hosts``, where the trace names the machines it was recorded on (a run: {rank: host} as ``rank_hosts``)."""
    row = {"id": trace.id, "path": trace.meta.path, "format": trace.meta.format, "tags": trace.meta.tags}
    run = (trace.meta.extra or {}).get("run") if trace.meta.format == "run" else None
    if run:
        row["run"] = {"name": run.get("name"), "world_size": run.get("world_size"), "ranks": run.get("ranks")}
    names = hosts(trace.meta)
    if names:
        row["hosts"] = names
        on = (trace.meta.extra or {}).get(RANK_HOSTS)
        if on:
            row["rank_hosts"] = on
    return row
