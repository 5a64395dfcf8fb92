"""Tensor parallelism inside data parallelism over gloo: three groupings of the same ranks, none named.

The fixtures (fixtures/make_tp_dp_fixtures.py ``--cpu``, four CPU processes on the GPU machine, PyTorch 2.11):
a ``(dp 2, tp 2)`` device mesh; each block's MLP split over the tensor-parallel group (``[0, 1]``, ``[2, 3]``:
an all-reduce of activations forward and backward), FSDP2 over the data-parallel group (``[0, 2]``, ``[1, 3]``:
all-gathers and reduce-scatters) and the loss all-reduced over all four. gloo names no group on any call, and
runs each on a worker thread of its group, recorded as its own annotation (a reduce-scatter as
``gloo:all_reduce``). Settled as one grouping for every call, the data-parallel pairs took the activations'
all-reduces too: the job with rank 3's loader 80 ms slow read "Stragglers: ranks 3 and 2" with rank 2 waiting
3 ms in all (it waited 282 ms, for its tensor-parallel partner). Every figure here is worked out from the raw
JSON and the groups the script made (its record), not from traceparse.
"""

from __future__ import annotations

import json

import polars as pl
import pytest

from helpers import FIXTURES, matched_waits, raw_events, run_of, run_rule, us_to_ns

RUNS = FIXTURES / "torch" / "multirank"
MADE = json.loads((RUNS / "tp2dp2_gloo_step_times.json").read_text())
JOBS = {v: RUNS / f"tp2dp2_gloo_{v}" for v in ("balanced", "slow_loader", "slow_gpu")}
CALLS = ("_c10d_functional::all_reduce", "c10d::allreduce_", "c10d::_allgather_base_", "c10d::_reduce_scatter_base_")


def oracle_instances(folder) -> dict:
    """Every collective of the job from the raw JSON, keyed ``(what, members, k)``, values ``{rank: arrival}``
    (the outermost call's start, ns): an all-reduce of activations (a functional all-reduce, holding its
    ``c10d::allreduce_``) over the rank's tensor-parallel group, the loss's (a ``c10d::allreduce_`` of a
    scalar, alone) over all ranks, an all-gather or reduce-scatter over the rank's data-parallel group; the
    k-th of its kind in that group."""
    world, groups = MADE["world_size"], MADE["groups"]
    out: dict = {}
    for rank in range(world):
        tp = tuple(next(g for g in groups["tp"] if rank in g))
        dp = tuple(next(g for g in groups["dp"] if rank in g))
        calls = sorted((e for e in raw_events(folder / f"rank{rank}.json.gz")
                        if e.get("cat") == "cpu_op" and e["name"] in CALLS), key=lambda e: e["ts"])
        functional = [e for e in calls if e["name"] == "_c10d_functional::all_reduce"]
        seen: dict = {}
        for e in calls:
            if e["name"] == "c10d::allreduce_" and any(
                    f["tid"] == e["tid"] and f["ts"] <= e["ts"] <= f["ts"] + f["dur"] for f in functional):
                continue  # inside its functional all-reduce: one call
            if e["name"] == "_c10d_functional::all_reduce":
                key = ("activations", tp)
            elif e["name"] == "c10d::allreduce_":
                assert e["args"]["Input Dims"][0] == [[]]  # the loss: a scalar
                key = ("loss", tuple(range(world)))
            else:
                key = (e["name"], dp)
            k = seen[key] = seen.get(key, -1) + 1
            out.setdefault((*key, k), {})[rank] = us_to_ns(e["ts"])
    return out


@pytest.fixture(scope="module", params=sorted(JOBS))
def job(request):
    return request.param, run_of(JOBS[request.param])


def test_each_call_meets_the_ranks_of_its_own_group(job):
    """Every instance traceparse matches holds exactly the ranks and arrivals of one collective of the oracle,
    each rank waiting the last arrival less its own: per job 48 all-reduces of activations (4 blocks × 2 ways ×
    3 steps × 2 tensor-parallel pairs), 54 all-gathers and 30 reduce-scatters (FSDP2's, over 2 data-parallel
    pairs) and 3 losses over all four."""
    want = oracle_instances(JOBS[job[0]])
    kinds = {}
    for what, members, _ in want:
        kinds[what] = kinds.get(what, 0) + 1
    assert kinds == {"activations": 48, "c10d::_allgather_base_": 54, "c10d::_reduce_scatter_base_": 30, "loss": 3}
    assert all(len(a) == (4 if w == "loss" else 2) for (w, *_), a in want.items())
    expected = {frozenset(a.items()): {r: max(a.values()) - t for r, t in a.items()} for a in want.values()}
    assert matched_waits(job[1]) == expected


