"""Long per-rank tables folded to a rows budget keep the telling rows (sweep of 64 and 256 ranks).

A synthetic run of 16 ranks (benchmarks/make_ranks.py, rank 11 slow) and a budget of 4 rows: the folded tables of
``analyze``, ``whatif`` and ``report --html`` name rank 11, the one a user must see, and their fold row says how many
rows it stands for; ``--all`` (the page's "all N rows") and JSON keep every row.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from helpers import REPO, run_cli
from traceparse.report import fmt_ns
from traceparse.run import ingest_run
from traceparse.store import Store
from traceparse.verdict import Column

SAMPLE = REPO.parent / "shared" / "samples" / "multirank" / "gloo4_resnet18_bs16" / "rank0.json.gz"
RANKS, SLOW, ROWS = 16, 11, 4


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(store folder, run id) of 16 ranks made from a real rank, rank 11 slow before each collective."""
    if not SAMPLE.is_file():
        pytest.skip("shared multirank samples not present")
    folder = tmp_path_factory.mktemp("ranks") / "r16"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "make_ranks.py"), str(SAMPLE), str(folder),
                    "--ranks", str(RANKS), "--slow-rank", str(SLOW)], check=True, capture_output=True)
    store = tmp_path_factory.mktemp("store")
    return str(store), ingest_run([folder], store=Store(store)).run["id"]


def table_lines(out: str, title: str) -> list[str]:
    """The body rows of the table titled ``title`` (the lines after its header rule up to the next blank-edged
    line that is not a row)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if title in line)
    rule = next(i for i in range(start, len(lines)) if "━" in lines[i])
    body = []
    for line in lines[rule + 1:]:
        if "│" not in line.strip("│ ").strip() and not re.search(r"\S\s+│\s", line):
            break
        body.append(line)
    return body


def test_fold_rows_keeps_the_worst_by_the_declared_column():
    from traceparse.report import fold_rows

    rows = [{"k": str(i), "v": v} for i, v in enumerate([5, 1, 9, 3, 7, 2])]
    columns = [Column("v", "v", "number")]
    assert fold_rows(rows, "k", columns, 2, "v") == [rows[2], rows[4], {"k": "(4 more, max)", "v": 5}]
    assert fold_rows(rows, "k", columns, 2, "-v") == [rows[1], rows[5], {"k": "(4 more, max)", "v": 9}]
    assert fold_rows(rows, "k", columns, 2) == [rows[0], rows[1], {"k": "(4 more, max)", "v": 9}]
    assert fold_rows(rows, "k", columns, 5, "v") == rows  # one row more than the budget: no fold


def test_folded_gpu_idle_devices_name_the_slow_rank(run):
    store, run_id = run
    code, out, err = run_cli("--store", store, "analyze", run_id, "--rule", "gpu-idle", "--json")
    assert code == 0, err
    (idle,) = json.loads(out)["findings"]
    devices = idle["metrics"]["devices"]
    assert len(devices) == RANKS  # JSON keeps every row, in rank order
    slowest = max(devices, key=lambda k: devices[k]["idle_ns"])
    assert slowest == f"rank {SLOW}:0"
    for width in ("120", "80"):
        code, out, err = run_cli("--store", store, "--width", width, "analyze", run_id, "--rule", "gpu-idle",
                                 "--rows", str(ROWS))
        assert code == 0, err
        assert f"devices ({ROWS} of {RANKS}, most idle first)" in out
        body = table_lines(out, "devices (")
        assert len(body) == ROWS + 1
        first = [c.strip() for c in body[0].strip("│ ").split("│")]
        assert first[0] == slowest and first[3] == fmt_ns(devices[slowest]["idle_ns"]).removesuffix(" ms")
        assert body[-1].strip("│ ").startswith(f"({RANKS - ROWS} more, max)")


def test_whatif_folds_its_step_table_to_the_ranks_of_largest_gain(run):
    store, run_id = run
    code, out, err = run_cli("--store", store, "whatif", run_id, "--balance", "--json")
    assert code == 0, err
    doc = json.loads(out)
    steps = len(doc["steps"]) // RANKS
    assert len(doc["steps"]) == steps * RANKS and len(doc["ranks"]) == RANKS  # JSON keeps every row
    code, out, err = run_cli("--store", store, "--width", "120", "whatif", run_id, "--balance", "--rows", str(ROWS))
    assert code == 0, err
    assert f"{ROWS} of {RANKS} ranks shown, largest gain first (--rows N, --all)" in out
    body = table_lines(out, "step time per rank")
    assert len(body) == ROWS * steps + 1 + ROWS + 1
    cells = [[c.strip() for c in line.strip().split("│")] for line in body]
    assert [c[1] for c in cells[:steps]] == [str(SLOW)] * steps  # the slow rank's steps first
    assert cells[ROWS * steps][0] == f"({(RANKS - ROWS) * steps} more, max)"
    assert cells[ROWS * steps + 1][:2] == ["mean", str(SLOW)]
    assert cells[-1][0] == f"({RANKS - ROWS} more, max)"
    code, out, err = run_cli("--store", store, "--width", "120", "whatif", run_id, "--balance", "--all")
    assert code == 0, err
    assert len(table_lines(out, "step time per rank")) == steps * RANKS + RANKS and "more, max" not in out


def test_the_html_report_folds_long_tables_and_the_source_list(run, tmp_path):
    pytest.importorskip("plotly")
    store, run_id = run
    page = tmp_path / "r16.html"
    code, out, err = run_cli("--store", store, "report", run_id, "--html", str(page), "--rule", "gpu-idle",
                             "--rows", str(ROWS))
    assert code == 0, err
    text = page.read_text()
    caption = f"<caption>devices ({ROWS} of {RANKS}, most idle first)</caption>"
    assert caption in text
    table = text[text.index(caption):text.index("</table>", text.index(caption))]
    assert table.count("<tr>") == 1 + ROWS + 1 and f"rank {SLOW}:0" in table.split("<tbody>")[1].split("</tr>")[0]
    assert f"({RANKS - ROWS} more, max)" in table
    assert f"<summary>all {RANKS} rows</summary>" in text  # the page's --all: every row, a click away
    assert f"<summary>and {RANKS - ROWS} more</summary>" in text  # the source files
    page_all = tmp_path / "all.html"
    code, out, err = run_cli("--store", store, "report", run_id, "--html", str(page_all), "--rule", "gpu-idle",
                             "--all")
    assert code == 0, err
    assert "more, max" not in page_all.read_text() and "all-rows\"><summary>" not in page_all.read_text()


def test_ties_as_shown_keep_their_order():
    """Values alike to four significant figures are ties: 131.7 ms idle but for nanoseconds of clock skew keep the
    ranks' order, not one the nanoseconds pick."""
    from traceparse.report import fold_rows

    rows = [{"k": str(i), "v": v} for i, v in enumerate([131_734_363, 131_734_990, 611_700_000, 131_734_400])]
    assert fold_rows(rows, "k", [Column("v", "v", "ns")], 2, "v")[:2] == [rows[2], rows[0]]


