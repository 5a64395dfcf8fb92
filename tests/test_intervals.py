"""Interval arithmetic against a brute-force count over every nanosecond (small random cases)."""

from __future__ import annotations

import random

import polars as pl

from traceparse import intervals


def random_events(rng: random.Random, n: int) -> pl.DataFrame:
    rows = [(rng.randrange(2), rng.randrange(0, 200), rng.randrange(1, 40)) for _ in range(n)]
    return pl.DataFrame(rows, schema={"device_id": pl.Int32, "start_ns": pl.Int64, "duration_ns": pl.Int64},
                        orient="row")


def covered(df: pl.DataFrame, device: int) -> list[int]:
    """How many intervals of ``device`` are open at each nanosecond."""
    depth = [0] * 300
    for d, s, n in df.iter_rows():
        if d == device:
            for t in range(s, s + n):
                depth[t] += 1
    return depth


def test_union_depth_overlap_and_gaps_match_brute_force():
    rng = random.Random(7)
    for _ in range(40):
        kernels = random_events(rng, rng.randrange(1, 12))
        copies = random_events(rng, rng.randrange(1, 6))
        depth = {d: covered(kernels, d) for d in (0, 1)}
        assert intervals.union_length(kernels, ["device_id"]) == sum(x >= 1 for d in depth.values() for x in d)
        assert intervals.time_at_depth(kernels, 2, ["device_id"]) == sum(x >= 2 for d in depth.values() for x in d)
        expected = [sum(1 for t in range(s, s + n) if depth[d][t] >= 1) for d, s, n in copies.iter_rows()]
        assert intervals.overlap_with(copies, kernels, ["device_id"]).to_list() == expected
        gap_total = 0
        for d in (0, 1):
            busy = [t for t, x in enumerate(depth[d]) if x]
            if busy:
                gap_total += sum(1 for t in range(busy[0], busy[-1] + 1) if depth[d][t] == 0)
        assert int(intervals.gaps(kernels, ["device_id"])["length"].sum() or 0) == gap_total


def test_touching_intervals_are_not_concurrent():
    df = pl.DataFrame({"start_ns": [0, 10], "duration_ns": [10, 10]})
    assert intervals.time_at_depth(df, 2) == 0
    assert intervals.union_length(df) == 20
    assert intervals.gaps(df).height == 0
