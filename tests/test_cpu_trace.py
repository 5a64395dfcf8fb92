"""A CPU-only torch.profiler trace of PyTorch 2.13 (fixtures/make_cpu_trace.py): what the screen says of a trace
with no GPU, no runtime calls and no exclusive times of its source. The oracle reads the raw JSON."""

from __future__ import annotations

import gzip
import json
import re

from helpers import FIXTURES, run_cli

CPU_TRACE = FIXTURES / "torch" / "cpu" / "convnet_cpu_torch213.json.gz"


def test_hotspots_says_no_zero_row_counts(store):
    """"exclusive rows 0" and "inclusive only rows 0" said nothing of a torch trace (its source gives no exclusive
    times): zero counts are left off the screen, kept in JSON; the count of nested events whose self time was
    computed is the number of timed host events on threads."""
    with gzip.open(CPU_TRACE, "rt") as f:
        doc = json.load(f)
    timed = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation",
                                                                                     "python_function")]
    code, out, err = run_cli("ingest", str(CPU_TRACE))
    assert code == 0, err
    code, out, err = run_cli("--width", "120", "analyze", "--rule", "hotspots")
    assert code == 0, err
    assert "exclusive rows" not in out and "inclusive only rows" not in out
    code, out, err = run_cli("analyze", "--rule", "hotspots", "--json")
    [main] = [f for f in json.loads(out)["findings"] if f["title"] == "Hotspots: routines by exclusive time"]
    m = main["metrics"]
    assert m["exclusive_rows"] == 0 and m["inclusive_only_rows"] == 0
    assert m["self_time_rows"] == len([e for e in timed if e["cat"] != "user_annotation"])


def test_the_rows_ranked_by_duration_are_not_read_as_the_host_rows_without_exclusive_time(tmp_path):
    """A real nvprof summary (CUDA.jl's): 5 API rows have no exclusive time, and its 1 kernel is ranked by its
    duration too. The panel said "inclusive only rows 6" under "5 operator/region/API rows have no exclusive time":
    two counts of one thing, it read; the figure says what it counts now."""
    path = FIXTURES / "nvprof" / "real" / "cudajl_summary.log"
    code, out, err = run_cli("--store", str(tmp_path), "analyze", str(path), "--rule", "hotspots", "--width", "200")
    assert code == 0, err
    code, doc, err = run_cli("--store", str(tmp_path), "analyze", str(path), "--rule", "hotspots", "--json")
    [hotspots] = [f for f in json.loads(doc)["findings"] if f["title"].startswith("Hotspots: routines")]
    assert " 5 operator/region/API rows have no exclusive time in this source" in hotspots["message"]
    assert hotspots["metrics"]["inclusive_only_rows"] == 6
    assert re.search(r"rows ranked by their duration +6\b", out) and "inclusive only rows" not in out
