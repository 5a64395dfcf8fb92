"""``analyze RUN`` reads a run rank by rank: the same findings as on the whole table, one rank in memory at a time.

The reference is the whole-table evaluation (``Store.load_run`` without
``lazy``: every rank's rows concatenated, what analyze did before), run in
this process; the rank-by-rank evaluation must give the same findings JSON,
byte for byte, in-process and on a Dask LocalCluster of two workers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from helpers import REPO, run_cli
from traceparse import measures
from traceparse.analysis import analyze
from traceparse.expr import calls, flat_rows, kind_is, prefer_timed
from traceparse.measures.base import PartitionedEvents
from traceparse.measures.routines import routine_choices, routine_time
from traceparse.run import ingest_run
from traceparse.schema import conform
from traceparse.store import Store

MULTIRANK = REPO.parent / "shared" / "samples" / "multirank"
SAMPLES = ["gloo4_resnet18_bs16", "gloo4_resnet18_bs16_slow_rank2"]
needs_samples = pytest.mark.skipif(not (MULTIRANK / SAMPLES[0]).is_dir(), reason="shared multirank samples not present")


@pytest.fixture(autouse=True)
def one_group_at_a_time(monkeypatch):
    """These tests are of the bounded path (a run past :data:`~traceparse.measures.base.KEPT_GROUP_BYTES`): no group
    is kept, one is in memory at a time. The groups kept within the budget have tests of their own below."""
    from traceparse.measures import base

    monkeypatch.setattr(base, "KEPT_GROUP_BYTES", 0)


def findings_json(trace) -> str:
    return json.dumps([f.to_dict() for f in analyze(trace)], sort_keys=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The two real 4-rank gloo runs and a synthetic 6-rank run (benchmarks/make_ranks.py: skew, slow rank 3)."""
    if not (MULTIRANK / SAMPLES[0]).is_dir():
        pytest.skip("shared multirank samples not present")
    store = Store(tmp_path_factory.mktemp("store"))
    synthetic = tmp_path_factory.mktemp("ranks") / "synthetic6"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "make_ranks.py"),
                    str(MULTIRANK / SAMPLES[0] / "rank1.json.gz"), str(synthetic), "--ranks", "6", "--slow-rank", "3",
                    "--skew-us", "500"], check=True, capture_output=True)
    ids = {}
    for name, path in [*((s, MULTIRANK / s) for s in SAMPLES), ("synthetic6", synthetic)]:
        ids[name] = ingest_run([path], store=store, jobs=1).run["id"]
    return store, ids


@needs_samples
@pytest.mark.parametrize("name", [*SAMPLES, "synthetic6"])
def test_rank_by_rank_gives_the_whole_table_findings_with_one_rank_in_memory(runs, name):
    store, ids = runs
    whole = store.load_run(ids[name])
    lazy = store.load_run(ids[name], lazy=True)
    table = lazy.events
    assert isinstance(table, PartitionedEvents) and not isinstance(whole.events, PartitionedEvents)
    assert findings_json(lazy) == findings_json(whole)
    # the memory bound: measures read one rank at a time, every rank the same number of times, and no rule
    # needed the whole table (the fallback that would read it is counted)
    ranks = len(whole.meta.extra["run"]["ranks"])
    assert table.most_at_once == 1
    assert table.loaded > 0 and table.loaded % ranks == 0
    assert table.whole_loads == 0
    if name == "gloo4_resnet18_bs16_slow_rank2":
        stragglers = json.loads(findings_json(lazy))
        assert [f["metrics"]["straggler_rank"] for f in stragglers if f["rule"] == "stragglers"] == [2]


