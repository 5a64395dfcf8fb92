"""Running rules over traces, and the ``--set RULE.PARAM=VALUE`` overrides."""

from __future__ import annotations

import contextvars
import datetime as _dt
import json
import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable

import polars as pl

from traceparse.cores import usable_cores
from traceparse.errors import InputError
from traceparse.measures.base import LARGE_TABLE_ROWS, sharing, table_rows
from traceparse.plugins import Registry, registry as default_registry
from traceparse.rule import Finding, RuleOptions, severity_rank
from traceparse.trace import Trace
from traceparse.validate import excerpt, fits_int64
from traceparse.verdict import QUIET_SHARE, is_quiet  # noqa: F401 - where the report and the summary find them


def parse_settings(settings: Iterable[str], reg: Registry | None = None) -> dict[str, dict[str, Any]]:
    """Parse ``RULE.PARAM=VALUE`` strings into {rule: {param: value}}.

    The rule and parameter must exist; the value is converted to the type of
    the parameter's default (numbers, booleans, strings, lists as JSON).
    """
    reg = reg or default_registry()
    out: dict[str, dict[str, Any]] = {}
    for setting in settings:
        key, eq, raw = setting.partition("=")
        rule_name, dot, param = key.partition(".")
        if not eq or not dot or not rule_name or not param:
            raise InputError(f"--set {setting!r}: expected RULE.PARAM=VALUE, e.g. low-memcpy-overlap.warning_below_pct=30")
        rule = reg.rule(rule_name)
        if param not in rule.thresholds:
            known = ", ".join(sorted(rule.thresholds)) or "none"
            raise InputError(f"--set {setting!r}: rule {rule_name} has no parameter {param!r} (it has: {known})")
        out.setdefault(rule_name, {})[param] = _convert(setting, raw, rule.thresholds[param])
    return out


def _convert(setting: str, raw: str, default: Any) -> Any:
    try:
        if isinstance(default, bool):
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if isinstance(default, int):
            value = int(raw)
            if not fits_int64(value):  # every count and size a rule takes is Int64, like the columns
                raise InputError(f"--set {setting!r}: {excerpt(raw)} does not fit a 64-bit integer "
                                 f"(at most {2**63 - 1:,})")
            return value
        if isinstance(default, float):
            value = float(raw)
            if not math.isfinite(value):
                raise InputError(f"--set {setting!r}: {excerpt(raw)} is not a finite number")
            return value
        if isinstance(default, (list, dict)):
            value = json.loads(raw)
            if not isinstance(value, type(default)):
                raise ValueError
            return value
        return raw
    except ValueError:
        raise InputError(f"--set {setting!r}: {raw!r} is not a valid {type(default).__name__}") from None


def check_settings(settings: dict[str, dict[str, Any]], reg: Registry | None = None) -> dict[str, dict[str, Any]]:
    """``settings`` as :func:`analyze` takes them ({rule: {param: value}}), checked as :func:`parse_settings`
    checks ``--set``: the rule and parameter must exist and the value have the type of the parameter's default
    (an int is taken for a float, as a float). A misspelled name is an error rather than a threshold silently
    left at its default; a one-line :class:`InputError` names ``rule.param`` and what was expected."""
    reg = reg or default_registry()
    out: dict[str, dict[str, Any]] = {}
    for rule_name, params in settings.items():
        try:
            rule = reg.rule(rule_name)
        except InputError as exc:
            raise InputError(f"settings: {exc}") from None
        if not isinstance(params, dict):
            raise InputError(f"settings {rule_name!r}: expected a dict {{parameter: value}}, got {excerpt(params)}")
        for param, value in params.items():
            if param not in rule.thresholds:
                known = ", ".join(sorted(rule.thresholds)) or "none"
                raise InputError(f"settings {rule_name}.{param}: rule {rule_name} has no parameter {param!r} "
                                 f"(it has: {known})")
            out.setdefault(rule_name, {})[param] = _checked(f"{rule_name}.{param}", value, rule.thresholds[param])
    return out


def _checked(key: str, value: Any, default: Any) -> Any:
    """``value`` of the threshold ``key`` when it has the type of its ``default`` (an int is taken for a float, as a
    float; a tuple for a list, as a list); else a one-line :class:`InputError`."""
    if isinstance(default, bool):
        ok, what = isinstance(value, bool), "True or False"
    elif isinstance(default, int):
        ok, what = isinstance(value, int) and not isinstance(value, bool) and fits_int64(value), \
            "an integer that fits 64 bits"
    elif isinstance(default, float):
        number = _finite(value)
        ok, what, value = number is not None, "a finite number", value if number is None else number
    elif isinstance(default, list):
        ok, what, value = isinstance(value, (list, tuple)), "a list", list(value) if isinstance(value, tuple) else value
    else:
        ok, what = isinstance(value, type(default)), f"a {type(default).__name__}"
    if not ok:
        raise InputError(f"settings {key}: expected {what} (the default is {default!r}), got {excerpt(value)}")
    return value


