"""A pipeline inside data parallelism over gloo: calls that name no process group, settled across the ranks.

The fixtures (fixtures/make_dppp_gloo.py, four CPU processes, PyTorch 2.11): pipelines ``[0, 1]`` and
``[2, 3]``, each stage's gradients all-reduced over ``[0, 2]`` and ``[1, 3]``; ``dp2pp2_gloo_balanced`` and
``dp2pp2_gloo_slow_rank3`` (rank 3 runs its layers three times over). gloo records ``c10d::send``/``c10d::recv_``
with their peer in the pipeline group's numbering and ``c10d::allreduce_`` with no group at all. Read as the
run's ranks and matched as the n-th all-reduce of every rank, the balanced job read "Stragglers: ranks 0, 2 and
3", "48 collectives are missing on some ranks" and "their clocks likely differ" (one machine). Every figure
here is worked out from the raw JSON and the groups the script made (its record), not from traceparse.
"""

from __future__ import annotations

import json

import polars as pl
import pytest

from helpers import FIXTURES, matched_waits, raw_events, read_torch, run_of, run_rule, us_to_ns

RUNS = FIXTURES / "torch" / "multirank"
MADE = json.loads((RUNS / "dp2pp2_gloo_step_times.json").read_text())
JOBS = {"balanced": RUNS / "dp2pp2_gloo_balanced", "slow": RUNS / "dp2pp2_gloo_slow_rank3"}
#: A DP2 x PP4 job of the same script (DPPP_STAGES=4): rank 7, the second pipeline's last stage, runs its layers
#: three times over (its balanced twin is not kept)
MADE_PP4 = json.loads((RUNS / "dp2pp4_gloo_step_times.json").read_text())
CHAIN = RUNS / "dp2pp4_gloo_slow_rank7"
CALLS = ("c10d::send", "c10d::recv_", "c10d::allreduce_")


def oracle_instances(folder, made: dict = MADE) -> dict:
    """Every transfer and all-reduce of the job from the raw JSON, keyed ``(what, members, k)``: a transfer's
    members are its sender and receiver (the third argument, a rank of the rank's pipeline group, as the script
    made it), numbered within the pair both ways together; an all-reduce's, the rank's data-parallel group,
    numbered within it. Values: ``{rank: arrival}`` (the call's start, ns)."""
    out: dict = {}
    for rank in range(made["world"]):
        pipeline = next(g for g in made["pp_groups"] if rank in g)
        data = next(g for g in made["dp_groups"] if rank in g)
        seen: dict = {}
        for e in sorted((e for e in raw_events(folder / f"rank{rank}.json.gz")
                         if e.get("cat") == "cpu_op" and e["name"] in CALLS), key=lambda e: e["ts"]):
            if e["name"] == "c10d::allreduce_":
                key = ("all_reduce", tuple(data))
            else:
                key = ("transfer", tuple(sorted((rank, pipeline[int(e["args"]["Concrete Inputs"][2])]))))
            k = seen[key] = seen.get(key, -1) + 1
            out.setdefault((*key, k), {})[rank] = us_to_ns(e["ts"])
    return out


@pytest.fixture(scope="module", params=sorted(JOBS))
def job(request):
    return request.param, run_of(JOBS[request.param])


def _expected(want: dict) -> dict:
    return {frozenset(a.items()): {r: max(a.values()) - t for r, t in a.items()} for a in want.values()}


def test_each_call_meets_the_ranks_of_its_own_group(job):
    """Every instance traceparse matches holds exactly the ranks and arrivals of one transfer or all-reduce of
    the oracle, each rank waiting the last arrival less its own: 48 transfers (4 micro-batches × 2 ways × 3
    steps × 2 pipelines) and 24 all-reduces (4 parameters × 3 steps × 2 data-parallel groups)."""
    want = oracle_instances(JOBS[job[0]])
    assert sum(w == "transfer" for w, *_ in want) == 48 and sum(w == "all_reduce" for w, *_ in want) == 24
    assert all(len(arrivals) == 2 for arrivals in want.values())
    assert matched_waits(job[1]) == _expected(want)


def test_four_stages_beside_data_parallelism_pair_as_well():
    """DP2 × PP4: groups of four (pipelines), of two (data parallel) and the world; 144 transfers (3 neighbour
    pairs × 2 ways × 4 micro-batches × 3 steps × 2 pipelines) and 48 all-reduces (4 × 3 × 4 pairs)."""
    want = oracle_instances(CHAIN, MADE_PP4)
    assert sum(w == "transfer" for w, *_ in want) == 144 and sum(w == "all_reduce" for w, *_ in want) == 48
    assert matched_waits(run_of(CHAIN)) == _expected(want)


