"""ncu's own verdicts reach the findings (issue 21): rule results (OPT/INF/WRN lines, "Estimated Speedup")
in ncu-speedups, the Speed Of Light percentages in ncu-sol, and the device narrowed through the GPU catalog.

Every expected figure comes from the raw text or CSV parsed here (regular expressions, the csv module,
Decimal), and the catalog's entries from gpus.toml read with tomllib.
"""

from __future__ import annotations

import csv
import json
import re
import tomllib
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest

from helpers import FIXTURES, REPO, run_cli, run_rule
from traceparse.ingest import read_paths

TEXT = FIXTURES / "ncu" / "ncu_sol_vgg11_bs16.txt"
TEXT_SPEEDUP = FIXTURES / "ncu" / "handwritten" / "text_2024_speedup.txt"
DETAILS = FIXTURES / "ncu" / "ncu_details_vgg11_bs16.csv"
TIME_NS = {"ns": 1, "nsecond": 1, "us": 1000, "usecond": 1000, "ms": 10 ** 6, "msecond": 10 ** 6}
RULE_LINE = re.compile(r"^    (OPT|INF|WRN|ERR)\s{2,}(.*)$")
SPEEDUP = re.compile(r"^Est\. (?:(Local|Global) )?Speedup: ([\d.]+)%")
KERNEL_LINE = re.compile(r"^  \S.* \(\d+, ?\d+, ?\d+\)x\(\d+, ?\d+, ?\d+\), Context \d+, Stream \d+, Device (\d+), CC ([\d.]+)")
SOL = {"Compute (SM) Throughput": "compute_pct", "Memory Throughput": "memory_pct", "DRAM Throughput": "dram_pct"}


def text_report(path: Path) -> dict:
    """Launches (SOL %, duration ns) and rule results (type, speed-up or None) of an ncu text report."""
    launches, rules, ccs = [], [], set()
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        k = KERNEL_LINE.match(line)
        if k:
            launches.append({})
            ccs.add(k.group(2))
            continue
        m = RULE_LINE.match(line)
        if m:
            speed = SPEEDUP.match(m.group(2).strip())
            rules.append((m.group(1), Decimal(speed.group(2)) if speed else None))
            continue
        cells = re.split(r"\s{2,}", line.strip())
        if launches and len(cells) == 3:
            name, unit, value = cells
            if name in SOL and unit == "%":
                launches[-1][SOL[name]] = Decimal(value.replace(",", ""))
            elif name == "Duration":
                launches[-1]["duration_ns"] = int(Decimal(value.replace(",", "")) * TIME_NS[unit])
    return {"launches": launches, "rules": rules, "ccs": ccs}