def test_the_groups_are_the_ones_the_script_made(job):
    """Each kind of collective is over the groups the script made, by the names Kineto gives them: the
    activations' all-reduces over the tensor-parallel pairs, FSDP2's all-gathers and reduce-scatters over the
    data-parallel pairs, the loss over the default group of all four."""
    from traceparse import measures

    waits = measures.collective_waits(job[1].events)
    members = (waits.group_by("process_group", "collective", "instance").agg(pl.col("member").sort())
               .group_by("collective").agg(pl.col("member").unique()))
    got = {c: sorted(ms) for c, ms in members.iter_rows()}
    tp, dp = sorted(MADE["groups"]["tp"]), sorted(MADE["groups"]["dp"])
    assert got["all_gather"] == got["reduce_scatter"] == dp
    assert got["all_reduce"] == sorted([*tp, [0, 1, 2, 3]])


def test_each_call_ends_with_the_worker_that_ran_it(job):
    """gloo runs each call on a worker thread of its group (``gloo:all_gather``, ``gloo:all_reduce``, a
    reduce-scatter as an all-reduce): every instance's members leave it by their worker's annotation, one
    whose recorded tensor is one of the call's (the raw JSON's ``Input Dims``), and none leaves before the
    last has arrived."""
    from traceparse.measures.comm import collectives, completions

    done = completions([collectives.part(job[1].events)])
    assert done.height == sum(len(a) for a in oracle_instances(JOBS[job[0]]).values())
    assert set(done["done_source"].to_list()) == {"host annotation"}
    assert set(zip(done["collective"].to_list(), done["done_name"].to_list())) == {
        ("all_gather", "gloo:all_gather"), ("all_reduce", "gloo:all_reduce"), ("reduce_scatter", "gloo:all_reduce")}
    events = {}
    for rank in range(4):
        for e in raw_events(JOBS[job[0]] / f"rank{rank}.json.gz"):
            if e.get("ph") == "X" and str(e.get("name")).startswith(("gloo:", "c10d::", "_c10d_functional::")):
                events[rank, us_to_ns(e["ts"])] = e

    for call_start, done_start, rank in done.select("arrival_ns", "join_ns", "member").iter_rows():
        call, worker = events[rank, call_start], events[rank, done_start]
        assert worker["name"].startswith("gloo:") and worker["tid"] != call["tid"]
        assert _sizes(worker["args"]["Input Dims"]) <= _sizes(call["args"]["Input Dims"])
    last = done.group_by("process_group", "instance").agg(
        left=pl.col("done_ns").min(), arrived=pl.col("arrival_ns").max())
    assert (last["left"] >= last["arrived"]).all()


def _sizes(dims: list) -> set:
    """The element counts of the non-empty shapes anywhere in ``dims`` (a list of tensors is a list of shapes),
    ``{1}`` where there are none (a scalar)."""
    out = set()
    for item in dims:
        if item and all(isinstance(x, int) for x in item):
            count = 1
            for x in item:
                count *= x
            out.add(count)
        elif item:
            out |= _sizes(item) - {1}
    return out or {1}


def _oracle_ranks(folder) -> dict:
    """Per rank: collectives it arrived last to, the wait it caused (each instance's waits, to its last
    arrival), the time it waited."""
    table = {r: {"last": 0, "caused": 0, "waited": 0} for r in range(4)}
    for arrivals in oracle_instances(folder).values():
        latest = max(arrivals.values())
        late = min(r for r, t in arrivals.items() if t == latest)
        table[late]["last"] += 1
        for r, t in arrivals.items():
            table[r]["waited"] += latest - t
            table[late]["caused"] += latest - t
    return table


@pytest.mark.parametrize("variant", ["slow_loader", "slow_gpu"])
def test_the_slow_rank_is_named_with_the_waits_of_the_oracle(variant):
    """Rank 3 (the script's slow rank) is the one straggler, with what it does longer; every rank's last count,
    wait caused and wait equal the oracle's. Before: "Stragglers: ranks 3 and 2" with rank 2 waiting 3 ms in
    all, where it waited 282 ms for rank 3, its tensor-parallel partner."""
    f = run_rule(run_of(JOBS[variant]), "stragglers")
    m = f.metrics
    assert MADE["slow_rank"] == m["straggler_rank"] == 3
    assert f.title == "Straggler: rank 3"
    want = _oracle_ranks(JOBS[variant])
    got = {int(r): {"last": row["last_count"], "caused": row["wait_caused_ns"], "waited": row["waited_ns"]}
           for r, row in m["ranks"].items()}
    assert got == want
    longer = m["slow_rank_host"][0]["name"]
    assert longer == ("DataLoader" if variant == "slow_loader" else "aten::mm")