def test_the_slow_end_of_a_chain_is_named_not_the_links_before_it():
    """Rank 7 (last stage of pipeline [4, 5, 6, 7]) runs its layers three times over. Counted at the instances
    each rank is last to, ranks 5 and 6 (late because they waited for rank 7's gradients) make the others wait
    more than rank 7 does, and wait most of their steps themselves: it read as the pipeline's bubble, "none is
    slow". Rank 7 waits under half the share of its steps the median other rank waits: it is the straggler."""
    f = run_rule(run_of(CHAIN), "stragglers")
    m = f.metrics
    assert (f.severity, m["straggler_rank"]) == ("warning", MADE_PP4["slow_rank"]["dp2pp4_gloo_slow_rank7"]) == (
        "warning", 7)
    ranks = {int(r): row for r, row in m["ranks"].items()}
    share = {r: row["waited_ns"] / row["step_ns"] for r, row in ranks.items()}
    others = sorted(v for r, v in share.items() if r != 7)
    assert share[7] < 0.5 * others[3]  # the median of the 7 others is the 4th
    assert max(ranks[5]["wait_caused_ns"], ranks[6]["wait_caused_ns"]) > ranks[7]["wait_caused_ns"] > 0
    assert m["wait_caused_ns"] == ranks[7]["wait_caused_ns"]
    assert m["slow_rank_host"][0]["name"] == "aten::mm"
    # the table lists ranks 5 and 6 above rank 7's wait caused: the finding says why they are not the straggler
    from traceparse.figures import fmt_ns, fmt_pct

    by_caused = sorted((5, 6), key=lambda r: (-ranks[r]["wait_caused_ns"], r))
    pct = {r: fmt_pct(round(100.0 * share[r], 4)) for r in (5, 6, 7)}
    assert (f"Ranks {by_caused[0]} and {by_caused[1]} made the others wait longer "
            f"({fmt_ns(ranks[by_caused[0]]['wait_caused_ns'])} and {fmt_ns(ranks[by_caused[1]]['wait_caused_ns'])} "
            f"in all) but were late because they waited: {pct[by_caused[0]]} and {pct[by_caused[1]]} of their step "
            f"time waiting, where rank 7 waited {pct[7]} of its own") in f.message


def test_the_all_reduces_are_named_by_the_data_parallel_groups(job):
    """The inferred groups are the script's data-parallel groups, by the names Kineto gives them
    (``pg_config``): each all-reduce instance's members are one of them."""
    from traceparse import measures

    _, trace = job
    waits = measures.collective_waits(trace.events).filter(pl.col("collective") == "all_reduce")
    members = {name: sorted(ms) for name, ms in waits.group_by("process_group").agg("member").with_columns(
        pl.col("member").list.unique()).iter_rows()}
    assert sorted(members.values()) == sorted(MADE["dp_groups"])
    for rank in range(4):  # the names are the ranks' own for those groups
        info = read_torch(JOBS[job[0]] / f"rank{rank}.json.gz").meta.distributed
        named = {str(g["name"]): sorted(g["ranks"]) for g in info["process_groups"]}
        assert all(named[name] == ms for name, ms in members.items() if rank in ms)


def test_the_slow_rank_is_named_with_what_it_does_longer():
    """Rank 3 runs its GEMMs three times over: it is the straggler, the others' waits are the oracle's, no
    collective is missing and no clock difference is claimed (one machine); the largest excess is aten::mm."""
    f = run_rule(run_of(JOBS["slow"]), "stragglers")
    m = f.metrics
    assert (f.severity, m["straggler_rank"]) == ("critical", MADE["slow_rank"]["dp2pp2_gloo_slow_rank3"]) == (
        "critical", 3)
    assert m["collectives"] == 72 and m["incomplete_collectives"] == 0
    assert "missing" not in f.message and "clocks" not in f.message
    want = oracle_instances(JOBS["slow"])
    last = dict.fromkeys(range(4), 0)
    for arrivals in want.values():
        latest = max(arrivals.values())
        last[min(r for r, t in arrivals.items() if t == latest)] += 1
    assert {int(r): row["last_count"] for r, row in m["ranks"].items()} == last
    assert m["slow_rank_host"][0]["name"] == "aten::mm"


