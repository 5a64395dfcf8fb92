"""The pointer jumping behind nesting (issue 25, stop 50): :func:`~traceparse.measures.nesting.innermost_open`,
:func:`~traceparse.measures.nesting._depth`, :func:`~traceparse.measures.op_work.owners` and gpu-idle's
innermost rows, each against its definition on random tables, partly overlapping rows (not nested) included; and
:func:`~traceparse.intervals.merge` and :func:`~traceparse.expr.by_id`, which skip work on rows in order."""

from __future__ import annotations

import numpy as np
import polars as pl

from traceparse.expr import by_id
from traceparse.intervals import merge
from traceparse.measures.nesting import _depth, innermost_open
from traceparse.measures.op_work import owners


def _rows(rng, n: int, threads: int = 3):
    """Rows sorted by thread, then start, longer first: thread, start, end (widths from 0, many ties)."""
    thread = np.sort(rng.integers(0, threads, n))
    start = rng.integers(0, 60, n)
    end = start + rng.integers(0, 3 if rng.random() < 0.3 else 30, n)
    order = np.lexsort((-end, start, thread))
    return thread[order], start[order].astype(np.int64), end[order].astype(np.int64)


def test_innermost_open_and_depth_are_their_definitions():
    """The parent of a row: the last earlier row of its thread still open at its start (-1: none); its depth:
    how many parents up to the top."""
    rng = np.random.default_rng(50)
    for _ in range(1500):
        thread, start, end = _rows(rng, int(rng.integers(0, 40)))
        parent = innermost_open(start, end, thread)
        expected = [max((j for j in range(i) if thread[j] == thread[i] and end[j] > start[i]), default=-1)
                    for i in range(len(start))]
        assert parent.tolist() == expected
        depth = []
        for i in range(len(start)):
            d, j = 0, expected[i]
            while j >= 0:
                d, j = d + 1, expected[j]
            depth.append(d)
        assert _depth(parent).tolist() == depth


def test_owners_are_the_last_formula_operator_before_that_ends_no_sooner():
    """An operator's owner: itself when a formula operator, else the last formula operator before it on its
    thread (by start, longer first, then event id) that ends at or after it does; a formula operator is a leaf
    when none is owned that way by it. On one trace and on several (a run's ranks, event ids repeating)."""
    rng = np.random.default_rng(51)
    for trial in range(600):
        n = int(rng.integers(1, 40))
        start = rng.integers(0, 60, n)
        frame = pl.DataFrame({"event_id": rng.permutation(n) + 1, "pid": rng.choice([1, 2], n),
                              "tid": rng.integers(0, 2, n), "start": start,
                              "end": start + rng.integers(0, 30, n)})
        several = trial % 2 == 1
        if several:
            frame = frame.with_columns(_trace=pl.Series(rng.integers(0, 2, n), dtype=pl.Int32))
        formula = frame.filter(pl.Series(rng.random(n) < 0.4)).select(*(["_trace"] if several else []), "event_id")
        got = owners(frame, formula)
        key = ["_trace"] if several else []
        rows = frame.sort([*key, "pid", "tid", "start", "end", "event_id"],
                          descending=[False] * (len(key) + 3) + [True, False]).to_dicts()
        is_formula = {tuple(r.values()) for r in formula.to_dicts()}

        def ident(r):
            return tuple(r[c] for c in [*key, "event_id"])

        def thread(r):
            return tuple(r[c] for c in [*key, "pid", "tid"])

        def enclosing(i):
            return max((j for j in range(i) if thread(rows[j]) == thread(rows[i]) and ident(rows[j]) in is_formula
                        and rows[j]["end"] >= rows[i]["end"]), default=None)

        parents = {ident(rows[enclosing(i)]) for i in range(len(rows))
                   if ident(rows[i]) in is_formula and enclosing(i) is not None}
        expected = []
        for i, r in enumerate(rows):
            mine = ident(r) in is_formula
            j = enclosing(i)
            expected.append({**{c: r[c] for c in key}, "event_id": r["event_id"],
                             "owner": r["event_id"] if mine else (rows[j]["event_id"] if j is not None else None),
                             "leaf": (ident(r) not in parents) if mine else None})
        assert got.to_dicts() == expected


def test_merge_of_rows_in_order_is_the_union_by_brute_force():
    """Per group of ``by`` (nulls a group of their own), the union of the intervals: touching ones merge."""
    rng = np.random.default_rng(52)
    for _ in range(400):
        n = int(rng.integers(1, 60))
        start = rng.integers(0, 200, n)
        iv = pl.DataFrame({"device_id": pl.Series(rng.choice([0, 1, None], n).tolist(), dtype=pl.Int32),
                           "start": start, "end": start + rng.integers(0, 20, n)})
        got = merge(iv, ["device_id"])
        expected = []
        for device in sorted(set(iv["device_id"].to_list()), key=lambda d: (d is not None, d or 0)):
            spans = sorted((s, e) for d, s, e in iv.iter_rows() if d == device)
            merged = [list(spans[0])]
            for s, e in spans[1:]:
                if s <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], e)
                else:
                    merged.append([s, e])
            expected += [(device, s, e) for s, e in merged]
        assert got.rows() == expected


def test_by_id_sorts_only_rows_out_of_order():
    """Rows whose ids strictly increase come back as they are; any tie, null or step back: sorted."""
    for ids, kept in (([1, 2, 5], True), ([], True), ([7], True), ([1, 1, 2], False), ([3, 2, 1], False),
                      ([1, None, 3], False)):
        frame = pl.DataFrame({"event_id": pl.Series(ids, dtype=pl.Int64), "x": list(range(len(ids)))})
        assert (by_id(frame) is frame) == kept
        assert by_id(frame).equals(frame.sort("event_id", maintain_order=True))
