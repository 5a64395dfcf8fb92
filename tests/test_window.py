"""``analyze --step/--window/--nvtx`` and :mod:`traceparse.window`: figures checked against the raw files.

The oracles here read the raw JSON (torch) or the SQLite export (nsys) in
plain Python, clip the GPU intervals to the step or range themselves and
merge them; none of traceparse's interval code is used for the expected
figures.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import sqlite3
from decimal import Decimal

import polars as pl
import pytest

from traceparse.figures import fmt_ns
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import FIXTURES, raw_steps, run_cli, us_to_ns

TORCH_GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


# -- independent oracles --------------------------------------------------------------------------------------
def union_length(spans: list[tuple[int, int]], lo: int, hi: int) -> int:
    """Length of the union of ``spans`` clipped to [lo, hi), by sorting and sweeping."""
    clipped = sorted((max(s, lo), min(e, hi)) for s, e in spans if min(e, hi) > max(s, lo))
    total, cur_s, cur_e = 0, None, None
    for s, e in clipped:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (cur_e - cur_s if cur_e is not None else 0)


def torch_raw(path):
    """(host steps {N: (start, end)}, GPU intervals [(start, end, cat, name)]) from a torch trace, in exact ns."""
    with gzip.open(path, "rt") as fh:
        raw = json.load(fh, parse_float=Decimal)
    steps, gpu = {}, []
    for e in raw["traceEvents"]:
        if e.get("ph") != "X":
            continue
        start = us_to_ns(e["ts"])
        end = start + us_to_ns(e["dur"])
        if e.get("cat") == "user_annotation" and re.fullmatch(r"ProfilerStep#\d+", e["name"]):
            steps[int(e["name"].split("#")[1])] = (start, end)
        elif e.get("cat") in TORCH_GPU_CATS:
            gpu.append((start, end, e["cat"], e["name"]))
    return steps, gpu


def category_of(name: str) -> str:
    """A kernel's category by the documented pattern table, matched with Python's re (first match wins)."""
    from traceparse.expr import OTHER_CATEGORY, kernel_categories

    for category, pattern in kernel_categories():
        if re.search(pattern, name.lower()):
            return category
    return OTHER_CATEGORY


def analyze_json(*args: str) -> dict:
    code, out, err = run_cli("analyze", *args, "--json")
    assert code == 0, err
    return json.loads(out)


def one_line_error(args: list[str], expected: str) -> None:
    code, out, err = run_cli(*args)
    assert code == 2, (out, err)
    assert err == f"traceparse: error: {expected}\n"


# -- torch: ProfilerStep#N windows ----------------------------------------------------------------------------
@pytest.fixture(params=["fixture", "sample"])
def torch_trace(request, fixtures_dir):
    if request.param == "fixture":
        return fixtures_dir / "torch" / "resnet18_bs16.json.gz"
    return request.getfixturevalue("samples_dir") / "torch" / "torch_resnet18_bs16.json.gz"


@pytest.mark.parametrize("steps_from", [[], ["--nvtx", "ProfilerStep#*"]], ids=["steps", "range-instances"])
def test_step_all_table_matches_the_raw_json(store, torch_trace, steps_from):
    """The steps measure's steps, or the instances of a range (here the same annotations, by a glob)."""
    steps, gpu = torch_raw(torch_trace)
    assert len(steps) == 2  # the two ProfilerStep#N host annotations of these captures
    rows = analyze_json(str(torch_trace), "--step", "all", *steps_from, "--rule", "kernel-share")["steps"]
    assert [r["step"] for r in rows] == sorted(steps)
    for row in rows:
        lo, hi = steps[row["step"]]
        busy = union_length([(s, e) for s, e, _, _ in gpu], lo, hi)
        per_category: dict[str, int] = {}
        for s, e, cat, name in gpu:
            if cat == "kernel" and min(e, hi) > max(s, lo):
                per_category[category_of(name)] = per_category.get(category_of(name), 0) + min(e, hi) - max(s, lo)
        top = max(sorted(per_category), key=per_category.get)
        assert set(row) == {"trace", "rank", "step", "start_ns", "dur_ns", "gpu_busy_pct", "idle_ns", "top_category"}
        assert (row["start_ns"], row["dur_ns"], row["idle_ns"]) == (lo, hi - lo, hi - lo - busy)
        assert row["gpu_busy_pct"] == pytest.approx(100 * busy / (hi - lo), rel=1e-12)
        assert row["top_category"] == top
        assert row["rank"] is None
        assert 0 < busy < hi - lo


