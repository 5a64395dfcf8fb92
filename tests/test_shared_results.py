"""What the rules of one analysis ask of a table is computed once (issue 25 item 4), and changes no finding.

:func:`traceparse.measures.base.sharing` keeps, per table (by identity) and per name and parameters, what
:func:`~traceparse.measures.base.shared` computed: every measure call, and the intermediates several measures
take (the rows of some kinds, launches linked to their calls, step windows). The memo must give back the very
value it computed, compute again for other parameters or another table, keep nothing outside a scope, never
keep a table alive, and leave every finding as it is without it.
"""

from __future__ import annotations

import gc
import json
from contextlib import nullcontext

import polars as pl
import pytest

from helpers import FIXTURES, read_torch
from traceparse import analysis
from traceparse.measures import base
from traceparse.measures.base import Measure, shared, sharing


class Counting(Measure):
    """A measure that counts how often it is computed."""

    name = "counting"

    def __init__(self):
        self.calls = 0

    def part(self, events, threshold=1, kinds=("kernel",)):
        self.calls += 1
        return events.select(pl.len().alias("rows"))

    def combine(self, parts, threshold=1, kinds=("kernel",)):
        return pl.concat(parts)


def table(rows: int = 3) -> pl.DataFrame:
    return pl.DataFrame({"kind": ["kernel"] * rows, "start_ns": list(range(rows))})


def test_a_measure_is_computed_once_per_table_and_parameters_in_a_scope():
    m, t = Counting(), table()
    with sharing() as scope:
        first = m(t, threshold=2)
        assert m(t, threshold=2) is first  # the same frame, not a copy
        assert m(t, kinds=["kernel"], threshold=2) is not first  # another parameter: computed again
        m(t, threshold=3)
        other = table(4)
        assert m(other, threshold=2)["rows"].to_list() == [4]  # another table, though equal in kind
        assert m.calls == 4
        assert (scope.hits, scope.misses) == (1, 4)
    m(t, threshold=2)
    m(t, threshold=2)
    assert m.calls == 6  # outside a scope, nothing is kept


def test_a_scope_inside_a_scope_is_the_outer_one():
    m, t = Counting(), table()
    with sharing() as outer:
        m(t)
        with sharing() as inner:
            assert inner is outer
            m(t)
        m(t)
    assert m.calls == 1


def test_parameters_that_are_not_plain_values_are_not_compared():
    m, t = Counting(), table()
    with sharing():
        m(t, kinds=pl.col("kind") == "kernel")
        m(t, kinds=pl.col("kind") == "kernel")
        assert m.calls == 2
        values = []
        assert shared(t, "x", lambda: values.append(1) or len(values), {"a": [1, {"b": None}]}) == 1
        assert shared(t, "x", lambda: values.append(1) or len(values), {"a": [1, {"b": None}]}) == 1
        assert shared(t, "x", lambda: values.append(1) or len(values), {"a": [1, {"b": 0}]}) == 2
        # True and 1 are equal in Python, not as parameters
        assert shared(t, "y", lambda: "bool", (True,)) == "bool"
        assert shared(t, "y", lambda: "int", (1,)) == "int"


def test_a_table_let_go_takes_its_entries_with_it():
    m = Counting()
    with sharing() as scope:
        t = table()
        m(t)
        assert len(scope.tables) == 1
        del t
        gc.collect()
        assert scope.tables == {}  # the scope did not keep the table (nor its results) alive
        m(table())
        assert m.calls == 2


def test_a_scope_keeps_nothing_once_closed():
    with sharing() as scope:
        Counting()(table())
    assert scope.tables == {} and base._SCOPE.get() is None


def _findings(trace, monkeypatch, share: bool) -> list[dict]:
    monkeypatch.setattr(analysis, "sharing", sharing if share else nullcontext)
    assert base._SCOPE.get() is None  # no scope around: without it nothing is shared
    return [json.loads(json.dumps(f.to_dict(), default=str)) for f in analysis.analyze(trace)]


