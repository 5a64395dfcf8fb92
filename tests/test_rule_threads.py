"""Rules run at once in threads (issue 25 item 4: an 8-rank run analysed in under 2 s), with the findings of one
rule at a time.

``analyze`` runs its rules in :func:`traceparse.analysis.rule_threads` threads. What several rules ask of a table
is computed once (:class:`traceparse.measures.base.SharedResults`): a second thread asking for a value under way
waits for it; a run's ranks stay one group in memory at a time. The findings, their order and the first rule's
error must not depend on the number of threads.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import threading
import time

import polars as pl
import pytest

from helpers import FIXTURES, read_torch, run_of
from traceparse import analysis
from traceparse.analysis import analyze, rule_threads
from traceparse.measures.base import SharedResults, sharing
from traceparse.rule import Finding, Rule
from traceparse.store import Store
from traceparse.trace import Trace, TraceMeta


def _dicts(findings) -> list[dict]:
    return [json.loads(json.dumps(f.to_dict(), default=str)) for f in findings]


@pytest.mark.parametrize("source", ["torch/resnet18_bs8.json.gz", "torch/mlp_no_profilerstep_60.json.gz",
                                    "torch/multirank/fsdp4_slow_loader", "torch/multirank/nccl2_slow_rank1"])
def test_the_findings_and_their_order_do_not_depend_on_the_threads(source):
    path = FIXTURES / source
    trace = run_of(path) if path.is_dir() else read_torch(path)
    trace.meta.id = "t"
    alone = _dicts(analyze(trace, threads=1))
    assert alone  # every one of these traces has findings
    assert _dicts(analyze(trace, threads=2)) == alone
    assert _dicts(analyze(trace, threads=5)) == alone


def test_a_stored_run_read_rank_by_rank_gives_the_same_findings_with_one_group_in_memory(tmp_path, monkeypatch):
    from traceparse.run import ingest_run
    from traceparse.measures import base

    monkeypatch.setattr(base, "GROUP_ROWS", 1)  # every rank its own group: measures go through them in turn
    monkeypatch.setattr(base, "KEPT_GROUP_BYTES", 0)  # none kept (a run past the budget): read as they are needed
    store = Store(tmp_path / "store")
    run_id = ingest_run([FIXTURES / "torch/multirank/gloo4_slow_rank2"], store=store, jobs=1).run["id"]
    serial = _dicts(analyze(store.load_run(run_id, lazy=True), threads=1))
    lazy = store.load_run(run_id, lazy=True)
    assert _dicts(analyze(lazy, threads=3)) == serial
    table = lazy.events
    assert len(table.groups()) == 4
    assert table.most_at_once == 1 and table.whole_loads == 0
    assert table.loaded > 0 and table.loaded % 4 == 0


def test_a_value_asked_by_two_threads_at_once_is_computed_once():
    scope, key, calls, got = SharedResults(), ("m", ()), [], []
    t = pl.DataFrame({"a": [1]})
    started = threading.Event()

    def compute():
        calls.append(1)
        started.set()
        time.sleep(0.3)  # the second thread asks meanwhile
        return pl.DataFrame({"b": [2]})

    first = threading.Thread(target=lambda: got.append(scope.get(t, key, compute)))
    first.start()
    assert started.wait(5)
    second = scope.get(t, key, compute)
    first.join()
    assert len(calls) == 1 and got[0] is second
    assert (scope.hits, scope.misses) == (1, 1)


def test_a_thread_waiting_for_a_value_that_failed_computes_it_itself():
    scope, key, calls, errors = SharedResults(), ("m", ()), [], []
    t = pl.DataFrame({"a": [1]})
    started = threading.Event()

    def failing():
        calls.append("failing")
        started.set()
        time.sleep(0.3)
        raise ValueError("no")

    def worker():
        try:
            scope.get(t, key, failing)
        except ValueError as exc:
            errors.append(str(exc))

    first = threading.Thread(target=worker)
    first.start()
    assert started.wait(5)
    value = scope.get(t, key, lambda: calls.append("second") or "value")
    first.join()
    assert errors == ["no"] and value == "value" and calls == ["failing", "second"]
    assert scope.get(t, key, lambda: "again") == "value"  # kept


class _Slow(Rule):
    name = "slow-failure"
    description = "Fails after a while."

    def check(self, trace, options):
        time.sleep(0.2)
        raise RuntimeError("slow-failure broke")


class _Quick(Rule):
    name = "quick-failure"
    description = "Fails at once."

    def check(self, trace, options):
        raise RuntimeError("quick-failure broke")


class _Fine(Rule):
    name = "fine"
    description = "Says one thing."

    def check(self, trace, options):
        return [Finding(self.name, "info", "Fine", "nothing wrong", impact_ns=1)]


class _Registry:
    def __init__(self, *rules):
        self.rules = {r.name: r for r in rules}

    def rule(self, name):
        return self.rules[name]


def _tiny() -> Trace:
    events = pl.DataFrame({"kind": ["kernel"], "name": ["k"], "start_ns": [0], "duration_ns": [10]})
    return Trace(events=events, meta=TraceMeta(id="t", format="torch"))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_first_rule_that_fails_is_the_error_whatever_finishes_first(threads):
    reg = _Registry(_Fine(), _Slow(), _Quick())
    with pytest.raises(RuntimeError, match="^slow-failure broke$"):
        analyze(_tiny(), reg=reg, threads=threads)
    assert [f.rule for f in analyze(_tiny(), rules=["fine"], reg=reg, threads=threads)] == ["fine"]


class _Noting(Rule):
    """Notes when it starts; a finding whose impact orders it among the others."""

    started: list = []

    def __init__(self, name: str, cost: int, impact: int):
        self.name, self.cost, self.impact = name, cost, impact

    def check(self, trace, options):
        _Noting.started.append(self.name)
        return [Finding(self.name, "warning", self.name, "noted", impact_ns=self.impact)]


def test_the_costliest_rule_starts_first_and_the_findings_keep_their_order(monkeypatch):
    """With one thread (the pool's, not the caller's) the rules start in the order they are handed to it: the
    costliest first (``Rule.cost``), ties in the rules' order; the findings come in the same order as with no
    pool at all."""
    rules = [_Noting("a", 1, 5), _Noting("b", 3, 9), _Noting("c", 1, 7), _Noting("d", 10, 1)]
    reg = _Registry(*rules)
    _Noting.started = []
    alone = [f.rule for f in analyze(_tiny(), reg=reg, threads=1)]
    assert _Noting.started == ["a", "b", "c", "d"] and alone == ["b", "c", "a", "d"]  # by impact, worst first
    pool = analysis.ThreadPoolExecutor  # a pool of one thread: the start order is the order of submission
    monkeypatch.setattr(analysis, "ThreadPoolExecutor", lambda workers, **kw: pool(1, **kw))
    _Noting.started = []
    assert [f.rule for f in analyze(_tiny(), reg=reg, threads=2)] == alone
    assert _Noting.started == ["d", "b", "a", "c"]


def test_how_many_rules_run_at_once(monkeypatch):
    trace = _tiny()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert rule_threads(trace) == analysis.RULE_THREADS == 2
    assert rule_threads(trace, 7) == 7 and rule_threads(trace, 0) == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert rule_threads(trace) == 1  # one core: one at a time
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(analysis, "LARGE_TABLE_ROWS", 0)
    assert rule_threads(trace) == 1  # a table over the line: one at a time (memory)
    monkeypatch.setattr(analysis, "LARGE_TABLE_ROWS", 1)
    assert rule_threads(trace) == 2


def test_the_option_reaches_the_analysis(monkeypatch, tmp_path):
    from helpers import run_cli
    from traceparse.cli import main

    seen = []
    real = analysis.rule_threads
    monkeypatch.setattr(analysis, "rule_threads", lambda trace, requested=None: seen.append(requested)
                        or real(trace, requested))
    store = str(tmp_path / "store")
    code, _, err = run_cli("--store", store, "-q", "ingest", str(FIXTURES / "torch/resnet18_bs8.json.gz"))
    assert code == 0, err
    assert run_cli("--store", store, "-q", "analyze", "--threads", "3")[0] == 0
    assert run_cli("--store", store, "-q", "analyze")[0] == 0
    assert seen == [3, None]
    err = io.StringIO()
    with pytest.raises(SystemExit) as exited, contextlib.redirect_stderr(err):
        main(["--store", store, "analyze", "--threads", "0"])
    assert exited.value.code == 2
    assert err.getvalue().endswith("error: argument --threads: expected a whole number of at least 1, got '0'\n")
