"""Ranks that profiled different steps: collectives without sequence numbers are matched within their step.

A rank's profiler may start a step later than the others' (on-demand tracing starts each rank at its own next
step; a trace cut at its start). gloo's collectives carry no sequence number, so they were matched as the n-th
of every rank: with rank 1 starting two steps late, its first collective met the others' first, every pair was
a step apart, rank 1 was named the straggler and the ranks' clocks were said to differ by 276 ms (one machine).
Matched within their ``ProfilerStep#N``, the same collective of the same step meets.

The run is a real one (fixtures/torch/multirank/gloo4_slow_rank2, four gloo ranks, rank 2 slow) with rank 1's
events before its ``ProfilerStep#3`` removed here, as if its profiler had started two steps later: a
hand-made edit of real data, for the edge case.
"""

from __future__ import annotations

import gzip
import json
import shutil

import polars as pl
import pytest

from helpers import FIXTURES, raw_events, run_of, run_rule, us_to_ns

SLOW = FIXTURES / "torch" / "multirank" / "gloo4_slow_rank2"


@pytest.fixture(scope="module")
def late(tmp_path_factory):
    """The run with rank 1's first two steps cut from its trace."""
    folder = tmp_path_factory.mktemp("late") / "gloo4_rank1_late"
    shutil.copytree(SLOW, folder)
    path = folder / "rank1.json.gz"
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    start = min(e["ts"] for e in doc["traceEvents"] if e.get("name") == "ProfilerStep#3" and e.get("ph") == "X")
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("ph") != "X" or e["ts"] >= start]
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)
    return folder


def oracle(folder) -> dict:
    """Each rank's ``c10d::`` calls keyed by (step, k-th in the step): the step is the host ``ProfilerStep#N``
    the call starts in. Values: {rank: its start}."""
    out: dict = {}
    for rank in range(4):
        events = raw_events(folder / f"rank{rank}.json.gz")
        steps = [(us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"]), int(e["name"].split("#")[1]))
                 for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
        seen: dict = {}
        for e in sorted((e for e in events if e.get("cat") == "cpu_op" and e["name"].startswith("c10d::")),
                        key=lambda e: e["ts"]):
            t = us_to_ns(e["ts"])
            [step] = [n for a, b, n in steps if a <= t < b]
            k = seen[step] = seen.get(step, -1) + 1
            out.setdefault((step, k), {})[rank] = t
    return out


def test_the_same_collective_of_the_same_step_meets(late):
    """Every instance holds the calls of one (step, k) of the oracle: 4 a step, steps 1 and 2 without rank 1."""
    from traceparse import measures

    want = oracle(late)
    assert sorted({len(a) for a in want.values()}) == [3, 4] and len(want) == 12
    waits = measures.collective_waits(run_of(late).events)
    got = {frozenset(zip(r["member"].to_list(), r["arrival_ns"].to_list()))
           for _, r in waits.group_by("process_group", "instance")}
    assert got == {frozenset(a.items()) for a in want.values()}


def test_the_slow_rank_is_named_not_the_late_one(late):
    """Rank 2 (the slow one) is the straggler, at the instances the oracle says it is last to; the eight
    collectives rank 1 did not record are missing; no clock difference is claimed."""
    want = oracle(late)
    last = dict.fromkeys(range(4), 0)
    for arrivals in want.values():
        latest = max(arrivals.values())
        last[min(r for r, t in arrivals.items() if t == latest)] += 1
    f = run_rule(run_of(late), "stragglers")
    m = f.metrics
    assert m["straggler_rank"] == 2 and f.severity == "critical"
    assert {int(r): row["last_count"] for r, row in m["ranks"].items()} == last
    assert m["incomplete_collectives"] == 8 == sum(len(a) == 3 for a in want.values())
    assert "clocks" not in f.message


def test_a_run_whose_ranks_profiled_the_same_steps_matches_as_before():
    """On the whole run every step has its collectives on every rank: within-step numbering is the n-th of each
    rank, and the instances are the oracle's."""
    from traceparse import measures

    want = oracle(SLOW)
    assert {len(a) for a in want.values()} == {4}
    waits = measures.collective_waits(run_of(SLOW).events)
    got = {frozenset(zip(r["member"].to_list(), r["arrival_ns"].to_list()))
           for _, r in waits.group_by("process_group", "instance")}
    assert got == {frozenset(a.items()) for a in want.values()}
    assert waits.filter(pl.col("members") < 4).height == 0