@needs_samples
@pytest.mark.parametrize("kept", [False, True])
@pytest.mark.parametrize("group_rows", [0, 25_000, None])
def test_every_measure_on_the_partitions_equals_the_whole_table(runs, group_rows, kept, monkeypatch):
    """Each rank alone (0), two ranks a group (25,000 rows; a sample rank has about 10,400), every rank together;
    past the budget (one group in memory at a time) and within it (each rank read once for all the measures; a
    per-trace measure on the groups as kept, in table order, sorted by trace id after)."""
    from traceparse.measures import base

    if group_rows is not None:
        monkeypatch.setattr(base, "GROUP_ROWS", group_rows)
    if kept:
        monkeypatch.setattr(base, "KEPT_GROUP_BYTES", 2**30)
    store, ids = runs
    for name, run_id in ids.items():
        whole = store.load_run(run_id).events
        table = store.load_run(run_id, lazy=True).events
        for measure_name, measure in measures.MEASURES.items():
            assert measure(table).equals(measure(whole)), (name, measure_name)
        # per-trace results are concatenated in trace-id order (what combine sorts by), not rank order
        order = [t for t in table.trace_ids]
        assert order != sorted(order) or name == "synthetic6"
        assert table.whole_loads == 0
        if kept:
            assert table.loaded == len(table.paths), (name, table.loaded)
        else:
            assert table.most_at_once == 1
        if group_rows == 25_000:
            assert 1 < len(table.groups()) < len(table.paths), [table.sizes, table.groups()]

@needs_samples
def test_the_lazy_table_answers_filters_and_aggregates_and_falls_back_to_the_whole_table(runs, monkeypatch):
    """Ranks too large to share a group (GROUP_ROWS 0 here): filters and aggregates are lazy scans."""
    from traceparse.measures import base

    monkeypatch.setattr(base, "GROUP_ROWS", 0)
    store, ids = runs
    whole = store.load_run(ids[SAMPLES[1]]).events
    table = store.load_run(ids[SAMPLES[1]], lazy=True).events
    kernels = kind_is("kernel")
    assert table.filter(kernels).equals(whole.filter(kernels))
    assert table.select(kernels.sum()).item() == whole.select(kernels.sum()).item() > 0
    assert table["rank"].equals(whole["rank"]) and table.height == whole.height and table.columns == whole.columns
    counts = {str(k): n for k, n in whole.group_by("kind").len().iter_rows()}
    assert {k: n for k, n in table.kind_counts.items() if n} == counts  # the ranks' ingest summaries
    assert table.whole_loads == 0 and table.loaded == 0  # none of these read a rank into memory
    assert table.sort("start_ns").equals(whole.sort("start_ns"))  # anything else: the whole table, counted
    assert table.whole_loads == 1


@needs_samples
def test_small_ranks_are_read_together_once(runs):
    """The 4 ranks of a sample run (a few thousand rows each) are one group: queries and measures read each rank
    file once, and give what the whole table gives."""
    store, ids = runs
    whole = store.load_run(ids[SAMPLES[1]])
    lazy = store.load_run(ids[SAMPLES[1]], lazy=True)
    table = lazy.events
    ranks = len(whole.meta.extra["run"]["ranks"])
    assert table.groups() == [list(range(ranks))]
    kernels = kind_is("kernel")
    assert table.filter(kernels).equals(whole.events.filter(kernels))
    assert findings_json(lazy) == findings_json(whole)
    assert table.loaded == ranks and table.most_at_once == 1 and table.whole_loads == 0


@needs_samples
@pytest.mark.parametrize("name", SAMPLES)
def test_cli_analyze_of_a_run_in_process_gives_the_whole_table_findings(runs, name, tmp_path):
    store, ids = runs
    code, out, err = run_cli("--store", str(store.root), "analyze", "--json", ids[name])
    assert code == 0, err
    got = json.loads(out)["findings"]
    assert json.dumps(got, sort_keys=True) == findings_json(store.load_run(ids[name]))


@needs_samples
def test_dask_local_cluster_of_two_workers_gives_the_whole_table_findings(runs):
    pytest.importorskip("distributed")
    from distributed import Client, LocalCluster

    from traceparse import distributed as dist

    store, ids = runs
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        for name in SAMPLES:
            lazy = store.load_run(ids[name], lazy=True)
            with dist.measures_on(client, store, lazy):
                got = findings_json(lazy)
            assert got == findings_json(store.load_run(ids[name])), name
            assert lazy.events.loaded == 0  # every rank was read on a worker, none here
        reads = client.run(lambda: dist._partition.cache_info().misses)
        assert len(reads) == 2 and all(n > 0 for n in reads.values())  # both workers read ranks


