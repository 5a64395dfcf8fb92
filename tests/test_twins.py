"""Issue 24, checked against reality: twin runs made minutes apart on one H100 (fixtures/make_whatif_twins.py):
DDP over gloo, 4 ranks, the same job balanced, with rank 1's data loader 40 ms slower a batch, and with rank 2
sleeping 40 ms in a gradient hook. Each step's wall time on each rank is in ddp4_step_times.json.

The oracles read the raw JSON (plain Python, no traceparse code): which rank joined each gloo all-reduce last,
the slow rank's delaying event and its self time per step, the step windows.
"""

from __future__ import annotations

import json
import statistics

import pytest

from helpers import FIXTURES, raw_events, raw_steps, run_of, run_rule, self_time, us_to_ns
from traceparse.analysis import analyze
from traceparse.figures import fmt_ns

TWINS = FIXTURES / "torch" / "multirank"
TIMES = json.loads((TWINS / "ddp4_step_times.json").read_text())
LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
HOOK = "autograd::engine::evaluate_function: AddBackward0"
#: variant -> (the slow rank, the event its delay sits in)
SLOW = {"ddp4_slow_loader": (1, LOADER), "ddp4_slow_hook": (2, HOOK)}


def joins(variant: str) -> dict[int, list[int]]:
    """{rank: start (ns) of each of its gloo all-reduce annotations, in order}: the k-th on every rank is one
    instance (all ranks run on one host, so their clocks agree)."""
    starts = {r: sorted(us_to_ns(e["ts"]) for e in raw_events(TWINS / variant / f"rank{r}.json.gz")
                        if e["name"] == "gloo:all_reduce" and e.get("cat") == "user_annotation") for r in range(4)}
    assert len({len(v) for v in starts.values()}) == 1
    return starts


def last_joiners(variant: str) -> list[int]:
    """For each gloo all-reduce instance, the rank that joined it last."""
    starts = joins(variant)
    return [max(range(4), key=lambda r: starts[r][k]) for k in range(len(starts[0]))]


def delay_per_step(variant: str) -> dict[int, int]:
    """{step: self time (ns) of the slow rank's delaying event, the longest in the step}."""
    rank, name = SLOW[variant]
    path = TWINS / variant / f"rank{rank}.json.gz"
    events = raw_events(path)
    return {n: max(self_time(events, e) for e in events if e["name"] == name and s <= us_to_ns(e["ts"]) < t)
            for n, (s, t) in raw_steps(path).items()}


def test_the_twins_differ_by_the_planted_delay():
    """The ground truth itself: both slow runs' steps are about 40 ms longer than the balanced run's."""
    mean = {v: statistics.mean(t for ts in TIMES["step_ms"][v].values() for t in ts) for v in TIMES["step_ms"]}
    for variant in SLOW:
        assert 30 < mean[variant] - mean["ddp4_balanced"] < 45, mean
        assert all(35e6 < ns < 45e6 for ns in delay_per_step(variant).values())


@pytest.mark.parametrize("variant", sorted(SLOW))
def test_stragglers_and_the_critical_path_name_the_planted_delay(variant):
    rank, name = SLOW[variant]
    run = run_of(TWINS / variant)
    last = last_joiners(variant)
    straggler = run_rule(run, "stragglers")
    assert straggler.metrics["straggler_rank"] == rank
    assert straggler.metrics["collectives"] == len(last)
    assert f"rank {rank} arrived last at {last.count(rank)} of {len(last)} collectives." in straggler.message

    path = run_rule(run, "critical-path")
    m, top = path.metrics, path.items[0]
    delays = delay_per_step(variant)
    # the largest part of the paths is the delaying event on the slow rank, about its self time per step
    assert (top["rank"], top["kind"], top["name"]) == (rank, "host op", name)
    assert 0.97 * statistics.mean(delays.values()) <= top["per_step_ns"] <= 1.01 * max(delays.values())
    assert path.severity == "critical"
    # every other rank's path crosses to the slow rank, at collectives it joined last
    starts = joins(variant)
    last_join = {max(starts[r][k] for r in starts): last[k] for k in range(len(last))}
    crossed_at = {c["instance"] for d in m["per_step"] for c in d["crossings"] if c["to_rank"] == rank}
    for d in m["per_step"]:
        start, end = raw_steps(TWINS / variant / f"rank{d['rank']}.json.gz")[d["step"]]
        assert d["step_ns"] == end - start and 0.95 * d["step_ns"] <= d["length_ns"] <= d["step_ns"]
        for c in d["crossings"]:  # a crossing is at an instance's last join, to the rank that joined last
            assert last_join[start + c["offset_ns"]] == c["to_rank"]
        if d["rank"] != rank:
            assert any(c["to_rank"] == rank for c in d["crossings"]), d
    assert len(crossed_at) == 4  # once a step: the instance after the delay, which it joined last
    assert m["collectives"] == len(last)
    assert f"It crosses to rank {rank} at 4 of the {len(last)} collectives" in path.message


def test_the_balanced_twin_has_no_rank_holding_the_others():
    run = run_of(TWINS / "ddp4_balanced")
    path = run_rule(run, "critical-path")
    assert path.severity == "info" and path.metrics["wait_pct"] < 10


def test_hotspots_lists_the_slow_loaders_self_time():
    """The slow data loader is a ``record_function`` annotation: hotspots ranks annotations by self time in a table
    of their own, with the loader's figures as the raw JSON gives them (on rank 1, ~165 ms over its 4 steps) and
    each rank's step annotations once (the device-side copies of ProfilerStep#N are not routines)."""
    variant, (rank, name) = "ddp4_slow_loader", SLOW["ddp4_slow_loader"]
    raw = {r: raw_events(TWINS / variant / f"rank{r}.json.gz") for r in range(4)}
    own = {r: [self_time(events, e) for e in events if e["name"] == name] for r, events in raw.items()}
    findings = analyze(run_of(TWINS / variant), rules=["hotspots"])
    (marks,) = [f for f in findings if f.title == "Hotspots: annotations by self time"]
    loader = next(i for i in marks.items if i["name"] == name)
    assert loader["time_ns"] == sum(sum(v) for v in own.values())
    assert loader["calls"] == sum(len(v) for v in own.values())
    assert loader["inclusive_ns"] == sum(us_to_ns(e["dur"]) for events in raw.values() for e in events
                                         if e["name"] == name)
    assert loader["max_ns"] == sum(own[rank]) == max(sum(v) for v in own.values())
    assert 160e6 < loader["max_ns"] < 170e6 and loader["min_ns"] == min(sum(v) for v in own.values())
    steps = next(i for i in marks.items if i["name"] == "ProfilerStep#N")
    assert steps["calls"] == sum(1 for events in raw.values() for e in events
                                 if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
    assert f"{name!r} is uneven: {fmt_ns(sum(own[rank]))} on its busiest thread" in marks.message
    assert sum(i["share_pct"] for i in marks.items) == pytest.approx(100, abs=0.01)  # all 6 annotations listed
    routines = next(f for f in findings if f.title == "Hotspots: routines by exclusive time")
    assert all(i["kind"] != "marker" for i in routines.items)  # the routines' table is what it was
