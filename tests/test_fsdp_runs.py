"""Real FSDP2 runs over NCCL on two H100s (fixtures/make_fsdp_fixtures.py, issue 28): a balanced run and two
twins where rank 1 sleeps 30 ms a step, in its ``DataLoader`` annotation or in a gradient hook.

Every expected figure is computed here from the raw JSON (gzip + json, plain loops) and from the step times
the job measured itself (``fsdp2_step_times.json``: ``torch.cuda.synchronize()`` and ``perf_counter`` around
each step), never from traceparse: the collectives of each kind, matched across the ranks (by ``Seq`` where
PyTorch writes it, else the n-th call of each rank), the overlap of communication with compute that FSDP's
prefetching gives, and the straggler with the wait it causes per step.

The fixtures were made on a machine of two GPUs (the lent nvidia-h100-x2: ``torchrun --nproc_per_node=2
fixtures/make_fsdp_fixtures.py OUT`` then ``python fixtures/make_comm_fixtures.py --fsdp OUT``); where they
are missing every test here is skipped, saying so.
"""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

import polars as pl
import pytest

from helpers import FIXTURES, intersect, run_cli, run_of, run_rule, union, us_to_ns, waited_first
from traceparse import measures
from traceparse.figures import fmt_ns

MULTIRANK = FIXTURES / "torch" / "multirank"
RUNS = {v: MULTIRANK / f"fsdp2_{v}" for v in ("balanced", "slow_loader", "slow_hook")}
SLOW = ("slow_loader", "slow_hook")
STEP_TIMES = MULTIRANK / "fsdp2_step_times.json"
MADE = STEP_TIMES.exists() and all((d / "rank1.json.gz").exists() for d in RUNS.values())
pytestmark = pytest.mark.skipif(not MADE, reason="the FSDP2 NCCL fixtures are not made yet (two GPUs needed: "
                                "fixtures/make_fsdp_fixtures.py, issue 28)")
TRUTH = json.loads(STEP_TIMES.read_text()) if MADE else {}
#: NCCL kernel name part -> traceparse's collective (traceparse.expr.COLLECTIVES)
KERNEL_KINDS = {"AllGather": "all_gather", "ReduceScatter": "reduce_scatter", "AllReduce": "all_reduce"}


def kind_of(name: str) -> str | None:
    """The collective of a c10d operator or a ``Collective name`` (``c10d::_allgather_base_``, ``allreduce``),
    for the three kinds these runs call; None for any other (``wait``, ``barrier``)."""
    letters = "".join(ch for ch in name.lower() if ch.isalpha())
    for part, kind in (("allreduce", "all_reduce"), ("reducescatter", "reduce_scatter"), ("allgather", "all_gather")):
        if part in letters:
            return kind
    return None


def raw(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def ranks(folder: Path) -> dict[int, dict]:
    return {int(p.name[4:].split(".")[0]): raw(p) for p in sorted(folder.glob("rank*.json.gz"))}



def xs(doc: dict, cat: str | None = None) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and (cat is None or e.get("cat") == cat)]