def _finite(value: Any) -> float | None:
    """``value`` as a finite float when it is an int or a float (not a bool) that is one; else None."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int past the floats
        return None
    return number if math.isfinite(number) else None


#: A finding with less time at stake than this share of its trace's span is never CRITICAL (``--critical-floor``).
CRITICAL_FLOOR_PCT = 1.0
#: Rules run at most this many at once (threads: polars and numpy work outside the interpreter's lock), on a table
#: of at most ``LARGE_TABLE_ROWS`` rows; a larger one runs them one at a time: two rules' working sets side by side
#: would raise the peak memory of the traces where it matters most (docs/scale.md).
RULE_THREADS = 2


def rule_threads(trace: Trace, requested: int | None = None) -> int:
    """How many rules :func:`analyze` runs at once on ``trace``: ``requested`` when given, else
    :data:`RULE_THREADS` (at most the cores this process may use) on a table of at most
    :data:`~traceparse.measures.base.LARGE_TABLE_ROWS` rows, one on a larger table or on a run whose ranks a Dask cluster reads.

    On two cores, two threads took 11–18% off the wall time of ``analyze`` (docs/scale.md); the findings are the
    same, in the same order.
    """
    if requested is not None:
        return max(1, int(requested))
    events = trace.events
    if getattr(events, "executor", None) is not None:
        return 1
    rows = table_rows(events)
    return min(RULE_THREADS, usable_cores()) if rows <= LARGE_TABLE_ROWS else 1


def analyze(trace: Trace, rules: Iterable[str] | None = None, settings: dict[str, dict[str, Any]] | None = None,
            gpu: Any = None, reg: Registry | None = None,
            critical_floor_pct: float = CRITICAL_FLOOR_PCT,
            on_rule: Callable[[str], None] | None = None, threads: int | None = None) -> list[Finding]:
    """Run rules on a trace and return their findings.

    ``rules`` names the rules to run; by default every rule that applies to
    the trace runs. On a run, each finding's ``impact_ns`` is made per rank
    (divided by the ranks, unless the rule gives it per rank already). A
    critical finding with less time at stake than ``critical_floor_pct`` of
    the trace's span is lowered to a warning, and says so: a percentage
    alone (0.6% overlap of 38 us of copies) does not make a problem critical.
    ``settings`` are threshold overrides as returned by :func:`parse_settings` ({rule: {param: value}}),
    checked by :func:`check_settings`.
    ``on_rule`` is told each rule's name as it starts (a progress bar).
    ``threads``: how many rules run at once (default :func:`rule_threads`);
    the findings and their order do not depend on it.
    """
    from traceparse.run import trace_ranks
    from traceparse.summary import trace_span

    reg = reg or default_registry()
    settings = check_settings(settings or {}, reg)
    ranks = trace_ranks(trace)
    span_ns = trace_span(trace.events)
    chosen = [reg.rule(name) for name in rules] if rules else list(reg.rules.values())

    def findings_of(rule) -> list[Finding]:
        """One rule's findings on the trace, made per rank on a run and floored."""
        if on_rule is not None:
            on_rule(rule.name)
        if not rule.applies_to(trace):
            if not rules:
                return []
            return [Finding(rule.name, "info", f"{rule.name}: not applicable",
                            (f"it needs {rule.needs}" if rule.needs
                             else f"it needs {' and '.join(rule.kinds)} events" if rule.needs_all_kinds
                             else f"the trace has no {' / '.join(rule.kinds)} events"), trace=trace.id)]
        options = RuleOptions(thresholds={**rule.thresholds, **settings.get(rule.name, {})}, gpu=gpu)
        found = []
        for finding in rule.check(trace, options):
            finding.trace = trace.id
            if ranks > 1 and finding.impact_ns and not rule.impact_per_rank:
                finding.impact_ns = round(finding.impact_ns / ranks)  # a run's time at stake is per rank
                if finding.impact_whole:  # and so is the whole it is part of
                    finding.impact_whole = (finding.impact_whole[0], round(finding.impact_whole[1] / ranks))
            _apply_floor(finding, span_ns, critical_floor_pct)
            found.append(finding)
        return found

    findings: list[Finding] = []
    with sharing():  # what several rules (and the summary) ask of the trace is computed once
        workers = min(rule_threads(trace, threads), len(chosen))
        if workers <= 1:
            for rule in chosen:
                findings.extend(findings_of(rule))
        else:
            pool = ThreadPoolExecutor(workers, thread_name_prefix="traceparse-rule")
            # each rule in a copy of this context: the sharing scope is the same object in every thread; the
            # costliest started first (the longest does not run alone at the end), the results read in order
            started = sorted(range(len(chosen)), key=lambda i: -getattr(chosen[i], "cost", 1))
            futures: list = [None] * len(chosen)
            for i in started:
                futures[i] = pool.submit(contextvars.copy_context().run, findings_of, chosen[i])
            try:
                for future in futures:  # in the rules' order: the first rule that fails is the error raised
                    findings.extend(future.result())
            finally:
                pool.shutdown(wait=True, cancel_futures=True)
    return order_findings(findings)


