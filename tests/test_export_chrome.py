"""``export --to chrome`` and the ``chrome`` reader: event counts checked with the json module, exact round trips
(torch trace, nsys aggregated summaries, nsys timed trace, counters with NaN), plain Chrome traces, bad input."""

from __future__ import annotations

import gzip
import json
import math
from collections import Counter
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from helpers import FIXTURES, run_cli, us_to_ns as _ns
from traceparse.ingest import read_paths
from traceparse.schema import SCHEMA_VERSION, conform
from traceparse.trace import Trace, TraceMeta
from traceparse_plugins.exporters.chrome import PATH_CAT, PATH_PID, ChromeExporter

TORCH = FIXTURES / "torch" / "resnet18_bs8.json.gz"
NSYS = FIXTURES / "nsys"
HANDWRITTEN = FIXTURES / "chrome" / "handwritten"
#: torch.profiler categories the torch reader keeps (plugins/readers/torch_profiler.py CATEGORY_KIND).
KEPT = {"kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset", "cuda_runtime", "runtime", "cuda_driver", "driver",
        "cuda_sync", "cpu_op", "operator", "user_annotation", "gpu_user_annotation", "python_function"}
GPU = {"kernel", "gpu_memcpy", "gpu_memset"}
API = {"cuda_runtime", "cuda_driver"}


def _load(path: Path) -> dict:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f, parse_float=Decimal)


def _export(ref: str, out: Path) -> str:
    code, _, err = run_cli("export", ref, "--to", "chrome", "--out", str(out))
    assert code == 0, err
    return err


def _events_of(ref: str) -> pl.DataFrame:
    from traceparse.session import Session

    return Session().resolve(ref)[0].events.drop("trace_id")


def test_torch_export_counts_and_exact_times(store, tmp_path):
    out = tmp_path / "r18.json"
    message = _export(str(TORCH), out)
    original = [e for e in _load(TORCH)["traceEvents"] if e.get("ph") == "X" and e.get("cat") in KEPT]
    assert " ".join(message.split()) == f"wrote {out} (chrome, {len(original):,} events)"
    doc = _load(out)
    assert list(doc)[:1] == ["traceparse"] and doc["traceparse"]["schema_version"] == SCHEMA_VERSION
    rows = [e for e in doc["traceEvents"] if e.get("cat") != PATH_CAT]  # the critical path's track aside
    phases = Counter(e["ph"] for e in rows)
    assert phases["X"] == len(original) and doc["traceparseRows"] == []
    # every slice keeps its name, start and duration to the nanosecond (ts written with 3 decimals)
    exported = Counter((e["name"], _ns(e["ts"]), _ns(e["dur"])) for e in rows if e["ph"] == "X")
    assert exported == Counter((e["name"], _ns(e["ts"]), _ns(e["dur"])) for e in original)
    for e in rows:
        if e["ph"] == "X":
            row = e["args"]["traceparse"]
            assert (row["start_ns"], row["duration_ns"]) == (_ns(e["ts"]), _ns(e["dur"]))
            assert "." in str(e["ts"]) and len(str(e["ts"]).split(".")[1]) == 3
    # one flow arrow per GPU activity whose correlation id has a launch API call
    api_corr = {e["args"]["correlation"] for e in original if e["cat"] in API and "correlation" in e.get("args", {})}
    launched = [e["args"]["correlation"] for e in original
                if e["cat"] in GPU and e.get("args", {}).get("correlation") in api_corr]
    assert phases["f"] == len(launched) > 0 and phases["s"] == len(set(launched))
    finishes = [e for e in rows if e["ph"] == "f"]
    assert all(e["bp"] == "e" and e["pid"] == 0 for e in finishes)
    streams = {e["args"]["stream"] for e in original if e["cat"] in GPU}
    names = {(e["name"], e["pid"], e["tid"]): e["args"] for e in doc["traceEvents"] if e["ph"] == "M"}
    assert names[("process_name", 0, 0)]["name"] == "GPU 0 (NVIDIA H100 80GB HBM3)"
    assert {tid for (n, pid, tid) in names if n == "thread_name" and pid == 0} == streams
    host_pids = {e["pid"] for e in original if e["cat"] == "cpu_op"}
    assert all(("process_name", pid, 0) in names for pid in host_pids)


