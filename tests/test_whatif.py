"""Issue 24 item 5: ``traceparse whatif`` (measure :mod:`traceparse.measures.whatif`, engine
:mod:`traceparse.measures.replay`).

A handwritten step pins every edit's prediction, computed by hand from the documented semantics; on the real runs
the oracles read the raw JSON (gzip + json) and share no code with traceparse: step windows, self times.
"""

from __future__ import annotations

import functools
import json
import re
import statistics
from pathlib import Path

import polars as pl
import pytest

from helpers import (FIXTURES, REPO, gpu, host, raw_events, raw_steps, run_cli, self_time, table,
                     us_to_ns, whatif_json)
from traceparse.errors import InputError
from traceparse.figures import fmt_ns
from traceparse.measures.whatif import Drop, Scale, parse_drop, parse_scale, scale_keys, what_if

SAMPLES = REPO.parent / "shared" / "samples"
SLOW = SAMPLES / "multirank" / "gloo4_resnet18_bs16_slow_rank2"
BALANCED = SAMPLES / "multirank" / "gloo4_resnet18_bs16"
MULTIRANK = FIXTURES / "torch" / "multirank"
needs_samples = pytest.mark.skipif(not SLOW.exists(), reason="the shared multirank samples are not here")


# -- one handwritten step, every edit by hand -------------------------------------------------------------------
#: Op A (10–110) runs op B (30–50) and launches a GEMM kernel (launch call 60–70, correlation 7; the kernel runs
#: 80–260); then a synchronisation (120–280) waits for it; the step annotation ends at 300.
STEP = [host("marker", "ProfilerStep#1", 0, 300), host("op", "A", 10, 110), host("op", "B", 30, 50),
        host("api", "cudaLaunchKernel", 60, 70, correlation_id=7), host("api", "cudaDeviceSynchronize", 120, 280),
        gpu("ampere_sgemm_128x64_nn", 80, 260, correlation_id=7)]


def predicted(drops=(), scales=(), **kw) -> int:
    result = what_if(table(*STEP), drops, scales, **kw)
    (row,) = result.steps.iter_rows(named=True)
    assert row["measured_ns"] == 300
    return row["predicted_ns"]


def test_no_edit_gives_back_the_step():
    assert predicted() == 300


@pytest.mark.parametrize("drops, scales, expected", [
    # A's own time (10–30, 50–60, 70–110: 70 ns) gone: the launch at 30, the kernel at 30 + its 20 ns latency,
    # 180 ns long; the sync returns its 20 ns wake-up after it, the step 20 ns later: 50 + 180 + 20 + 20
    ([Drop("A")], [], 270),
    # the kernel takes 90 ns: it ends at 170, the sync at 190, the step at 210
    ([], [Scale("gemm", 0.5)], 210),
    # no kernel time: the sync's own time (it only ever waited) weighs nothing; 80 + 20 + 20 + 20
    ([], [Scale("kernel", 0.0)], 140),
    # both: the kernel 50–140, the sync at 160, the step at 180
    ([Drop("A")], [Scale("gemm", 0.5)], 180),
    # the launch call's own time is off the path (the kernel holds the step): nothing gained
    ([Drop("cudaLaunch*")], [], 300),
    # no copy in the step: nothing changes
    ([], [Scale("memcpy", 0.0)], 300),
])
def test_each_edit_by_hand(drops, scales, expected):
    assert predicted(drops, scales) == expected


def test_the_new_path_tiles_the_predicted_step():
    result = what_if(table(*STEP), [Drop("A")], [Scale("gemm", 0.5)])
    assert result.path_ns == 180
    parts = {(t["kind"], t["name"]): t["per_step_ns"] for t in result.top}
    assert parts == {("kernel", "ampere_sgemm_128x64_nn"): 90, ("untraced", "(nothing traced in ProfilerStep#N)"): 30,
                     ("sync", "cudaDeviceSynchronize"): 20, ("launch", "cudaLaunchKernel"): 20,
                     ("host op", "B"): 20}
    (drop, scale) = result.applied
    assert (drop.text, drop.calls, drop.removed_ns, drop.by_rank) == ("--drop A", 1, 70, {None: 70})
    assert (scale.text, scale.calls, scale.removed_ns, scale.by_rank) == ("--scale gemm=0.5", 1, 90, {None: 90})


