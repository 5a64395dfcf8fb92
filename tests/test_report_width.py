"""Every rule's finding on a representative set of fixtures, rendered at 80 columns: no table loses its name
column or its names, no number is cut with an ellipsis, the headline figures are there (issue 11, items 3-4)."""

from __future__ import annotations

import re

import pytest
from rich.console import Console

from helpers import FIXTURES, run_cli
from traceparse.names import key_entry
from traceparse.report import (MEMBER_KEYS, TABLE_ROWS, _cell, _format_column, figure_label, fmt_unit, render_findings,
                               shown_figures, unsaid_figures)

CASES = ["torch/resnet18_bs16.json.gz", "nsys/resnet18_bs8.sqlite.gz", "ncu/ncu_raw_vgg11_bs16.csv",
         "tau/real/cpi-mpi", "nvprof/real/rlscope_gpu_trace.csv", "torch/multirank/gloo4_slow_rank2"]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """{fixture: (findings, text at 80 columns)}, the findings analysed through the CLI's store."""
    from traceparse.analysis import analyze
    from traceparse.session import Session

    store = tmp_path_factory.mktemp("store")
    out = {}
    for case in CASES:
        session = Session(store)
        traces = session.resolve_all([str(FIXTURES / case)], fmt="auto")
        findings = [f for t in traces for f in analyze(t, reg=session.registry)]
        console = Console(width=80, record=True, file=open("/dev/null", "w"))
        render_findings(console, findings, {t.id: t.meta for t in traces})
        out[case] = (findings, console.export_text())
    return out


def _rows(text: str) -> list[str]:
    return [line.strip("│ ") for line in text.splitlines()]


@pytest.mark.parametrize("case", CASES)
def test_every_line_fits_80_columns(rendered, case):
    _, text = rendered[case]
    assert max(len(line) for line in text.splitlines()) <= 80


@pytest.mark.parametrize("case", CASES)
def test_every_table_keeps_its_name_column_and_names(rendered, case):
    findings, text = rendered[case]
    for f in findings:
        items = f.items
        if f.columns and f.columns[0].key in MEMBER_KEYS and len(items) > TABLE_ROWS + 1:  # one row per rank
            assert f"({len(items) - TABLE_ROWS} more, max)" in text, f.rule
            items = items[:TABLE_ROWS]
        tables = [(f.columns, items)] if items and f.columns else []
        for key, cols in f.tables.items():
            data = f.metrics.get(key)
            if isinstance(data, dict) and data and cols:
                keys = list(data)
                if len(keys) > TABLE_ROWS + 1:  # the worst rows, then one row for the rest
                    assert f"({len(keys) - TABLE_ROWS} more, max)" in text, (f.rule, key)
                    keys = keys[:TABLE_ROWS]
                tables.append(([cols[0]] + list(cols[1:]), [{cols[0].key: str(k)} for k in keys]))
        for cols, items in tables:
            name = next((c for c in cols if c.unit == "name"), None) or next(
                (c for c in cols if c.unit == "text"), cols[0])
            assert re.search(rf"(^|[│┃ ]){re.escape(name.label)}( |$)", text, re.M), (f.rule, name.label)
            values = [item.get(name.key) for item in items]
            for value, shown in zip(values, _format_column(name, values)[1]):
                if shown in text:
                    continue
                # shortened for its cell, with a key number; the key below gives the name, from its head
                head = key_entry(str(value), 60)[:10]
                assert re.search(rf"\[\d+\]\s+{re.escape(head)}", text), (f.rule, shown)


NUMERIC = ("ns", "pct", "bytes", "bytes_binary", "count", "gbps", "flops", "ratio")


@pytest.mark.parametrize("case", CASES)
def test_no_number_is_cut(rendered, case):
    _, text = rendered[case]
    cells = [c.strip() for line in text.splitlines() for c in re.split(r"[│┃]", line)]
    assert not [c for c in cells if re.fullmatch(r"[-\d.,]+ ?\S*…", c)]