def test_torch_round_trip_gives_the_same_events(store, tmp_path):
    out = tmp_path / "r18.json.gz"
    _export(str(TORCH), out)
    assert out.read_bytes()[:2] == b"\x1f\x8b"
    code, stdout, err = run_cli("ingest", str(out), "--json")
    assert code == 0, err
    meta = json.loads(stdout)["traces"][0]
    assert meta["format"] == "chrome" and meta["variant"].endswith("of a torch trace")
    assert meta["devices"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert_frame_equal(_events_of(str(out)), _events_of(str(TORCH)))


def test_aggregated_rows_round_trip_through_the_side_array(store, tmp_path):
    """nsys stats summaries have no start times: they are kept in traceparseRows, not on the timeline."""
    paths = [str(NSYS / "resnet18_bs8_cuda_gpu_kern_sum.csv"), str(NSYS / "resnet18_bs8_cuda_api_sum.csv")]
    code, out, err = run_cli("ingest", *paths, "-q", "--json")
    assert code == 0, err
    trace_id = json.loads(out)["traces"][0]["id"]
    exported = tmp_path / "summary.json"
    _export(trace_id, exported)
    doc = _load(exported)
    rows = sum(1 for p in paths for _ in open(p)) - 2  # data lines of the two CSVs
    assert len(doc["traceparseRows"]) == rows
    assert [e for e in doc["traceEvents"] if e["ph"] != "M"] == [] and doc["traceEvents"] == []
    assert all(r["start_ns"] is None for r in doc["traceparseRows"] if "start_ns" in r)
    assert_frame_equal(_events_of(str(exported)), _events_of(trace_id))


def test_nsys_timed_trace_round_trip(store, tmp_path):
    source = str(NSYS / "resnet18_bs8.sqlite.gz")
    exported = tmp_path / "nsys.json"
    _export(source, exported)
    phases = Counter(e["ph"] for e in _load(exported)["traceEvents"] if e.get("cat") != PATH_CAT)
    assert phases["f"] > 300
    assert_frame_equal(_events_of(str(exported)), _events_of(source))


def test_counters_and_non_finite_values_round_trip(tmp_path):
    """Edge case no real trace here has: counters (timed and aggregated) with NaN and infinite values."""
    events = conform(pl.DataFrame({
        "kind": ["counter", "counter", "counter", "kernel", "counter"],
        "name": ["sm__throughput", "dram__bytes", "sm__throughput", "k", "power"],
        "start_ns": [None, None, None, 1_000_000_123_456, 1_000_000_200_000],
        "duration_ns": [None, None, None, 1500, None],
        "value": [float("nan"), 12.5, float("inf"), None, 310.25],
        "value_min": [float("-inf"), 0.1 + 0.2, None, None, None],
        "unit": ["%", "byte", "%", None, "W"], "parent_id": [3, 3, 3, None, None], "device_id": [0, 0, 0, 0, 0],
    }), trace_id="x")
    trace = Trace(events, TraceMeta(id="x", format="ncu"))
    # the core's validation drops non-finite values (issue 16); set the table directly to test the exporter's own
    # handling of them (a store written before that validation may still hold them)
    trace._events, trace._stamped = events, "x"
    out = tmp_path / "counters.json"
    ChromeExporter().export(trace, out)
    doc = json.loads(out.read_text())  # strict JSON: no NaN literals
    assert sorted(doc["traceparseNonFinite"]) == [[0, "value", "NaN"], [0, "value_min", "-Infinity"],
                                                  [2, "value", "Infinity"]]
    assert [e["ph"] for e in doc["traceEvents"] if e["ph"] != "M"] == ["X", "C"]
    # read back through the core: the rows with a non-finite value are dropped, with one counted warning
    [trace] = read_paths([out])
    back = trace.events
    finite = [1, 3, 4]
    assert_frame_equal(back.drop("trace_id", "event_id", "parent_id"),
                       events[finite].drop("trace_id", "event_id", "parent_id"))
    assert back["value_min"][0] == 0.1 + 0.2
    assert any("dropped 2 events whose value is not a finite number" in w for w in trace.meta.warnings)


def test_sniffing_prefers_the_chrome_reader_for_exports(tmp_path):
    from traceparse.plugins import registry
    from traceparse.sources import read_head

    out = tmp_path / "e.json"
    ChromeExporter().export(read_paths([TORCH])[0], out)
    head = read_head(out)
    from traceparse.ingest import detect_reader

    readers = registry().readers
    # an export's first key is "traceparse": the chrome reader's signature, not one of Kineto's keys
    assert (readers["chrome"].sniff(out, head), readers["torch"].sniff(out, head)) == (1.0, 0.0)
    assert detect_reader(out, registry()).name == "chrome"
    # a Kineto trace: both claim it, and torch refines chrome, so torch reads it
    assert readers["chrome"].sniff(TORCH, read_head(TORCH)) > 0 and readers["torch"].refines == "chrome"
    assert detect_reader(TORCH, registry()).name == "torch"


def test_a_kineto_trace_read_as_a_plain_chrome_trace(store):
    """Any Chrome trace: ph X events become region rows with exact times, cat in `group`."""
    trace = read_paths([TORCH], fmt="chrome")[0]
    raw = _load(TORCH)["traceEvents"]
    xs = [e for e in raw if e.get("ph") == "X"]
    instants = [e for e in raw if e.get("ph") in ("i", "I", "R")]
    events = trace.events
    regions = events.filter(pl.col("kind") == "region")
    assert events.height == len(xs) + len(instants) and regions.height == len(xs)
    assert Counter(zip(regions["name"], regions["start_ns"], regions["duration_ns"], regions["group"])) == \
        Counter((e["name"], _ns(e["ts"]), _ns(e["dur"]), e.get("cat")) for e in xs)
    markers = events.filter(pl.col("kind") == "marker")
    assert sorted(zip(markers["name"], markers["start_ns"])) == sorted((e["name"], _ns(e["ts"])) for e in instants)
    assert any("skipped events that are not timeline slices" in w for w in trace.meta.warnings)


def test_handwritten_plain_traces():
    trace = read_paths([HANDWRITTEN / "object_form.json"])[0]
    assert trace.meta.format == "chrome"
    rows = trace.events.select("kind", "name", "start_ns", "duration_ns", "pid", "tid", "group", "value").rows()
    assert rows[0] == ("region", "Asub", 830_500, 1_750, 22630, 22630, "PERF", None)
    assert rows[1] == ("region", "Asub", 829_000, 4_000, 22630, 22630, "PERF", None)
    assert rows[2] == ("region", "Frame", 900_002, 16_667, 22630, None, "gpu", None)
    assert rows[3] == ("marker", "Vsync", 950_000, 0, 22630, 22630, "gpu", None)
    assert rows[4:] == [("counter", "ctr.cats", 960_000, None, 22630, None, "mem", 0.0),
                        ("counter", "ctr.dogs", 960_000, None, 22630, None, "mem", 7.5),
                        ("counter", "heap", 970_000, None, 22630, None, None, 1048576.0)]
    # process_name metadata is read (nothing to warn of); an async begin without its end is said as such
    assert trace.meta.warnings == [
        f"{HANDWRITTEN / 'object_form.json'}: 1 asynchronous begin (b, S) without a matching end, left out",
        f"{HANDWRITTEN / 'object_form.json'}: skipped events that are not timeline slices: 1 s"]
    unclosed = read_paths([HANDWRITTEN / "array_form_unclosed.json"], fmt="chrome")[0]
    assert unclosed.events.select("name", "start_ns", "duration_ns").rows() == [("load", 10_000, 5_000),
                                                                             ("parse", 16_000, 2_500)]
    assert unclosed.meta.warnings == []


def test_truncated_export_keeps_complete_events(store, tmp_path):
    whole = tmp_path / "whole.json"
    ChromeExporter().export(read_paths([TORCH])[0], whole)
    lines = whole.read_bytes().split(b"\n")
    cut = tmp_path / "cut.json"
    cut.write_bytes(b"\n".join(lines[:1500]) + b"\n" + lines[1500][:40])  # the profiler died mid-write
    kept = sum(1 for line in lines[3:1500] if b'"traceparse":{' in line)
    code, out, err = run_cli("ingest", str(cut), "--json")
    assert code == 0, err
    meta = json.loads(out)["traces"][0]
    assert meta["event_count"] == kept
    assert f"the file ends early (truncated); kept the {kept} complete timeline rows" in err


def test_newer_export_version_and_broken_rows_are_one_line_errors(store, tmp_path):
    whole = tmp_path / "whole.json"
    ChromeExporter().export(read_paths([HANDWRITTEN / "object_form.json"])[0], whole)
    text = whole.read_text()
    newer = tmp_path / "newer.json"
    newer.write_text(text.replace('"export_version": 1', '"export_version": 2', 1))
    code, out, err = run_cli("ingest", str(newer))
    assert code == 2 and out == ""
    assert err == (f"traceparse: error: {newer}: traceparse.export_version: export layout version 2; this "
                   "traceparse reads versions up to 1\n")
    bad = tmp_path / "bad.json"
    bad.write_text(text.replace('"start_ns":829000', '"start_ns":"829000"', 1))
    code, _, err = run_cli("ingest", str(bad))
    assert code == 2
    assert err == (f"traceparse: error: {bad}: embedded row 1: not a traceparse row: "
                   "Expected `int | null`, got `str`\n")
    code, out, _ = run_cli("list", "--json")
    assert json.loads(out)["traces"] == []  # nothing left in the store


# -- the critical path (issue 24) ---------------------------------------------------------------------------------
SLOW_RUNS = [FIXTURES / "torch" / "multirank" / "gloo4_slow_rank2",
             FIXTURES.parent.parent / "shared" / "samples" / "multirank" / "gloo4_resnet18_bs16_slow_rank2"]


@pytest.mark.parametrize("run", SLOW_RUNS, ids=["trimmed", "whole"])
def test_the_export_marks_each_steps_critical_path(store, tmp_path, run):
    """The slow-rank run: on the "critical path" process, one track per rank; each step's path is slices that tile
    the step up to its ProfilerStep#N end (raw JSON), and one flow per step links exactly those slices, one point
    in each, in time order. In the whole run (its operators kept) every other rank's path crosses to rank 2's
    sleep in its gradient hook in every step; the trimmed copy cannot show that wait."""
    if not run.exists():
        pytest.skip("the shared multirank samples are not here")
    whole = run.name.endswith("bs16_slow_rank2")
    out = tmp_path / "run.json"
    _export(str(run), out)
    events = _load(out)["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"
             and e["pid"] == PATH_PID}
    assert sorted(names.values()) == [f"rank {r}: each step's critical path" for r in range(4)]
    track = {v.split(":")[0]: tid for (_, tid), v in names.items()}
    slices = [e for e in events if e.get("cat") == PATH_CAT and e["ph"] == "X"]
    flows = [e for e in events if e.get("cat") == PATH_CAT and e["ph"] in ("s", "t", "f")]
    assert slices and flows and all(e["pid"] == PATH_PID for e in slices + flows)
    for rank in range(4):
        steps = {int(e["name"].split("#")[1]): (_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]))
                 for e in _load(run / f"rank{rank}.json.gz")["traceEvents"]
                 if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")}
        tid = track[f"rank {rank}"]
        for step, (start, end) in steps.items():
            mine = sorted((_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"]), e) for e in slices
                          if e["tid"] == tid and e["args"]["step"] == step)
            assert mine[-1][1] == end and mine[0][0] >= start
            assert all(a[1] == b[0] for a, b in zip(mine, mine[1:]))  # they tile, no gap, no overlap
            if whole and rank != 2:
                assert any(e["name"] == "rank 2: autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
                           and e["args"]["rank"] == 2 and e["dur"] > 50_000 for _, _, e in mine)
            # the step's flow: one point inside each of its slices, in order: s, t..., f
            ids = {f["id"] for f in flows if f["tid"] == tid and start < _ns(f["ts"]) < end}
            assert len(ids) == 1
            points = sorted((_ns(f["ts"]), f["ph"]) for f in flows if f["id"] in ids)
            assert [p for _, p in points] == ["s"] + ["t"] * (len(mine) - 2) + ["f"]
            assert all(a < t < b for (t, _), (a, b, _) in zip(points, mine))
    # no row rides on the path's slices: the reader reads the rows back alone (the torch round trip above)
    assert all("traceparse" not in e["args"] for e in slices)


def test_a_runs_export_reads_back_rank_by_rank(store, tmp_path):
    """A run's export reads back (it failed: "every row needs its own event_id", each rank numbering its rows from
    0): one id per row, and per rank the raw file's events and kernel time; each launch flow joins an API call and
    the GPU work of one rank (ranks reuse correlation ids)."""
    run = FIXTURES / "torch" / "multirank" / "ddp4_slow_loader"
    out = tmp_path / "run.json.gz"
    _export(str(run), out)
    code, _, err = run_cli("ingest", str(out))
    assert code == 0, err
    back = _events_of(str(out))
    assert back["event_id"].n_unique() == back.height
    launches = []
    for path in sorted(run.glob("rank*.json.gz")):
        rank = int(path.name[4:].split(".")[0])
        raw = [e for e in _load(path)["traceEvents"] if e.get("ph") == "X" and e.get("cat") in KEPT]
        mine = back.filter(pl.col("rank") == rank)
        assert mine.height == len(raw)
        assert Counter(mine["name"].to_list()) == Counter(e["name"] for e in raw)
        assert mine.filter(pl.col("kind") == "kernel")["duration_ns"].sum() == sum(
            _ns(e["dur"]) for e in raw if e["cat"] == "kernel")
        calls = {e["args"]["correlation"]: _ns(e["ts"]) for e in raw if e["cat"] in API and "correlation" in e["args"]}
        launches += [(calls[e["args"]["correlation"]], _ns(e["ts"])) for e in raw
                     if e["cat"] in GPU and e["args"].get("correlation") in calls]
    flows = [e for e in _load(out)["traceEvents"] if e.get("cat") == "launch"]
    start = {e["id"]: _ns(e["ts"]) for e in flows if e["ph"] == "s"}
    assert len(start) == sum(1 for e in flows if e["ph"] == "s")  # one flow per rank's correlation id
    assert Counter((start[e["id"]], _ns(e["ts"])) for e in flows if e["ph"] == "f") == Counter(launches)


def test_one_numbering_moves_the_ids_that_point_at_rows():
    """Rank after rank, each rank's ids past the last one's; ``parent_id`` and ``data_from`` moved alike (by hand)."""
    from traceparse_plugins.exporters.chrome import one_numbering

    rows = conform(pl.DataFrame({"trace_id": ["b", "b", "a", "a", "a"], "rank": [1, 1, 0, 0, 0],
                                 "event_id": [0, 1, 0, 1, 2], "kind": ["op"] * 5, "parent_id": [None, 0, None, 0, 1],
                                 "data_from": [None, "[0]", None, None, "[0,1]"]}))
    out = one_numbering(rows).sort("event_id")
    assert out.select("trace_id", "event_id", "parent_id", "data_from").rows() == [
        ("a", 0, None, None), ("a", 1, 0, None), ("a", 2, 1, "[0,1]"), ("b", 3, None, None), ("b", 4, 3, "[3]")]
    single = rows.filter(pl.col("trace_id") == "a")
    assert_frame_equal(one_numbering(single), single)