def step_windows(doc: dict) -> list[tuple[int, int]]:
    return union((us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"])) for e in xs(doc, "user_annotation")
                 if e["name"].startswith("ProfilerStep#"))


def calls(doc: dict) -> list[dict]:
    """A rank's collective calls in arrival order: ``record_param_comms`` with ``Seq`` where the trace writes it
    (keyed by process group and Seq), else the outermost c10d collective operators of each thread (keyed by
    their order). Each: ``key``, ``collective``, ``arrival`` (ns)."""
    with_seq = [e for e in xs(doc, "cpu_op") if e["name"] == "record_param_comms" and "Seq" in e.get("args", {})
                and kind_of(str(e["args"].get("Collective name")))]
    if with_seq:
        rows = sorted(with_seq, key=lambda e: e["ts"])
        return [{"key": (str(e["args"].get("Process Group Name")), int(e["args"]["Seq"])),
                 "collective": kind_of(e["args"]["Collective name"]), "arrival": us_to_ns(e["ts"])} for e in rows]
    ops = sorted((e for e in xs(doc, "cpu_op") if e["name"].startswith("c10d::") and kind_of(e["name"])),
                 key=lambda e: (e["tid"], e["ts"]))
    outer, end = [], {}
    for e in ops:  # a call inside another of its thread is part of it
        if e["ts"] >= end.get(e["tid"], float("-inf")):
            outer.append(e)
            end[e["tid"]] = e["ts"] + e["dur"]
    outer.sort(key=lambda e: e["ts"])
    return [{"key": i, "collective": kind_of(e["name"]), "arrival": us_to_ns(e["ts"])} for i, e in enumerate(outer)]


def device_calls(doc: dict) -> list[dict]:
    """:func:`calls` with each arrival moved to the call's NCCL kernel (the k-th call of a collective kind runs the
    k-th kernel of that kind, by start): an NCCL call only queues its kernel, and it is the device that waits."""
    kernels: dict[str, list[int]] = {}
    for e in sorted(xs(doc, "kernel"), key=lambda e: e["ts"]):
        kind = next((k for part, k in KERNEL_KINDS.items() if e["name"].startswith("nccl") and part in e["name"]), None)
        if kind:
            kernels.setdefault(kind, []).append((us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"])))
    seen: dict[str, int] = {}
    out = []
    for c in calls(doc):
        k = seen.get(c["collective"], 0)
        seen[c["collective"]] = k + 1
        arrival, end = kernels[c["collective"]][k]
        out.append({**c, "arrival": arrival, "end": end})
    assert {kind: len(v) for kind, v in kernels.items()} == seen  # one kernel per call
    return out


def oracle_stragglers(folder: Path) -> dict:
    """Instances matched across ranks by key; arrivals on the device (:func:`device_calls`); at each the last
    rank holds the others, each waiting [its arrival, the last arrival) but not past its own kernel's end,
    counted where none of its compute kernels runs. A rank's wait caused = Σ over the others of their waits at the
    instances it was last to ∩ their ProfilerStep# windows, each moment of a rank's waiting put down to the wait
    that began first."""
    docs = ranks(folder)
    arrivals = {r: {c["key"]: c["arrival"] for c in device_calls(d)} for r, d in docs.items()}
    ends = {r: {c["key"]: c["end"] for c in device_calls(d)} for r, d in docs.items()}
    windows = {r: step_windows(d) for r, d in docs.items()}
    compute = {r: union(iv for iv in comm_intervals(d)[1]) for r, d in docs.items()}
    keys = sorted(set.intersection(*(set(a) for a in arrivals.values())))
    last_of = {}
    for k in keys:
        latest = max(arrivals[r][k] for r in docs)
        last_of[k] = (min(r for r in docs if arrivals[r][k] == latest), latest)

    caused = {c: 0 for c in docs}  # each moment a rank waited, to the wait that began first
    for r in docs:
        for c, ns in waited_first([(arrivals[r][k], min(latest, ends[r][k]), last) for k, (last, latest)
                                   in last_of.items() if last != r], windows[r], compute[r]).items():
            caused[c] += ns
    candidate = max(docs, key=lambda r: (caused[r], -r))
    others_step = sum(e - s for r in docs if r != candidate for s, e in windows[r])
    n_steps = len(windows[candidate])
    return {"candidate": candidate, "collectives": len(keys), "wait_caused_ns": caused,
            "pct": round(100.0 * caused[candidate] / others_step, 4),
            "per_step_ns": round(caused[candidate] / (len(docs) - 1) / n_steps),
            "last_count": {r: sum(1 for last, _ in last_of.values() if last == r) for r in docs}}


def oracle_waited(folder: Path) -> dict[int, int]:
    """Per rank, the time it waited at collectives: |union of [its arrival, the last arrival or its kernel's end)
    over the instances it was not last to ∩ its ProfilerStep# windows| less the part its compute kernels cover (as
    :func:`oracle_stragglers` counts a wait, whoever held it)."""
    docs = ranks(folder)
    arrivals = {r: {c["key"]: c["arrival"] for c in device_calls(d)} for r, d in docs.items()}
    ends = {r: {c["key"]: c["end"] for c in device_calls(d)} for r, d in docs.items()}
    windows = {r: step_windows(d) for r, d in docs.items()}
    compute = {r: union(iv for iv in comm_intervals(d)[1]) for r, d in docs.items()}
    keys = set.intersection(*(set(a) for a in arrivals.values()))
    latest = {k: max(arrivals[r][k] for r in docs) for k in keys}
    out = {}
    for r in docs:
        waits = union((arrivals[r][k], min(latest[k], ends[r][k])) for k in keys
                      if min(latest[k], ends[r][k]) > arrivals[r][k])
        inside = [(max(s, a), min(e, b)) for s, e in waits for a, b in windows[r] if min(e, b) > max(s, a)]
        out[r] = sum(e - s - intersect(s, e, compute[r]) for s, e in inside)
    return out


def comm_intervals(doc: dict) -> tuple[list, list]:
    """(communication kernels, compute kernels) of a rank, as (start, end) ns."""
    comm, compute = [], []
    for e in xs(doc, "kernel"):
        s = us_to_ns(e["ts"])
        (comm if e["name"].startswith("nccl") else compute).append((s, s + us_to_ns(e["dur"])))
    return comm, compute


# -- the job's own measurements ------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", sorted(RUNS))
def test_the_measured_step_times_are_the_traces_steps(variant):
    """The wall time the job measured for each profiled step is its ProfilerStep#N on that rank (both are cut at
    a device synchronisation; the annotation also holds the profiler's step bookkeeping): within 2 ms."""
    measured = TRUTH["variants"][f"fsdp2_{variant}"]["profiled_wall_ms"]
    for rank, doc in ranks(RUNS[variant]).items():
        steps = sorted((int(e["name"].split("#")[1]), e["dur"] / 1e3) for e in xs(doc, "user_annotation")
                       if e["name"].startswith("ProfilerStep#"))
        assert [n for n, _ in steps] == [2, 3, 4]
        assert [abs(ms - wall) < 2.0 for (_, ms), wall in zip(steps, measured[str(rank)])] == [True] * 3, (rank, steps)


def test_the_planted_sleep_slows_the_twins():
    """Ground truth for whatif: rank 0 of a slow twin waits for rank 1. The loader's sleep comes before anything is
    queued, so rank 0's step grows by about the sleep (within a third of it); the hook's sleep comes in the
    backward, while the GPU still runs the forward queued before it, so part of it is hidden: the step grows by
    more than a third of the sleep and less than the loader's twin."""
    wall = {v: statistics.mean(TRUTH["variants"][f"fsdp2_{v}"]["profiled_wall_ms"]["0"]) for v in RUNS}
    sleep = TRUTH["sleep_ms"]
    assert abs(wall["slow_loader"] - wall["balanced"] - sleep) < sleep / 3, wall
    assert sleep / 3 < wall["slow_hook"] - wall["balanced"] < wall["slow_loader"] - wall["balanced"], wall


# -- collectives ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", sorted(RUNS))
def test_every_collective_kind_is_recognised(variant):
    """All-gather, reduce-scatter (FSDP) and all-reduce (the logged loss): each NCCL kernel and each c10d operator
    has its collective, as many of each kind as the raw JSON has, none unknown."""
    trace = run_of(RUNS[variant])
    for rank, doc in ranks(RUNS[variant]).items():
        mine = trace.events.filter(pl.col("rank") == rank)
        kernels = [e["name"] for e in xs(doc, "kernel") if e["name"].startswith("nccl")]
        want = {kind: sum(part in k for k in kernels) for part, kind in KERNEL_KINDS.items()}
        assert sum(want.values()) == len(kernels) and min(want.values()) > 0, want
        got = mine.filter(pl.col("kind") == "kernel", pl.col("collective").is_not_null())
        assert dict(got.group_by("collective").len().iter_rows()) == want
        ops = [kind_of(e["name"]) for e in xs(doc, "cpu_op") if e["name"].startswith("c10d::") and kind_of(e["name"])]
        got = mine.filter(pl.col("kind") == "op", pl.col("name").str.starts_with("c10d::"),
                          pl.col("collective").is_not_null())
        assert sorted(got["collective"].to_list()) == sorted(ops)


@pytest.mark.parametrize("variant", sorted(RUNS))
def test_collectives_are_matched_across_ranks(variant):
    """Every instance has both ranks, of one collective kind; its arrivals are the raw calls' start times."""
    docs = ranks(RUNS[variant])
    want = {r: calls(d) for r, d in docs.items()}
    assert len({len(c) for c in want.values()}) == 1
    assert [c["collective"] for c in want[0]] == [c["collective"] for c in want[1]]  # the ranks call alike
    got = measures.collectives(run_of(RUNS[variant]).events)
    assert got.group_by("process_group", "instance").agg(pl.col("rank").n_unique())["rank"].to_list() == \
        [2] * len(want[0])
    assert got.group_by("process_group", "instance").agg(pl.col("collective").n_unique())["collective"].max() == 1
    for r, rows in want.items():
        mine = got.filter(pl.col("rank") == r).sort("arrival_ns")
        assert mine["arrival_ns"].to_list() == [c["arrival"] for c in rows]
        assert mine["collective"].to_list() == [c["collective"] for c in rows]


# -- overlap -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", sorted(RUNS))
def test_fsdp_prefetch_overlaps_communication_with_compute(variant):
    """Per rank: communication-kernel time, and the part of it under compute kernels (above zero: FSDP2 issues the
    next block's all-gather on its own stream while this block computes), from the raw JSON."""
    m = run_rule(run_of(RUNS[variant]), "comm-compute-overlap").metrics
    assert m["members"] == "rank"
    for rank, doc in ranks(RUNS[variant]).items():
        comm, compute = comm_intervals(doc)
        merged = union(compute)
        want = {"kernels": len(comm), "comm_time_ns": sum(e - s for s, e in comm),
                "overlapped_ns": sum(intersect(s, e, merged) for s, e in comm)}
        got = m["ranks"][str(rank)]
        assert {k: got[k] for k in want} == want
        assert got["overlapped_ns"] > 0 and 0 < got["overlap_pct"] <= 100


# -- stragglers ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", sorted(RUNS))
def test_stragglers_figures_equal_the_raw_json(variant):
    want = oracle_stragglers(RUNS[variant])
    f = run_rule(run_of(RUNS[variant]), "stragglers")
    m = f.metrics
    assert m["collectives"] == want["collectives"]
    assert {int(k): v["wait_caused_ns"] for k, v in m["ranks"].items()} == want["wait_caused_ns"]
    assert {int(k): v["last_count"] for k, v in m["ranks"].items()} == want["last_count"]
    assert m["step_time_lost_pct"] == want["pct"]
    assert m["wait_caused_per_step_ns"] == want["per_step_ns"]


def raw_kernel_waiting(folder: Path) -> dict[str, int]:
    """Per NCCL kernel name, the time its kernels spun before the last rank's kernel of the same collective
    instance started: instances matched across ranks by key (:func:`calls`), the k-th call of a kind on a rank
    running its k-th kernel of that kind (by start); a kernel waits min(last start − its start, its duration)."""
    docs = ranks(folder)
    kernels = {}  # rank -> kind -> [(name, start, end)] in order of start
    for r, d in docs.items():
        for e in sorted(xs(d, "kernel"), key=lambda e: e["ts"]):
            kind = next((k for part, k in KERNEL_KINDS.items() if e["name"].startswith("nccl") and part in e["name"]),
                        None)
            if kind:
                start = us_to_ns(e["ts"])
                kernels.setdefault(r, {}).setdefault(kind, []).append((e["name"], start, start + us_to_ns(e["dur"])))
    of = {}  # rank -> instance key -> its kernel
    for r, d in docs.items():
        seen: dict[str, int] = {}
        for c in calls(d):
            k = seen.get(c["collective"], 0)
            seen[c["collective"]] = k + 1
            of.setdefault(r, {})[c["key"]] = kernels[r][c["collective"]][k]
    waiting: dict[str, int] = {}
    for key in set.intersection(*(set(v) for v in of.values())):
        last = max(of[r][key][1] for r in docs)
        for r in docs:
            name, start, end = of[r][key]
            waiting[name] = waiting.get(name, 0) + max(0, min(last - start, end - start))
    return waiting


@pytest.mark.parametrize("variant", sorted(RUNS))
def test_hotspots_says_how_much_of_a_communication_kernel_is_waiting(variant):
    """hotspots ranks the ReduceScatter kernel that spins on rank 0 while the hook twin's rank 1 sleeps first (its
    self time is real): each communication kernel listed says how much of its time was spent waiting for the
    other rank's kernel to start, equal to the raw JSON's, and the message says so of the leader."""
    from traceparse.analysis import analyze

    want = raw_kernel_waiting(RUNS[variant])
    [f] = [f for f in analyze(run_of(RUNS[variant]), rules=["hotspots"])
           if f.title == "Hotspots: routines by exclusive time"]
    listed = {i["name"]: i for i in f.items if i["kind"] == "kernel" and i["name"].startswith("nccl")}
    assert listed and {name: i["waiting_ns"] for name, i in listed.items()} == {name: want[name] for name in listed}
    assert all(0 <= i["waiting_ns"] <= i["time_ns"] for i in listed.values())
    assert f.metrics["comm_waiting_ns"] == sum(want.values())
    assert "waiting_ns" not in next(i for i in f.items if not i["name"].startswith("nccl"))
    top = f.items[0]
    if variant == "slow_hook":  # rank 0 spins in the step's first ReduceScatter while rank 1 sleeps in its hook
        assert "ReduceScatter" in top["name"] and top["waiting_ns"] > 0.9 * top["time_ns"]
        assert f"{fmt_ns(top['waiting_ns'])} of its time" in f.message and "stragglers says which" in f.message


def _wait_per_step_ms(variant: str) -> float:
    return run_rule(run_of(RUNS[variant]), "stragglers").metrics["wait_caused_per_step_ns"] / 1e6


@pytest.mark.parametrize("variant", SLOW)
def test_stragglers_names_rank_1_and_its_wait_per_step(variant):
    """Rank 1 is the straggler of both twins. The wait it causes per step is time rank 0's GPU stood in its NCCL
    kernels with nothing else to run; it is at least what rank 0 lost (the slow twin's measured step time on rank
    0 less the balanced run's), and more by the idle rank 0 would have had anyway (its own host's gaps, which
    the wait absorbs), so under 1.5 times it and under the step."""
    f = run_rule(run_of(RUNS[variant]), "stragglers")
    assert f.metrics["straggler_rank"] == 1 and f.severity in ("warning", "critical")
    wall = {v: statistics.mean(TRUTH["variants"][f"fsdp2_{v}"]["profiled_wall_ms"]["0"]) for v in ("balanced", variant)}
    lost_ms = wall[variant] - wall["balanced"]
    per_step_ms = f.metrics["wait_caused_per_step_ns"] / 1e6
    assert 0.9 * lost_ms <= per_step_ms <= min(1.5 * lost_ms, wall[variant]), (per_step_ms, lost_ms)


def test_the_balanced_run_has_no_large_straggler():
    """The balanced run's steps are not synchronised across ranks (each starts after its own device sync), and
    here rank 0 starts its steps a few ms after rank 1, so rank 1 waits at their first all-gathers: a straggler
    of its own, but well under a third of what the planted sleeps cost per step, and not critical."""
    f = run_rule(run_of(RUNS["balanced"]), "stragglers")
    assert f.severity != "critical"
    assert all(_wait_per_step_ms("balanced") < _wait_per_step_ms(v) / 3 for v in SLOW)


@pytest.mark.parametrize("variant", SLOW)
def test_analyze_on_the_run_directory_names_rank_1(variant, tmp_path):
    """`traceparse analyze DIR` stores the two rank files as one run; its summary names rank 1."""
    code, out, err = run_cli("--store", str(tmp_path), "analyze", str(RUNS[variant]), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert sorted(doc["traces"][0]["run"]["ranks"]) == ["0", "1"]
    (finding,) = [f for f in doc["findings"] if f["rule"] == "stragglers"]
    assert finding["metrics"]["straggler_rank"] == 1


# -- whatif ----------------------------------------------------------------------------------------------------
def _whatif_mean_ms(folder: Path, tmp_path: Path, *edits: str) -> tuple[float, dict]:
    code, out, err = run_cli("--store", str(tmp_path), "whatif", str(folder), *edits, "--json")
    assert code == 0, err
    doc = json.loads(out)
    return doc["mean"]["predicted_ns"] / 1e6, doc


def test_balance_of_the_slow_loader_twin_predicts_the_balanced_run(tmp_path):
    """``whatif --balance`` on the slow-loader twin takes rank 1's DataLoader down to rank 0's (of two ranks the
    median is the other rank, not their mean, which kept half the sleep) and nothing else of note: the predicted
    mean step is the balanced twin's measured one (rank 0, the job's own clock) within 5%."""
    balanced = statistics.mean(TRUTH["variants"]["fsdp2_balanced"]["profiled_wall_ms"]["0"])
    predicted, doc = _whatif_mean_ms(RUNS["slow_loader"], tmp_path, "--balance")
    assert abs(predicted - balanced) <= 0.05 * balanced, (predicted, balanced)
    (edit,) = doc["edits"]
    assert "DataLoader" in edit["names"]
    assert edit["removed_per_step_by_rank"]["1"] >= 0.9 * TRUTH["sleep_ms"] * 1e6  # the sleep, on rank 1


def test_balance_of_the_slow_hook_twin_takes_the_sleep_and_rank_0s_slower_gemms(tmp_path):
    """On the slow-hook twin ``--balance`` takes out rank 1's hook sleep (in autograd's AddBackward0) and rank 0's
    two GEMM kernels, which ran slower than rank 1's beside its NCCL kernels spinning for rank 1: a prediction
    under the balanced twin's measured step, by less than 15% (the DDP twins' bound)."""
    balanced = statistics.mean(TRUTH["variants"]["fsdp2_balanced"]["profiled_wall_ms"]["0"])
    predicted, doc = _whatif_mean_ms(RUNS["slow_hook"], tmp_path, "--balance")
    assert 0.85 * balanced <= predicted <= balanced, (predicted, balanced)
    (edit,) = doc["edits"]
    assert "autograd::engine::evaluate_function: AddBackward0" in edit["names"]
    assert edit["removed_per_step_by_rank"]["1"] >= 0.9 * TRUTH["sleep_ms"] * 1e6
    assert [n for n in edit["names"] if n != "autograd::engine::evaluate_function: AddBackward0"] and all(
        "gemm" in n for n in edit["names"] if n != "autograd::engine::evaluate_function: AddBackward0")


def test_balance_of_the_balanced_run_changes_almost_nothing(tmp_path):
    """No name on either rank of the balanced run exceeds the other by 1% of a step but noise: the prediction is
    within 1% of the measured mean step."""
    predicted, doc = _whatif_mean_ms(RUNS["balanced"], tmp_path, "--balance")
    measured = doc["mean"]["measured_ns"] / 1e6
    assert abs(predicted - measured) <= 0.01 * measured, (predicted, measured)


# -- critical path -----------------------------------------------------------------------------------------------
DELAY = {"slow_loader": "DataLoader", "slow_hook": "autograd::engine::evaluate_function: AddBackward0"}


@pytest.mark.parametrize("variant", SLOW)
def test_the_critical_path_runs_through_the_planted_delay(variant):
    """Every step's critical path of rank 0 crosses to rank 1, and the largest part of the paths is rank 1's
    delaying event (the DataLoader annotation, or the autograd node whose hook sleeps), at its self time per step
    as the raw JSON gives it (the longest such event of each step on rank 1, less its children)."""
    from helpers import raw_events, raw_steps, self_time

    path = RUNS[variant] / "rank1.json.gz"
    events = raw_events(path)
    delays = [max(self_time(events, e) for e in events if e["name"] == DELAY[variant] and s <= us_to_ns(e["ts"]) < t)
              for s, t in raw_steps(path).values()]
    assert all(0.9 * TRUTH["sleep_ms"] * 1e6 <= d <= 1.2 * TRUTH["sleep_ms"] * 1e6 for d in delays), delays
    f = run_rule(run_of(RUNS[variant]), "critical-path")
    top = f.items[0]
    assert (top["rank"], top["kind"], top["name"]) == (1, "host op", DELAY[variant])
    assert 0.97 * statistics.mean(delays) <= top["per_step_ns"] <= 1.01 * max(delays)
    zero = [d for d in f.metrics["per_step"] if d["rank"] == 0]
    assert len(zero) == 3 and all(any(c["to_rank"] == 1 for c in d["crossings"]) for d in zero)
    assert all(d["length_ns"] <= d["step_ns"] for d in f.metrics["per_step"])
    # NCCL waits on the device, so rank 0's path crosses at the step's last all-reduce, when the ranks are nearly
    # in step again: little of it is waiting, but the delay is a third or more of rank 0's path, and is critical
    assert f.metrics["wait_pct"] < 1
    assert f.metrics["held_pct"] >= 100 * 0.97 * statistics.mean(delays) / statistics.mean(d["length_ns"] for d in zero)
    assert f.severity == "critical" and f.title == f"Rank 1's {DELAY[variant].split(': ')[-1]} holds the step"


def test_the_balanced_runs_critical_path_is_held_by_no_rank():
    """No part of one rank takes more than a few percent of the other rank's paths in the balanced run: info."""
    f = run_rule(run_of(RUNS["balanced"]), "critical-path")
    assert f.severity == "info" and f.metrics["held_pct"] < 5 and f.metrics["wait_pct"] < 5