def test_step_n_analyses_only_that_step(store, torch_trace):
    steps, gpu = torch_raw(torch_trace)
    lo, hi = steps[2]
    doc = analyze_json(str(torch_trace), "--step", "2", "--rule", "gpu-idle", "--rule", "kernel-share")
    assert "steps" not in doc
    assert doc["window"]["label"] == "step 2"
    assert [(w["start_ns"], w["end_ns"]) for w in doc["window"]["windows"]] == [(lo, hi)]
    idle = next(f for f in doc["findings"] if f["rule"] == "gpu-idle")["metrics"]
    assert idle["busy_ns"] == union_length([(s, e) for s, e, _, _ in gpu], lo, hi)
    inside = [(max(s, lo), min(e, hi)) for s, e, _, _ in gpu if min(e, hi) > max(s, lo)]
    assert idle["span_ns"] == max(e for _, e in inside) - min(s for s, _ in inside)
    assert idle["busy_ns"] <= idle["span_ns"] <= hi - lo
    share = next(f for f in doc["findings"] if f["rule"] == "kernel-share")["metrics"]
    assert share["kernel_time_ns"] == sum(min(e, hi) - max(s, lo) for s, e, cat, _ in gpu
                                          if cat == "kernel" and min(e, hi) > max(s, lo))


def test_step_all_prints_the_table_before_the_findings(store, fixtures_dir):
    code, out, err = run_cli("analyze", str(fixtures_dir / "torch" / "resnet18_bs16.json.gz"), "--step", "all",
                             "--rule", "gpu-idle")
    assert code == 0, err
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if "GPU busy" in line and "top category" in line)
    finding = next(i for i, line in enumerate(lines) if "gpu-idle" in line)
    assert header < finding
    # step 1 starts the trace, busy with one decimal; each time column in one unit, named in its header
    assert re.search(r"^ step ┃ start \(ms\) ┃ time \(ms\) ┃ GPU busy of step ┃ idle \(ms\) ┃ top category", out, re.M)
    assert re.search(r"^\s+1 │\s+0\.00 │ .* │\s+\d+\.\d% │", out, re.M)


def test_the_step_tables_gpu_busy_says_it_is_of_the_step(store, fixtures_dir):
    """The step table's GPU busy is of the step's time; the summary's, of the GPU's span inside the window. Both were
    labelled "GPU busy": step 1 of the ResNet18 fixture read one figure in the table (--step all) and another in
    the summary of --step 1. Both recomputed here from the raw JSON."""
    path = fixtures_dir / "torch" / "resnet18_bs16.json.gz"
    steps, gpu = torch_raw(path)
    lo, hi = steps[1]
    busy = union_length([(s, e) for s, e, _, _ in gpu], lo, hi)
    inside = [(max(s, lo), min(e, hi)) for s, e, _, _ in gpu if min(e, hi) > max(s, lo)]
    of_step = f"{100 * busy / (hi - lo):.1f}%"
    of_span = f"{100 * busy / (max(e for _, e in inside) - min(s for s, _ in inside)):.1f}%"
    assert of_step != of_span  # the two wholes give two figures here
    code, out, err = run_cli("--width", "120", "analyze", str(path), "--step", "all", "--rule", "gpu-idle")
    assert code == 0, err
    assert re.search(r"step ┃ start \(ms\) ┃ time \(ms\) ┃ GPU busy of step ┃ idle \(ms\) ┃ top category", out)
    assert re.search(r"^ +1 │ +0\.00 │ [^│]+│ +" + re.escape(of_step) + " │", out, re.M)
    code, out, err = run_cli("--width", "120", "analyze", str(path), "--step", "1", "--rule", "gpu-idle")
    assert code == 0, err
    assert f"GPU busy     {of_span} of the GPU's span (first to last activity)" in out