@pytest.mark.parametrize("case", CASES)
def test_headline_figures_and_no_python_reprs(rendered, case):
    """Every headline figure is on screen: in the panel's figures, or in its sentence (the text read across its
    wrapped lines), where the panel does not show it a second time."""
    findings, text = rendered[case]
    flat = " ".join(re.sub(r"[│╭╮╰╯─]", " ", text).split())
    for f in findings:
        shown = dict(shown_figures(f))
        grid = dict(unsaid_figures(f))
        for key, unit in f.figures.items():
            label = f.labels.get(key) or figure_label(key, unit)
            if unit == "problem_count" and f.metrics.get(key) == 0 or key not in f.metrics:
                assert label not in shown, (f.rule, key)  # nothing left out: a zero says nothing; nor "-" of none
                continue
            value = fmt_unit(unit, f.metrics.get(key))
            assert label in shown, (f.rule, key)
            if unit == "pct" and shown[label] != value:  # a share as its table shows it (they add up to 100)
                assert abs(float(shown[label].rstrip("%")) - f.metrics[key]) <= 0.1, (f.rule, key)
                value = shown[label]
            if label in grid:
                assert label in text and (unit in ("text", "name") or value in text), (f.rule, key)
            else:  # said in the sentence
                assert value in f.message and value in flat, (f.rule, key)
    cells = [c.strip() for line in text.splitlines() for c in re.split(r"[│┃]", line)]
    assert not {"True", "False", "None"} & set(cells)


@pytest.mark.parametrize("case", CASES)
def test_one_unit_per_column(rendered, case):
    _, text = rendered[case]
    for line in text.splitlines():
        if "┃" in line:
            assert not re.search(r"\d (ms|us|ns)\b", line)
    # a duration column names its unit in its header and no cell repeats a unit
    rows = [line for line in text.splitlines() if line.count("│") >= 3]
    assert not [r for r in rows if re.search(r"\d\.\d{3} (ms|us) *│", r)]


