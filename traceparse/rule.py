"""What an analysis rule is and what it reports."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any, ClassVar

import polars as pl

from traceparse.figures import fmt_ns
from traceparse.text import visible
from traceparse.trace import Trace
from traceparse.validate import excerpt
from traceparse.verdict import SEVERITIES, Column, grade, severity_rank  # noqa: F401 - the verdict floor, re-exported


@dataclass
class Finding:
    """One result of a rule on one trace.

    ``metrics`` are the figures the rule computed (JSON keys documented per
    rule); ``items`` are the top offenders, each a dict. ``columns`` declare
    the items' columns (key, label, unit) in the order shown; ``figures`` the
    headline metrics shown (key -> unit, see :data:`traceparse.verdict.UNITS`);
    ``tables`` the columns of a metric that is a table ({row key: {column:
    value}}), the row key first. ``labels`` names a headline figure on
    screen where its key's words would read like another figure of the same
    screen (gpu-idle's ``span_ns`` is "GPU span", not the summary's trace
    "span"); a figure without one is labelled from its key. The renderer shows what is declared and
    guesses nothing; a finding that declares nothing is shown plainly.
    ``items_title`` names the items' table on screen and in HTML (gpu-idle's
    "longest gaps"), where it follows tables of metrics and could be read as
    one of them; without one the items' table has no title.
    ``impact_ns`` is the time at stake (idle time, exposed copy time, ...):
    what ranks findings of one severity and names the bottleneck; None where
    the finding has no time at stake, 0 where the rule looked and found none.
    On a run of several ranks it is per rank (the mean over the ranks, see
    :attr:`Rule.impact_per_rank`), so that it is never longer than a rank's
    time and findings of a run rank fairly against each other.
    ``impact_whole`` says what whole the time at stake is part of, (what it
    is, ns), where that is not the trace's span: gpu-idle's idle time is part
    of the GPU's span (first to last GPU activity), and the summary gives its
    share of that whole, the share the finding itself states, not a second
    percentage of another whole. It is made per rank with ``impact_ns``.
    ``impact_range``, where ``impact_ns`` is a mean over parts (gpu-idle's
    GPUs), says over how many and which parts had least and most:
    {"parts": N, "per": "rank" or "GPU", "least_ns", "least", "most_ns", "most"}
    (``least`` and ``most`` are the parts' labels), so that the mean of 20.9
    and 234.6 ms is never read as though one part had it.
    """

    rule: str
    severity: str
    title: str
    message: str
    suggestion: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    items: list[dict[str, Any]] = field(default_factory=list)
    trace: str | None = None
    columns: list[Column] = field(default_factory=list)
    figures: dict[str, str] = field(default_factory=dict)
    tables: dict[str, list[Column]] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    items_title: str = ""
    impact_ns: int | None = None
    impact_whole: tuple[str, int] | None = None
    impact_range: dict[str, Any] | None = None
    #: What the summary says of the time at stake after the figure: "lost" (time the trace spent so), or the
    #: rule's words where the time is an estimate of what a change would save (ncu-speedups: "to gain").
    impact_said: str = "lost"
    #: A line the rule asks its trace's summary panel to show, (label, text): e.g. a run's straggler and its cost.
    summary: tuple[str, str] | None = None
    #: Per table (a key of ``tables``, or "items"), the column whose worst rows a folded table keeps on screen
    #: and in HTML (:func:`traceparse.report.fold_rows`): its largest values, or its smallest where the key starts
    #: with ``-`` (``"-overlap_pct"``). A table of 256 ranks folded to 8 rows then shows the rank that stands
    #: out, not ranks 0 to 7; a table without one keeps its first rows. JSON keeps every row in the rule's order.
    worst: dict[str, str] = field(default_factory=dict)
    #: Groups of headline figures (metric keys) that are the shares of one whole (gpu-idle's host, kernel and other
    #: wait): shown rounded together, so that they add up to 100 as shown
    #: (:func:`traceparse.figures.shares_shown`), as the rule's sentence gives them. JSON keeps the exact values.
    shares: list[tuple[str, ...]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form used by ``traceparse analyze --json``."""
        return {
            "trace": self.trace,
            "rule": self.rule,
            "severity": self.severity,
            "title": self.title,
            "message": self.message,
            "suggestion": self.suggestion,
            "metrics": self.metrics,
            "items": self.items,
            "items_title": self.items_title,
            "impact_ns": self.impact_ns,
            "impact_whole": ({"of": self.impact_whole[0], "ns": self.impact_whole[1]} if self.impact_whole else None),
            "impact_range": self.impact_range,
            "impact_said": self.impact_said,
            "summary": list(self.summary) if self.summary else None,
            "columns": [c.to_dict() for c in self.columns],
            "figures": dict(self.figures),
            "labels": dict(self.labels),
        }

    def __repr__(self) -> str:
        """One short line: rule, severity, title and the time at stake (:meth:`to_dict` is the whole finding).

        The dataclass' own repr wrote every metric and item, up to 22 KB a finding, so a list of findings as a
        notebook cell's last line printed 100 KB on one line."""
        at_stake = f" {fmt_ns(self.impact_ns)} {self._stake_said()}" if self.impact_ns is not None else ""
        return f"<Finding {self.rule} {self.severity} {excerpt(self.title)}{at_stake}>"

    def _stake_said(self) -> str:
        """How the time at stake reads: "at stake", or "to gain" where the finding's figure is an estimate of what
        a fix gains (``impact_said``: ncu's speedups), as the summary says it."""
        return "to gain" if self.impact_said == "to gain" else "at stake"

    def _repr_html_(self) -> str:
        """The finding as a notebook shows it: severity, rule and title, then its message and suggestion. Every
        text is escaped (a title or message quotes names from the trace file: untrusted text)."""
        def text(value: Any) -> str:
            return html.escape(visible(value))

        at_stake = f" ({text(fmt_ns(self.impact_ns))} {self._stake_said()})" if self.impact_ns is not None else ""
        parts = [f"<div><b>{text(self.severity)}</b> <code>{text(self.rule)}</code>: {text(self.title)}{at_stake}",
                 f"<p>{text(self.message)}</p>" if self.message else "",
                 f"<p><i>{text(self.suggestion)}</i></p>" if self.suggestion else "", "</div>"]
        return "".join(parts)




@dataclass
class RuleOptions:
    """What the core passes to :meth:`Rule.check`.

    ``thresholds`` are the rule's defaults overridden by ``--set``; ``gpu``
    is the user's ``--gpu`` choice, if any (a name, or a
    :class:`traceparse.catalog.GpuChoice` that may also give peaks by hand:
    hand it to :func:`traceparse.catalog.gpu_for_trace`); ``params`` holds
    anything else a command passes on.
    """

    thresholds: dict[str, Any] = field(default_factory=dict)
    gpu: Any = None
    params: dict[str, Any] = field(default_factory=dict)


class Rule:
    """Base class for analysis rules.

    Subclasses set ``name``, ``description`` (one line), ``definition``
    (what exactly is computed, shown by ``traceparse rules -v``),
    ``thresholds`` (defaults, settable with ``--set NAME.KEY=VALUE``) and
    ``kinds`` (event kinds the rule needs; it applies to a trace that has
    at least one of them), and implement :meth:`check`.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    definition: ClassVar[str] = ""
    thresholds: ClassVar[dict[str, Any]] = {}
    kinds: ClassVar[tuple[str, ...]] = ()
    #: True when the rule needs events of every one of ``kinds`` (launches need kernels *and* API calls).
    needs_all_kinds: ClassVar[bool] = False
    #: What the rule needs, said when it does not apply to a trace (``--rule NAME``), where an :meth:`applies_to`
    #: of its own asks for more than ``kinds`` ("ncu's Speed-of-Light figures"); empty: the kinds are named.
    needs: ClassVar[str] = ""
    #: True when the rule's ``impact_ns`` on a run is already per rank; else (the default: a rule that sums its
    #: time over the run's ranks) the core divides it by the number of ranks (:func:`traceparse.analysis.analyze`).
    impact_per_rank: ClassVar[bool] = False
    #: About how much work the rule does beside the others (1: a few queries; a rule that builds a graph of every
    #: event, 10). When rules run at once, the costliest start first, so that the longest is not left to run alone
    #: at the end (:func:`traceparse.analysis.analyze`); the findings and their order do not depend on it.
    cost: ClassVar[int] = 1

    def applies_to(self, trace: Trace) -> bool:
        """True when the trace has events of a kind this rule needs (an aggregate: a run's rows stay in the store)."""
        if not self.kinds:
            return True
        known = getattr(trace.events, "kind_counts", None)  # a run's ranks: counted at ingest, nothing to read
        present = (set(k for k, n in known.items() if n) if known is not None else
                   set(trace.events.select(pl.col("kind").unique().cast(pl.String)).to_series().to_list()))
        if self.needs_all_kinds:
            return set(self.kinds) <= present
        return bool(present & set(self.kinds))

    def check(self, trace: Trace, options: RuleOptions) -> list[Finding]:
        """Analyse ``trace`` and return findings (at least one, stating the figures)."""
        raise NotImplementedError