# -- nsys: NVTX ranges of a whole-process capture -------------------------------------------------------------
def nsys_raw(path, tmp_path, range_name):
    """(instances [(start, end)] of the NVTX range, GPU intervals [(start, end, kind)]) from the SQLite export."""
    db_path = tmp_path / "export.sqlite"
    with gzip.open(path) as src, open(db_path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    db = sqlite3.connect(db_path)
    ranges = db.execute("SELECT a.start, a.\"end\" FROM NVTX_EVENTS a LEFT JOIN StringIds s ON s.id = a.textId "
                        "WHERE COALESCE(a.text, s.value) = ? AND a.\"end\" IS NOT NULL", (range_name,)).fetchall()
    gpu = []
    for table, kind in (("CUPTI_ACTIVITY_KIND_KERNEL", "kernel"), ("CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy"),
                        ("CUPTI_ACTIVITY_KIND_MEMSET", "memset")):
        gpu += [(s, e, kind) for s, e in db.execute(f"SELECT start, \"end\" FROM {table}")]
    db.close()
    return ranges, gpu


@pytest.mark.parametrize("name", ["train_step", "forward"])
def test_nvtx_range_of_the_nsys_fixture(store, fixtures_dir, tmp_path, name):
    path = fixtures_dir / "nsys" / "resnet18_bs8.sqlite.gz"
    ranges, gpu = nsys_raw(path, tmp_path, name)
    assert len(ranges) == 1
    (lo, hi), = ranges
    doc = analyze_json(str(path), "--nvtx", name, "--rule", "gpu-idle", "--rule", "kernel-share")
    assert [(w["start_ns"], w["end_ns"]) for w in doc["window"]["windows"]] == [(lo, hi)]
    idle = next(f for f in doc["findings"] if f["rule"] == "gpu-idle")["metrics"]
    assert idle["busy_ns"] == union_length([(s, e) for s, e, _ in gpu], lo, hi)
    share = next(f for f in doc["findings"] if f["rule"] == "kernel-share")["metrics"]
    assert share["kernel_time_ns"] == sum(min(e, hi) - max(s, lo) for s, e, k in gpu
                                          if k == "kernel" and min(e, hi) > max(s, lo))


def test_instances_of_an_nvtx_range_as_steps(store, fixtures_dir, tmp_path):
    path = fixtures_dir / "nsys" / "resnet18_bs8.sqlite.gz"
    ranges, gpu = nsys_raw(path, tmp_path, "train_step")
    (lo, hi), = ranges
    doc = analyze_json(str(path), "--nvtx", "train_step", "--step", "all", "--rule", "gpu-idle")
    busy = union_length([(s, e) for s, e, _ in gpu], lo, hi)
    assert [(r["step"], r["start_ns"], r["dur_ns"], r["idle_ns"]) for r in doc["steps"]] == [(1, lo, hi - lo, hi - lo - busy)]
    assert doc["window"]["label"] == "range train_step (all instances)"


def test_nvtx_range_excludes_the_setup_of_a_whole_process_capture(store, samples_dir, tmp_path):
    """The shared nsys sample captures the whole process (1.47 s); its one train_step range is 20.8 ms of it."""
    path = samples_dir / "nsys" / "resnet18_bs16.sqlite.gz"
    ranges, gpu = nsys_raw(path, tmp_path, "train_step")
    (lo, hi), = ranges
    whole = analyze_json(str(path), "--rule", "gpu-idle")
    cut = analyze_json(str(path), "--nvtx", "train_step", "--rule", "gpu-idle")
    whole_m, cut_m = (next(f for f in d["findings"] if f["rule"] == "gpu-idle")["metrics"] for d in (whole, cut))
    all_gpu = [(s, e) for s, e, _ in gpu]
    assert whole_m["busy_ns"] == union_length(all_gpu, min(s for s, _ in all_gpu), max(e for _, e in all_gpu))
    assert cut_m["busy_ns"] == union_length(all_gpu, lo, hi)
    inside = [(max(s, lo), min(e, hi)) for s, e in all_gpu if min(e, hi) > max(s, lo)]
    assert cut_m["span_ns"] == max(e for _, e in inside) - min(s for s, _ in inside)
    assert cut_m["span_ns"] < hi - lo < whole_m["span_ns"]  # the setup before the range is gone


# -- --window ---------------------------------------------------------------------------------------------------
def test_window_counts_from_the_trace_start(store, fixtures_dir, tmp_path):
    path = fixtures_dir / "nsys" / "resnet18_bs8.sqlite.gz"
    _, gpu = nsys_raw(path, tmp_path, "train_step")
    db = sqlite3.connect(tmp_path / "export.sqlite")
    # every timed row the reader keeps: API calls, NVTX, GPU work; the first start is the trace's start
    origin = min(db.execute(f"SELECT MIN(start) FROM {t}").fetchone()[0]
                 for t in ("CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_KERNEL",
                           "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"))
    db.close()
    doc = analyze_json(str(path), "--window", "5:12.5", "--rule", "gpu-idle")
    lo, hi = origin + 5_000_000, origin + 12_500_000
    assert [(w["start_ns"], w["end_ns"]) for w in doc["window"]["windows"]] == [(lo, hi)]
    idle = next(f for f in doc["findings"] if f["rule"] == "gpu-idle")["metrics"]
    assert idle["busy_ns"] == union_length([(s, e) for s, e, _ in gpu], lo, hi)
    # an open end runs to the end of the trace
    open_end = analyze_json(str(path), "--window", "5:", "--rule", "gpu-idle")
    assert open_end["window"]["windows"][0]["start_ns"] == lo
    busy = next(f for f in open_end["findings"] if f["rule"] == "gpu-idle")["metrics"]["busy_ns"]
    assert busy == union_length([(s, e) for s, e, _ in gpu], lo, 1 << 62)


def test_a_window_says_which_steps_it_cuts_and_ends_with_the_trace(store, fixtures_dir):
    """``--window 10:60`` of a 33 ms trace of two steps: it starts inside step 1, whose 10 ms before it are not
    in it, and ends past the trace. The summary gave the part of step 1 as a step time without a word, and the
    line above it said "50 ms analysed" of 33 ms."""
    path = fixtures_dir / "torch" / "resnet18_bs16.json.gz"
    steps = raw_steps(path)
    # every complete event but the profiler's own span (category "Trace"), which is no row
    events = [e for e in json.load(gzip.open(path))["traceEvents"] if e.get("ph") == "X" and e.get("cat") != "Trace"]
    origin = min(us_to_ns(e["ts"]) for e in events)
    end = max(us_to_ns(e["ts"]) + us_to_ns(e["dur"]) for e in events)
    doc = analyze_json(str(path), "--window", "10:60", "--rule", "kernel-share")
    lo = origin + 10_000_000
    assert [(w["start_ns"], w["end_ns"]) for w in doc["window"]["windows"]] == [(lo, end + 1)]  # not origin + 60 ms
    cut = [n for n, (s, e) in steps.items() if s < end + 1 and e > lo and not (s >= lo and e <= end + 1)]
    assert len(steps) == 2 and cut == [1]
    [summary] = doc["summary"]
    assert (summary["steps"], summary["steps_cut"]) == (2, 1)
    assert summary["step_min_ns"] == steps[1][1] - lo  # step 1's part inside the window
    code, out, err = run_cli("--store", str(store), "analyze", str(path), "--window", "10:60", "--rule",
                             "kernel-share", "--width", "200")
    assert code == 0, err
    assert f"window 10:60 ms: {fmt_ns(end + 1 - lo)} analysed of resnet18_bs16.json.gz" in out
    assert "; the window cuts 1 of them: its time is that of its part inside the window" in out
    code, out, err = run_cli("--store", str(store), "analyze", str(path), "--step", "2", "--rule", "kernel-share")
    assert code == 0 and "the window cuts" not in out, err  # a step's own window cuts no step


# -- bad values: one line, exit 2 ---------------------------------------------------------------------------------
@pytest.mark.parametrize("option, expected", [
    (["--step", "9"], "--step 9: {path} has no step 9 (its steps, from ProfilerStep#N: 1, 2)"),
    (["--step", "two"], "--step 'two': expected a step number (as in ProfilerStep#N) or all"),
    (["--window", "5"], "--window '5': expected START:END in ms from the trace's start, e.g. 100:250 or 100:"),
    (["--window", "10:5"], "--window '10:5': the end must be after the start"),
    (["--window", "a:5"], "--window 'a:5': 'a' is not a number of ms"),
    (["--window=-1:5"], "--window '-1:5': the edges are ms from the trace's start and cannot be negative"),
    (["--window", "100000:"], "--window '100000:': {path} has no event in that window (it spans {span} from its start)"),
    (["--nvtx", "train_step"], "--nvtx 'train_step': {path} has no range named train_step (its ranges: "
                               "Optimizer.step#SGD.step, Optimizer.zero_grad#SGD.zero_grad, ProfilerStep#1, ProfilerStep#2)"),
])
def test_bad_window_values_are_one_line_errors(store, fixtures_dir, option, expected):
    path = fixtures_dir / "torch" / "resnet18_bs16.json.gz"
    with gzip.open(path, "rt") as fh:  # the span of the complete events (the profiler's own "Trace" span is no event)
        timed = [e for e in json.load(fh, parse_float=Decimal)["traceEvents"] if e.get("ph") == "X" and e["cat"] != "Trace"]
    span = max(us_to_ns(e["ts"]) + us_to_ns(e["dur"]) for e in timed) - min(us_to_ns(e["ts"]) for e in timed)
    one_line_error(["analyze", str(path), *option], expected.format(path=path, span=fmt_ns(span)))


def test_nsys_errors_name_what_the_capture_has(store, fixtures_dir):
    path = str(fixtures_dir / "nsys" / "resnet18_bs8.sqlite.gz")
    one_line_error(["analyze", path, "--nvtx", "step"],
                   f"--nvtx 'step': {path} has no range named step "
                   "(its ranges: backward, forward, h2d_copies, optimizer, train_step)")
    one_line_error(["analyze", path, "--nvtx", "train_step", "--step", "2"],
                   f"--step 2: {path} has 1 instance of range train_step, no 2")
    one_line_error(["analyze", path, "--window", "1:", "--step", "1"],
                   "--window cannot be combined with --step or --nvtx (a window is a part of the trace; "
                   "steps and ranges are others)")
    one_line_error(["analyze", path, "--step", "2"],  # its one train_step range is its step 1
                   f"--step 2: {path} has no step 2 (its steps, from range train_step: 1)")
    nvprof = str(fixtures_dir / "nvprof" / "real" / "rlscope_gpu_trace.csv")  # GPU rows only: nothing marks a step
    one_line_error(["analyze", nvprof, "--step", "all"],
                   f"--step all: {nvprof} has no steps (no ProfilerStep#N annotations, ranges named like steps "
                   "or optimizer annotations); use --nvtx NAME or --window START:END")


# -- the cut itself, on a hand-written table of edge cases ----------------------------------------------------------
def hand_trace(trace_id="t"):
    """A hand-written table (not tool output): two instances of range r, [10, 50) and [100, 150), and events
    inside, straddling, between and after them."""
    from traceparse.trace import Trace, TraceMeta

    ev = pl.DataFrame({
        "kind": ["kernel", "kernel", "memcpy", "marker", "marker", "counter", "counter", "kernel", "kernel", "kernel"],
        "name": ["a", "b", "c", "r", "r", "sample", "metric", "between", "mark", "aggregated"],
        "start_ns": [0, 40, 120, 10, 100, 60, None, 60, 149, None],
        "duration_ns": [30, 100, 40, 40, 50, None, None, 20, 0, 500],
        "calls": [1, 1, 1, 1, 1, 1, 1, 1, 1, 5],
        "bytes": [None, None, 4000, None, None, None, None, None, None, None],
        "flops": [300.0, None, None, None, None, None, None, None, None, None],
        "device_id": [0, 0, 0, None, None, None, None, 0, 0, 0],
        "pid": [None, None, None, 1, 1, None, None, None, None, None],
        "parent_id": [None, None, None, None, None, None, 1, None, None, None],
    })
    return Trace(ev, TraceMeta(id=trace_id))


def test_cut_clips_edges_and_lays_windows_end_to_end():
    from traceparse import window

    trace = hand_trace()
    out = window.cut(trace, window.range_windows(trace, "r"), "range r")
    rows = {r["name"]: r for r in out.events.iter_rows(named=True)}
    # 'sample' and 'between' lie between the windows; 'aggregated' has no time
    assert set(rows) == {"a", "b", "c", "r", "metric", "mark"}
    assert out.meta.warnings == ["t: range r: 1 rows with no time (aggregated summaries) cannot be placed in "
                                 "the window and were left out"]
    assert trace.meta.warnings == []
    # a: [0, 30) clipped to [10, 30); flops scaled by the 20 of 30 ns kept
    assert (rows["a"]["start_ns"], rows["a"]["duration_ns"], rows["a"]["flops"]) == (10, 20, 200.0)
    # b: [40, 140) keeps [40, 50) and [100, 140): 50 ns, from 40 on the laid-out clock (the gap 50..100 removed)
    assert (rows["b"]["start_ns"], rows["b"]["duration_ns"]) == (40, 50)
    # c: [120, 160) keeps [120, 150): 30 of 40 ns, bytes scaled so throughput stays 100 B/ns; shifted by the gap
    assert (rows["c"]["start_ns"], rows["c"]["duration_ns"], rows["c"]["bytes"]) == (70, 30, 3000)
    assert rows["metric"]["parent_id"] == 1  # a counter of a kept kernel stays with it
    assert (rows["mark"]["start_ns"], rows["mark"]["duration_ns"]) == (99, 0)  # an instant inside
    assert out.id == trace.id and out.events.columns == trace.events.columns
    assert out.meta.extra["window"]["windows"] == [{"trace": "t", "start_ns": 10, "end_ns": 50},
                                                    {"trace": "t", "start_ns": 100, "end_ns": 150}]


def test_cut_busy_never_exceeds_the_window():
    from traceparse import window
    from traceparse.measures import device_busy

    trace = hand_trace()
    out = window.cut(trace, window.offset_windows(trace, *window.parse_window("0.000015:0.000045")), "w")
    busy = device_busy(out.events).row(0, named=True)
    # window [15, 45) ns from the first start (0): a [0, 30) keeps [15, 30), b [40, 140) keeps [40, 45)
    assert (busy["first_ns"], busy["last_ns"], busy["busy_ns"], busy["span_ns"]) == (15, 45, 20, 30)


def test_step_all_of_a_run_gives_each_rank_its_own_steps(store, samples_dir):
    run = samples_dir / "multirank" / "gloo4_resnet18_bs16"
    rows = analyze_json(str(run), "--step", "all", "--rule", "gpu-idle")["steps"]
    assert [(r["rank"], r["step"]) for r in rows] == [(rank, step) for rank in range(4) for step in (1, 2, 3)]
    for rank in range(4):
        steps, gpu = torch_raw(run / f"rank{rank}.json.gz")
        mine = [r for r in rows if r["rank"] == rank]
        for row in mine:
            lo, hi = steps[row["step"]]
            busy = union_length([(s, e) for s, e, _, _ in gpu], lo, hi)
            assert (row["start_ns"], row["dur_ns"], row["idle_ns"]) == (lo, hi - lo, hi - lo - busy)


def _merged(windows):
    out = []
    for s, e in sorted(windows):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


@settings(max_examples=60, deadline=None)
@given(events=st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 300)), min_size=1, max_size=25),
       windows=st.lists(st.tuples(st.integers(0, 1200), st.integers(1, 200)), min_size=1, max_size=5))