@pytest.mark.parametrize("fixture", ["torch/resnet18_bs8.json.gz", "torch/mlp_no_profilerstep_60.json.gz"])
def test_every_finding_is_the_same_with_and_without_sharing(fixture, monkeypatch):
    trace = read_torch(FIXTURES / fixture)
    trace.meta.id = "t"
    with monkeypatch.context() as m:
        alone = _findings(trace, m, share=False)
    with sharing() as scope:
        together = [json.loads(json.dumps(f.to_dict(), default=str)) for f in analysis.analyze(trace)]
        assert scope.hits > 0  # something was shared: the kernels' rows, the launches, the steps
    assert len(together) == len(alone) > 10
    assert together == alone


def test_a_stored_run_gives_the_same_findings_with_and_without_sharing(tmp_path, monkeypatch):
    from traceparse.run import ingest_run
    from traceparse.store import Store

    store = Store(tmp_path / "store")
    result = ingest_run([str(FIXTURES / "torch" / "multirank" / "gloo4_slow_rank2")], store=store)
    run_id = result.run["id"]
    with monkeypatch.context() as m:
        alone = _findings(store.load_run(run_id, lazy=True), m, share=False)
    lazy = store.load_run(run_id, lazy=True)
    together = [json.loads(json.dumps(f.to_dict(), default=str)) for f in analysis.analyze(lazy)]
    assert together == alone and len(alone) > 5
    assert lazy.events.most_at_once == 1 and lazy.events.whole_loads == 0


class Large(Counting):
    """A counting measure as large as its table (the dependency graph is one)."""

    name = "large"
    large = True


def test_a_large_measure_of_a_large_table_is_not_kept(monkeypatch):
    monkeypatch.setattr(base, "LARGE_TABLE_ROWS", 3)
    m = Large()
    with sharing() as scope:
        small, large = table(3), table(4)
        assert m(small) is m(small)
        assert m.calls == 1
        m(large)
        m(large)
        assert m.calls == 3  # let go as soon as its rule is done with it
        assert (scope.hits, scope.misses) == (1, 1)


# -- a large table's shared values within a budget ------------------------------------------------------------
def column(rows: int) -> pl.DataFrame:
    """A frame of ``rows`` int64 values: 8 bytes each."""
    return pl.DataFrame({"x": pl.Series(range(rows), dtype=pl.Int64)})


def test_a_large_tables_values_take_at_most_a_quarter_of_it(monkeypatch):
    monkeypatch.setattr(base, "LARGE_TABLE_ROWS", 100)
    big = column(1_000)  # 8,000 bytes: its values may take 2,000
    assert big.estimated_size() == 8_000
    computed = []

    def value(name: str, rows: int):
        return shared(big, name, lambda: computed.append(name) or column(rows))

    with sharing() as scope:
        a = value("a", 100)            # 800 bytes
        value("b", 100)                # 1,600
        assert value("a", 100) is a    # a hit: a is now the most recently asked
        value("c", 100)                # 2,400 > 2,000: b, the least recently asked, goes
        assert scope.dropped == 1
        assert value("a", 100) is a
        value("b", 100)                # computed again
        assert computed == ["a", "b", "c", "b"]
        value("d", 1_000)              # 8,000 alone: every other value goes, never the one just computed
        assert [name for name, _ in scope.tables[id(big)]] == ["d"]
        assert scope.hits == 2 and scope.misses == 5 and scope.dropped == 4


def test_a_small_tables_values_are_all_kept(monkeypatch):
    monkeypatch.setattr(base, "LARGE_TABLE_ROWS", 100)
    small = column(100)  # not more than the line: no budget
    with sharing() as scope:
        for name in "abcdef":
            shared(small, name, lambda: column(1_000))
        assert len(scope.tables[id(small)]) == 6 and scope.dropped == 0
