"""Command ``traceparse report TRACE|RUN --html FILE``: one self-contained HTML report of a trace or a run.

The page (:mod:`.page`) holds the trace's metadata, a summary
(:mod:`.summary`), interactive plotly charts (:mod:`.charts`, figures from
:mod:`.data`) and every finding of :func:`traceparse.analysis.analyze` with
its tables. plotly is the optional ``html`` extra; its JavaScript is inlined,
so the file opens without a network.
"""

from __future__ import annotations

import argparse
from contextlib import nullcontext
from pathlib import Path

from traceparse.analysis import analyze, parse_settings
from traceparse.command import Command, gpu_choice
from traceparse.errors import InputError
from traceparse.report import TABLE_ROWS
from traceparse.plugins import hookimpl
from traceparse.text import literal, markup_literal

from . import data

HTML_EXTRA_HINT = "pip install 'traceparse[html]'"


class ReportCommand(Command):
    name = "report"
    help = "write a self-contained HTML report of a trace or run: summary, charts, every finding"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """TRACE... (one trace or run; several paths only when they make one trace), ``--html FILE`` and the
        rule options of ``analyze``."""
        self.add_common_options(parser, traces="*", json=False, fmt=True,
                                trace_help="a store id (or prefix), a run's name, a path, or a rank directory; "
                                           "several paths only when they are one capture (default: the last "
                                           "ingested trace)")
        parser.add_argument("--html", required=True, metavar="FILE", help="write the report to this HTML file")
        parser.add_argument("--rule", action="append", metavar="NAME", help="run only this rule (repeatable)")
        parser.add_argument("--set", action="append", metavar="RULE.PARAM=VALUE", help="override a rule threshold")
        self.add_gpu_options(parser)
        parser.add_argument("--rows", type=int, default=TABLE_ROWS, metavar="N",
                            help=f"rows of a per-rank, per-device or per-stream table (and source files) shown "
                                 f"before a fold that opens to all of them (default {TABLE_ROWS})")
        parser.add_argument("--all", action="store_true", help="show every row of every table, with no fold")
        parser.add_argument("--bins", type=int, default=data.DEFAULT_BINS, metavar="N",
                            help=f"bins of the GPU busy timeline (default {data.DEFAULT_BINS})")

    def run(self, args: argparse.Namespace, session) -> int:
        """Resolve the trace, analyse it, draw the charts and write the page."""
        out = Path(args.html)
        if out.suffix.lower() not in (".html", ".htm"):
            raise InputError(f"--html {args.html}: expected a .html file name")
        if args.rows < 1:
            raise InputError(f"--rows {args.rows}: expected a number of rows, at least 1")
        if args.bins < 1:
            raise InputError(f"--bins {args.bins}: expected a positive number of bins")
        modules = require_plotly()
        settings = parse_settings(args.set or [], session.registry)
        for name in args.rule or []:
            session.registry.rule(name)
        trace = one_trace(session, args.traces, args.format)
        status = (session.err.status(f"writing the report of {markup_literal(trace.id)}")
                  if session.err.is_terminal and not session.quiet else nullcontext())
        with status:
            text = build_report(trace, rules=args.rule, settings=settings, gpu=gpu_choice(args), bins=args.bins,
                                reg=session.registry, plotly=modules, rows=None if args.all else args.rows)
            try:
                out.write_text(text, encoding="utf-8")
            except OSError as e:
                raise InputError(f"--html {args.html}: cannot write: {e.strerror or e}") from None
        if not session.quiet:
            session.err.print(literal(f"wrote {out}"))
        return 0


def require_plotly():
    """plotly's modules for the charts, or a one-line InputError naming the ``html`` extra."""
    from .charts import require_plotly as modules

    try:
        return modules()
    except ImportError:
        raise InputError(f"report --html needs plotly, which is not installed: {HTML_EXTRA_HINT}") from None


def one_trace(session, refs: list[str], fmt: str):
    """The one trace (or run) the TRACE arguments name: several paths must be one capture (e.g. the CSV
    reports of one nsys capture)."""
    if len(refs) > 1:
        missing = [r for r in refs if not Path(r).exists()]
        if missing:
            raise InputError(f"{missing[0]}: report takes one trace or run; several arguments must be paths of "
                             "one capture")
        results = session.ingest(refs, fmt)
        if len(results) != 1:
            raise InputError(f"report takes one trace or run; these {len(refs)} paths make {len(results)} traces: "
                             "report each one")
        return session.store.load(results[0].meta.id)
    found = session.resolve_all(refs, fmt)
    if len(found) != 1:  # a run folder of several profiling windows: a run each
        raise InputError(f"{refs[0] if refs else 'the last ingested'}: report takes one trace or run; this makes "
                         f"{len(found):,} ({', '.join(str(t.meta.id) for t in found)}): name one by its id")
    return found[0]


def build_report(trace, rules=None, settings=None, gpu=None, bins: int = data.DEFAULT_BINS, reg=None,
                 plotly=None, rows: int | None = TABLE_ROWS) -> str:
    """The report of ``trace`` as HTML text: analyse, summarize, chart, render; tables longer than ``rows + 1``
    folded (None: none)."""
    from traceparse import __version__

    from .charts import build_charts
    from .page import render_page
    from .summary import ordered, summarize

    _, _, pio, offline = plotly or require_plotly()
    findings = ordered(analyze(trace, rules=rules, settings=settings, gpu=gpu, reg=reg))
    summary = summarize(trace, findings)
    charts, missing = build_charts(trace, gpu=gpu, bins=bins)
    figure_json = {c.id: pio.to_json(c.figure, validate=False) for c in charts}
    return render_page(trace, summary, findings, charts, missing, offline.get_plotlyjs(), figure_json, __version__,
                       rows)


@hookimpl
def traceparse_commands():
    """The ``report`` command."""
    return [ReportCommand()]