def details_report(path: Path) -> dict:
    """The same from an ncu --csv details page."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    launches: dict[str, dict] = {}
    rules = []
    for row in csv.DictReader(line for line in lines[start:] if not line.startswith("==")):
        launch = launches.setdefault(row["ID"], {})
        if row["Metric Name"] in SOL and row["Section Name"] == "GPU Speed Of Light Throughput":
            launch[SOL[row["Metric Name"]]] = Decimal(row["Metric Value"].replace(",", ""))
        elif row["Metric Name"] == "Duration":
            launch["duration_ns"] = int(Decimal(row["Metric Value"].replace(",", "")) * TIME_NS[row["Metric Unit"]])
        elif row.get("Rule Name") and not row["Metric Name"]:
            rules.append((row["Rule Type"], Decimal(row["Estimated Speedup"]) if row["Estimated Speedup"] else None))
    return {"launches": list(launches.values()), "rules": rules}


def sol_expected(launches: list[dict]) -> dict:
    """Duration-weighted SOL means and the latency-bound time (both compute and memory under 60%)."""
    total = sum(l["duration_ns"] for l in launches)
    out = {f: float(sum(l[f] * l["duration_ns"] for l in launches) / total) for f in SOL.values()}
    out["latency_bound_ns"] = sum(l["duration_ns"] for l in launches
                                  if max(l["compute_pct"], l["memory_pct"]) < 60)
    out["kernel_time_ns"] = total
    return out


def check_speedups_finding(finding, rules: list) -> None:
    types = Counter(t for t, _ in rules)
    m = finding.metrics
    assert m["rule_results"] == len(rules) > 0
    assert m["rule_types"] == dict(types)
    assert m["speedup_results"] == sum(1 for _, s in rules if s is not None and s >= 1)
    said = m["ncu_says"].values()
    assert sum(r["launches"] for r in said) == len(rules) or len(said) == 10
    assert list(m["ncu_says"]) == [str(i + 1) for i in range(len(said))]
    order = {"ERR": 0, "WRN": 1, "OPT": 2, "INF": 3}
    assert [order[r["type"]] for r in said] == sorted(order[r["type"]] for r in said)


def test_text_report_rule_results_are_counted_and_quoted():
    raw = text_report(TEXT)
    assert len(raw["rules"]) == 5 and all(s is None for _, s in raw["rules"])
    finding = run_rule(read_paths([TEXT])[0], "ncu-speedups")
    check_speedups_finding(finding, raw["rules"])
    assert finding.severity == "info" and finding.impact_ns == 0
    texts = {r["text"] for r in finding.metrics["ncu_says"].values()}
    assert any(t.startswith("Compute is more heavily utilized than Memory") for t in texts)


def test_text_report_speedups_are_read():
    raw = text_report(TEXT_SPEEDUP)
    finding = run_rule(read_paths([TEXT_SPEEDUP])[0], "ncu-speedups")
    check_speedups_finding(finding, raw["rules"])
    (speedup,) = [s for _, s in raw["rules"] if s is not None]
    (launch,) = raw["launches"]
    assert finding.metrics["est_saved_ns"] == round(launch["duration_ns"] * speedup / 100)
    assert max(r["speedup_pct"] or 0 for r in finding.metrics["ncu_says"].values()) == float(speedup)
    texts = [r["text"] for r in finding.metrics["ncu_says"].values()]
    assert any("0.8 full waves" in t for t in texts)


@pytest.mark.parametrize("where", ["fixture", "sample"])
def test_details_page_rule_results_of_every_type(where, request):
    path = DETAILS if where == "fixture" else request.getfixturevalue("samples_dir") / "ncu" / "ncu_details_alexnet_bs16.csv"
    raw = details_report(path)
    finding = run_rule(read_paths([path])[0], "ncu-speedups")
    check_speedups_finding(finding, raw["rules"])
    assert finding.metrics["rule_results"] > finding.metrics["speedup_results"]  # INF results count too


@pytest.mark.parametrize("path", [TEXT, DETAILS], ids=["text", "details"])
def test_sol_percentages_against_the_report(path):
    raw = text_report(path) if path.suffix == ".txt" else details_report(path)
    expected = sol_expected(raw["launches"])
    finding = run_rule(read_paths([path])[0], "ncu-sol")
    m = finding.metrics
    assert m["launches"] == len(raw["launches"])
    assert m["kernel_time_ns"] == expected["kernel_time_ns"]
    for figure in SOL.values():
        assert m[figure] == pytest.approx(expected[figure], abs=1e-3), figure
    assert m["latency_bound_ns"] == expected["latency_bound_ns"]
    assert m["compute_bound_ns"] + m["memory_bound_ns"] + m["latency_bound_ns"] == m["kernel_time_ns"]
    assert 0 <= m["latency_bound_pct"] <= 100
    share = 100 * expected["latency_bound_ns"] / expected["kernel_time_ns"]
    assert finding.severity == ("critical" if share >= 80 else "warning" if share >= 50 else "info")
    assert finding.impact_ns is None


def test_sol_threshold_is_settable():
    raw = details_report(DETAILS)
    finding = run_rule(read_paths([DETAILS])[0], "ncu-sol", "ncu-sol.low_pct=90", "ncu-sol.high_pct=95")
    expected = sum(l["duration_ns"] for l in raw["launches"] if max(l["compute_pct"], l["memory_pct"]) < 90)
    assert finding.metrics["latency_bound_ns"] == expected


def test_the_text_reports_device_is_narrowed_by_its_compute_capability(tmp_path):
    raw = text_report(TEXT)
    (cc,) = raw["ccs"]
    catalog = tomllib.loads((REPO / "plugins" / "catalog" / "gpus.toml").read_text())["gpu"]
    family = [g["name"] for g in catalog if "identify" not in g and g.get("compute_capability") == cc]
    assert family and "H100 SXM" in family
    code, out, err = run_cli("--store", str(tmp_path), "show", str(TEXT))
    flat = " ".join(out.replace("│", " ").split())
    assert f"compute capability {cc}: one of {', '.join(family)}" in flat


def test_sol_of_ncu_2020_under_its_old_names(tmp_path):
    """ncu 2019.x-2020.x named the SOL figures "SM [%]", "Memory [%]" and "SOL FB" (a real rodinia cfd run on a
    V100, XPlacer's data): ncu-sol found none and, asked for, said the trace had no counters."""
    head = '"ID","Process ID","Process Name","Host Name","Kernel Name","Kernel Time","Context","Stream",' \
           '"Section Name","Metric Name","Metric Unit","Metric Value"'
    rows = []
    for launch, (name, dur_us, sm, mem, fb) in enumerate((("cuda_compute_flux", "30.00", "23.70", "35.60", "35.60"),
                                                          ("cuda_time_step", "10.00", "10.00", "80.00", "80.00"))):
        for metric, unit, value in (("Duration", "usecond", dur_us), ("SM [%]", "%", sm), ("Memory [%]", "%", mem),
                                    ("SOL FB", "%", fb)):
            rows.append(f'"{launch}","1","cfd","127.0.0.1","{name}(int)","2020-May-29 12:02:4{launch}","1","7",'
                        f'"GPU Speed Of Light","{metric}","{unit}","{value}"')
    path = tmp_path / "nsight_cfd.csv"
    path.write_text("\n".join([head, *rows]) + "\n")
    m = run_rule(read_paths([path])[0], "ncu-sol").metrics
    assert m["launches"] == 2 and m["kernel_time_ns"] == 40_000
    assert m["compute_pct"] == pytest.approx((23.7 * 30 + 10 * 10) / 40)   # duration-weighted
    assert m["memory_pct"] == pytest.approx((35.6 * 30 + 80 * 10) / 40)
    assert m["dram_pct"] == pytest.approx((35.6 * 30 + 80 * 10) / 40)
