"""The report's summary of one trace or run: the core summary (:mod:`traceparse.summary`) plus the worst findings.

The page shows what ``analyze`` shows first (span, steps, GPU busy %, the
bottleneck, the top kernel categories), computed by the same function, so the
terminal, ``--json`` and the HTML report never disagree; it adds ``worst``,
the findings the summary card links to.
"""

from __future__ import annotations

from typing import Any

from traceparse.analysis import order_findings
from traceparse.rule import Finding
from traceparse.summary import summarize as core_summary

#: Findings named in the summary's "worst findings".
WORST = 3


#: The label of the summary line (:attr:`Finding.summary`) of a finding that names a run's straggler.
STRAGGLER = "straggler"


def ordered(findings: list[Finding]) -> list[Finding]:
    """Findings in ``analyze``'s order (most severe first, then most time at stake: :func:`order_findings`),
    except that a finding naming a run's straggler comes first: on a run the others' idle GPUs and waits
    follow from it, so it is what to read first."""
    out = order_findings(findings)
    first = [f for f in out if f.summary and f.summary[0] == STRAGGLER]
    return first + [f for f in out if not any(f is g for g in first)]


def summarize(trace, findings: list[Finding]) -> dict[str, Any]:
    """The summary of ``trace`` given its ``findings``: :func:`traceparse.summary.summarize`'s keys plus
    ``worst`` (up to :data:`WORST` findings that are not info, in :func:`ordered` order: {rule, title,
    severity, impact_ns})."""
    summary = core_summary(trace, findings)
    serious = [f for f in ordered(findings) if f.severity != "info"]
    summary["worst"] = [{"rule": f.rule, "title": f.title, "severity": f.severity, "impact_ns": f.impact_ns}
                        for f in serious[:WORST]]
    return summary
