"""``traceparse analyze``: run the rules on traces and report their findings."""

from __future__ import annotations

import argparse

from traceparse.analysis import analyze, parse_settings, worst_severity
from traceparse.command import Command
from traceparse.report import render_findings
from traceparse.rule import SEVERITIES, severity_rank


class AnalyzeCommand(Command):
    name = "analyze"
    help = "run rules on traces (default: the last ingested)"

    def configure(self, parser: argparse.ArgumentParser) -> None:
        """TRACE..., ``--rule``, ``--set``, ``--fail-on``, ``--gpu`` and the common options."""
        self.add_common_options(parser, traces="*", json=True, fmt=True)
        parser.add_argument("--rule", action="append", metavar="NAME", help="run only this rule (repeatable)")
        parser.add_argument("--set", action="append", metavar="RULE.PARAM=VALUE", help="override a rule threshold")
        parser.add_argument("--fail-on", choices=SEVERITIES,
                            help="exit 1 if a finding at or above this severity exists")
        parser.add_argument("--gpu", metavar="NAME", help="GPU to take peak figures from, overriding the trace's")

    def run(self, args: argparse.Namespace, session) -> int:
        """Analyze each trace; exit 1 when ``--fail-on`` is given and a finding reaches it."""
        settings = parse_settings(args.set or [], session.registry)
        for name in args.rule or []:
            session.registry.rule(name)  # unknown rule names fail before any work
        traces = session.resolve_all(args.traces, fmt=args.format)
        findings = []
        for trace in traces:
            findings.extend(analyze(trace, rules=args.rule, settings=settings, gpu=args.gpu, reg=session.registry))
        if args.json:
            self.print_json({
                "traces": [{"id": t.id, "path": t.meta.path, "format": t.meta.format, "tags": t.meta.tags}
                           for t in traces],
                "findings": [f.to_dict() for f in findings],
            })
        else:
            render_findings(session.out, findings, {t.id: t.meta for t in traces})
        worst = worst_severity(findings)
        if args.fail_on and worst and severity_rank(worst) >= severity_rank(args.fail_on):
            return 1
        return 0