def test_edits_are_parsed_and_bad_ones_are_one_line_errors():
    assert parse_drop("aten::mm@3") == Drop("aten::mm", 3)
    assert parse_drop("a@b") == Drop("a@b")
    assert parse_scale("gemm=0.5") == Scale("gemm", 0.5)
    assert parse_scale("communication=0.8") == Scale("comm", 0.8)
    keys = scale_keys()
    assert keys[:5] == ["kernel", "memcpy", "memset", "comm", "communication"]
    assert {"gemm", "convolution", "normalization", "other"} <= set(keys)
    with pytest.raises(InputError) as e:
        parse_scale("tensor=2")
    assert str(e.value) == f"--scale 'tensor=2': unknown kind or category 'tensor'; valid: {', '.join(keys)}"
    with pytest.raises(InputError) as e:
        parse_scale("gemm=-1")
    assert str(e.value) == "--scale 'gemm=-1': FACTOR a number ≥ 0, got '-1'"
    with pytest.raises(InputError) as e:
        what_if(table(*STEP), [Drop("C")])
    assert str(e.value) == "--drop C: no host op or annotation is named 'C' (exactly or as a glob)"
    with pytest.raises(InputError) as e:
        what_if(table(*STEP), [Drop("A", 1)])
    assert str(e.value) == "--drop A@1: no rank 1 in the trace (one trace without ranks)"
    with pytest.raises(InputError) as e:
        what_if(table(*STEP), balance=True)
    assert str(e.value).startswith("--balance: the trace is not a run of several ranks")


def test_a_trace_without_steps_or_threads_cannot_be_replayed():
    with pytest.raises(InputError) as e:
        what_if(table(*STEP[1:]))  # no step annotation, no optimizer mark
    assert str(e.value) == ("no steps to replay: the trace has no ProfilerStep#N, no step range and no optimizer "
                            "mark (whatif predicts step times)")
    with pytest.raises(InputError) as e:
        what_if(table(gpu("k1", 0, 10), gpu("k2", 20, 30)))
    assert str(e.value) == ("no host events on a thread: whatif needs the host's program order (no host events: "
                            "only the GPU streams' order can be replayed)")


# -- stream order where activities overlap --------------------------------------------------------------------------
def test_stream_order_keeps_the_backlog_of_overlapping_activities():
    """k2 starts 10 ns before k1 ends (a programmatic dependent launch), k3 inside k2, k4 after both: each waits for
    the activity before it that ended last (k4 for k2, not for k3, which ended first); one that overlaps starts after
    its predecessor started and ends after it ended; so a replay with k1 twice as long delays k2, k3 and k4."""
    from traceparse.measures import dependency_graph
    from traceparse.measures.critical_path import replay

    events = table(host("marker", "ProfilerStep#1", 0, 400),
                   *[host("api", "cudaLaunchKernel", 10 + 20 * i, 20 + 20 * i, correlation_id=i + 1) for i in range(4)],
                   gpu("k1", 100, 200, correlation_id=1), gpu("k2", 190, 250, correlation_id=2),
                   gpu("k3", 240, 245, correlation_id=3), gpu("k4", 260, 300, correlation_id=4))
    graph = dependency_graph(events)
    # event ids: 0 the step, 1-4 the launches, 5-8 k1-k4; node 2e its start, 2e + 1 its end
    stream = sorted(graph.filter(pl.col("edge") == "stream").select("src_node", "dst_node", "segment", "gap_ns").rows())
    assert stream == [(10, 11, "kernel", 100), (10, 12, "queue", 90), (11, 13, "kernel", 50),
                      (12, 13, "kernel", 60), (12, 14, "queue", 50), (13, 16, "queue", 10), (14, 15, "kernel", 5),
                      (16, 17, "kernel", 40)]
    k1 = (pl.col("edge") == "stream") & (pl.col("src_node") == 10) & (pl.col("dst_node") == 11)
    at = dict(((t, n), r) for t, n, _, r in replay(graph, pl.when(k1).then(200).otherwise(pl.col("weight_ns")))
              .iter_rows())
    # k1 ends at 300; k2 (started 90 ns after k1) ends 50 ns after it; k3 5 ns after its start 50 ns after k2's;
    # k4 10 ns after k2's end
    assert (at[("t", 11)], at[("t", 13)], at[("t", 15)], at[("t", 16)], at[("t", 17)]) == (300, 350, 245, 360, 400)


# -- the real runs -------------------------------------------------------------------------------------------------
#: Each raw rank file parsed once for the module (the oracles below read the same files many times).
raw_events = functools.lru_cache(maxsize=None)(raw_events)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """One store for the module: each run is ingested once."""
    return str(tmp_path_factory.mktemp("whatif") / "store")