def _apply_floor(finding: Finding, span_ns: int | None, floor_pct: float) -> None:
    """Lower a CRITICAL finding to a warning when its time at stake is under ``floor_pct`` of the span."""
    if finding.severity != "critical" or finding.impact_ns is None or not span_ns:
        return
    floor = floor_pct / 100.0 * span_ns
    if finding.impact_ns < floor:
        from traceparse.figures import fmt_ns

        finding.severity = "warning"
        finding.message += (f" Lowered from critical: {fmt_ns(finding.impact_ns)} at stake is under "
                             f"{floor_pct:g}% of the {fmt_ns(span_ns)} span.")


def order_findings(findings: Iterable[Finding]) -> list[Finding]:
    """Findings worst first, so that the first one read is the one that matters most.

    Traces keep the order they first appear in; within a trace, by severity
    (critical first), then ``impact_ns`` (the most time at stake first; a
    finding without one after those with one), then rule name; findings
    equal on all three keep their order (a rule's own findings stay in the
    order it gave them). The order is the same on screen and in JSON.
    """
    findings = list(findings)
    traces = {t: i for i, t in enumerate(dict.fromkeys(f.trace for f in findings))}
    return sorted(findings, key=lambda f: (traces[f.trace], -severity_rank(f.severity),
                                           (0, -f.impact_ns) if f.impact_ns is not None else (1, 0), f.rule))


def select_findings(findings: Iterable[Finding], min_severity: str | None = None,
                    top: int | None = None) -> list[Finding]:
    """Ordered findings (:func:`order_findings`) at or above ``min_severity``, the first ``top`` of each trace."""
    kept: list[Finding] = []
    per_trace: dict[str | None, int] = {}
    floor = severity_rank(min_severity) if min_severity else 0
    for f in order_findings(findings):
        if severity_rank(f.severity) < floor:
            continue
        per_trace[f.trace] = per_trace.get(f.trace, 0) + 1
        if top is None or per_trace[f.trace] <= top:
            kept.append(f)
    return kept




def worst_severity(findings: Iterable[Finding]) -> str | None:
    """The most severe severity among ``findings`` (None when there are none)."""
    ranks = [severity_rank(f.severity) for f in findings]
    from traceparse.rule import SEVERITIES

    return SEVERITIES[max(ranks)] if ranks else None


#: The columns of a stored analysis (:meth:`traceparse.store.Store.save_findings`, the ``findings`` SQL view).
FINDINGS_SCHEMA = pl.Schema({"rule": pl.String, "severity": pl.String, "title": pl.String, "message": pl.String,
                             "suggestion": pl.String, "impact_ns": pl.Int64, "metrics": pl.String,
                             "items": pl.String, "scope": pl.String, "analyzed_at": pl.String})


def findings_frame(findings: Iterable[Finding], scope: str | None = None) -> pl.DataFrame:
    """Findings as one row each (:data:`FINDINGS_SCHEMA`), to keep beside their trace in the store.

    ``metrics`` and ``items`` are the JSON text ``analyze --json`` prints for them; ``scope`` names the part
    of the trace analysed (``step 3``, the window's label), null for the whole trace; ``analyzed_at`` is now, in
    UTC.
    """
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    rows = [{"rule": f.rule, "severity": f.severity, "title": f.title, "message": f.message,
             "suggestion": f.suggestion, "impact_ns": f.impact_ns,
             "metrics": json.dumps(f.metrics, default=str), "items": json.dumps(f.items, default=str),
             "scope": scope, "analyzed_at": now} for f in findings]
    return pl.DataFrame(rows, schema=FINDINGS_SCHEMA, strict=False)
