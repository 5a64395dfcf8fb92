"""The generic Chrome reader's ``B``/``E`` pairs and thread ids, on hand-written traces modelled on speedscope's
trace-event test files (jlfwong/speedscope, MIT: ``sample/profiles/trace-event/``), which the reader refused or
read wrongly: ``E`` events listed before their ``B``, names that close out of nesting order, thread ids written
as text (Hermes), a trace of ``B`` events only.
"""

from __future__ import annotations

import json

import polars as pl
import pytest

from helpers import run_cli
from traceparse.errors import InputError
from traceparse.ingest import read_paths


def regions(tmp_path, events: list[dict]) -> tuple[list[tuple], list[str]]:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(events))
    trace = read_paths([path], fmt="chrome")[0]
    rows = trace.events.filter(pl.col("kind") == "region").sort("start_ns", "name")
    return rows.select("name", "start_ns", "duration_ns", "tid").rows(), list(trace.meta.warnings)


def test_ends_listed_before_their_begins_are_paired_in_time_order(tmp_path):
    """speedscope's out-of-order-unbalanced-name.json: both E events come first in the file, and alpha closes
    before beta although beta opened inside it. Each E closes the open B of its name."""
    events = [{"pid": 0, "tid": 0, "ph": "E", "name": "alpha", "ts": 9},
              {"pid": 0, "tid": 0, "ph": "E", "name": "beta", "ts": 10},
              {"pid": 0, "tid": 0, "ph": "B", "name": "alpha", "ts": 0},
              {"pid": 0, "tid": 0, "ph": "B", "name": "beta", "ts": 1}]
    rows, warnings = regions(tmp_path, events)
    assert rows == [("alpha", 0, 9000, 0), ("beta", 1000, 9000, 0)]
    assert warnings == []


def test_an_end_without_a_name_closes_the_innermost(tmp_path):
    events = [{"pid": 1, "tid": 2, "ph": "B", "name": "outer", "ts": 0},
              {"pid": 1, "tid": 2, "ph": "B", "name": "inner", "ts": 1},
              {"pid": 1, "tid": 2, "ph": "E", "ts": 2},
              {"pid": 1, "tid": 2, "ph": "E", "ts": 5}]
    rows, _ = regions(tmp_path, events)
    assert rows == [("outer", 0, 5000, 2), ("inner", 1000, 1000, 2)]


def test_thread_ids_written_as_digits_are_ids(tmp_path):
    """speedscope's multi-thread-with-samples.json (Hermes): ``"tid": "1"`` and ``"tid": "2"`` were no ids, and
    the two threads one. A label stays no id."""
    events = [{"pid": 7, "tid": "1", "ph": "X", "name": "a", "ts": 0, "dur": 1},
              {"pid": 7, "tid": "2", "ph": "X", "name": "b", "ts": 0, "dur": 1},
              {"pid": 7, "tid": "main", "ph": "X", "name": "c", "ts": 0, "dur": 1}]
    rows, _ = regions(tmp_path, events)
    assert rows == [("a", 0, 1000, 1), ("b", 0, 1000, 2), ("c", 0, 1000, None)]


def test_a_trace_of_begins_only_is_refused_saying_why(tmp_path):
    """speedscope's only-begin-events.json: nothing closes, nothing to store, and the one line says why."""
    path = tmp_path / "t.json"
    path.write_text(json.dumps([{"pid": 0, "tid": 0, "ph": "B", "name": "a", "ts": 1},
                                {"pid": 0, "tid": 0, "ph": "B", "name": "b", "ts": 2}]))
    code, out, err = run_cli("--store", str(tmp_path / "s"), "ingest", str(path))
    assert (code, err) == (2, f"traceparse: error: {path}: the trace has no events (nothing to store); the reader: "
                              "2 B events have no matching E; left out\n")
    with pytest.raises(InputError):
        read_paths([path], fmt="chrome")[0].events


def test_the_critical_path_of_a_trace_without_gpu_says_only_what_is_missing(tmp_path):
    """A generic Chrome trace of host slices and no GPU (the handwritten object-form trace): the critical path
    says the trace has no timed GPU work; not that GPU work is linked by external ids, nor that it has "no
    operators (only annotations and collective calls)" while its slices are the host's work."""
    from helpers import FIXTURES

    path = FIXTURES / "chrome" / "handwritten" / "object_form.json"
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(path), "--rule", "critical-path", "--json")
    assert code == 0, err
    message = json.loads(out)["findings"][0]["message"]
    assert "The trace has no timed GPU work." in message
    assert "GPU work is linked" not in message and "no operators" not in message


