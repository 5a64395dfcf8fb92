"""Findings worst first, --min-severity / --top / --all, quiet rules in one line, no table twice (issue 11, item 2)."""

from __future__ import annotations

import json
import re

import pytest

from traceparse.figures import fmt_ns

from helpers import FIXTURES, run_cli
from traceparse.analysis import is_quiet, order_findings, select_findings
from traceparse.rule import SEVERITIES, Finding

TORCH = FIXTURES / "torch" / "resnet18_bs16.json.gz"


def _f(rule, severity, impact=None, trace="t", items=()):
    return Finding(rule, severity, rule, "", impact_ns=impact, trace=trace, items=list(items))


def test_order_is_severity_then_impact_then_rule_and_stable():
    found = [_f("b", "info", 5), _f("a", "info", None), _f("c", "warning", 1), _f("a", "info", 5),
             _f("z", "critical", None), _f("y", "critical", 0), _f("h", "info", None, trace="u"),
             _f("h", "critical", 9, trace="u"), _f("b", "info", 5)]
    first_b, last_b = found[0], found[8]
    ordered = order_findings(found)
    assert [(f.trace, f.rule, f.severity, f.impact_ns) for f in ordered] == [
        ("t", "y", "critical", 0), ("t", "z", "critical", None), ("t", "c", "warning", 1),
        ("t", "a", "info", 5), ("t", "b", "info", 5), ("t", "b", "info", 5), ("t", "a", "info", None),
        ("u", "h", "critical", 9), ("u", "h", "info", None)]
    assert ordered[4] is first_b and ordered[5] is last_b  # equal keys keep their order
    assert order_findings(list(reversed(found)))[:3] == ordered[:3]


def test_select_min_severity_and_top_per_trace():
    found = [_f("a", "info", 1), _f("b", "warning", 2), _f("c", "critical", 3), _f("d", "warning", 9),
             _f("e", "info", 1, trace="u"), _f("f", "warning", 1, trace="u")]
    assert [f.rule for f in select_findings(found, "warning")] == ["c", "d", "b", "f"]
    assert [f.rule for f in select_findings(found, top=2)] == ["c", "d", "f", "e"]
    assert [f.rule for f in select_findings(found, "critical", 5)] == ["c"]
    assert [f.rule for f in select_findings(found)] == [f.rule for f in order_findings(found)]


def test_the_bottleneck_is_the_most_time_at_stake_whatever_the_severity():
    from traceparse.summary import bottleneck

    assert bottleneck([_f("a", "critical", 5), _f("b", "info", 7), _f("c", "warning", None)])["rule"] == "b"
    assert bottleneck([_f("b", "info", 7), _f("c", "warning", 7), _f("a", "info", 7)]) == {
        "rule": "c", "impact_ns": 7, "title": "c", "severity": "warning", "whole": "the span", "whole_ns": None,
        "share_pct": None, "range": None, "said": "lost"}
    assert bottleneck([_f("c", "warning", 7)], span_ns=28)["share_pct"] == 25.0
    whole = _f("g", "critical", 30)
    whole.impact_whole = ("the GPU's span", 40)
    assert bottleneck([whole], span_ns=50) == {"rule": "g", "impact_ns": 30, "title": "g", "severity": "critical",
                                               "whole": "the GPU's span", "whole_ns": 40, "share_pct": 75.0,
                                               "range": None, "said": "lost"}
    assert bottleneck([_f("a", "info", 7), _f("b", "info", 7)])["rule"] == "a"
    assert bottleneck([_f("a", "critical", 0), _f("b", "info", None)]) is None


def test_quiet_means_info_with_nothing_at_stake():
    assert is_quiet(_f("a", "info", 0))
    assert is_quiet(_f("a", "info", 99), span_ns=10_000)          # under 1% of the span
    assert not is_quiet(_f("a", "info", 100), span_ns=10_000)     # 1%: something to say
    assert not is_quiet(_f("a", "info", 99))                      # no span to compare with
    assert is_quiet(_f("a", "info", None))                        # nothing measured, nothing listed
    assert not is_quiet(_f("a", "info", None, items=[{"name": "k"}]))  # a table to read (kernel-share)
    assert not is_quiet(_f("a", "warning", 0)) and not is_quiet(_f("a", "critical", None))


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    store = tmp_path_factory.mktemp("store")
    code, out, err = run_cli("--store", str(store), "analyze", str(TORCH), "--json")
    assert code == 0, err
    return json.loads(out), store