def test_the_balanced_job_has_no_straggler():
    f = run_rule(run_of(JOBS["balanced"]), "stragglers")
    assert f.severity == "info" and f.metrics["straggler_rank"] is None
    want = _oracle_ranks(JOBS["balanced"])
    assert {int(r): row["waited_ns"] for r, row in f.metrics["ranks"].items()} == {
        r: w["waited"] for r, w in want.items()}


def test_the_critical_paths_graph_joins_every_rank_at_every_instance_of_it():
    """The dependency graph (critical path, ``whatif``) matches collectives with the same settlement: each rank
    joins each instance it is in, as the oracle counts them (69 a rank: 24 activations, 27 all-gathers, 15
    reduce-scatters, 3 losses)."""
    from traceparse.measures.critical_path import dependency_graph

    want = oracle_instances(JOBS["slow_loader"])
    per_rank = {r: sum(r in arrivals for arrivals in want.values()) for r in range(4)}
    assert per_rank == dict.fromkeys(range(4), 69)
    graph = dependency_graph(run_of(JOBS["slow_loader"]).events)
    joins = graph.filter(pl.col("edge") == "join").group_by("src_rank").len()
    assert dict(joins.iter_rows()) == per_rank


def test_balancing_the_slow_loader_predicts_the_balanced_twin(tmp_path):
    """``whatif --balance`` on the job whose rank 3 loads late: the balanced twin, measured by the script's own
    clock (the mean of every rank's profiled steps), is the answer within 15% (120.6 ms against 131.2; the job
    itself runs 197.8)."""
    from helpers import run_cli

    code, out, err = run_cli("--store", str(tmp_path / "s"), "whatif", str(JOBS["slow_loader"]), "--balance",
                             "--json")
    assert code == 0, err
    predicted_ms = json.loads(out)["mean"]["predicted_ns"] / 1e6
    steps = [t for per_rank in MADE["variants"]["tp2dp2_balanced"]["profiled_wall_ms"].values() for t in per_rank]
    twin_ms = sum(steps) / len(steps)
    slow = [t for per_rank in MADE["variants"]["tp2dp2_slow_loader"]["profiled_wall_ms"].values() for t in per_rank]
    assert abs(predicted_ms - twin_ms) <= 0.15 * twin_ms < sum(slow) / len(slow) - twin_ms, (predicted_ms, twin_ms)


# -- FSDP2 alone over gloo's default group (the script's --tp 1 --no-mesh): nothing to settle, calls still linked --
PLAIN = RUNS / "fsdp4_gloo_slow_loader"
PLAIN_MADE = json.loads((RUNS / "fsdp4_gloo_step_times.json").read_text())


def test_a_reduce_scatter_ends_with_its_worker_where_there_is_one_group():
    """One process group (every rank lists only the default one): no group to settle, but gloo still runs each
    reduce-scatter as ``gloo:all_reduce``. Matched as the k-th annotation of its own collective, every
    reduce-scatter ended with its own call (queued, not exchanged) and the loss's all-reduces took the first
    reduce-scatters' annotations: 13 of 45 instances had a rank leaving before the last one arrived. Now each
    call ends with its worker's annotation, and none does."""
    from traceparse.measures.comm import collectives, completions

    assert PLAIN_MADE["mesh"] is None and PLAIN_MADE["backend"] == "gloo"
    done = completions([collectives.part(run_of(PLAIN).events)])
    calls = {}
    for rank in range(4):
        for e in raw_events(PLAIN / f"rank{rank}.json.gz"):
            if e.get("ph") == "X" and e.get("cat") == "cpu_op" and e["name"] in CALLS[1:]:
                calls[rank, us_to_ns(e["ts"])] = e["name"]
    # 27 all-gathers, 15 reduce-scatters and 3 losses a rank, every one an instance of all four ranks
    assert sorted(calls.values()).count("c10d::_reduce_scatter_base_") == 60 and len(calls) == 180
    assert done.height == 180 and set(done["done_source"].to_list()) == {"host annotation"}
    names = dict(zip(zip(done["member"].to_list(), done["arrival_ns"].to_list()), done["done_name"].to_list()))
    assert {(calls[k], v) for k, v in names.items()} == {
        ("c10d::_allgather_base_", "gloo:all_gather"), ("c10d::_reduce_scatter_base_", "gloo:all_reduce"),
        ("c10d::allreduce_", "gloo:all_reduce")}
    last = done.group_by("process_group", "instance").agg(
        left=pl.col("done_ns").min(), arrived=pl.col("arrival_ns").max())
    assert last.height == 45 and (last["left"] >= last["arrived"]).all()
    f = run_rule(run_of(PLAIN), "stragglers")
    assert f.metrics["straggler_rank"] == PLAIN_MADE["slow_rank"] == 3