def test_the_balanced_job_is_its_pipelines_bubble():
    """Even stages: every rank waits in its transfers and its all-reduces, the most waited-for about as much as
    it makes the others wait: the pipeline's bubble, no straggler."""
    f = run_rule(run_of(JOBS["balanced"]), "stragglers")
    assert (f.severity, f.title, f.metrics["straggler_rank"]) == (
        "info", "Pipeline bubble: every stage waits, none is slow", None)
    assert f.message.startswith("4 ranks, 48 point-to-point transfers and 24 collectives. Every rank waits in its "
                                "sends and receives and its collectives: ")
    assert "missing" not in f.message and "clocks" not in f.message


def test_the_reader_lists_what_an_unnamed_call_may_be():
    """``peer_rank`` where the rank's groups (``pg_config``) leave one rank for the call's third argument, else
    ``peer_rank_choices`` (the default group's reading first); ``process_group_choices`` on every all-reduce
    row: the rank's groups' names, largest first. Worked out from each rank's raw JSON."""
    import gzip

    for rank in range(4):
        path = JOBS["balanced"] / f"rank{rank}.json.gz"
        with gzip.open(path, "rt") as fh:
            info = json.load(fh)["distributedInfo"]
        mine = sorted((g for g in info["pg_config"] if rank in g["ranks"]), key=lambda g: -len(g["ranks"]))
        calls = [e for e in raw_events(path) if e.get("cat") == "cpu_op" and e["name"] in CALLS[:2]]
        want = {}
        for e in calls:
            local = int(e["args"]["Concrete Inputs"][2])
            may = []
            for g in mine:
                if local < len(g["ranks"]) and g["ranks"][local] != rank and g["ranks"][local] not in may:
                    may.append(g["ranks"][local])
            want[us_to_ns(e["ts"])] = (may[0], None) if len(may) == 1 else (None, may)
        events = read_torch(path).events
        got = {t: (p, None if c is None else json.loads(c)) for t, p, c in events.filter(
            pl.col("name").is_in(CALLS[:2])).select("start_ns", "peer_rank", "peer_rank_choices").iter_rows()}
        assert got == want and len(got) == 24
        reduces = events.filter(pl.col("collective") == "all_reduce")
        assert reduces.height == 24  # 12 c10d::allreduce_ calls, 12 gloo:all_reduce on the worker threads
        assert set(reduces["process_group_choices"].to_list()) == {json.dumps([str(g["pg_name"]) for g in mine])}
    # rank 1's peer is rank 0 in every group it belongs to; rank 2's "1" is rank 1 or rank 3
    assert {len(json.loads(c)) for c in read_torch(JOBS["balanced"] / "rank2.json.gz").events[
        "peer_rank_choices"].drop_nulls().to_list()} == {2}


# -- hand-made rows (edge cases the real jobs do not have) ------------------------------------------------------
def _rows(ends: dict, choices: str | None = '["0", "1", "2"]', named: str | None = None) -> pl.DataFrame:
    """Collective candidate rows: for each member, one gloo annotation per end time (start 1 ms before)."""
    rows = [{"member": m, "rank": m, "trace_id": f"r{m}", "event_id": k, "device_id": None, "stream_id": None,
             "pid": m, "tid": 1, "name": "gloo:all_reduce", "collective": "all_reduce", "seq": None,
             "process_group": named, "process_group_choices": choices, "peer_rank": None,
             "peer_rank_choices": None, "start_ns": end - 1_000_000, "end_ns": end, "bytes": None,
             "source": "host annotation", "step": None} for m, times in ends.items() for k, end in enumerate(times)]
    return pl.DataFrame(rows, schema_overrides={"member": pl.Int32, "rank": pl.Int32, "device_id": pl.Int32,
                                                "peer_rank": pl.Int32, "seq": pl.Int64, "stream_id": pl.Int64,
                                                "process_group": pl.String, "process_group_choices": pl.String,
                                                "peer_rank_choices": pl.String, "bytes": pl.Int64,
                                                "step": pl.Int64})


def _groups_of(rows: pl.DataFrame) -> dict:
    from traceparse.measures.comm_groups import settled_groups

    # members listing group "0" (all four), "1" ([0, 1]) or "2" ([2, 3]): each lists the world and its own pair
    return dict(settled_groups(rows).select("member", "process_group").unique().iter_rows())