def test_span_counts_instants_at_both_ends(tmp_path):
    """Hand-written after catapult's fuchsia trace (counter samples 5.8 s after the last slice): the span ran from
    the first counter sample to the last slice's end, counting instants at the start but not at the end."""
    events = [{"pid": 1, "tid": 1, "ph": "C", "name": "gpu freq", "ts": 0, "args": {"mhz": 900}},
              {"pid": 1, "tid": 1, "ph": "X", "name": "draw", "ts": 10, "dur": 10},
              {"pid": 1, "tid": 1, "ph": "i", "name": "vsync", "ts": 100, "s": "t"},
              {"pid": 1, "tid": 1, "ph": "C", "name": "gpu freq", "ts": 200, "args": {"mhz": 1000}}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(events))
    store = str(tmp_path / "store")
    code, out, _ = run_cli("--store", store, "ingest", "--json", str(path))
    assert code == 0, out
    code, out, _ = run_cli("--store", store, "analyze", "--json", str(path))
    assert code == 0 and json.loads(out)["summary"][0]["span_ns"] == 200_000
    code, out, _ = run_cli("--store", store, "show", "--json", str(path))
    assert code == 0 and '"span_ns": 200000' in out


def test_nestable_async_events_are_spans_of_their_id(tmp_path):
    """Hand-written after catapult's nestable_async.json test data (BSD): b/e pairs of one id nest, an end closes
    the begin of its name, an unmatched begin or end is counted. A trace of async events only (a serving system's
    request latencies) was refused as having no events."""
    def ev(ph, ts, name, ident="0x313", cat="bar"):
        return {"cat": cat, "pid": 1, "tid": 2, "ts": ts, "ph": ph, "name": name, "id": ident}

    events = [ev("b", 10, "REQUEST"), ev("b", 20, "DELEGATE"), ev("e", 30, "DELEGATE"), ev("n", 35, "INSTANT"),
              ev("b", 80, "UNMATCHED_BEGIN"), ev("e", 100, "REQUEST"),
              ev("b", 110, "OTHER", ident=7, cat="foo"), ev("e", 130, "UNMATCHED_END", ident=7, cat="foo"),
              ev("e", 200, "OTHER", ident=7, cat="foo")]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    trace = read_paths([path], fmt="chrome")[0]
    rows = trace.events.sort("start_ns", "name").select("kind", "name", "start_ns", "duration_ns", "group").rows()
    assert rows == [("region", "REQUEST", 10_000, 90_000, "async"), ("region", "DELEGATE", 20_000, 10_000, "async"),
                    ("marker", "INSTANT", 35_000, 0, "async"), ("region", "OTHER", 110_000, 90_000, "async")]
    assert trace.meta.warnings == [
        f"{path}: 1 asynchronous begin (b, S) without a matching end, left out",
        f"{path}: skipped events that are not timeline slices: 1 e without b"]


def test_thread_names_from_metadata(tmp_path):
    """Hand-written after catapult's x_event_trace.json: thread_name metadata names the threads (a renderer's
    CompositorRasterWorker1 showed as 14689/14752)."""
    events = [{"ph": "M", "name": "thread_name", "pid": 14689, "tid": 14752,
               "args": {"name": "CompositorRasterWorker1"}},
              {"ph": "M", "name": "process_name", "pid": 14689, "args": {"name": "Renderer"}},
              {"ph": "X", "name": "Picture::Raster", "pid": 14689, "tid": 14752, "ts": 0, "dur": 10}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(events))
    trace = read_paths([path], fmt="chrome")[0]
    assert trace.meta.extra["thread_names"] == {"14689/14752": "CompositorRasterWorker1"}
    assert trace.meta.warnings == []
    code, out, err = run_cli("--store", str(tmp_path / "s"), "--wide", "analyze", "--rule", "hotspots", str(path))
    assert code == 0 and "14689/14752 (CompositorRasterWorker1)" in out


def test_instants_are_no_annotations(tmp_path):
    """Hand-written after catapult's simple_trace.json: its instant events were listed by hotspots as
    "annotations (record_function, NVTX, step ranges)" of 0 ns."""
    events = [{"ph": "X", "name": "Frame", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
              {"ph": "i", "name": "Vsync", "pid": 1, "tid": 1, "ts": 5, "s": "t"}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(events))
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", "--json", "--rule", "hotspots", str(path))
    assert code == 0, err
    titles = [f["title"] for f in json.loads(out)["findings"]]
    assert not any("nnotation" in t for t in titles) and "Vsync" not in out
