"""grade(), declared columns and figures, and a renderer that shows only what a finding declares."""

from __future__ import annotations

import doctest

import pytest
from rich.console import Console

import traceparse.expr
import traceparse.measures.busy
import traceparse.verdict
from traceparse.report import render_findings
from traceparse.rule import Finding
from traceparse.verdict import Column, grade


@pytest.mark.parametrize("value, expected", [(None, "info"), (24.9, "info"), (25.0, "warning"), (49.9, "warning"),
                                             (50.0, "critical"), (80, "critical")])
def test_grade_higher_is_worse_at_or_above(value, expected):
    assert grade(value, warning=25.0, critical=50.0) == expected


@pytest.mark.parametrize("value, expected", [(None, "info"), (50.0, "info"), (49.9, "warning"), (10.0, "warning"),
                                             (9.99, "critical"), (0, "critical")])
def test_grade_lower_is_worse_strictly_below(value, expected):
    assert grade(value, warning=50.0, critical=10.0, higher_is_worse=False) == expected


def test_grade_without_a_critical_threshold_stops_at_warning():
    assert grade(1e9, warning=1.0) == "warning"
    assert grade(1e9) == "info"


def test_a_column_refuses_an_unknown_unit():
    with pytest.raises(ValueError, match="unit 'seconds'"):
        Column("t", "time", "seconds")


def test_finding_json_keeps_its_keys_and_adds_the_declarations():
    f = Finding("r", "info", "t", "m", metrics={"a_ns": 5}, items=[{"k": 1}], columns=[Column("k", "K", "count")],
                figures={"a_ns": "ns"}, labels={"a_ns": "GPU span"})
    d = f.to_dict()
    assert list(d)[:8] == ["trace", "rule", "severity", "title", "message", "suggestion", "metrics", "items"]
    assert d["columns"] == [{"key": "k", "label": "K", "unit": "count"}] and d["figures"] == {"a_ns": "ns"}
    assert d["labels"] == {"a_ns": "GPU span"}


def render(finding: Finding) -> str:
    console = Console(record=True, width=200)
    render_findings(console, [finding], {})
    return console.export_text()


def test_the_renderer_uses_the_declared_units_not_the_key_names():
    f = Finding("r", "info", "t", "m",
                metrics={"looks_like_ns": 1500, "shown_pct": 12.345, "hidden_ns": 7, "size": 2048},
                figures={"looks_like_ns": "count", "shown_pct": "pct", "size": "bytes_binary"},
                items=[{"when_ns": 2_500_000, "label": "HtoD (pinned -> device)", "other": 1}],
                columns=[Column("when_ns", "when", "ns"), Column("label", "copy", "text")])
    text = render(f)
    assert "1,500" in text and "1.500 us" not in text        # a key ending in _ns is not taken for a duration
    assert "12.3%" in text and "2.000 KiB" in text             # four significant figures
    assert "hidden_ns" not in text                           # undeclared figures are not shown
    assert "when (ms)" in text and "2.500" in text and "HtoD (pinned -> device)" in text  # one unit per column, in its header
    assert "other" not in text                               # nor undeclared item columns


def test_a_finding_that_declares_nothing_is_shown_plainly():
    f = Finding("r", "info", "t", "m", metrics={"calls_ns": 1500}, items=[{"x_pct": 0.5}])
    text = render(f)
    assert "calls_ns" in text and "1500" in text and "x_pct" in text and "0.5" in text and "%" not in text


def test_a_declared_figure_is_labelled_without_its_units_suffix():
    from traceparse.report import figure_label

    assert [figure_label(k, u) for k, u in (("idle_ns", "ns"), ("idle_pct", "pct"), ("peak_bytes", "bytes_binary"),
                                            ("calls_ns", "count"), ("ns", "ns"))] == \
        ["idle", "idle", "peak", "calls ns", "ns"]  # a suffix that is not its unit's stays: no guessing
    f = Finding("r", "info", "t", "m", metrics={"busy_ns": 1500, "copy_gbps": 2.5},
                figures={"busy_ns": "ns", "copy_gbps": "gbps"})
    text = render(f)
    assert "busy_ns" not in text and "busy" in text and "copy" in text


@pytest.mark.parametrize("module", [traceparse.expr, traceparse.verdict, traceparse.measures.busy])
def test_docstring_examples(module):
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
