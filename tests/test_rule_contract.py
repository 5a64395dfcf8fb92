"""Contract tests over the rule registry: every installed rule is documented in docs/rules.md.

Parametrized over ``registry().rules``, so a new rule is checked without a new
test: its section exists, names every threshold (with its default where the
section has a threshold table) and every metric key the rule reports on the
fixtures.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import pytest

from helpers import FIXTURES, REPO
from traceparse.analysis import analyze
from traceparse.ingest import read_paths
from traceparse.plugins import registry

RULES_DOC = REPO / "docs" / "rules.md"
RULES = sorted(registry().rules)

#: Fixtures that, together, give every built-in rule something to measure.
INPUTS = [
    FIXTURES / "torch" / "resnet18_bs16.json.gz",
    FIXTURES / "torch" / "multigpu" / "dp2_resnet18_bs16.json.gz",
    FIXTURES / "nsys" / "resnet18_bs8.sqlite.gz",
    FIXTURES / "nsys" / "resnet18_bs8_cuda_gpu_trace.csv",
    FIXTURES / "nvprof" / "handwritten" / "gpu_api_trace.log",
    FIXTURES / "nvprof" / "handwritten" / "summary.csv",
    FIXTURES / "nvprof" / "handwritten" / "metrics_events.log",
    FIXTURES / "ncu" / "ncu_raw_vgg11_bs16.csv",
    FIXTURES / "ncu" / "ncu_details_vgg11_bs16.csv",
    FIXTURES / "tau" / "real" / "cpi-mpi",
    FIXTURES / "tau" / "handwritten" / "multi-cupti",
    FIXTURES / "tau" / "handwritten" / "pprof-papi-counts.txt",
    FIXTURES / "chrome" / "handwritten" / "memory_counters.json",
]


def sections() -> dict[str, str]:
    """docs/rules.md split at its ``## name`` headings: rule name -> section text."""
    text = RULES_DOC.read_text(encoding="utf-8")
    return dict(re.findall(r"^## (\S+)\n(.*?)(?=^## |\Z)", text, re.M | re.S))


@cache
def reported_metrics() -> dict[str, set[str]]:
    """Rule name -> every top-level metric key its findings carry on :data:`INPUTS`."""
    keys: dict[str, set[str]] = {}
    for path in INPUTS:
        for trace in read_paths([path]):
            for finding in analyze(trace):
                keys.setdefault(finding.rule, set()).update(finding.metrics)
    return keys


def test_every_section_is_an_installed_rule():
    """No stale section: each ``## name`` of docs/rules.md is a registered rule."""
    assert sorted(sections()) == RULES


@pytest.mark.parametrize("name", RULES)
def test_rule_has_a_section(name):
    """The rule has its own section in docs/rules.md."""
    assert name in sections(), f"docs/rules.md has no '## {name}' section"


@pytest.mark.parametrize("name", RULES)
def test_every_threshold_is_documented(name):
    """Each threshold key is named in the rule's section; a threshold table also states its default exactly."""
    section = sections().get(name, "")
    rule = registry().rules[name]
    for key, default in rule.thresholds.items():
        assert f"`{key}`" in section, f"{name}: threshold {key} is not in docs/rules.md"
        row = re.search(rf"^\| `{re.escape(key)}` \| (.*?) \|", section, re.M)
        if "| threshold | default |" in section:
            assert row, f"{name}: threshold {key} has no row in the section's table"
            written = row.group(1).strip("`")
            assert json.loads(written) == default, f"{name}.{key}: docs say {written}, the rule's default is {default!r}"


@pytest.mark.parametrize("name", RULES)
def test_every_metric_is_documented(name):
    """Each metric key the rule reports is named in its section (or in a docs page the section points to)."""
    section = sections().get(name, "")
    assert "Metrics" in section, f"{name}: the section lists no metrics"
    pointed = "".join((REPO / page).read_text(encoding="utf-8") for page in set(re.findall(r"docs/[\w/.-]+\.md", section)))
    metrics = reported_metrics().get(name, set())
    assert metrics, f"{name}: no finding with metrics on the contract fixtures; add a fixture the rule applies to"
    missing = sorted(k for k in metrics if f"`{k}`" not in section and f"`{k}`" not in pointed)
    assert missing == [], f"{name}: metrics not in docs/rules.md: {', '.join(missing)}"


def test_the_contract_sees_every_rule():
    """The fixtures exercise every installed rule, so the metric check above is never vacuous."""
    assert sorted(reported_metrics()) == RULES
    assert Path(RULES_DOC).is_file()