def test_cut_keeps_exactly_the_time_inside_the_windows(events, windows):
    """For random events and windows: each kept event's duration is its time inside the windows, its start the
    window time before it (plus the first window's start), and an event with no time inside is dropped."""
    from traceparse import window
    from traceparse.trace import Trace, TraceMeta

    trace = Trace(pl.DataFrame({"kind": ["kernel"] * len(events), "start_ns": [s for s, _ in events],
                                "duration_ns": [d for _, d in events], "device_id": [0] * len(events)}),
                  TraceMeta(id="h"))
    wins = _merged([(s, s + n) for s, n in windows])
    frame = pl.DataFrame({"__window_trace": ["h"] * len(windows), "start": [s for s, _ in windows],
                          "end": [s + n for s, n in windows]})
    out = {r["event_id"]: r for r in window.cut(trace, frame, "w").events.iter_rows(named=True)}

    def before(t):  # window time before instant t
        return sum(max(0, min(e, t) - s) for s, e in wins)

    for i, (s, d) in enumerate(events):
        inside = sum(max(0, min(e, s + d) - max(st_, s)) for st_, e in wins)
        instant_in = d == 0 and any(st_ <= s < e for st_, e in wins)
        if inside > 0 or instant_in:
            assert (out[i]["start_ns"], out[i]["duration_ns"]) == (wins[0][0] + before(s), inside)
        else:
            assert i not in out