def test_a_grouping_is_taken_only_where_its_members_leave_together():
    """Four ranks in the world group and in pairs ``[0, 1]``, ``[2, 3]``: all-reduces all four leave within 20 us
    are the world's (a finer grouping is never further apart, so the coarsest that is close enough is taken);
    all-reduces each pair leaves together, 5 ms after the other pair, are the pairs'."""
    lists = {0: '["0", "1"]', 1: '["0", "1"]', 2: '["0", "2"]', 3: '["0", "2"]'}
    together = pl.concat([_rows({m: [10_000_000 + 5_000 * m, 20_000_000 + 5_000 * m]}, lists[m]) for m in range(4)])
    assert _groups_of(together) == {0: "0", 1: "0", 2: "0", 3: "0"}
    pairs = pl.concat([_rows({m: [10_000_000 + 5_000_000 * (m // 2), 20_000_000 + 5_000_000 * (m // 2)]}, lists[m])
                       for m in range(4)])
    assert _groups_of(pairs) == {0: "1", 1: "1", 2: "2", 3: "2"}


def test_collectives_that_name_their_group_are_read_as_they_say():
    """Where any collective of the run names its process group, nothing is inferred: the unnamed ones keep no
    group (as before), and the choices column is dropped."""
    from traceparse.measures.comm_groups import settled_groups

    rows = pl.concat([_rows({0: [10_000_000], 1: [10_000_000]}, '["0", "1"]'),
                      _rows({2: [15_000_000]}, None, named="7")])
    out = settled_groups(rows)
    assert "process_group_choices" not in out.columns
    assert out.sort("member")["process_group"].to_list() == [None, None, "7"]


def test_a_peer_no_other_side_settles_keeps_the_default_groups_reading():
    """Rank 0's send to its group's "1" may be rank 1 or rank 2; neither receives from rank 0 (their traces are
    cut short): the first listed (the default group's numbering) is kept, as the trace's number reads."""
    from traceparse.measures.comm_groups import settled_peers

    rows = pl.DataFrame({"member": [0, 1, 2], "collective": ["send", "send", "send"], "peer_rank": [None, 3, 3],
                         "peer_rank_choices": ["[1, 2]", None, None]},
                        schema_overrides={"member": pl.Int32, "peer_rank": pl.Int32})
    assert settled_peers(rows)["peer_rank"].to_list() == [1, 3, 3]
    rows = rows.with_columns(collective=pl.Series(["send", "recv", "send"]))  # rank 1 receives from 3, not 0
    assert settled_peers(rows)["peer_rank"].to_list() == [1, 3, 3]
    rows = rows.with_columns(collective=pl.Series(["send", "send", "recv"]), peer_rank=pl.Series([None, 3, 0],
                                                                                                 dtype=pl.Int32))
    assert settled_peers(rows)["peer_rank"].to_list() == [2, 3, 0]  # rank 2 receives from rank 0: it is rank 2


# -- the dependency graph and its replay see the same pairs -----------------------------------------------------
def test_the_critical_paths_graph_joins_every_rank_at_every_instance_of_it():
    """The critical path's graph built its own collective matching from candidate rows cut to a fixed set of
    columns, without the choices: rank 0's transfers paired with nobody, rank 1 joined 12 of its 36 instances,
    and ``whatif --balance`` kept rank 1 waiting for a rank 3 that was no longer slow (345 ms predicted where the
    balanced twin runs 188 ms a step). Each rank now joins each of its instances, as the oracle counts them."""
    from traceparse.measures.critical_path import dependency_graph

    want = oracle_instances(JOBS["slow"])
    per_rank = {r: sum(r in arrivals for arrivals in want.values()) for r in range(4)}
    assert per_rank == {0: 36, 1: 36, 2: 36, 3: 36}
    graph = dependency_graph(run_of(JOBS["slow"]).events)
    joins = graph.filter(pl.col("edge") == "join").group_by("src_rank").len()
    assert dict(joins.iter_rows()) == per_rank


@pytest.mark.parametrize("slow, made, twin", [
    (JOBS["slow"], MADE, "dp2pp2_gloo_balanced"), (CHAIN, MADE_PP4, "dp2pp4_gloo_balanced")], ids=["dp2pp2", "dp2pp4"])
def test_balancing_the_slow_rank_predicts_the_balanced_twin(tmp_path, slow, made, twin):
    """``whatif --balance`` evens the slow rank's work: the balanced twin, measured by the script's own clock (the
    mean of every rank's profiled steps), is the answer, within 15% (dp2pp2: 168.6 ms against 187.9;
    dp2pp4: 302.8 against 266.1)."""
    from helpers import run_cli

    code, out, err = run_cli("--store", str(tmp_path / "s"), "whatif", str(slow), "--balance", "--json")
    assert code == 0, err
    predicted_ms = json.loads(out)["mean"]["predicted_ns"] / 1e6
    steps = [t for per_rank in made["step_wall_ms"][twin].values() for t in per_rank[2:]]
    twin_ms = sum(steps) / len(steps)
    assert abs(predicted_ms - twin_ms) <= 0.15 * twin_ms, (predicted_ms, twin_ms)
