"""Papercuts of issue 23 (item 5), each on a bundled real trace: what the user reads says what it means."""

from __future__ import annotations

import re

from helpers import FIXTURES, run_cli


def test_rules_with_nothing_to_report_are_not_counted_as_findings(store):
    code, out, _ = run_cli("--store", str(store), "analyze", str(FIXTURES / "torch" / "resnet18_bs16.json.gz"))
    assert code == 0
    panels = re.findall(r"^╭─ (CRITICAL|WARNING|INFO) ", out, re.M)
    nothing = re.search(r"^Nothing to report: (.*?) \(--all shows them\)", out, re.M | re.S).group(1)
    folded = [n.strip() for n in nothing.replace("\n", " ").split(",")]
    tally = re.search(r"^(\d+) findings?: (.*); (\d+) rules? with nothing to report$", out, re.M)
    assert tally, out[-400:]
    assert int(tally.group(1)) == len(panels)
    assert int(tally.group(3)) == len(folded)
    shown = {sev: panels.count(sev) for sev in ("CRITICAL", "WARNING", "INFO")}
    expected = ", ".join(f"{n} {label}" for sev, n, label in (
        ("CRITICAL", shown["CRITICAL"], "critical"), ("WARNING", shown["WARNING"],
                                                      "warning" if shown["WARNING"] == 1 else "warnings"),
        ("INFO", shown["INFO"], "info")) if n)
    assert tally.group(2) == expected
    summary_line = re.search(r"│ findings\s+(.*?)\s+│", out).group(1)
    assert summary_line == f"{expected}; {len(folded)} rules with nothing to report"