def test_measures_on_refuses_a_run_held_in_memory(tmp_path):
    from traceparse import distributed as dist
    from traceparse.trace import Trace

    with pytest.raises(TypeError, match="lazy=True"):
        with dist.measures_on(None, Store(tmp_path), Trace(conform(pl.DataFrame({"kind": ["kernel"]})))):
            pass


# -- hotspots' routines, against the whole-table algorithm they replace --------------------------------------------
def whole_table_routines(events: pl.DataFrame, kinds: list[str]) -> tuple[pl.DataFrame, dict]:
    """The hotspots rule's rows before per-rank measuring: filter, flat rows, timed rows per kind, self time."""
    rows = events.filter(kind_is(*kinds))
    rows, nested = flat_rows(rows)
    parts, dropped = [], 0
    for kind in rows["kind"].cast(pl.String).unique().sort().to_list():
        kept, n = prefer_timed(rows.filter(pl.col("kind") == kind))
        parts.append(kept)
        dropped += n
    rows = pl.concat(parts) if parts else rows
    own = measures.self_time(rows).select("trace_id", "event_id", "self_ns")
    rows = rows.join(own, on=["trace_id", "event_id"], how="left", nulls_equal=True)
    rows = rows.with_columns(time_ns=pl.coalesce("exclusive_ns", "self_ns", "duration_ns"), calls=calls(),
                             kind=pl.col("kind").cast(pl.String)).filter(pl.col("time_ns").is_not_null())
    thread = ["pid", "device_id", "tid"]
    per_thread = rows.group_by(["name", "kind", *thread]).agg(
        time_ns=pl.col("time_ns").sum(), inclusive_ns=pl.col("duration_ns").sum(), calls=pl.col("calls").sum())
    return per_thread, {"nested": nested, "dropped": dropped,
                        "exclusive_rows": int(rows["exclusive_ns"].is_not_null().sum()),
                        "self_time_rows": int(rows["self_ns"].is_not_null().sum())}


def table_of(rows: list[tuple]) -> pl.DataFrame:
    cols = ["trace_id", "event_id", "kind", "name", "pid", "tid", "start_ns", "duration_ns", "exclusive_ns",
            "call_path", "calls"]
    return conform(pl.DataFrame([dict(zip(cols, r)) for r in rows]))


