"""Steps from what the trace has (issue 21, item 4): NVTX ranges ``step N`` keep their numbers, and a torch
trace with no ``ProfilerStep#N`` has one step per ``Optimizer.step#SGD.step``. Both fixtures are real
(fixtures/make_step_fixtures.sh on an H100); the expected steps are read from the raw SQLite / JSON here.
The summary, ``--step all`` and ``--step N`` must agree: same count, same numbers, same durations, same source.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import sqlite3
import statistics
from decimal import Decimal

import polars as pl
import pytest

from helpers import FIXTURES, run_cli, us_to_ns

NSYS = FIXTURES / "nsys" / "mlp_nvtx_steps.sqlite.gz"
TORCH = FIXTURES / "torch" / "mlp_no_profilerstep_60.json.gz"
HOST_CATS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")


def analyze_json(*args: str) -> dict:
    code, out, err = run_cli("analyze", *args, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.fixture(scope="module")
def nsys_steps(tmp_path_factory) -> dict[int, tuple[int, int]]:
    """{N: (start, end)} of the NVTX ranges named ``step N``, read from the SQLite export's NVTX_EVENTS."""
    db_path = tmp_path_factory.mktemp("nsys") / "export.sqlite"
    with gzip.open(NSYS) as src, open(db_path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    db = sqlite3.connect(db_path)
    rows = db.execute("SELECT COALESCE(a.text, s.value), a.start, a.\"end\" FROM NVTX_EVENTS a "
                      "LEFT JOIN StringIds s ON s.id = a.textId WHERE a.\"end\" IS NOT NULL").fetchall()
    db.close()
    out = {}
    for name, start, end in rows:
        m = re.fullmatch(r"step (\d+)", name or "")
        if m:
            assert int(m.group(1)) not in out
            out[int(m.group(1))] = (start, end)
    return out


@pytest.fixture(scope="module")
def torch_steps() -> tuple[list[tuple[int, int]], str]:
    """[(start, end)] of one step per host ``Optimizer.step#SGD.step`` annotation: step k from the end of
    annotation k-1 (step 1: from the first host event) to the end of annotation k; and the annotation's name."""
    with gzip.open(TORCH, "rt") as fh:
        raw = json.load(fh, parse_float=Decimal)["traceEvents"]
    timed = [e for e in raw if e.get("ph") == "X"]
    assert not any(re.fullmatch(r"ProfilerStep#\d+", e["name"]) for e in timed)
    first = min(us_to_ns(e["ts"]) for e in timed if e.get("cat") in HOST_CATS)
    ends = sorted(us_to_ns(e["ts"]) + us_to_ns(e["dur"]) for e in timed
                  if e.get("cat") == "user_annotation" and e["name"].startswith("Optimizer.step#"))
    names = {e["name"] for e in timed if e.get("cat") == "user_annotation" and e["name"].startswith("Optimizer.step#")}
    assert len(names) == 1
    return list(zip([first] + ends[:-1], ends)), names.pop()


# -- NVTX ranges "step 2" .. "step 5" of a real nsys capture ------------------------------------------------------
def test_numbered_nvtx_ranges_are_one_series_keeping_their_numbers(store, nsys_steps):
    assert sorted(nsys_steps) == [2, 3, 4, 5]  # the capture started at iteration 2
    durations = [end - start for _, (start, end) in sorted(nsys_steps.items())]
    doc = analyze_json(str(NSYS), "--step", "all", "--rule", "gpu-idle")
    rows = doc["steps"]
    assert [(r["step"], r["start_ns"], r["dur_ns"]) for r in rows] == \
        [(n, start, end - start) for n, (start, end) in sorted(nsys_steps.items())]
    assert doc["window"]["step_source"] == "range step N"
    [whole] = analyze_json(str(NSYS), "--rule", "gpu-idle")["summary"]
    assert (whole["steps"], whole["step_windows"], whole["step_source"]) == (4, 4, "range step N")
    assert whole["step_time_ns"] == round(statistics.fmean(durations))
    assert (whole["step_min_ns"], whole["step_max_ns"]) == (min(durations), max(durations))
    assert whole["step_stdev_ns"] == round(statistics.stdev(durations))
    [cut] = doc["summary"]  # the summary of --step all: the same steps
    assert {k: cut[k] for k in ("steps", "step_time_ns", "step_source")} == \
        {k: whole[k] for k in ("steps", "step_time_ns", "step_source")}


def test_step_3_is_the_range_named_step_3(store, nsys_steps):
    doc = analyze_json(str(NSYS), "--step", "3", "--rule", "gpu-idle")
    assert [(w["start_ns"], w["end_ns"]) for w in doc["window"]["windows"]] == [nsys_steps[3]]
    assert doc["window"]["label"] == "step 3"
    [summary] = doc["summary"]
    assert (summary["steps"], summary["step_time_ns"]) == (1, nsys_steps[3][1] - nsys_steps[3][0])


def test_nvtx_glob_keeps_the_numbers(store, nsys_steps):
    rows = analyze_json(str(NSYS), "--nvtx", "step *", "--step", "all", "--rule", "gpu-idle")["steps"]
    assert [(r["step"], r["start_ns"]) for r in rows] == [(n, s) for n, (s, _) in sorted(nsys_steps.items())]
    doc = analyze_json(str(NSYS), "--nvtx", "step *", "--step", "4", "--rule", "gpu-idle")
    assert [(w["start_ns"], w["end_ns"]) for w in doc["window"]["windows"]] == [nsys_steps[4]]


def test_the_panel_names_the_series(store, nsys_steps):
    code, out, err = run_cli("analyze", str(NSYS), "--rule", "gpu-idle")
    assert code == 0, err
    assert re.search(r"steps\s+4 \(range step N\), mean ", out)
    code, out, err = run_cli("analyze", str(NSYS), "--step", "7")
    assert code == 2 and err == (f"traceparse: error: --step 7: {NSYS} has no step 7 "
                                 "(its steps, from range step N: 2, 3, 4, 5)\n")


# -- a torch trace whose only step marks are Optimizer.step#SGD.step ----------------------------------------------
def test_one_step_per_optimizer_step_annotation(store, torch_steps):
    spans, name = torch_steps
    assert (len(spans), name) == (60, "Optimizer.step#SGD.step")
    durations = [e - s for s, e in spans]
    doc = analyze_json(str(TORCH), "--step", "all", "--rule", "gpu-idle")
    assert [(r["step"], r["start_ns"], r["dur_ns"]) for r in doc["steps"]] == \
        [(k, s, e - s) for k, (s, e) in enumerate(spans, 1)]
    assert doc["window"]["step_source"] == "one per Optimizer.step#SGD.step"
    [whole] = analyze_json(str(TORCH), "--rule", "gpu-idle")["summary"]
    assert (whole["steps"], whole["step_source"]) == (60, "one per Optimizer.step#SGD.step")
    assert whole["step_time_ns"] == round(statistics.fmean(durations))
    assert (whole["step_min_ns"], whole["step_max_ns"]) == (min(durations), max(durations))
    [cut] = doc["summary"]
    assert (cut["steps"], cut["step_time_ns"], cut["step_source"]) == \
        (whole["steps"], whole["step_time_ns"], whole["step_source"])
    code, out, err = run_cli("analyze", str(TORCH), "--rule", "gpu-idle")
    assert code == 0, err
    assert re.search(r"steps\s+60 \(one per Optimizer\.step#SGD\.step\), mean ", out)


def test_step_n_of_optimizer_marks(store, torch_steps):
    spans, _ = torch_steps
    doc = analyze_json(str(TORCH), "--step", "3", "--rule", "gpu-idle")
    assert [(w["start_ns"], w["end_ns"]) for w in doc["window"]["windows"]] == [spans[2]]
    code, out, err = run_cli("analyze", str(TORCH), "--step", "61")
    assert code == 2 and err == (f"traceparse: error: --step 61: {TORCH} has no step 61 "
                                 "(its steps, from one per Optimizer.step#SGD.step: 1-60)\n")


# -- the rules, on hand-made tables --------------------------------------------------------------------------------
def _events(rows: list[tuple]) -> pl.DataFrame:
    """A normalized table of host rows from (name, start, duration[, kind]) (kind marker unless given)."""
    from traceparse.trace import Trace, TraceMeta

    batch = pl.DataFrame({"kind": [r[3] if len(r) > 3 else "marker" for r in rows], "name": [r[0] for r in rows],
                          "start_ns": [r[1] for r in rows], "duration_ns": [r[2] for r in rows],
                          "pid": [1] * len(rows), "tid": [1] * len(rows)})
    return Trace(batch, TraceMeta(id="t")).events


def steps_of(rows: list[tuple]) -> list[tuple]:
    from traceparse.measures.steps import step_series

    s = step_series(_events(rows))
    return [(r["step"], r["start_ns"], r["duration_ns"], r["source"]) for r in s.iter_rows(named=True)]


def test_a_constant_name_is_numbered_from_1_by_start():
    assert steps_of([("train_step", 300, 50), ("train_step", 100, 50), ("forward", 100, 10)]) == \
        [(1, 100, 50, "range train_step"), (2, 300, 50, "range train_step")]


@pytest.mark.parametrize("names, pattern", [(["iteration 7", "iteration 8"], "iteration N"),
                                            (["iter_12", "iter_13"], "iter_N"), (["step7", "step8"], "stepN")])
def test_names_differing_by_a_trailing_number_keep_it(names, pattern):
    rows = [(n, 100 * (i + 1), 50) for i, n in enumerate(names)]
    assert [(s, src) for s, _, _, src in steps_of(rows)] == \
        [(int(re.search(r"\d+$", n).group()), f"range {pattern}") for n in names]


def test_python_frames_are_no_steps():
    """with_stack's Python frames (region rows; names from TraceLens' and vLLM's real traces) that say "iter" are
    no iteration: 240 ``tree_iter`` frames were taken for 240 steps of 4 us. A step range beside them wins."""
    frames = [("torch/utils/_pytree.py(1462): tree_iter", 10 * i, 4, "region") for i in range(240)]
    frames += [("<frozen _collections_abc>(892): __iter__", 5 + 10 * i, 2, "region") for i in range(6)]
    frames += [("<built-in function iter>", 7, 1, "region")]
    assert steps_of(frames) == []
    assert steps_of(frames + [("train_step", 0, 3000), ("train_step", 3000, 3000)]) == \
        [(1, 0, 3000, "range train_step"), (2, 3000, 3000, "range train_step")]


def test_profiler_steps_come_first_and_the_series_with_most_time_wins():
    assert steps_of([("ProfilerStep#4", 0, 100), ("step 1", 0, 90)]) == [(4, 0, 100, "ProfilerStep#N")]
    assert steps_of([("step 1", 0, 10), ("step 2", 20, 10), ("train_step", 0, 15)]) == \
        [(1, 0, 10, "range step N"), (2, 20, 10, "range step N")]
    assert steps_of([("Optimizer.step#SGD.step", 0, 5), ("step 1", 0, 1)]) == [(1, 0, 1, "range step N")]


def test_optimizer_zero_grad_starts_its_iteration():
    rows = [("Optimizer.zero_grad#SGD.zero_grad", 10, 2), ("aten::mm", 12, 30, "op"),
            ("Optimizer.zero_grad#SGD.zero_grad", 50, 2), ("aten::mm", 52, 30, "op")]
    assert steps_of(rows) == [(1, 10, 40, "one per Optimizer.zero_grad#SGD.zero_grad"),
                              (2, 50, 32, "one per Optimizer.zero_grad#SGD.zero_grad")]


def test_by_trace_each_trace_chooses_its_own_steps_as_if_alone():
    """``step_series(by_trace=True)`` (a group of a run's ranks in one query) gives each trace the steps it has
    alone: here one trace has ProfilerStep#N, one a numbered NVTX series, one a constant name, one optimizer
    marks; on the table as a whole the first source found wins for every trace."""
    from traceparse.measures.steps import step_series

    alone = {"prof": [("ProfilerStep#4", 0, 100), ("step 1", 0, 90)],
             "nvtx": [("step 1", 0, 10), ("step 2", 20, 10), ("train_step", 0, 15)],
             "const": [("train_step", 300, 50), ("train_step", 100, 50)],
             "marks": [("Optimizer.zero_grad#SGD.zero_grad", 10, 2), ("aten::mm", 12, 30, "op"),
                       ("Optimizer.zero_grad#SGD.zero_grad", 50, 2)]}
    table = pl.concat([_events(rows).with_columns(trace_id=pl.lit(t)) for t, rows in alone.items()])
    # and one whose reader marks its steps (JAX's StepTraceAnnotation: group "step"), numbered by name
    marked = _events([("train 3", 0, 40), ("train 4", 50, 40), ("step 1", 0, 95)]).with_columns(
        trace_id=pl.lit("jax"), group=pl.when(pl.col("name").str.starts_with("train")).then(pl.lit("step")))
    table = pl.concat([table, marked])
    got = step_series(table, by_trace=True)
    want = {"prof": [(4, 0, 100, "ProfilerStep#N")],
            "nvtx": [(1, 0, 10, "range step N"), (2, 20, 10, "range step N")],
            "const": [(1, 100, 50, "range train_step"), (2, 300, 50, "range train_step")],
            "marks": [(1, 10, 40, "one per Optimizer.zero_grad#SGD.zero_grad"),
                      (2, 50, 2, "one per Optimizer.zero_grad#SGD.zero_grad")]}
    marked_alone = step_series(marked).iter_rows(named=True)
    assert [(r["step"], r["start_ns"], r["duration_ns"], r["source"]) for r in marked_alone] == \
        [(3, 0, 40, "marked step train N"), (4, 50, 40, "marked step train N")]
    want["jax"] = [(3, 0, 40, "marked step train N"), (4, 50, 40, "marked step train N")]
    for t, steps in want.items():
        if t in alone:
            assert steps_of(alone[t]) == steps  # each alone, through the table-wide path
        assert [(r["step"], r["start_ns"], r["duration_ns"], r["source"])
                for r in got.filter(pl.col("trace_id") == t).iter_rows(named=True)] == steps
    assert set(step_series(table)["source"]) == {"ProfilerStep#N"}  # as one table: the first source wins


def test_a_step_named_by_its_number_alone():
    """TensorFlow's XSpace names each step by its number (``"0"``), one range a GPU (xprof's GPU-multi-worker
    demo): that is step 0, over both GPUs, labelled ``marked step N`` (was "marked step 0 N", steps 1 and 2)."""
    from traceparse.measures.steps import step_series

    rows = _events([("0", 100, 50, "region"), ("0", 110, 60, "region"), ("1", 300, 40, "region")]).with_columns(
        group=pl.lit("step"), pid=pl.lit(None, dtype=pl.Int64), device_id=pl.Series([0, 1, 0], dtype=pl.Int32))
    s = step_series(rows)
    assert [(r["step"], r["start_ns"], r["duration_ns"], r["source"]) for r in s.iter_rows(named=True)] == \
        [(0, 100, 70, "marked step N"), (1, 300, 40, "marked step N")]