def test_the_cli_piped_uses_80_columns(tmp_path, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    code, out, _ = run_cli("--store", str(tmp_path), "analyze", str(FIXTURES / "torch/resnet18_bs16.json.gz"))
    assert code == 0
    assert max(len(line) for line in out.splitlines()) <= 80
    assert " name " in out and "aten::convolution_backward" in out


@pytest.mark.parametrize("args, width", [(["--width", "120"], 120), (["--wide"], 240), ([], 80)])
def test_width_and_wide_set_the_layout_width(tmp_path, monkeypatch, args, width):
    """``--width N`` and ``--wide`` (before or after the command's name) lay the report out for that many
    columns: no line is longer, and the panels use it (a panel's border spans the whole width)."""
    monkeypatch.delenv("COLUMNS", raising=False)
    trace = str(FIXTURES / "torch/resnet18_bs16.json.gz")
    for argv in (["--store", str(tmp_path), *args, "analyze", trace], ["--store", str(tmp_path), "analyze", trace, *args]):
        code, out, err = run_cli(*argv)
        assert code == 0, err
        lengths = [len(line) for line in out.splitlines()]
        assert max(lengths) == width
        assert any(line.startswith("╭─ summary") and len(line) == width for line in out.splitlines())


@pytest.mark.parametrize("value", ["39", "0", "wide", "-5", "10001", "99999999999999999999"])
def test_width_below_40_or_not_a_number_is_refused(tmp_path, value, capsys):
    from traceparse.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--store", str(tmp_path), "analyze", f"--width={value}"])
    assert exit_.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == ("traceparse analyze: error: argument --width: expected a whole number of columns from 40 to "
                    f"10,000, got '{value}'")


def test_a_figure_the_sentence_gives_is_not_shown_again():
    """By hand: the sentence gives 745 gaps and 23.59 ms; 7,450 and 1,745 are other numbers, 0.0% is two figures'
    value (which one the sentence means cannot be told), and a figure that is no number is always shown."""
    from traceparse.rule import Finding

    message = "The GPU ran nothing for 23.59 ms: 1,745 rows, 7,450 calls, in 745 gaps; other 0.0%, host -."
    metrics = {"idle_ns": 23_590_000, "gaps": 745, "rows": 745_0, "calls": 1745, "other_pct": 0.0,
               "kernel_pct": 0.0, "busy_ns": 9_541_000, "rank": "-"}
    figures = {"idle_ns": "ns", "gaps": "count", "rows": "count", "calls": "count", "other_pct": "pct",
               "kernel_pct": "pct", "busy_ns": "ns", "rank": "text"}
    finding = Finding(rule="r", severity="info", title="t", message=message, metrics=metrics, figures=figures)
    assert dict(shown_figures(finding)) == {"idle": "23.59 ms", "gaps": "745", "rows": "7,450", "calls": "1,745",
                                            "other": "0.0%", "kernel": "0.0%", "busy": "9.541 ms", "rank": "-"}
    assert unsaid_figures(finding) == [("other", "0.0%"), ("kernel", "0.0%"), ("busy", "9.541 ms"), ("rank", "-")]


def test_the_tally_of_findings_reads_as_a_sentence():
    """By hand: findings with something to say are counted by severity; the quiet ones (``silent``, all info) are
    rules with nothing to report; with none to count the line says "no findings", not "0 findings: none"."""
    from traceparse.report import _severity_counts, _tally
    from traceparse.rule import Finding

    def finding(severity):
        return Finding(rule="r", severity=severity, title="t", message="m")

    def plain(markup):
        return re.sub(r"\[/?[a-z ]+\]", "", markup)

    two = [finding("critical"), finding("warning"), finding("info")]
    assert plain(_tally(two, silent=1)) == "2 findings: 1 critical, 1 warning; 1 rule with nothing to report"
    assert plain(_tally(two[:1])) == "1 finding: 1 critical"
    assert plain(_tally([finding("info")], silent=1)) == "no findings; 1 rule with nothing to report"
    assert plain(_tally([finding("info")] * 3, silent=3)) == "no findings; 3 rules with nothing to report"
    assert _tally([]) == "no findings"
    assert plain(_severity_counts([finding("info")], silent=1)) == "none; 1 rule with nothing to report"
    assert plain(_severity_counts(two + [finding("warning")])) == "1 critical, 2 warnings, 1 info"


@pytest.mark.parametrize("case", CASES)
def test_an_items_table_after_tables_of_metrics_has_its_title(rendered, case):
    """Where a finding draws tables of its metrics, its items' table comes after them under a title of its own,
    so that its rows are not read as more rows of the table above; the title is the line above its header."""
    findings, text = rendered[case]
    lines = _rows(text)
    checked = 0
    for f in findings:
        drawn = [k for k in f.tables if isinstance(f.metrics.get(k), dict) and f.metrics[k]]
        if not (f.items and drawn):
            continue
        assert f.items_title, f"{f.rule}: items after the tables {drawn} have no title"
        columns = [c.label for c in f.columns if c.key in f.items[0]]
        at = [i for i, line in enumerate(lines) if line.rstrip() == f.items_title]
        assert at, f"{f.rule}: no line {f.items_title!r}"
        header = " ".join(lines[at[0] + 1:at[0] + 3])  # a header may take two lines
        assert columns[-1].split()[0] in header, (f.rule, header)
        checked += 1
    if case.startswith("torch/resnet18"):
        assert checked >= 3  # gpu-idle, kernel-share, api-share at least


def test_the_items_title_in_json_and_html():
    """``items_title`` is in the JSON form of a finding and the caption of its items' table in the HTML page."""
    from traceparse.rule import Column, Finding
    from traceparse_plugins.commands.report.page import finding_html

    f = Finding(rule="r", severity="info", title="t", message="m", items=[{"name": "<b>k</b>", "n": 3}],
                columns=[Column("name", "name", "name"), Column("n", "n", "count")], items_title="top <kernels>")
    assert f.to_dict()["items_title"] == "top <kernels>"
    html = finding_html(f, 0)
    assert "<caption>top &lt;kernels&gt;</caption>" in html and "&lt;b&gt;k&lt;/b&gt;" in html
    f.items_title = ""
    assert "<caption>" not in finding_html(f, 0) and f.to_dict()["items_title"] == ""


@pytest.mark.parametrize("width", [60, 80, 120])
def test_a_double_width_name_is_cut_to_its_cells(tmp_path, width):
    """A kernel renamed in CJK (a hand-made mutant of a real trace): its 46 characters take 92 cells. Cut by its
    characters, the row lost its ellipsis and its key number (at 120 columns the name was silently cut and never
    shown whole). Cut by cells, the row ends with its key number and the key gives the whole name."""
    import gzip
    import json

    from rich.cells import cell_len

    doc = json.load(gzip.open(FIXTURES / "torch" / "alexnet_bs4.json.gz"))
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    top = max({e["name"] for e in kernels}, key=lambda n: sum(e.get("dur", 0) for e in kernels if e["name"] == n))
    wide = "最適化カーネル_多重テンソル適用_二項演算リスト_加算_浮動小数点_全角文字の長い名前"
    for e in kernels:
        if e["name"] == top:
            e["name"] = wide
    path = tmp_path / "cjk.json"
    path.write_text(json.dumps(doc, ensure_ascii=False))
    code, out, err = run_cli("--store", str(tmp_path / "s"), "--width", str(width), "analyze", str(path),
                             "--rule", "kernel-share")
    assert code == 0, err
    lines = out.splitlines()
    (row,) = [line for line in lines if line.startswith("│  最適")]
    number = re.search(r"… *.* \[(\d+)\] *│", row)
    assert number, row
    key = [line for line in lines if line.startswith(f"│ [{number.group(1)}]")]
    assert key and "".join(lines[lines.index(key[0]):lines.index(key[0]) + 3]).replace("│", "").replace(
        " ", "").find(wide) >= 0
    assert {cell_len(line) for line in lines if line.startswith(("│", "╭", "╰"))} == {width}


def test_a_time_column_of_zeros_takes_its_neighbours_unit():
    # gpu-idle's streams table: "other" was 0 on every stream and read "other (ns)" beside "kernel wait (us)"
    from traceparse.report import _fitted_table
    from traceparse.verdict import Column

    columns = [Column("stream", "stream", "text"), Column("wait_ns", "wait", "ns"), Column("other_ns", "other", "ns"),
               Column("span_ns", "span", "ns"), Column("bytes", "bytes", "bytes")]
    rows = [{"stream": "0:7", "wait_ns": 183_300, "other_ns": 0, "span_ns": 13_220_000, "bytes": 0},
            {"stream": "0:45", "wait_ns": 0, "other_ns": 0, "span_ns": 9_640_000, "bytes": 0}]
    table = _fitted_table(columns, rows, 76)[0]
    headers = [str(c.header) for c in table.columns]
    assert headers == ["stream", "wait (us)", "other (us)", "span (ms)", "bytes (B)"]
    assert [str(cell) for cell in table.columns[2].cells] == ["0.0", "0.0"]


def test_a_time_column_keeps_a_figure_for_its_small_values():
    """TAU's hotspots over 8 MPI ranks: a time column of 2,654 s took no decimals from its largest value, so
    `main` of 0.59 s read "1" and `save_factor` of 3.993 s "4". The column takes up to two decimals more where its
    smallest value shown as a number would be more than 5% off; a value too small even then reads "<0.01"."""
    from traceparse.verdict import Column

    column = Column("time_ns", "time", "ns")
    values = [2_653_810_000_000, 590_000_000, 530_000_000, 3_993_000_000, 1_000_000]
    header, cells = _format_column(column, values)
    assert header == "time (s)"
    assert cells == ["2,653.81", "0.59", "0.53", "3.99", "<0.01"]
    for shown, value in zip(cells[1:4], values[1:4]):
        assert abs(float(shown) - value / 1e9) <= 0.05 * value / 1e9
    # a column whose values all keep their figures in the largest's decimals is as before
    assert _format_column(column, [9_553_000, 1_136_000, 350_000])[1] == ["9.553", "1.136", "0.350"]