CASES = {
    # two traces; op nests an api call; aggregated op rows beside timed ones (left out); a kernel without a thread
    "mixed": [("a", 0, "op", "fwd", 1, 1, 0, 100, None, None, None), ("a", 1, "api", "launch", 1, 1, 10, 20, None,
              None, None), ("a", 2, "op", "fwd", 1, 1, None, 300, None, None, 3), ("a", 3, "kernel", "k", None, None,
              5, 50, None, None, None), ("b", 0, "op", "fwd", 1, 1, 0, 70, None, None, None),
              ("b", 1, "op", "bwd", 1, 2, 0, 40, None, None, None)],
    # TAU-like: exclusive time, flat rows and call-path rows (the call-path rows are left out)
    "callpaths": [("t", 0, "region", "main", 0, 0, None, 500, 200, "main", 1), ("t", 1, "region", "f", 0, 0, None,
                  300, 300, "f", 2), ("t", 2, "region", "main => f", 0, 0, None, 300, 300, "main => f", 2),
                  ("u", 0, "region", "main", 0, 0, None, 400, 100, "main", 1)],
    # only aggregated rows: kept
    "aggregated": [("a", 0, "op", "x", 1, 1, None, 10, None, None, 2), ("b", 0, "op", "x", 1, 1, None, 30, None,
                   None, 5)],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_routine_time_per_trace_equals_the_whole_table_algorithm(case):
    events = table_of(CASES[case])
    kinds = ["region", "kernel", "op", "api"]
    expected, counts = whole_table_routines(events, kinds)
    chosen = routine_choices(events, kinds)
    assert (chosen["nested"], chosen["dropped"]) == (counts["nested"], counts["dropped"])
    params = {"kinds": tuple(kinds), "drop_nested": chosen["drop_nested"],
              "drop_aggregated": tuple(chosen["drop_aggregated"])}
    for routines in (routine_time(events, **params),
                     measures.partitioned(routine_time, events, by="trace_id", **params)):
        got = routines.group_by(["name", "kind", "pid", "device_id", "tid"]).agg(
            pl.col("time_ns", "inclusive_ns", "calls").sum())
        key = ["name", "kind", "pid", "device_id", "tid"]
        assert_frame_equal(got.sort(key, nulls_last=False), expected.sort(key, nulls_last=False),
                           check_dtypes=False, check_column_order=False)
        assert int(routines["exclusive_rows"].sum()) == counts["exclusive_rows"]
        assert int(routines["self_time_rows"].sum()) == counts["self_time_rows"]
    with pytest.raises(ValueError, match="cannot be partitioned by device_id"):
        measures.partitioned(routine_time, events, by="device_id", **params)


# -- collective instances on the real gloo files: no sequence numbers, so the n-th call of each rank ----------------
@needs_samples
@pytest.mark.parametrize("name", SAMPLES)
def test_gloo_samples_have_no_collective_seq_and_instances_are_the_nth_call_of_each_rank(runs, name):
    """No sequence numbers: an instance is the n-th call of each rank in its ProfilerStep#N (every call lies in
    one), so ranks that profiled different steps still meet at the same step's collectives."""
    import gzip

    from helpers import us_to_ns
    from traceparse.measures.comm import STEP_STRIDE

    store, ids = runs
    expected = {}
    for rank in range(4):
        doc = json.loads(gzip.open(MULTIRANK / name / f"rank{rank}.json.gz").read())
        events = doc["traceEvents"]
        # what Kineto writes for collectives with a sequence number is absent from these files; the autograd
        # "Sequence number" of operators is there, and is not a collective's
        assert not [e for e in events if e.get("name") == "record_param_comms"]
        assert not [e for e in events if {"Seq", "Process Group Name"} & set(e.get("args") or {})]
        assert any("Sequence number" in (e.get("args") or {}) for e in events)
        calls = sorted((e for e in events if e.get("cat") == "cpu_op" and e.get("name", "").startswith("c10d::")),
                       key=lambda e: e["ts"])
        steps = [(us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"]), int(e["name"].split("#")[1]))
                 for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                 and e["name"].startswith("ProfilerStep#")]
        seen: dict = {}
        expected[rank] = []
        for e in calls:  # each call is the k-th of its ProfilerStep#N (every call lies in one)
            [n] = [n for a, b, n in steps if a <= us_to_ns(e["ts"]) < b]
            seen[n] = seen.get(n, -1) + 1
            expected[rank].append((e["name"], us_to_ns(e["ts"]), n * STEP_STRIDE + seen[n]))
    table = store.load_run(ids[name], lazy=True).events
    assert table.select(pl.col("seq").is_not_null().sum()).item() == 0
    found = measures.collectives(table)
    assert set(found["source"]) == {"c10d op"} and found["seq"].null_count() == found.height
    for rank in range(4):
        mine = found.filter(pl.col("member") == rank).sort("instance")
        assert list(zip(mine["name"], mine["arrival_ns"], mine["instance"])) == expected[rank]
        assert mine["index"].to_list() == list(range(len(expected[rank])))  # the n-th call of the rank, in order
    # every instance has all four ranks
    assert set(found.group_by("process_group", "instance").len()["len"]) == {4}


@needs_samples
def test_a_measure_not_declared_per_trace_gets_every_ranks_part_combined(runs):
    from traceparse.measures.base import Measure

    class Rows(Measure):  # a third-party measure that sums over traces, declaring nothing
        name = "rows"

        def part(self, events, **params):
            return pl.DataFrame({"rows": [events.height]})

        def combine(self, parts, **params):
            return pl.DataFrame({"rows": [int(pl.concat(parts)["rows"].sum())]})

    store, ids = runs
    table = store.load_run(ids[SAMPLES[0]], lazy=True).events
    assert Rows.per_trace is False
    assert Rows()(table)["rows"].to_list() == [store.load_run(ids[SAMPLES[0]]).events.height]
    assert table.most_at_once == 1 and table.loaded == 4


def _group_bytes(table: PartitionedEvents) -> list[int]:
    from traceparse.events_file import read_events

    return [read_events(path).rechunk().estimated_size() for path in table.paths]


@needs_samples
def test_groups_within_the_budget_are_kept_and_each_rank_is_read_once(runs, monkeypatch):
    """Within KEPT_GROUP_BYTES every group is read once for the whole analysis (not once per measure), with the same
    findings as the whole table; the values shared for a kept group get a large table's budget."""
    from traceparse.measures import base

    monkeypatch.setattr(base, "GROUP_ROWS", 0)  # each rank its own group, as a large rank is
    store, ids = runs
    whole = store.load_run(ids["synthetic6"])
    lazy = store.load_run(ids["synthetic6"], lazy=True)
    table = lazy.events
    monkeypatch.setattr(base, "KEPT_GROUP_BYTES", sum(_group_bytes(table)))  # every group, just
    assert findings_json(lazy) == findings_json(whole)
    assert table.loaded == 6 and table.most_at_once == 6 and table.whole_loads == 0
    assert len(table._kept) == 6 and table._kept_bytes == sum(_group_bytes(table))
    group = table.group([0])
    assert id(group) in base._KEPT_GROUPS
    scope = base.SharedResults()
    scope.get(group, ("k",), lambda: 1)
    assert scope._budgets[id(group)] == group.estimated_size() // 4


@needs_samples
def test_groups_past_the_budget_are_read_each_time_one_at_a_time(runs, monkeypatch):
    """Past the budget the groups kept stay within it, and the others are read as before: one in memory at a time
    beside the kept ones."""
    from traceparse.measures import base

    monkeypatch.setattr(base, "GROUP_ROWS", 0)
    store, ids = runs
    whole = store.load_run(ids["synthetic6"])
    lazy = store.load_run(ids["synthetic6"], lazy=True)
    table = lazy.events
    sizes = _group_bytes(table)
    monkeypatch.setattr(base, "KEPT_GROUP_BYTES", sum(sizes) // 2)
    assert findings_json(lazy) == findings_json(whole)
    assert 0 < len(table._kept) < 6 and table._kept_bytes <= sum(sizes) // 2
    assert table.loaded > 6 and table.most_at_once <= len(table._kept) + 1 and table.whole_loads == 0


@needs_samples
@pytest.mark.parametrize("kept", [True, False])
def test_map_in_threads_where_every_group_is_kept(runs, monkeypatch, kept):
    """``map(threads=2)`` runs on two groups at once only where every group is kept (else one after the other, one in
    memory at a time); the results are the same, in the groups' order, either way."""
    import threading

    from traceparse.measures import base

    monkeypatch.setattr(base, "GROUP_ROWS", 0)
    store, ids = runs
    table = store.load_run(ids["synthetic6"], lazy=True).events
    if kept:
        monkeypatch.setattr(base, "KEPT_GROUP_BYTES", sum(_group_bytes(table)))
    threads_seen = set()

    def rows(events):
        threads_seen.add(threading.current_thread().name)
        return events.height, events["trace_id"][0]

    expected = [(size, trace_id) for size, trace_id in zip(table.sizes, table.trace_ids)]
    assert table.map(rows, threads=2) == expected
    assert table.map(rows) == expected
    workers = {name for name in threads_seen if name.startswith("traceparse-group")}
    assert bool(workers) if kept else (not workers and table.most_at_once == 1)
    assert table.loaded == (6 if kept else 12)


def test_the_kept_groups_budget_follows_a_small_machines_memory(monkeypatch):
    """1 GiB at most, and at most an eighth of the machine's memory: 256 MiB on a machine of 2 GiB; the constant
    where the system does not say."""
    import os

    from traceparse.measures import base

    monkeypatch.setattr(base, "KEPT_GROUP_BYTES", 2**30)  # as shipped (this module's tests set it to 0)
    pages = {"SC_PHYS_PAGES": 2 * 2**30 // 4096, "SC_PAGE_SIZE": 4096}
    monkeypatch.setattr(os, "sysconf", lambda name: pages[name])
    assert base.kept_group_bytes() == 256 * 2**20
    pages["SC_PHYS_PAGES"] = 64 * 2**30 // 4096
    assert base.kept_group_bytes() == base.KEPT_GROUP_BYTES == 2**30

    def unknown(name):
        raise ValueError(name)

    monkeypatch.setattr(os, "sysconf", unknown)
    assert base.kept_group_bytes() == 2**30
