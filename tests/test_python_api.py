"""The Python API as a notebook uses it (traceparse.load, add, analyze, sql): the README's example charts the
trace it loaded, a folder of ranks loads as a run, a rank loads by the trace id the traces view lists, what a
reader read past is a Python warning, and a wrong argument is a one-line TypeError, not a crash deep inside."""

from __future__ import annotations

import gzip
import json
import warnings

import polars as pl
import pytest

import traceparse
from helpers import FIXTURES, REPO
from traceparse.store import Store

TRACE = FIXTURES / "torch" / "resnet18_bs16.json.gz"
RUN = FIXTURES / "torch" / "multirank" / "gloo4_slow_rank2"


def raw_kernels(path) -> int:
    """The number of kernel events in the raw JSON."""
    return sum(1 for e in json.load(gzip.open(path))["traceEvents"] if e.get("cat") == "kernel" and e.get("ph") == "X")


def test_the_readme_example_queries_the_trace_it_ingested(tmp_path, monkeypatch):
    """In a fresh folder with no store, the README's SQL sees the one trace it ingested: every kernel of it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRACEPARSE_STORE", raising=False)
    trace_id = traceparse.add(str(TRACE))
    assert trace_id == traceparse.load(str(TRACE)).meta.id  # the content's id, as the CLI stores it
    df = traceparse.sql("SELECT COUNT(*) AS n, COUNT(DISTINCT trace_id) AS traces FROM kernels", traces=trace_id)
    assert df.row(0) == (raw_kernels(TRACE), 1)
    assert traceparse.add(str(TRACE)) == trace_id  # stored once: the same id again
    frame = traceparse.pandas_frame(traceparse.sql(
        "SELECT category, SUM(duration_ns) AS kernel_ns FROM kernels GROUP BY category ORDER BY kernel_ns DESC",
        traces=[trace_id]))
    assert str(frame["kernel_ns"].dtype) == "Int64"
    assert int(frame["kernel_ns"].sum()) == traceparse.load(trace_id).events.filter(
        pl.col("kind") == "kernel")["duration_ns"].sum()


def test_a_folder_of_ranks_loads_as_a_run_and_a_rank_by_its_trace_id(tmp_path):
    store = tmp_path / "store"
    run = traceparse.load(str(RUN), store=store)
    assert run.meta.format == "run" and run.events["rank"].unique().sort().to_list() == [0, 1, 2, 3]
    ranks = Store(store).run_meta(run.meta.id)["ranks"]
    rank2 = traceparse.load(ranks["2"][:8], store=store)
    assert rank2.meta.id == ranks["2"] and rank2.events["rank"].unique().to_list() == [2]
    assert rank2.events.height == run.events.filter(pl.col("rank") == 2).height


def test_a_file_cut_short_is_a_python_warning(tmp_path):
    data = gzip.open(TRACE).read()
    cut = tmp_path / "cut.json"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.warns(traceparse.TraceparseWarning, match=r"cut\.json: the file ends early \(truncated JSON\); "
                                                          r"kept the \d+ complete events"):
        trace = traceparse.load(str(cut))
    assert trace.meta.warnings and trace.events.height > 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a whole file warns of nothing
        traceparse.load(str(TRACE))


def test_wrong_arguments_are_one_line_type_errors():
    with pytest.raises(TypeError, match=r"^traceparse.analyze takes a Trace \(traceparse.load\(...\) gives one\), "
                                        r"not str 'x.json'$"):
        traceparse.analyze("x.json")
    with pytest.raises(TypeError, match=r"^traceparse.load takes a path or store id, or a list of paths, not 3$"):
        traceparse.load(3)
    trace = traceparse.load(str(TRACE))
    (share,) = traceparse.analyze(trace, rules="kernel-share")  # one rule by its name alone, not its letters
    assert share.rule == "kernel-share"


def test_a_list_of_paths_is_one_capture():
    """nsys's CSV reports of one capture, given together, are one trace (they were a raw pathlib TypeError)."""
    folder = REPO.parent / "shared" / "samples" / "nsys"
    paths = sorted(str(p) for p in folder.glob("resnet18_bs16_cuda_*trace.csv"))
    if len(paths) < 2:
        pytest.skip("the shared nsys samples are not here")
    with pytest.warns(traceparse.TraceparseWarning, match="nsys rounded 'Bytes \\(MB\\)' to 1000 bytes"):
        trace = traceparse.load(paths)
    assert set(trace.events["kind"].unique().to_list()) >= {"kernel", "api"}