def run_steps(folder: Path) -> dict[tuple[int, int], int]:
    """{(rank, N): duration} of the host-side ProfilerStep#N annotations of every rank file, ns."""
    return {(int(path.name[4:].split(".")[0]), n): end - start for path in sorted(folder.glob("rank*.json.gz"))
            for n, (start, end) in raw_steps(path).items()}


RUNS = [MULTIRANK / "nccl2_slow_rank1", MULTIRANK / "nccl2_balanced", SLOW, BALANCED]


@pytest.mark.parametrize("folder", RUNS, ids=lambda p: p.name)
def test_with_no_edit_the_replay_gives_back_every_measured_step(store, folder):
    if not folder.exists():
        pytest.skip("the shared multirank samples are not here")
    doc = whatif_json(store, folder)
    steps = run_steps(folder)
    assert sorted((r["rank"], r["step"]) for r in doc["steps"]) == sorted(steps)
    for r in doc["steps"]:
        raw = steps[(r["rank"], r["step"])]
        assert r["measured_ns"] == raw
        assert abs(r["predicted_ns"] - raw) <= 0.02 * raw
    assert doc["edits"] == [] and doc["command"] == "whatif"


def self_times(events: list[dict], name: str, start: int, end: int) -> list[int]:
    """Self time of every ``name`` event starting in [start, end), ns."""
    return [self_time(events, e) for e in events if e["name"] == name and start <= us_to_ns(e["ts"]) < end]


def delaying_op(folder: Path, slow: int) -> tuple[str, dict[int, int]]:
    """The host operator whose longest call on rank ``slow`` exceeds the median rank's longest call most, and that
    call's self time per step on ``slow``: found in the raw JSON."""
    longest: dict[int, dict[str, int]] = {}
    for path in sorted(folder.glob("rank*.json.gz")):
        rank = int(path.name[4:].split(".")[0])
        per: dict[str, int] = {}
        for e in raw_events(path):
            if e.get("cat") == "cpu_op":
                per[e["name"]] = max(per.get(e["name"], 0), us_to_ns(e["dur"]))
        longest[rank] = per
    excess = {n: d - statistics.median(longest[r].get(n, 0) for r in longest)
              for n, d in longest[slow].items()}
    name = max(excess, key=excess.get)
    events = raw_events(folder / f"rank{slow}.json.gz")
    windows = raw_steps(folder / f"rank{slow}.json.gz")
    return name, {n: max(self_times(events, name, s, t)) for n, (s, t) in windows.items()}


def twin_mean_step(folder: Path) -> float:
    steps = run_steps(folder)
    return sum(steps.values()) / len(steps)


@needs_samples
@pytest.mark.parametrize("edit", ["--balance", "--drop"])
def test_removing_rank_2s_delay_gains_its_sleep_on_every_rank(store, edit):
    """``--balance`` and ``--drop`` of rank 2's delaying op (found in the raw trace: the op whose longest call
    exceeds the median rank's most) take its sleep off every rank's steps: each rank's step gains at least 90%
    of that step's sleep and at most the sleep plus 5% of the step."""
    name, sleeps = delaying_op(SLOW, 2)
    assert name == "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
    assert min(sleeps.values()) > 55_000_000
    args = ["--balance"] if edit == "--balance" else ["--drop", f"{name}@2"]
    doc = whatif_json(store, SLOW, *args)
    steps = run_steps(SLOW)
    for r in doc["steps"]:
        gain = steps[(r["rank"], r["step"])] - r["predicted_ns"]
        assert 0.9 * sleeps[r["step"]] <= gain <= sleeps[r["step"]] + 0.05 * steps[(r["rank"], r["step"])], r
    if edit == "--drop":
        (e,) = doc["edits"]
        assert e["ranks"] == [2] and e["names"] == [name]
        # the work taken out: every call's self time on rank 2, per step (raw JSON)
        events = raw_events(SLOW / "rank2.json.gz")
        windows = [(us_to_ns(x["ts"]), us_to_ns(x["ts"]) + us_to_ns(x["dur"])) for x in events
                   if x.get("cat") == "user_annotation" and x["name"].startswith("ProfilerStep#")]
        own = sum(sum(self_times(events, name, a, b)) for a, b in windows) / len(windows)
        assert e["removed_per_step_by_rank"] == {"2": pytest.approx(own, rel=1e-3)}
    # the sleep is off the predicted path: it is no longer its largest part
    assert all(t["name"] != name for t in doc["path"]["top"])


