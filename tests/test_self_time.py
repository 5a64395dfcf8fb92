"""Self time of nested host events (measure self_time) and hotspots on it, against a plain-Python sweep of the JSON.

The oracle reads the raw Chrome JSON (exact decimal microseconds), keeps the host-side complete events of the
categories that nest on a thread (operators, annotations, runtime/driver calls, Python functions), and runs a
stack sweep per (pid, tid): an event's parent is the innermost event still open at its start (events ending at
or before that start are closed); a parent's self time is its duration minus, per direct child, the child's
time up to the parent's end.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest

from helpers import FIXTURES, read_torch, us_to_ns
from traceparse.analysis import analyze, parse_settings
from traceparse import measures
from traceparse.schema import conform
from traceparse.trace import Trace

HOST = {"cpu_op", "operator", "user_annotation", "cuda_runtime", "runtime", "cuda_driver", "driver",
        "python_function"}
TORCH = sorted((FIXTURES / "torch").glob("*.json.gz")) + sorted((FIXTURES / "torch" / "rocm").glob("*.json.gz"))


def oracle(path: Path) -> Counter:
    """Counter of (pid, tid, name, start_ns, duration_ns, self_ns) over the host events of a torch trace."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        events = json.load(f, parse_float=Decimal)["traceEvents"]
    threads = defaultdict(list)
    for i, e in enumerate(events):
        if e.get("ph") != "X" or str(e.get("cat", "")).lower() not in HOST:
            continue
        if not isinstance(e.get("pid"), int) or not isinstance(e.get("tid"), int):
            continue
        start, dur = us_to_ns(e["ts"]), us_to_ns(e["dur"])
        threads[(e["pid"], e["tid"])].append([start, dur, i, e["name"], 0])
    out = Counter()
    for (pid, tid), rows in threads.items():
        rows.sort(key=lambda r: (r[0], -r[1], r[2]))
        stack, parent = [], []
        for k, row in enumerate(rows):
            while stack and rows[stack[-1]][0] + rows[stack[-1]][1] <= row[0]:
                stack.pop()
            parent.append(stack[-1] if stack else None)
            stack.append(k)
        # a child covers its parent up to its reach (the last end under it), clipped to the parent's end
        reach = [r[0] + r[1] for r in rows]
        for k in range(len(rows) - 1, -1, -1):  # children come after their parents
            if parent[k] is not None:
                reach[parent[k]] = max(reach[parent[k]], reach[k])
        for k, row in enumerate(rows):
            if parent[k] is not None:
                up = rows[parent[k]]
                up[4] += min(reach[k], up[0] + up[1]) - row[0]
        for start, dur, _, name, inner in rows:
            out[(pid, tid, name, start, dur, max(dur - inner, 0))] += 1
    return out


@pytest.mark.parametrize("path", TORCH, ids=lambda p: p.name)
def test_self_time_matches_the_json(path):
    trace = read_torch(path)
    events = trace.events
    got = measures.self_time(events).join(events, on=["trace_id", "event_id"], nulls_equal=True)
    counted = Counter(zip(got["pid"].to_list(), got["tid"].to_list(), got["name"].to_list(),
                          got["start_ns"].to_list(), got["duration_ns"].to_list(), got["self_ns"].to_list()))
    assert counted == oracle(path)


def test_self_time_by_hand():
    # thread 1: A [0, 100) holds B [10, 40) and C [50, 90); B holds D [20, 30); E [95, 120) outlasts A by 20 ns
    # thread 2: F [0, 50) alone. A: 100 - 30 - 40 - 5 = 25; B: 30 - 10 = 20; C 40, D 10, E 25 (top: none), F 50.
    # E starts inside A (95 < 100) so it is A's child, counted up to A's end: 5 ns.
    rows = [("A", 1, 0, 100), ("B", 1, 10, 30), ("C", 1, 50, 40), ("D", 1, 20, 10), ("E", 1, 95, 25),
            ("F", 2, 0, 50), ("K", None, 0, 10)]
    events = conform(pl.DataFrame([{"kind": "op" if n != "K" else "kernel", "name": n, "pid": 7, "tid": t,
                                     "start_ns": s, "duration_ns": d} for n, t, s, d in rows]), trace_id="t")
    got = measures.self_time(events).join(events.select("event_id", "name"), on="event_id")
    assert dict(zip(got["name"], got["self_ns"])) == {"A": 25, "B": 20, "C": 40, "D": 10, "E": 25, "F": 50}
    parents = dict(zip(got["name"], got["parent_event_id"]))
    assert parents == {"A": None, "B": 0, "C": 0, "D": 1, "E": 0, "F": None}


def test_parents_by_hand_in_the_rows_own_order():
    """``nesting.parents`` gives each row's parent and depth where the row is, not in the sweep's order: the rows
    of test_self_time_by_hand, shuffled, on two threads, with a zero-length event at a parent's start."""
    from traceparse.measures.nesting import parents

    rows = pl.DataFrame({"name": ["D", "F", "A", "C", "B", "E", "Z"], "event_id": [3, 5, 0, 2, 1, 4, 6],
                         "tid": [1, 2, 1, 1, 1, 1, 1], "start_ns": [20, 0, 0, 50, 10, 95, 10],
                         "duration_ns": [10, 50, 100, 40, 30, 25, 0]})
    got = pl.concat([rows, parents(rows, ["tid"])], how="horizontal")
    # Z [10, 10) starts with B: the longer first, so B opens and Z is its child; D is in B, inside A
    assert dict(zip(got["name"], zip(got["parent_event_id"], got["depth"]))) == {
        "A": (None, 0), "B": (0, 1), "C": (0, 1), "D": (1, 2), "E": (0, 1), "F": (None, 0), "Z": (1, 2)}


