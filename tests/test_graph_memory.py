"""A run's critical path is one graph of every rank: where it would not fit in the memory free, it is not built.

The graph takes about :data:`GRAPH_BYTES_PER_ROW` bytes per event while it is built (measured: 650-750 on runs of
64 and 256 ranks); a run of 64 ranks of 300,000 events would need some 15 GB, and the system would kill the
process with every other finding. Here the memory free is made small (the function that reads it is replaced)
on a real two-rank NCCL run: analyze says why the rule has no path and gives the others, whatif refuses in one
line, the HTML page says why the chart is missing, the Chrome export names an empty track.
"""

from __future__ import annotations

import gzip
import html
import json

import pytest

from helpers import FIXTURES, run_cli
from traceparse.figures import fmt_bytes
from traceparse.measures import critical_path as graph_module

RUN = FIXTURES / "torch" / "multirank" / "nccl2_slow_rank1"
FREE = 1_000_000  # 1 MB free: the graph of the run (3,582 events, trimmed) needs some 2.9 MB


@pytest.fixture
def little_memory(monkeypatch):
    monkeypatch.setattr(graph_module, "available_memory", lambda: FREE)


def _events(store) -> int:
    code, out, err = run_cli("--store", str(store), "list", "--json")
    assert code == 0, err
    (run,) = json.loads(out)["runs"]
    return run["events"]


def _reason(rows: int) -> str:
    return (f"the critical path's graph of {rows:,} events would take about {fmt_bytes(rows * 800)} of memory, "
            f"more than the {fmt_bytes(FREE)} this machine has free")


def test_analyze_says_why_the_critical_path_is_missing_and_gives_the_rest(tmp_path, little_memory):
    store = tmp_path / "s"
    code, out, err = run_cli("--store", str(store), "analyze", str(RUN), "--json", "--all")
    assert code == 0, err
    findings = json.loads(out)["findings"]
    (path,) = [f for f in findings if f["rule"] == "critical-path"]
    assert path["title"] == "Critical path not computed"
    assert path["message"] == (f"Not computed: {_reason(_events(store))}. `analyze --step N` (or `--window "
                               "START:END`) follows the paths of some steps at a time.")
    assert {"gpu-idle", "stragglers", "kernel-share"} <= {f["rule"] for f in findings}


def test_python_is_told_how_to_cut_the_trace_in_python(tmp_path, little_memory):
    """In a notebook "`analyze --step N` (or `--window START:END`)" names flags there is nothing to pass to."""
    import traceparse

    trace = traceparse.load(str(RUN), store=tmp_path / "s")
    (path,) = traceparse.analyze(trace, rules=["critical-path"])
    assert path.message == (f"Not computed: {_reason(trace.events.height)}. Analysing traceparse.window.cut(trace, "
                            "traceparse.window.step_windows(trace, N), 'step N') follows the paths of some steps at "
                            "a time.")


def test_whatif_refuses_in_one_line(tmp_path, little_memory):
    store = tmp_path / "s"
    code, _, err = run_cli("--store", str(store), "ingest", str(RUN))
    assert code == 0, err
    code, out, err = run_cli("--store", str(store), "whatif", RUN.name, "--balance")
    assert code == 2 and "Traceback" not in err
    assert err == f"traceparse: error: {_reason(_events(store))}\n"


def test_the_page_and_the_export_say_the_path_was_not_computed(tmp_path, little_memory):
    pytest.importorskip("plotly")
    store, page, chrome = tmp_path / "s", tmp_path / "r.html", tmp_path / "t.json.gz"
    code, _, err = run_cli("--store", str(store), "report", str(RUN), "--html", str(page))
    assert code == 0, err
    reason = _reason(_events(store))
    assert f"Critical path of each step: not computed, {reason}." in html.unescape(page.read_text())
    code, _, err = run_cli("--store", str(store), "export", RUN.name, "--to", "chrome", "--out", str(chrome))
    assert code == 0, err
    with gzip.open(chrome, "rt") as f:
        names = [e["args"]["name"] for e in json.load(f)["traceEvents"]
                 if e.get("ph") == "M" and e.get("name") == "process_name"]
    assert f"critical path: not computed, {reason}" in names


def test_the_memory_free_is_read():
    from traceparse.cores import available_memory

    free = available_memory()
    assert free is None or free > 0