def test_rank_balance_of_even_work_folds_to_the_most_idle_in_rank_order(run):
    """Every rank does the same GPU work (the slow rank is slow on the host): rank-balance names no slowest rank,
    and its folded table keeps rank 11, the most idle, then the others in rank order."""
    store, run_id = run
    code, out, err = run_cli("--store", store, "--width", "120", "analyze", run_id, "--rule", "rank-balance",
                             "--rows", str(ROWS))
    assert code == 0, err
    assert f"{ROWS} of {RANKS}, most idle first" in out
    body = table_lines(out, "most idle first")
    ranks = [row.strip("│ ").split("│")[0].strip() for row in body]
    assert ranks == [str(SLOW), "0", "1", "2", f"({RANKS - ROWS:,} more, max)"]


def test_the_pages_all_rows_fold_keeps_the_worst_of_thousands():
    """A run of 256 ranks' streams table (3,328 rows) took 650 KB of the page under its "all rows" fold: past 256
    rows the fold keeps the worst 256 and one row for the rest, and says so."""
    from traceparse_plugins.commands.report.page import FOLD_ROWS_KEPT, folded_table_html

    columns = [Column("stream", "stream", "text"), Column("idle_ns", "idle", "ns")]
    rows = [{"stream": f"rank {i}:0:7", "idle_ns": (i * 7919) % 1000 * 1_000} for i in range(3328)]
    page = folded_table_html(columns, rows, "streams", 8, "idle_ns")
    fold = page[page.index('<details class="all-rows">'):]
    assert f"<summary>{FOLD_ROWS_KEPT} of 3,328 rows, the worst (report --all keeps every row)</summary>" in fold
    kept = re.findall(r">(rank \d+:0:7)</td>", fold)
    worst = sorted(rows, key=lambda r: -r["idle_ns"])[:FOLD_ROWS_KEPT]
    assert sorted(kept) == sorted(r["stream"] for r in worst)  # the 256 most idle, none else
    assert "(3,072 more, max)" in fold
    short = folded_table_html(columns, rows[:200], "streams", 8, "idle_ns")
    assert "<summary>all 200 rows</summary>" in short