@needs_samples
@pytest.mark.xfail(strict=True, reason="the slow run's all_reduces themselves ran 1.66× as long after their last "
                                       "rank joined as the twin's (test below): a replay of the slow run keeps "
                                       "them, so it predicts ~77 ms against the twin's 50.5 ms")
@pytest.mark.parametrize("edit", ["--balance", "--drop"])
def test_balanced_prediction_meets_the_twin_within_15_pct(store, edit):
    name, _ = delaying_op(SLOW, 2)
    doc = whatif_json(store, SLOW, *(["--balance"] if edit == "--balance" else ["--drop", f"{name}@2"]))
    twin = twin_mean_step(BALANCED)
    assert abs(doc["mean"]["predicted_ns"] - twin) <= 0.15 * twin


def collective_times(folder: Path) -> list[float]:
    """Per gloo all_reduce instance (k-th long ``gloo:all_reduce`` annotation of every rank), the time from its
    last rank's joining (annotation start) to the mean rank's leaving (annotation end), ns."""
    per_rank = []
    for path in sorted(folder.glob("rank*.json.gz")):
        per_rank.append(sorted(((us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"])) for e in raw_events(path)
                                if e["name"] == "gloo:all_reduce" and us_to_ns(e["dur"]) > 1_000_000)))
    out = []
    for k in range(len(per_rank[0])):
        last = max(r[k][0] for r in per_rank)
        out.append(sum(r[k][1] for r in per_rank) / len(per_rank) - last)
    return out


@needs_samples
def test_why_the_twin_is_missed_the_slow_runs_collectives_are_slower(store):
    """The miss above, measured in the raw JSON: every all_reduce of the slow run took longer after its last rank
    joined than the same all_reduce of the balanced twin, 1.5× as long or more in all, and the prediction keeps the
    slow run's: it is within 15% of the twin's step plus the all_reduces' extra time per step."""
    slow, twin = collective_times(SLOW), collective_times(BALANCED)
    assert len(slow) == len(twin) == 6
    assert all(s > t for s, t in zip(slow, twin)) and sum(slow) >= 1.5 * sum(twin)
    extra_per_step = (sum(slow) - sum(twin)) / 3
    doc = whatif_json(store, SLOW, "--balance")
    expected = twin_mean_step(BALANCED) + extra_per_step
    assert abs(doc["mean"]["predicted_ns"] - expected) <= 0.15 * expected


def test_a_trimmed_run_says_what_it_cannot_replay(store):
    """nccl2_slow_rank1 keeps only the communication operators and annotations: rank 1's sleep in its gradient
    hook is untraced time. --balance does not guess it away: the steps stay within 10% of their measured time
    (the balanced twin measured a third of it), and it says which rank's path holds time it cannot replay."""
    folder = MULTIRANK / "nccl2_slow_rank1"
    doc = whatif_json(store, folder, "--balance")
    steps = run_steps(folder)
    for r in doc["steps"]:
        assert r["predicted_ns"] >= 0.9 * steps[(r["rank"], r["step"])]
    twin = twin_mean_step(MULTIRANK / "nccl2_balanced")
    assert doc["mean"]["predicted_ns"] > 2.5 * twin
    assert any("is time on rank 1 that the trace does not show" in line for line in doc["cannot_replay"])
    assert doc["missing"] == [
        "no runtime calls (launches, synchronisations): no wait of the host for the GPU, nor for another thread "
        "but at a collective's end, can be replayed",
        "no operators (only annotations and collective calls): the host's own work is untraced time, replayed as "
        "measured"]
    code, out, err = run_cli("--store", store, "whatif", str(folder), "--drop",
                             "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad@1")
    assert code == 2 and out == ""
    assert err == ("traceparse: error: run nccl2_slow_rank1: --drop autograd::engine::evaluate_function: "
                   "torch::autograd::AccumulateGrad@1: no host op or annotation on rank 1 is named "
                   "'autograd::engine::evaluate_function: torch::autograd::AccumulateGrad' (exactly or as a glob)\n")


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    store = str(tmp_path / "store")
    ncu = next(iter(sorted((FIXTURES / "ncu").glob("*.csv"))))
    code, out, err = run_cli("--store", store, "whatif", str(ncu))
    assert code == 2 and out == "" and "Traceback" not in err
    *warnings, line = err.splitlines()  # the reader's own warnings about the file, then one error line
    assert all(w.startswith("traceparse: warning: ") for w in warnings)
    assert line == f"traceparse: error: {ncu.name}: no timeline to replay: the trace has no events placed in time"
    code, out, err = run_cli("--store", store, "whatif", str(MULTIRANK / "nccl2_balanced"), "--scale", "tensor=2")
    assert code == 2 and err.startswith("traceparse: error: --scale 'tensor=2': unknown kind or category 'tensor'; "
                                        "valid: kernel, memcpy, memset, comm, communication, ")


def test_text_view_names_the_edits_and_the_mean(tmp_path):
    code, out, err = run_cli("--store", str(tmp_path / "store"), "--width", "100", "whatif",
                             str(MULTIRANK / "nccl2_balanced"), "--scale", "comm=0.5")
    assert code == 0, err
    text = " ".join(out.split())
    assert text.startswith("whatif run nccl2_balanced ")
    assert "--scale comm=0.5: " in text and "mean step: " in text and "predicted critical path: " in text


def test_without_a_trace_it_replays_the_last_ingested_one_as_analyze_does(tmp_path):
    """``whatif`` and ``show`` with no TRACE take the trace (or run) ingested last, as ``analyze`` does: the same
    document as naming it; an empty store is one line and exit 2, not argparse's usage text."""
    store = str(tmp_path / "store")
    code, out, err = run_cli("--store", store, "whatif", "--json")
    assert (code, out, err) == (2, "", f"traceparse: error: no store at {store}: ingest a trace first, or give "
                                       "--store\n")
    run = str(MULTIRANK / "nccl2_balanced")
    assert run_cli("--store", store, "ingest", run)[0] == 0
    named = run_cli("--store", store, "whatif", run, "--scale", "comm=0.5", "--json")
    last = run_cli("--store", store, "whatif", "--scale", "comm=0.5", "--json")
    assert named[0] == last[0] == 0
    assert json.loads(last[1]) == json.loads(named[1])
    assert json.loads(last[1])["trace"]["label"] == "run nccl2_balanced"
    trace = FIXTURES / "torch" / "resnet18_bs16.json.gz"
    assert run_cli("--store", store, "ingest", str(trace))[0] == 0
    code, out, err = run_cli("--store", store, "show", "--json")
    assert code == 0, err
    assert json.loads(out)["source_paths"] == [str(trace)]


# -- the DDP twins (fixtures/make_whatif_twins.py: the same job balanced, with a slow data loader, a slow hook) -----
DDP = MULTIRANK


def planted_delay(variant: str, slow: int) -> str:
    """The slow rank's delaying event, found in the raw JSON: of its operators and annotations of 20 ms or more
    (not the step, the collectives, DDP's forward), the one with the largest self time; on the other ranks no
    event of that name has 5 ms of it."""
    from helpers import self_time

    skip = ("ProfilerStep#", "gloo:", "c10d::", "DistributedDataParallel", "nccl:")
    per_rank = {r: raw_events(DDP / variant / f"rank{r}.json.gz") for r in range(4)}
    mine = per_rank[slow]
    long = [e for e in mine if e.get("cat") in ("cpu_op", "user_annotation") and us_to_ns(e["dur"]) >= 20_000_000
            and not e["name"].startswith(skip)]
    name = max(long, key=lambda e: self_time(mine, e))["name"]
    for r, events in per_rank.items():
        if r != slow:
            assert all(self_time(events, e) < 5_000_000 for e in events if e["name"] == name)
    return name


@pytest.mark.parametrize("variant, slow", [("ddp4_slow_hook", 2), ("ddp4_slow_loader", 1)])
@pytest.mark.parametrize("edit", ["--balance", "--drop"])
def test_the_ddp_twins_balanced_prediction_meets_the_balanced_twin(store, variant, slow, edit):
    """Issue 24's acceptance on twins made minutes apart on one H100 (gloo, 4 ranks, 40 ms planted on one rank: in
    a gradient hook, or in the data loader): ``--balance``, or ``--drop`` of the delaying event found in the raw
    JSON, predicts the balanced twin's mean ProfilerStep#N time (raw JSON) within 15%."""
    args = ["--balance"] if edit == "--balance" else ["--drop", f"{planted_delay(variant, slow)}@{slow}"]
    doc = whatif_json(store, DDP / variant, *args)
    slow_steps = run_steps(DDP / variant)
    assert doc["mean"]["measured_ns"] == pytest.approx(sum(slow_steps.values()) / len(slow_steps), abs=1)
    twin = twin_mean_step(DDP / "ddp4_balanced")
    assert doc["mean"]["measured_ns"] > 1.6 * twin  # the delay is there to be taken out
    assert abs(doc["mean"]["predicted_ns"] - twin) <= 0.15 * twin, (doc["mean"], twin)


def test_the_path_table_reads_whole_at_80_columns(store, monkeypatch):
    """At COLUMNS=80 the predicted path's table keeps every column and its words whole (it showed "com…on [1]"
    for communication and dropped "share"): each row's rank, thread and kind as ``--json`` gives them, the
    communication rows on the threads that ran the rank's gloo all-reduces (raw JSON)."""
    folder = DDP / "ddp4_slow_loader"
    top = whatif_json(store, folder, "--balance")["path"]["top"]
    monkeypatch.setenv("COLUMNS", "80")
    code, out, err = run_cli("--store", store, "whatif", str(folder), "--balance")
    assert code == 0, err
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "not shown at this width" not in out
    table = out[out.index("predicted critical path"):]
    rows = [[c.strip() for c in line.split("│")] for line in table.splitlines() if line.count("│") == 5]
    # a lane named after its thread ("thread 1513 (pt_gloo_runloop)") may be cut to a numbered key under the table
    keys = {k: v.strip() for k, v in re.findall(r"^\[(\d+)\] (.+)$", table, re.M)}
    whole = lambda cell: keys[m.group(1)] if (m := re.search(r"\[(\d+)\]$", cell)) else cell  # noqa: E731
    assert [(int(r[0]), whole(r[1]), r[2], r[5]) for r in rows] == [
        (t["rank"], t["lane"], t["kind"], f"{t['share_pct']:.1f}%") for t in top]
    assert "communication" in {r[2] for r in rows}  # the word that was cut
    for rank, lane, kind, _ in ((int(r[0]), whole(r[1]), r[2], r) for r in rows):
        if kind == "communication":
            tids = {e["tid"] for e in raw_events(folder / f"rank{rank}.json.gz") if e["name"] == "gloo:all_reduce"}
            assert int(lane.removeprefix("thread ").split()[0]) in tids, (rank, lane)


@pytest.mark.parametrize("folder", [MULTIRANK / "fsdp2_slow_hook", MULTIRANK / "ddp4_balanced"], ids=lambda p: p.name)
@pytest.mark.parametrize("edit", [["--scale", "gemm=0.5"], ["--scale", "kernel=0.5"], ["--scale", "comm=0.5"]])
def test_a_speed_up_never_makes_a_step_slower(store, folder, edit):
    """Halving GEMM time made step 3 of rank 0 of the FSDP2 run 3.9 ms (5.8%) *slower*, and on the DDP run step 5
    lost exactly the 176.1 us step 4 gained: the whole trace was replayed at once, so a step that started earlier
    waited for a node no edge explains (kept where it was measured), and read as slower. Each step is replayed from
    its measured start now: with speed-ups only, every step's gain is between 0 and the step, and the mean's gain is
    the mean of the steps'."""
    doc = whatif_json(store, folder, *edit)
    steps = run_steps(folder)
    assert sorted((r["rank"], r["step"]) for r in doc["steps"]) == sorted(steps)
    for r in doc["steps"]:
        assert r["measured_ns"] == steps[(r["rank"], r["step"])]
        assert 0 <= r["gain_ns"] == r["measured_ns"] - r["predicted_ns"] <= r["measured_ns"], r
    gains = [r["gain_ns"] for r in doc["steps"]]
    assert doc["mean"]["gain_ns"] == pytest.approx(sum(gains) / len(gains), abs=1)


def test_cannot_replay_names_the_untraced_part_with_the_most_time(tmp_path):
    """It named the untraced part with the most segments: "mostly (nothing traced on the thread)" (1.14 ms a step)
    beside "(nothing traced in ProfilerStep#N)" (1.39 ms) on the ResNet18 fixture."""
    code, out, err = run_cli("--store", str(tmp_path / "s"), "whatif",
                             str(FIXTURES / "torch" / "resnet18_bs16.json.gz"), "--json", "--top", "1000")
    assert code == 0, err
    doc = json.loads(out)
    untraced: dict[str, int] = {}
    for part in doc["path"]["top"]:
        if part["kind"] == "untraced":
            untraced[part["name"]] = untraced.get(part["name"], 0) + part["per_step_ns"]
    largest = max(untraced, key=untraced.get)
    assert largest == "(nothing traced in ProfilerStep#N)" and len(untraced) == 2
    (note,) = doc["cannot_replay"]
    assert f", mostly {largest}: replayed as measured" in note


@pytest.mark.parametrize("run", ["gloo4_slow_rank2", "nccl2_slow_rank1"])
def test_balance_says_when_it_cannot_touch_the_straggler(tmp_path, run):
    """The trimmed gloo4_slow_rank2 (rank 2 sleeps 60 ms a step in a hook its trace does not record) predicted
    "gain 426.6 us (0.3%)" from evening rank 3's operators, beside a straggler the others wait 74 ms a step for.
    The balance says, before its prediction, that it takes nothing off the straggler and keeps that wait."""
    folder = MULTIRANK / run
    store = str(tmp_path / "s")
    code, out, err = run_cli("--store", store, "analyze", str(folder), "--rule", "stragglers", "--json")
    assert code == 0, err
    m = json.loads(out)["findings"][0]["metrics"]
    rank, wait = m["straggler_rank"], m["wait_caused_per_step_ns"]
    code, out, err = run_cli("--store", store, "whatif", str(folder), "--balance", "--json")
    assert code == 0, err
    doc = json.loads(out)
    [edit] = doc["edits"]
    assert not edit["removed_per_step_by_rank"].get(str(rank))  # nothing recorded on the straggler to even
    note = (f"--balance evens the work the trace records, and takes nothing off rank {rank}, which the others wait "
            f"for {fmt_ns(wait)} a step (stragglers)")
    assert doc["notes"][0].startswith(note)
    code, out, err = run_cli("--store", store, "--width", "300", "whatif", str(folder), "--balance")
    lines = out.splitlines()
    assert lines[2].startswith("note: " + note)  # right under the edit, before the table and the gain


def test_balance_that_removes_the_stragglers_excess_needs_no_note(tmp_path):
    code, out, err = run_cli("--store", str(tmp_path), "whatif", str(MULTIRANK / "ddp4_slow_loader"), "--balance",
                             "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert "edit_notes" not in doc and not any(n.startswith("--balance") for n in doc["notes"])
    assert doc["edits"][0]["removed_per_step_by_rank"]["1"] > 40_000_000  # rank 1's DataLoader, evened


def test_a_caveat_share_is_of_the_path_the_table_shares_are_of(tmp_path):
    """"31.41 ms ... 23.2%" in the path table and "31.41 ms per step of the predicted path (23.0%)" in the caveat
    under it: two shares of one figure. Both are of the predicted path's length now."""
    import re

    from traceparse.figures import fmt_pct

    code, out, err = run_cli("--store", str(tmp_path), "whatif", str(MULTIRANK / "gloo4_slow_rank2"), "--balance",
                             "--top", "100", "--json")  # every part of the path in the table
    assert code == 0, err
    doc = json.loads(out)
    assert doc["cannot_replay"]
    untraced: dict[int, list[dict]] = {}
    for t in doc["path"]["top"]:
        if t["kind"] == "untraced":
            untraced.setdefault(t["rank"], []).append(t)
    compared = 0
    for line in doc["cannot_replay"]:
        ms, pct = re.match(r"([\d.]+) ms per step of the predicted path \(([\d.]+)%\)", line).groups()
        rank = int(re.search(r"on rank (\d+)", line).group(1))
        rows = untraced.get(rank, [])
        if rows and abs(sum(r["per_step_ns"] for r in rows) / 1e6 - float(ms)) < 0.01:  # all of it in the table
            assert f"({fmt_pct(sum(r['share_pct'] for r in rows))})" in line, line
            compared += 1
    assert compared == len(doc["cannot_replay"]) >= 1


def test_an_edits_count_is_of_what_its_time_per_step_covers(tmp_path):
    """The nsys capture of ResNet18 holds 1,114 kernels, 372 of them in its one step (``train_step``): the count
    beside "4.572 ms less work per step" is of those 372 (counted here from the raw SQLite export), and the whole
    trace's count is said as such; it read "1,114 events" beside the step's figure."""
    path = SAMPLES / "nsys" / "resnet18_bs16.sqlite.gz"
    if not path.exists():
        pytest.skip("the shared nsys sample is not here")
    import gzip
    import sqlite3

    db = tmp_path / "capture.sqlite"
    db.write_bytes(gzip.decompress(path.read_bytes()))
    con = sqlite3.connect(db)
    (a, b), = con.execute("SELECT start, end FROM NVTX_EVENTS WHERE text = 'train_step'").fetchall()
    total, inside = con.execute("SELECT COUNT(*), SUM(end > ? AND end <= ?) FROM CUPTI_ACTIVITY_KIND_KERNEL",
                                (a, b)).fetchone()
    con.close()
    assert (total, inside) == (1114, 372)
    store = str(tmp_path / "store")
    code, out, err = run_cli("--store", store, "--width", "120", "whatif", str(path), "--scale", "kernel=0")
    assert code == 0, err
    assert out.splitlines()[1] == ("--scale kernel=0: 372 events in 1 step (1,114 in the whole trace), 4.572 ms less "
                                   "work per step")
    code, out, err = run_cli("--store", store, "whatif", str(path), "--scale", "kernel=0", "--json")
    edit = json.loads(out)["edits"][0]
    assert (edit["calls"], edit["calls_in_steps"], edit["step_windows"]) == (total, inside, 1)


def test_a_runs_edit_counts_the_events_in_its_ranks_steps(tmp_path):
    """On a run the count is of the events in every rank's steps, and says over how many (3 steps × 4 ranks of
    gloo4_balanced): its kernels ending inside a ProfilerStep#N annotation, counted in the raw rank files."""
    folder = MULTIRANK / "gloo4_balanced"
    total = inside = 0
    for rank in range(4):
        path = folder / f"rank{rank}.json.gz"
        steps = raw_steps(path).values()
        ends = [us_to_ns(e["ts"]) + us_to_ns(e["dur"]) for e in raw_events(path) if e.get("cat") == "kernel"]
        total += len(ends)
        inside += sum(any(a < end <= b for a, b in steps) for end in ends)
    store = str(tmp_path / "store")
    code, out, err = run_cli("--store", store, "whatif", str(folder), "--scale", "kernel=0", "--json")
    assert code == 0, err
    edit = json.loads(out)["edits"][0]
    assert (edit["calls"], edit["calls_in_steps"], edit["step_windows"]) == (total, inside, 12)
    code, out, err = run_cli("--store", store, "--width", "200", "whatif", str(folder), "--scale", "kernel=0")
    whole = f" ({total:,} in the whole trace)" if total > inside else ""
    assert out.splitlines()[1].startswith(f"--scale kernel=0: {inside:,} events in 3 steps of each of 4 ranks{whole}; "
                                          "work per step: rank ")


def test_an_edit_after_another_says_its_time_was_left_by_it(tmp_path):
    """``--scale kernel=0 --scale gemm=0.5``: the GEMMs have no time left once every kernel takes none; the line
    said "no time in the steps", as if the GEMMs took none. Edits apply in the order given, and it says so."""
    trace, store = str(FIXTURES / "torch" / "resnet18_bs16.json.gz"), str(tmp_path / "s")
    code, out, err = run_cli("--store", store, "--width", "200", "whatif", trace, "--scale", "kernel=0",
                             "--scale", "gemm=0.5")
    assert code == 0, err
    gemm = next(line for line in out.splitlines() if line.startswith("--scale gemm=0.5:"))
    assert gemm.endswith(", no time left in the steps after the edits before it (edits apply in the order given)")
    code, out, err = run_cli("--store", store, "--width", "200", "whatif", trace, "--scale", "gemm=0.5",
                             "--scale", "kernel=0")
    gemm = next(line for line in out.splitlines() if line.startswith("--scale gemm=0.5:"))
    assert gemm.endswith("less work per step")


def test_an_event_s_time_taken_out_is_counted_once():
    """A GPU activity's stream edge and its collective's leave edge are two ways to one end: the larger counts,
    not both; a host event's pieces between its children add up; edges of no event count as they are
    (hand-made edges, said so)."""
    from traceparse.measures.whatif import _per_event

    graph = pl.DataFrame({"trace_id": ["a", "a", "a", "a", "b", "b"], "event_id": [1, 1, 2, 2, None, 3],
                          "edge": ["stream", "leave", "thread", "thread", "thread", "leave"]})
    taken = _per_event(graph, [4.0, 6.0, 1.0, 2.0, 5.0, 0.0])
    assert dict(taken.group_by("trace_id").agg(pl.col("taken").sum()).iter_rows()) == {"a": 9.0, "b": 5.0}