def test_a_runs_ranks_are_cut_to_the_same_windows(store):
    """tp2_nccl_slow_gpu: each rank's steps are separated by gaps of their own (95 us on rank 0, 159 us on rank 1).
    Cut to its own steps and laid end to end, each rank's clock moved by its own gaps: the critical path of
    `--step all` read "70.23 ms (53.3%)" held by rank 1's GEMM, where the same steps uncut read 82.85 ms (62.8%),
    and crossed at other collectives. Each rank still keeps its own steps (from the raw JSON here), but only time
    in no rank's step is removed, the same for both: the paths are those of the uncut run."""
    run = FIXTURES / "torch" / "multirank" / "tp2_nccl_slow_gpu"
    spans = [span for rank in (0, 1) for span in torch_raw(run / f"rank{rank}.json.gz")[0].values()]
    cut = analyze_json(str(run), "--step", "all", "--rule", "critical-path")
    windows = sorted([w["start_ns"], w["end_ns"]] for w in cut["window"]["windows"])  # each rank's own steps
    assert windows == sorted([s, e] for s, e in spans)
    gaps = [sorted(torch_raw(run / f"rank{rank}.json.gz")[0].items()) for rank in (0, 1)]
    assert len({steps[1][1][0] - steps[0][1][1] for steps in gaps}) == 2  # the ranks' own gaps differ
    whole = analyze_json(str(run), "--rule", "critical-path")
    [a], [b] = whole["findings"], cut["findings"]
    for key in ("length_ns", "wait_ns", "other_rank_ns", "crossings", "held_pct", "per_step", "ranks"):
        assert a["metrics"][key] == b["metrics"][key], key


def test_a_window_of_a_run_counts_from_the_runs_first_event(store):
    """`--window 10:20` of a run: one window for every rank, 10 to 20 ms after the run's first event (the
    earliest timed event of any rank, from the raw JSON), not after each rank's own first one."""
    run = FIXTURES / "torch" / "multirank" / "tp2_nccl_slow_gpu"
    firsts = []
    for rank in (0, 1):
        with gzip.open(run / f"rank{rank}.json.gz", "rt") as fh:
            raw = json.load(fh, parse_float=Decimal)
        # the profiler's own "Trace" span is no event of the trace (the reader keeps it as metadata)
        firsts.append(min(us_to_ns(e["ts"]) for e in raw["traceEvents"]
                          if e.get("ph") == "X" and e.get("cat") != "Trace"))
    assert firsts[0] != firsts[1]
    doc = analyze_json(str(run), "--window", "10:20", "--rule", "gpu-idle")
    origin = min(firsts)
    assert sorted((w["start_ns"], w["end_ns"]) for w in doc["window"]["windows"]) == \
        [(origin + 10_000_000, origin + 20_000_000)] * 2
