"""Running rules over traces, and the ``--set RULE.PARAM=VALUE`` overrides."""

from __future__ import annotations

import json
from typing import Any, Iterable

from traceparse.errors import InputError
from traceparse.plugins import Registry, registry as default_registry
from traceparse.rule import Finding, RuleOptions, severity_rank
from traceparse.trace import Trace


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
            return int(raw)
        if isinstance(default, float):
            return float(raw)
        if isinstance(default, (list, dict)):
            value = json.loads(raw)
            if not isinstance(value, type(default)):
                raise ValueError
            return value
        return raw
    except ValueError:
        raise InputError(f"--set {setting!r}: {raw!r} is not a valid {type(default).__name__}") from None


def analyze(trace: Trace, rules: Iterable[str] | None = None, settings: dict[str, dict[str, Any]] | None = None,
            gpu: str | None = None, reg: Registry | None = None) -> list[Finding]:
    """Run rules on a trace and return their findings.

    ``rules`` names the rules to run; by default every rule that applies to
    the trace runs. ``settings`` are threshold overrides as returned by
    :func:`parse_settings`.
    """
    reg = reg or default_registry()
    settings = settings or {}
    chosen = [reg.rule(name) for name in rules] if rules else list(reg.rules.values())
    findings: list[Finding] = []
    for rule in chosen:
        if not rule.applies_to(trace):
            if rules:
                findings.append(Finding(
                    rule.name, "info", f"{rule.name}: not applicable",
                    (f"it needs {' and '.join(rule.kinds)} events" if rule.needs_all_kinds
                     else f"the trace has no {' / '.join(rule.kinds)} events"), trace=trace.id,
                ))
            continue
        options = RuleOptions(thresholds={**rule.thresholds, **settings.get(rule.name, {})}, gpu=gpu)
        for finding in rule.check(trace, options):
            finding.trace = trace.id
            findings.append(finding)
    return findings


def worst_severity(findings: Iterable[Finding]) -> str | None:
    """The most severe severity among ``findings`` (None when there are none)."""
    ranks = [severity_rank(f.severity) for f in findings]
    from traceparse.rule import SEVERITIES

    return SEVERITIES[max(ranks)] if ranks else None