def test_json_findings_are_ordered_and_carry_impact(doc):
    d, _ = doc
    keys = [(-SEVERITIES.index(f["severity"]), (0, -f["impact_ns"]) if f["impact_ns"] is not None else (1, 0),
             f["rule"]) for f in d["findings"]]
    assert keys == sorted(keys) and len(keys) == 15  # 13 rules; hotspots gives 3 (routines, per thread, annotations)
    impact = {f["rule"]: f["impact_ns"] for f in d["findings"] if f["title"] != "Hotspots per thread"}
    m = {f["rule"]: f["metrics"] for f in d["findings"]}
    assert impact["gpu-idle"] == m["gpu-idle"]["idle_ns"] > 0
    assert impact["low-memcpy-overlap"] == m["low-memcpy-overlap"]["memcpy_time_ns"] - m["low-memcpy-overlap"]["overlapped_ns"]
    assert impact["pageable-memcpy"] == m["pageable-memcpy"]["pageable_time_ns"] == 0
    assert impact["inefficient-memcpy-size"] == m["inefficient-memcpy-size"]["small_copy_time_ns"]
    assert impact["kernel-share"] is None and impact["hotspots"] is None
    # launch-bound time: Σ over directly launched kernels of how much their launch call outlasts them
    launches = m["launch-stats"]
    assert 0 < impact["launch-stats"] <= launches["launch_time_ns"]
    assert d["findings"][0]["rule"] == "gpu-idle" and d["findings"][0]["severity"] == "critical"


def test_json_min_severity_top_and_fail_on_sees_everything(doc):
    d, store = doc
    code, out, _ = run_cli("--store", str(store), "analyze", str(TORCH), "--json", "--min-severity", "warning")
    assert [f["rule"] for f in json.loads(out)["findings"]] == [
        f["rule"] for f in d["findings"] if f["severity"] != "info"]
    code, out, _ = run_cli("--store", str(store), "analyze", str(TORCH), "--json", "--top", "3")
    assert json.loads(out)["findings"] == d["findings"][:3]
    # what is shown does not change the gate: the warnings hidden by --min-severity critical still fail it
    code, out, _ = run_cli("--store", str(store), "analyze", str(TORCH), "--min-severity", "critical",
                           "--fail-on", "warning", "--json")
    assert code == 1 and {f["severity"] for f in json.loads(out)["findings"]} == {"critical"}
    with pytest.raises(SystemExit) as exit_:
        run_cli("--store", str(store), "analyze", str(TORCH), "--top", "0")
    assert exit_.value.code == 2