@pytest.mark.parametrize("path", [FIXTURES / "torch" / "resnet18_bs8.json.gz",
                                  *sorted((FIXTURES / "torch" / "rocm").glob("*.json.gz"))[:1]], ids=lambda p: p.name)
def test_parents_are_self_times_nesting(path):
    from traceparse.measures.nesting import parents

    events = read_torch(path).events
    nest = measures.self_time(events).select("event_id", "parent_event_id", "depth")
    rows = events.join(nest.select("event_id"), on="event_id", how="semi").sample(fraction=1.0, shuffle=True, seed=3)
    got = pl.concat([rows.select("event_id"), parents(rows, ["trace_id", "pid", "tid"])], how="horizontal")
    assert got.height == nest.height > 90
    assert got.sort("event_id").equals(nest.sort("event_id"))


@pytest.mark.parametrize("path", [FIXTURES / "torch" / "resnet18_bs8.json.gz",
                                  *sorted((FIXTURES / "torch" / "rocm").glob("*.json.gz"))[:1]], ids=lambda p: p.name)
def test_self_times_in_the_rows_own_order_are_the_measures(path):
    """``nesting.self_times`` gives every row (shuffled, kernels and other rows that do not nest among them: null)
    the measure's self time; the trace read without a store has no trace id, as a table in memory may not."""
    from traceparse.measures.nesting import self_times

    events = read_torch(path).events.sample(fraction=1.0, shuffle=True, seed=5)
    want = measures.self_time(events).select("event_id", "self_ns")
    got = events.select("event_id", "kind", self_times(events))
    assert events["trace_id"].null_count() == events.height
    assert got.filter(pl.col("self_ns").is_not_null()).height == want.height > 90
    kernels = got.filter(pl.col("kind") == "kernel")
    assert kernels["self_ns"].null_count() == kernels.height
    joined = got.join(want, on="event_id", how="left", suffix="_want")
    assert joined["self_ns"].equals(joined["self_ns_want"], check_names=False)


def test_a_child_that_outlasts_its_parent_is_not_its_grandparents_time():
    """A Python stack cut at the trace's end (ROCm TraceLens traces): G [0, 31) holds P [1, 11), whose child X
    [6, 21) outlasts it. From 11 to 21 X is the innermost open event: its time, not G's as well (G once counted
    it, and the thread's self time exceeded its span). G: 31 - (min(21, 31) - 1) = 11; P: 10 - (11 - 6) = 5; X 15:
    31 in all, the thread's span."""
    rows = [("G", 0, 31), ("P", 1, 10), ("X", 6, 15)]
    events = conform(pl.DataFrame([{"kind": "region", "name": n, "pid": 7, "tid": 1, "start_ns": s, "duration_ns": d}
                                   for n, s, d in rows]), trace_id="t")
    got = measures.self_time(events).join(events.select("event_id", "name"), on="event_id")
    assert dict(zip(got["name"], got["self_ns"])) == {"G": 11, "P": 5, "X": 15}


@pytest.mark.parametrize("path", sorted((FIXTURES / "torch" / "rocm").glob("*.json.gz")), ids=lambda p: p.name)
def test_a_threads_self_times_add_up_to_the_union_of_its_events(path):
    """On every thread of the ROCm traces (Python stacks included), the self times add up to the time covered by
    the thread's host events (the union of their intervals in the raw JSON), never more."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        events = json.load(f, parse_float=Decimal)["traceEvents"]
    spans = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and str(e.get("cat", "")).lower() in HOST and isinstance(e.get("pid"), int) \
                and isinstance(e.get("tid"), int):
            spans[(e["pid"], e["tid"])].append((us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"])))
    union = {}
    for thread, intervals in spans.items():
        covered, end = 0, None
        for a, b in sorted(intervals):
            if end is None or a >= end:
                covered, end = covered + b - a, b
            elif b > end:
                covered, end = covered + b - end, b
        union[thread] = covered
    trace = read_torch(path)
    got = measures.self_time(trace.events).join(trace.events, on=["trace_id", "event_id"], nulls_equal=True)
    per_thread = got.group_by("pid", "tid").agg(pl.col("self_ns").sum())
    assert {(p, t): n for p, t, n in per_thread.iter_rows()} == union


def test_a_source_with_exclusive_time_keeps_it():
    events = conform(pl.DataFrame([{"kind": "region", "name": "main", "pid": 0, "tid": 0, "start_ns": 0,
                                    "duration_ns": 10, "exclusive_ns": 3}]), trace_id="t")
    assert measures.self_time(events).height == 0


@pytest.mark.parametrize("path", [FIXTURES / "torch" / "resnet18_bs16.json.gz"], ids=lambda p: p.name)
def test_hotspots_rank_self_time(path):
    trace = read_torch(path)
    f = analyze(trace, rules=["hotspots"], settings=parse_settings(["hotspots.top=1000"]))[0]
    own = oracle(path)
    per_name = defaultdict(int)
    for (pid, tid, name, start, dur, self_ns), n in own.items():
        per_name[name] += self_ns * n
    for item in f.items:
        if item["kind"] in ("op", "api", "marker", "region"):
            assert item["time_ns"] == per_name[item["name"]], item["name"]
    span = trace.events.select(pl.col("start_ns").min(), (pl.col("start_ns") + pl.col("duration_ns")).max().alias("end"))
    # every host thread's self time fits in the trace's span (inclusive time counted nested calls many times)
    host = Trace(trace.events.filter(pl.col("pid").is_not_null()), trace.meta)
    g = analyze(host, rules=["hotspots"])[0]
    per_thread = g.metrics["time_ns"] / max(1, sum(g.metrics["threads_per_kind"].values()))
    assert per_thread <= span.row(0)[1] - span.row(0)[0]