def test_the_critical_path_runs_through_the_late_loader_not_the_waits_for_it():
    """A functional collective's ``wait_tensor`` blocks its thread under gloo until the worker has exchanged the
    tensor: the wait is the others' late arrival, not work of its own. Read as a host operator, the critical
    path of the slow-loader job named "rank 2's wait_tensor holds the step" (57 ms a step; rank 2 waits for
    rank 3, its tensor-parallel partner). A thread resuming from one may have been woken by the worker
    (``wake``), and the path reaches rank 3's ``DataLoader``: per step at least 95% of its mean duration in
    the raw JSON (the 80 ms the script sleeps there), and no ``wait_tensor`` among the path's host operators."""
    durations = [e["dur"] for e in raw_events(JOBS["slow_loader"] / "rank3.json.gz")
                 if e.get("ph") == "X" and e.get("name") == "DataLoader" and e.get("cat") == "user_annotation"]
    per_step_ns = us_to_ns(sum(durations)) / len(durations)
    assert len(durations) == 3 and per_step_ns > 80e6
    f = run_rule(run_of(JOBS["slow_loader"]), "critical-path")
    m = f.metrics
    assert f.title == "Rank 3's DataLoader holds the step"
    assert m["host_ops"]["DataLoader"] >= 0.95 * per_step_ns
    assert max(m["host_ops"], key=m["host_ops"].get) == "DataLoader"
    assert "_c10d_functional::wait_tensor" not in m["host_ops"]


def test_without_shapes_the_calls_are_settled_as_one_grouping(tmp_path):
    """A trace recorded without ``record_shapes`` (made here from the real slow-loader job by dropping every
    ``Input Dims``: an edge case, written so) gives no call's data, so no call can be linked to its worker and no
    family is scored on its exchanges: the calls are settled as one grouping, as before families. The
    all-gathers and reduce-scatters (the data-parallel pairs, 84 of 135) still meet the oracle's ranks (a first
    version scored such families on the calls' own ends, when they were queued, and put the reduce-scatters
    over the tensor-parallel pairs)."""
    import gzip

    stripped = tmp_path / "run"
    stripped.mkdir()
    for rank in range(4):
        doc = json.loads(gzip.open(JOBS["slow_loader"] / f"rank{rank}.json.gz", "rt").read())
        for e in doc["traceEvents"]:
            (e.get("args") or {}).pop("Input Dims", None)
        (stripped / f"rank{rank}.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    want = {frozenset(a.items()): {r: max(a.values()) - t for r, t in a.items()}
            for (what, *_), a in oracle_instances(JOBS["slow_loader"]).items() if what.startswith("c10d::")}
    assert len(want) == 84
    got = matched_waits(run_of(stripped))
    assert {k: got.get(k) for k in want} == want


def test_hotspots_say_the_leading_wait_is_a_wait():
    """On ranks 0–2 of the slow-loader job ``wait_tensor`` leads the routines by exclusive time (40%: they wait
    for rank 3): the finding says it is a wait, not work, and points at stragglers."""
    f = next(f for f in analyze_rules(run_of(JOBS["slow_loader"]), "hotspots")
             if f.title == "Hotspots: routines by exclusive time")
    assert f.items[0]["name"] == "_c10d_functional::wait_tensor"
    assert ("'_c10d_functional::wait_tensor' is a wait: it blocks its thread until a collective is done, so its "
            "time is the exchange and the other ranks' lateness (stragglers says whose), not work of its own."
            ) in f.message


def analyze_rules(trace, rule: str) -> list:
    from traceparse.analysis import analyze

    return [f for f in analyze(trace, rules=[rule]) if f.rule == rule]