def test_screen_summary_first_then_the_worst_finding_and_quiet_rules_last(doc, monkeypatch):
    """The README's main command piped (80 columns): the summary panel, the worst finding, the quiet line."""
    d, store = doc
    monkeypatch.delenv("COLUMNS", raising=False)
    code, out, _ = run_cli("--store", str(store), "analyze", str(TORCH))
    assert code == 0 and max(len(line) for line in out.splitlines()) <= 80
    titles = [line for line in out.splitlines() if line.startswith("╭")]
    assert titles[0].startswith("╭─ summary") and titles[1].startswith("╭─ CRITICAL  gpu-idle: GPU idle")
    [summary] = d["summary"]
    idle_ms = fmt_ns(summary['bottleneck']['impact_ns'])
    # one figure, one percentage: the summary gives the idle time's share of the GPU's span, as gpu-idle does
    # (not of the trace's span, which starts before the GPU's first activity)
    [idle] = [f for f in d["findings"] if f["rule"] == "gpu-idle"]
    share = idle["metrics"]["idle_pct"]
    assert summary["bottleneck"]["share_pct"] == pytest.approx(100 * idle["impact_ns"] / idle["metrics"]["span_ns"])
    assert summary["bottleneck"]["whole_ns"] == idle["metrics"]["span_ns"] < summary["span_ns"]
    panel = " ".join(out.split("╭─ CRITICAL")[0].replace("│", " ").split())  # the summary panel, lines joined
    assert f"bottleneck GPU idle, {idle_ms} lost, {share:.1f}% of the GPU's span (gpu-idle, critical)" in panel
    assert f"{share:.1f}% idle" in " ".join(out.split())  # gpu-idle's own panel: the same percentage
    assert re.search(rf"│ GPU busy +{summary['gpu_busy_pct']:.1f}% ", out)
    assert re.search(rf"│ steps +2 \(ProfilerStep#N\), mean {fmt_ns(summary['step_time_ns'])}", out)
    quiet = sorted({f["rule"] for f in d["findings"]
                    if f["severity"] == "info" and (f["impact_ns"] == 0 or (f["impact_ns"] is None and not f["items"])
                                                    or (f["impact_ns"] is not None
                                                        and f["impact_ns"] < 0.01 * summary["span_ns"]))})
    assert "pageable-memcpy" in quiet and "kernel-share" not in quiet
    line = " ".join(out[out.index("Nothing to report: "):].split("(--all")[0].split())
    assert sorted(line.removeprefix("Nothing to report: ").split(", ")) == quiet
    for rule in quiet:
        assert f"  {rule}:" not in out  # no panel
    code, full, _ = run_cli("--store", str(store), "analyze", str(TORCH), "--all")
    assert "Nothing to report" not in full and all(f"  {rule}:" in full for rule in quiet)
    # one device, one stream: gpu-idle's per-device and per-stream tables (its headline figures again) are not
    # drawn; --all changes nothing there
    start = full.index("gpu-idle: GPU idle")
    panel = full[start:full.index("╰", start)]
    assert "\n│ devices" not in panel and "│ streams" not in panel


def test_a_table_is_not_drawn_twice(tmp_path):
    """A kernel summary: hotspots' rows are kernel-share's kernels with the same times; kernel-share keeps them."""
    path = FIXTURES / "nsys" / "resnet18_bs8_cuda_gpu_kern_sum.csv"
    code, out, _ = run_cli("--store", str(tmp_path), "analyze", str(path), "--json")
    found = {(f["rule"], f["title"]): f for f in json.loads(out)["findings"]}
    hot = found[("hotspots", "Hotspots: routines by exclusive time")]
    share = found[("kernel-share", "Where the kernel time goes")]
    assert {(i["name"], i["time_ns"]) for i in hot["items"]} == {(i["name"], i["time_ns"]) for i in share["items"]}
    code, out, _ = run_cli("--store", str(tmp_path), "analyze", str(path))
    assert out.count(f"(its {len(hot['items'])} rows are in kernel-share's table)") == 1
    assert len(re.findall(r"┃ +GPU(?: share %)? +│", out)) == 1  # kernel-share's table (its header may fold), once


def test_a_finding_with_nothing_to_report_is_no_bottleneck():
    from traceparse.summary import bottleneck

    # 142 us at stake in a 14.44 ms span (0.99%) is "nothing to report" in the tally: the summary must not name it
    # as the bottleneck (fixtures/torch/acceptance/compiled_cudagraphs_h200's launch-stats, run alone)
    quiet = _f("launch-stats", "info", 142_300)
    assert bottleneck([quiet], span_ns=14_440_000) is None
    assert bottleneck([quiet], span_ns=14_000_000)["rule"] == "launch-stats"  # 1.02%: something to report
    assert bottleneck([quiet, _f("gpu-idle", "info", 2_053_000)], span_ns=14_440_000)["rule"] == "gpu-idle"
    # a warning is never quiet among the findings, but 1 ns of a 1 s span is no headline ("0.0% of the span")
    assert bottleneck([_f("w", "warning", 1)], span_ns=10**9) is None
    assert bottleneck([_f("w", "warning", 10**7)], span_ns=10**9)["rule"] == "w"
