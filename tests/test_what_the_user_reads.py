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


def test_the_summary_of_several_traces_sorts_numbers_by_value(store):
    paths = sorted(str(p) for p in (FIXTURES / "torch_sweep2").glob("alexnet_bs*.json.gz"))  # text order
    assert [p.rsplit("_bs", 1)[1] for p in paths][:3] == ["128.json.gz", "16.json.gz", "32.json.gz"]
    code, out, _ = run_cli("--store", str(store), "analyze", *paths)
    assert code == 0
    table = out[out.index("summary of the traces"):]
    batches = [int(b) for b in re.findall(r"^ alexnet_bs(\d+) ", table, re.M)]
    assert batches == sorted(batches) and len(batches) == len(paths)
    assert re.search(r"^ alexnet_bs4 .*│ gpu-idle +│", table, re.M)  # the bottleneck's name is never cut


def test_list_shows_a_run_whole_at_80_columns(store, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    run = FIXTURES / "torch" / "multirank" / "gloo4_slow_rank2"
    assert run_cli("--store", str(store), "ingest", str(run))[0] == 0
    code, out, _ = run_cli("--store", str(store), "list")
    assert code == 0 and max(map(len, out.splitlines())) <= 80
    assert re.search(r"^ [0-9a-f]{16} │ gloo4_slow_rank2 │ torch +│ +4 │ 0–3 +│", out, re.M), out


def test_the_ingest_panel_keeps_a_captures_report_kinds_apart(store, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    deep = tmp_path / "a" / "very" / "long" / "directory" / "name" / "that" / "goes" / "on"
    deep.mkdir(parents=True)
    files = sorted((FIXTURES / "nsys").glob("resnet18_bs8_*.csv"))
    for f in files:
        (deep / f.name).write_bytes(f.read_bytes())
    code, out, _ = run_cli("--store", str(store), "ingest", *sorted(str(deep / f.name) for f in files))
    assert code == 0
    lines = [line.strip("│ ") for line in out.splitlines() if ".csv" in line]
    assert len(lines) == len(files) and max(map(len, out.splitlines())) <= 80
    for f in files:  # each report's kind is readable on its line
        kind = f.name.removeprefix("resnet18_bs8_").removesuffix(".csv")
        assert sum(line.endswith(f"_{kind}.csv") for line in lines) == 1, (kind, lines)


def test_html_plots_need_only_plotly(store, tmp_path, monkeypatch):
    """``--out x.html`` of compare and roofline draw with plotly (the ``html`` extra) without matplotlib."""
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    sweep = [str(FIXTURES / "torch_sweep2" / f"alexnet_bs{b}.json.gz") for b in (4, 8, 16)]
    ids = []
    for path, batch in zip(sweep, (4, 8, 16)):
        code, out, err = run_cli("--store", str(store), "ingest", path, "--tag", f"batch={batch}", "--json")
        assert code == 0, err
        ids.append(__import__("json").loads(out)["traces"][0]["id"])
    page = tmp_path / "compare.html"
    code, _, err = run_cli("--store", str(store), "compare", *ids, "--by", "batch", "--out", str(page), "-q")
    assert code == 0, err
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and "plotly" in text and text.count("alexnet_bs") >= 3
    page = tmp_path / "roofline.html"
    code, _, err = run_cli("--store", str(store), "roofline", str(FIXTURES / "ncu" / "ncu_raw_vgg11_bs16.csv"),
                           "--out", str(page), "-q")
    assert code == 0, err
    text = page.read_text()
    assert "plotly" in text and "Roofline of" in text and "<td>sm90_xmma_wgrad" in text
    code, _, err = run_cli("--store", str(store), "compare", *ids, "--out", str(tmp_path / "p.png"))
    assert code == 2 and "matplotlib" in err


def test_rules_verbose_speaks_to_the_user(store, monkeypatch):
    """``rules -v`` renders the rules' definitions: no internal wording (the study the project began from, its
    fixtures and issues), no internal module or measure names, only what a user can see or look up."""
    monkeypatch.setenv("COLUMNS", "200")
    code, out, err = run_cli("rules", "-v")
    assert code == 0, err
    flat = " ".join(out.split())
    for pattern in (r"\bseed", r"\bfixtures?\b", r"\bissue \d", r"\btraceparse\.\w", r"\bmeasure [`\w]",
                    r":(data|func|mod|class):", r"\btests?/"):
        found = re.findall(rf".{{0,60}}{pattern}.{{0,40}}", flat, re.I)
        assert not found, (pattern, found)
    assert "graph_launch (cudaGraphLaunch, cuGraphLaunch, hipGraphLaunch)" in flat  # the API classes, in words
