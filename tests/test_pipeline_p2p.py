"""Pipeline parallelism: two stages exchanging activations and gradients by NCCL point-to-point calls.

The fixtures (fixtures/make_pipeline_fixtures.py, two H200s, PyTorch 2.11): ``pp2_balanced`` (4 layers on each
stage) and ``pp2_slow_stage1`` (12 layers on stage 1, rank 1). Each step is a GPipe schedule of 4 micro-batches:
rank 0 ``dist.send``\\ s each activation (a lone P2P call: its kernel's Kineto arguments say ``send``), rank 1
``irecv``\\ s it; the gradients go back through ``batch_isend_irecv`` on both sides (a batched call: its kernel
says no collective, only its name, ``ncclDevKernel_SendRecv``). Every figure here is worked out from the raw
JSON, not from traceparse.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from helpers import FIXTURES, intersect, run_cli, run_of, run_rule, union, us_to_ns
from traceparse.figures import fmt_ns, fmt_pct

RUNS = FIXTURES / "torch" / "multirank"
STEP_TIMES = RUNS / "pp2_step_times.json"


def raw_events(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


def complete(events: list[dict], cat: str) -> list[dict]:
    return sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == cat), key=lambda e: e["ts"])


def span(e: dict) -> tuple[int, int]:
    return us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"])


def oracle_pipeline_waits(folder: Path) -> dict:
    """The waits of a two-stage pipeline from the raw JSON, pairing each transfer by its direction.

    A forward transfer is a kernel whose Kineto ``Collective name`` is ``send`` on rank 0 and ``recv`` on rank
    1 (lone calls); a backward transfer is a P2P kernel without one (the batched calls), on either rank: the
    j-th of a kind on rank 0 meets the j-th of that kind on rank 1 (NCCL keeps a pair's transfers in order).
    Each side's kernel starts when its stream reaches it and spins until the other side's has started, so a
    rank waits [its start, the later start), or to its own kernel's end where that is sooner (a send whose data
    went out before the receive started). A rank's waited time is the union of its waits inside its
    ProfilerStep# windows less what its compute kernels cover; the wait a rank causes is the other's waited
    time at the transfers it was last to.
    """
    kernels, windows, compute = {}, {}, {}
    for rank in (0, 1):
        events = raw_events(folder / f"rank{rank}.json.gz")
        gpu = complete(events, "kernel")
        nccl = [e for e in gpu if e["name"].startswith("ncclDevKernel_SendRecv")]
        forward = "send" if rank == 0 else "recv"
        kernels[rank] = {"forward": [span(e) for e in nccl if e["args"].get("Collective name") == forward],
                         "backward": [span(e) for e in nccl if "Collective name" not in e["args"]]}
        assert len(kernels[rank]["forward"]) + len(kernels[rank]["backward"]) == len(nccl)
        compute[rank] = union([span(e) for e in gpu if not e["name"].startswith("nccl")])
        windows[rank] = union([span(e) for e in complete(events, "user_annotation")
                               if e["name"].startswith("ProfilerStep#")])
    pairs = [(kernels[0][kind][j], kernels[1][kind][j]) for kind in ("forward", "backward")
             for j in range(len(kernels[0][kind]))]
    assert all(len(kernels[0][k]) == len(kernels[1][k]) for k in ("forward", "backward"))
    return waits_of_pairs(pairs, windows, compute)


def waits_of_pairs(pairs: list[tuple[tuple[int, int], tuple[int, int]]], windows: dict, compute: dict) -> dict:
    """Each rank's waited time (the union of its waits, [its start, the later start) but not past its own kernel's
    end, inside its step windows, less its compute kernels), last counts and step time, from the two ranks'
    kernels (start, end) at each transfer."""
    def until(pair, rank: int) -> int:
        return min(max(pair[0][0], pair[1][0]), pair[rank][1])

    def waited(rank: int) -> int:
        waits = union([(pair[rank][0], until(pair, rank)) for pair in pairs if until(pair, rank) > pair[rank][0]])
        inside = [(max(s, a), min(e, b)) for s, e in waits for a, b in windows[rank] if min(e, b) > max(s, a)]
        return sum(e - s - intersect(s, e, compute[rank]) for s, e in inside)

    last_count = {0: sum(1 for a, b in pairs if a[0] > b[0]), 1: sum(1 for a, b in pairs if b[0] >= a[0])}
    steps = {r: sum(e - s for s, e in w) for r, w in windows.items()}
    return {"transfers": len(pairs), "waited_ns": {r: waited(r) for r in (0, 1)}, "last_count": last_count,
            "step_ns": steps}


def test_the_slow_stage_is_the_straggler_at_its_gpus_arrivals():
    """The batched transfers' kernels say only ``send_recv``: the calls (``c10d::recv_``) must still find them.

    Before, no call of rank 0's batched receives met a kernel, so the whole run fell back to the calls' host
    starts: 57.51 ms waited in all (19.17 ms a step), where rank 0's GPU waits 43 ms of each 62 ms step.
    """
    want = oracle_pipeline_waits(RUNS / "pp2_slow_stage1")
    f = run_rule(run_of(RUNS / "pp2_slow_stage1"), "stragglers")
    m = f.metrics
    assert m["straggler_rank"] == 1 and f.severity == "critical"
    assert m["collectives"] == want["transfers"] == 24
    assert m["wait_caused_ns"] == want["waited_ns"][0]  # rank 0 waits only on rank 1
    assert m["others_step_ns"] == want["step_ns"][0]
    for rank in (0, 1):
        row = m["ranks"][str(rank)]
        assert row["last_count"] == want["last_count"][rank]
        assert row["waited_ns"] == want["waited_ns"][rank]
        assert row["step_ns"] == want["step_ns"][rank]
    # the independent oracle: rank 0 waits most of each step (the measured steps are 61-62 ms)
    measured = json.loads(STEP_TIMES.read_text())["variants"]["pp2_slow_stage1"]["step_ms"]
    per_step_ms = want["waited_ns"][0] / 3 / 1e6
    assert 40 < per_step_ms < min(measured["rank0"][2:]) == pytest.approx(61.4, abs=0.1)


def test_the_balanced_pipelines_waits_equal_the_raw_json():
    """Balanced stages still wait: the GPipe bubble (fill and drain). The figures must be the raw JSON's."""
    want = oracle_pipeline_waits(RUNS / "pp2_balanced")
    m = run_rule(run_of(RUNS / "pp2_balanced"), "stragglers").metrics
    assert {int(r): row["waited_ns"] for r, row in m["ranks"].items()} == want["waited_ns"]
    assert {int(r): row["last_count"] for r, row in m["ranks"].items()} == want["last_count"]


def whatif_json(tmp_path: Path, folder: Path, *edits: str) -> dict:
    code, out, err = run_cli("--store", str(tmp_path / "store"), "whatif", str(folder), "--json", *edits)
    assert code == 0, err
    return json.loads(out)


def measured_mean_step_ms(variant: str) -> float:
    """The script's own clock: the mean of every rank's profiled steps (2..4), ms."""
    steps = json.loads(STEP_TIMES.read_text())["variants"][variant]["step_ms"]
    times = [t for per_rank in steps.values() for t in per_rank[2:]]
    return sum(times) / len(times)


def test_balancing_the_slow_stage_predicts_the_balanced_twin(tmp_path):
    """``--balance`` evens stage 1's work to stage 0's: the measured balanced pipeline (4 layers a stage, the
    script's clock: 24.145 ms a step) is the answer. Before, the send/recv calls met no kernel and no wait
    joined the ranks: rank 0 kept its 61.7 ms of waiting and the run's mean was 42.88 ms (77% off)."""
    doc = whatif_json(tmp_path, RUNS / "pp2_slow_stage1", "--balance")
    twin_ms = measured_mean_step_ms("pp2_balanced")
    assert twin_ms == pytest.approx(24.145, abs=0.001)
    assert measured_mean_step_ms("pp2_slow_stage1") > 2.4 * twin_ms  # the slow stage is there to be evened
    assert abs(doc["mean"]["predicted_ns"] / 1e6 - twin_ms) <= 0.05 * twin_ms, doc["mean"]


def test_no_communication_time_does_not_free_the_waiting_stage(tmp_path):
    """Rank 0's receive kernels are mostly rank 0 waiting for stage 1. With communication taking no time, a
    step still lasts at least stage 1's own compute (its compute kernels' union per step, from the raw JSON);
    before, rank 0's steps were predicted at 18.2 ms, as if its waits were the transfers' cost."""
    events = raw_events(RUNS / "pp2_slow_stage1" / "rank1.json.gz")
    windows = [span(e) for e in complete(events, "user_annotation") if e["name"].startswith("ProfilerStep#")]
    compute = union([span(e) for e in complete(events, "kernel") if not e["name"].startswith("nccl")])
    per_step = sum(intersect(s, e, compute) for s, e in windows) / len(windows)
    assert per_step > 50e6
    doc = whatif_json(tmp_path, RUNS / "pp2_slow_stage1", "--scale", "comm=0")
    rank0 = [row for row in doc["steps"] if row["rank"] == 0]
    assert len(rank0) == 3 and all(row["predicted_ns"] >= per_step for row in rank0), rank0


def compute_per_step(rank: int, folder: Path) -> float:
    """A rank's compute kernels (not NCCL) inside its ProfilerStep# windows, per step, ns (raw JSON)."""
    events = raw_events(folder / f"rank{rank}.json.gz")
    windows = [span(e) for e in complete(events, "user_annotation") if e["name"].startswith("ProfilerStep#")]
    compute = union([span(e) for e in complete(events, "kernel") if not e["name"].startswith("nccl")])
    return sum(intersect(s, e, compute) for s, e in windows) / len(windows)


def test_the_slow_stages_gpu_work_is_said_to_explain_the_wait():
    """Stage 1's extra work is spread over three GEMM kernels (none alone half the wait): the rule said "what
    the trace records on rank 1 explains little of the wait ... look at what it does that the trace does not
    show (data loading, hooks, I/O, a sleep)", of twelve layers against four, all in the trace."""
    folder = RUNS / "pp2_slow_stage1"
    want = oracle_pipeline_waits(folder)
    wait_per_step = want["waited_ns"][0] / 3
    extra = compute_per_step(1, folder) - compute_per_step(0, folder)
    assert extra >= 0.5 * wait_per_step  # the raw JSON: stage 1's extra compute is most of rank 0's wait
    f = run_rule(run_of(folder), "stragglers")
    assert f.suggestion.startswith("rank 1's GPU work explains the wait: the 5 kernels of largest excess take ")
    assert "explains little" not in f.suggestion and "a sleep" not in f.suggestion
    listed = sum(r["slow_ns"] - r["median_ns"] for r in f.metrics["slow_rank_gpu"])
    assert 0.9 * extra <= listed <= extra  # the listed kernels' excess: most of the raw JSON's
    assert "of 24 point-to-point transfers" in f.message and "Even out the pipeline's stages" in f.suggestion


def test_a_balanced_pipeline_is_its_bubble_not_a_straggler():
    """Both stages wait (the GPipe fill and drain); the rule named rank 1 "Straggler" (warning, 24.8%) and
    advised looking for uneven data or a slower GPU. The most waited-for stage waits itself at least half as
    long as it makes the other wait (raw JSON): the pipeline's bubble, said as such, at info."""
    want = oracle_pipeline_waits(RUNS / "pp2_balanced")
    assert want["waited_ns"][1] >= 0.5 * want["waited_ns"][0] > 0
    f = run_rule(run_of(RUNS / "pp2_balanced"), "stragglers")
    assert (f.severity, f.title) == ("info", "Pipeline bubble: every stage waits, none is slow")
    assert f.metrics["straggler_rank"] is None
    assert f.suggestion.startswith("Shrink the bubble")
    # what is at stake is every stage's own wait, a mean over the ranks (it was what rank 1 makes rank 0 wait over
    # the ranks: "0 ns on rank 1" in the bottleneck line, for a stage that waits 12.9 ms)
    assert f.impact_ns == round((want["waited_ns"][0] + want["waited_ns"][1]) / 2)
    assert (f.impact_range["least"], f.impact_range["least_ns"], f.impact_range["most"], f.impact_range["most_ns"]) \
        == ("rank 1", want["waited_ns"][1], "rank 0", want["waited_ns"][0])
    # the slow twin keeps its straggler: rank 1 waits 9% of what it costs rank 0
    slow = oracle_pipeline_waits(RUNS / "pp2_slow_stage1")["waited_ns"]
    assert slow[1] < 0.5 * slow[0]


@pytest.mark.parametrize("run", ["pp2_balanced", "pp2_slow_stage1"])
def test_overlap_advice_for_a_pipeline_is_not_data_parallel(run):
    """Every communication kernel of these runs is a send or receive (raw JSON: Kineto's collective name, or
    none on a batch); the rule advised DistributedDataParallel buckets and FSDP prefetching."""
    for rank in (0, 1):
        for e in complete(raw_events(RUNS / run / f"rank{rank}.json.gz"), "kernel"):
            if e["name"].startswith("nccl"):
                assert e["name"].startswith("ncclDevKernel_SendRecv")
                assert e["args"].get("Collective name", "send") in ("send", "recv")
    f = run_rule(run_of(RUNS / run), "comm-compute-overlap")
    assert "DistributedDataParallel" not in f.suggestion and "FSDP" not in f.suggestion
    assert f.suggestion.startswith("Overlap the pipeline's transfers with compute")
    assert "Every communication kernel is a point-to-point transfer" in f.message


def oracle_batched_waits(folder: Path) -> dict:
    """The waits of a two-stage 1F1B pipeline whose every transfer is batched (``batch_isend_irecv``: a send and
    a receive, one NCCL kernel), from the raw JSON: a call's kernel is the first ``ncclDevKernel_SendRecv``
    launched on its thread at or after the call's start (the launch: a CUDA runtime or driver call with the
    kernel's correlation id), and the k-th call of rank 0 meets the k-th of rank 1 (a batch's calls share one
    kernel, so which of its calls meets which does not change a wait)."""
    arrivals, windows, compute = {}, {}, {}
    for rank in (0, 1):
        events = raw_events(folder / f"rank{rank}.json.gz")
        kernels = {e["args"]["correlation"]: e for e in complete(events, "kernel")
                   if e["name"].startswith("ncclDevKernel_SendRecv")}
        launches = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")
                    and e["args"].get("correlation") in kernels]
        launches.sort(key=lambda e: e["ts"])
        calls = [e for e in complete(events, "cpu_op") if e["name"] in ("c10d::send", "c10d::recv_")]
        arrivals[rank] = []
        for call in calls:
            launch = next(e for e in launches if e["tid"] == call["tid"] and e["ts"] >= call["ts"])
            arrivals[rank].append(span(kernels[launch["args"]["correlation"]]))
        compute[rank] = union([span(e) for e in complete(events, "kernel") if not e["name"].startswith("nccl")])
        windows[rank] = union([span(e) for e in complete(events, "user_annotation")
                               if e["name"].startswith("ProfilerStep#")])
    assert len(arrivals[0]) == len(arrivals[1])
    return waits_of_pairs(list(zip(arrivals[0], arrivals[1])), windows, compute)


def test_batched_transfers_wait_at_their_kernels():
    """1F1B batches each send with the stage's next receive: 24 calls and 15 NCCL kernels a rank. Matched call by
    call, no rank had a kernel for every call, and the waits fell back to the calls' host starts: 19.65 ms a
    step where rank 0's GPU waits about 43 ms. A batch's calls now take the kernel launched inside the
    ``nccl:coalesced`` annotation that follows them: every figure equals the raw JSON's, paired by launches."""
    folder = RUNS / "pp2_1f1b_slow_stage1"
    want = oracle_batched_waits(folder)
    f = run_rule(run_of(folder), "stragglers")
    m = f.metrics
    assert m["straggler_rank"] == 1 and f.severity == "critical"
    assert m["collectives"] == want["transfers"] == 24
    assert m["wait_caused_ns"] == want["waited_ns"][0]
    for rank in (0, 1):
        row = m["ranks"][str(rank)]
        assert (row["last_count"], row["waited_ns"], row["step_ns"]) == (
            want["last_count"][rank], want["waited_ns"][rank], want["step_ns"][rank])
    assert 40 < want["waited_ns"][0] / 3 / 1e6 < 62  # most of each ~62 ms step, as the GPipe twin's
    assert "starts on the host" not in f.message


@pytest.fixture(scope="module")
def no_runtime_1f1b(tmp_path_factory) -> Path:
    """The real 1F1B run with its CUDA runtime and driver calls left out (a hand-made edge case of real data:
    as a trace recorded without them, or trimmed), gzipped as the fixture's ranks."""
    folder = tmp_path_factory.mktemp("pp2_1f1b_no_runtime")
    for rank in (0, 1):
        doc = json.loads(gzip.decompress((RUNS / "pp2_1f1b_slow_stage1" / f"rank{rank}.json.gz").read_bytes()))
        doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") not in ("cuda_runtime", "cuda_driver")]
        with gzip.open(folder / f"rank{rank}.json.gz", "wt") as f:
            json.dump(doc, f)
    return folder


def test_host_arrivals_are_said_when_batched_calls_cannot_be_paired(no_runtime_1f1b):
    """Where the batches cannot be told (no launch says which kernel a batch made), the waits stay the calls'
    host starts, and the finding says so, with each rank's counts (raw JSON: its c10d::send and c10d::recv_
    operators, its NCCL kernels)."""
    folder = no_runtime_1f1b
    counts = {}
    for rank in (0, 1):
        events = raw_events(folder / f"rank{rank}.json.gz")
        calls = [e for e in complete(events, "cpu_op") if e["name"] in ("c10d::send", "c10d::recv_")]
        kernels = [e for e in complete(events, "kernel") if e["name"].startswith("nccl")]
        counts[rank] = (len(calls), len(kernels))
    assert counts == {0: (24, 15), 1: (24, 15)}
    f = run_rule(run_of(folder), "stragglers")
    assert f.metrics["straggler_rank"] == 1
    said = "; ".join(f"rank {r} {c} calls, {k} kernels" for r, (c, k) in counts.items())
    assert (f" The arrivals are the calls' starts on the host, not their kernels' on the GPU: the point-to-point "
            f"transfers' calls and communication kernels do not pair one to one ({said};") in f.message
    # where every call met its kernel (the GPipe twin), nothing of the kind is said
    assert "starts on the host" not in run_rule(run_of(RUNS / "pp2_slow_stage1"), "stragglers").message


def test_the_critical_path_says_transfers_where_every_instance_is_one():
    """A pipeline's path crosses ranks at sends and receives, and the message said "of the 24 collectives ... had
    joined a collective": every instance of the run is a send or a receive (raw JSON: no other collective call),
    so it says transfers; a run of all-reduces keeps "collectives"."""
    names = {e["name"] for r in (0, 1) for e in complete(raw_events(RUNS / "pp2_slow_stage1" / f"rank{r}.json.gz"),
                                                         "cpu_op") if e["name"].startswith("c10d::")}
    assert names and all(n.startswith(("c10d::send", "c10d::recv")) for n in names)
    f = run_rule(run_of(RUNS / "pp2_slow_stage1"), "critical-path")
    assert f.metrics["point_to_point"] is True
    assert f" of the {f.metrics['collectives']} point-to-point transfers (" in f.message
    assert "had joined a transfer and waited for them." in f.message and "collective" not in f.message
    fsdp = run_rule(run_of(RUNS / "fsdp2_slow_hook"), "critical-path")  # NCCL all-reduces its path crosses at
    assert fsdp.metrics["point_to_point"] is False
    assert f" of the {fsdp.metrics['collectives']} collectives (" in fsdp.message


# -- four stages over gloo: each transfer has two members, its sender and its receiver --------------------------
PP4 = {"balanced": RUNS / "pp4_gloo_balanced", "slow": RUNS / "pp4_gloo_slow_stage2"}


def oracle_pairwise_transfers(folder: Path) -> dict:
    """Every transfer of a four-stage pipeline from the raw JSON: a ``c10d::send`` on the sender and a
    ``c10d::recv_`` on the receiver, whose third argument (``Concrete Inputs``) is the other rank; the k-th send
    from s to d meets the k-th receive on d from s. Each side arrives at its call's start; the later one is last
    (of two at one instant, the lower rank) and the other waited the difference."""
    arrivals: dict = {}
    for rank in range(4):
        for e in sorted((e for e in raw_events(folder / f"rank{rank}.json.gz") if e.get("cat") == "cpu_op"
                         and e["name"] in ("c10d::send", "c10d::recv_")), key=lambda e: e["ts"]):
            peer = int(e["args"]["Concrete Inputs"][2])
            pair = (rank, peer) if e["name"] == "c10d::send" else (peer, rank)
            arrivals.setdefault(pair, {}).setdefault(rank, []).append(us_to_ns(e["ts"]))
    last, caused = dict.fromkeys(range(4), 0), dict.fromkeys(range(4), 0)
    n = 0
    for (src, dst), sides in arrivals.items():
        assert abs(src - dst) == 1 and len(sides[src]) == len(sides[dst])  # neighbours only, every send received
        for a, b in zip(sides[src], sides[dst]):
            late = src if a > b or (a == b and src < dst) else dst
            last[late] += 1
            caused[late] += abs(a - b)
            n += 1
    return {"transfers": n, "last": last, "caused": caused}


def test_each_transfer_of_a_four_stage_pipeline_meets_its_peer():
    """Stage 2 (rank 2) does three times the others' work (fixtures/make_pipeline4_gloo.py, four CPU processes).
    Transfers were matched as the n-th point-to-point call of every rank, all four together: the rule named
    rank 0 the straggler, counted 24 of 48 transfers "missing on some ranks" and said the ranks' clocks
    differed by 311.7 ms (one host, one clock). Each transfer is now its sender's and its receiver's: the figures
    are the raw JSON's, pair by pair."""
    want = oracle_pairwise_transfers(PP4["slow"])
    f = run_rule(run_of(PP4["slow"]), "stragglers")
    m = f.metrics
    assert (f.severity, m["straggler_rank"]) == ("critical", 2)
    assert m["collectives"] == want["transfers"] == 72  # 3 neighbour pairs × 2 ways × 4 micro-batches × 3 steps
    assert m["incomplete_collectives"] == 0
    assert {int(r): row["last_count"] for r, row in m["ranks"].items()} == want["last"]
    assert {int(r): row["wait_caused_ns"] for r, row in m["ranks"].items()} == want["caused"]
    assert m["wait_caused_ns"] == want["caused"][2] == max(want["caused"].values())
    assert "missing" not in f.message and "clocks" not in f.message
    made = json.loads((RUNS / "pp4_gloo_step_times.json").read_text())
    assert made["slow_rank"]["pp4_gloo_slow_stage2"] == 2 and made["slow_layers"] == 3 * made["layers"]


def test_a_balanced_four_stage_pipeline_is_its_bubble():
    want = oracle_pairwise_transfers(PP4["balanced"])
    f = run_rule(run_of(PP4["balanced"]), "stragglers")
    assert (f.severity, f.title) == ("info", "Pipeline bubble: every stage waits, none is slow")
    assert {int(r): row["last_count"] for r, row in f.metrics["ranks"].items()} == want["last"]
    assert f.metrics["collectives"] == want["transfers"] == 72


def self_time_by_name(events: list[dict], windows: list[tuple[int, int]]) -> dict[str, int]:
    """Each operator name's self time (its duration less its children's, by nesting on its thread) inside
    ``windows``, from the raw JSON."""
    ops = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"
                  and any(s <= us_to_ns(e["ts"]) < t for s, t in windows)),
                 key=lambda e: (e["tid"], us_to_ns(e["ts"]), -us_to_ns(e["dur"])))
    own: dict[str, int] = {}
    stack: list[list] = []  # [end, name] of the open operators of the thread
    tid = None
    for e in ops:
        start, end = span(e)
        if e["tid"] != tid:
            stack, tid = [], e["tid"]
        while stack and stack[-1][0] <= start:
            stack.pop()
        if stack:
            own[stack[-1][1]] -= end - start
        own[e["name"]] = own.get(e["name"], 0) + end - start
        stack.append([end, e["name"]])
    return own


def test_the_critical_path_of_a_four_stage_pipeline_runs_through_the_slow_stage():
    """The path crossed to rank 0 and made rank 3's untraced time its largest part; it runs through stage 2's
    GEMMs now: its largest part is the operator with the most self time on rank 2 in the raw JSON, on rank 2."""
    events = raw_events(PP4["slow"] / "rank2.json.gz")
    windows = [span(e) for e in complete(events, "user_annotation") if e["name"].startswith("ProfilerStep#")]
    own = self_time_by_name(events, windows)
    longest = max(own, key=own.get)
    f = run_rule(run_of(PP4["slow"]), "critical-path")
    top = f.items[0]
    assert (top["rank"], top["kind"], top["name"]) == (2, "host op", longest)
    assert longest == "aten::mm"
    assert f.metrics["point_to_point"] is True


def test_peer_ranks_are_read_from_the_calls_and_from_record_param_comms():
    """``peer_rank``: a c10d call's third argument (gloo), Kineto's ``Dst Rank``/``Src Rank`` mapped through
    ``Process Group Ranks`` (NCCL), each checked against the raw JSON."""
    from traceparse.ingest import read_paths

    for path in (PP4["slow"] / "rank1.json.gz", RUNS / "pp2_balanced" / "rank0.json.gz"):
        raw = [e for e in raw_events(path) if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
        expected = {}
        for e in raw:
            a = e["args"]
            if e["name"] in ("c10d::send", "c10d::recv_"):
                expected[(e["name"], us_to_ns(e["ts"]))] = int(a["Concrete Inputs"][2])
            elif e["name"] == "record_param_comms" and ("Dst Rank" in a or "Src Rank" in a):
                ranks = json.loads(a["Process Group Ranks"])
                expected[(e["name"], us_to_ns(e["ts"]))] = ranks[a.get("Dst Rank", a.get("Src Rank"))]
        events = read_paths([path], fmt="torch")[0].events
        got = {(n, t): p for n, t, p in events.filter(events["peer_rank"].is_not_null())
               .select("name", "start_ns", "peer_rank").iter_rows() if n in ("c10d::send", "c10d::recv_",
                                                                              "record_param_comms")}
        assert got == expected and len(got) >= 24


def test_balancing_the_slow_stage_of_four_predicts_the_balanced_twin(tmp_path):
    """``whatif --balance`` on the four-stage pipeline evens stage 2's work: the balanced twin, measured by the
    script's own clock (mean of every rank's profiled steps), is the answer. Matched by position, the straggler
    was rank 0 and the balance evened its 4.1 ms: 345 ms predicted against the twin's 201.6 ms (now 204)."""
    made = json.loads((RUNS / "pp4_gloo_step_times.json").read_text())["step_wall_ms"]
    twin_ms = [t for per_rank in made["pp4_gloo_balanced"].values() for t in per_rank[2:]]
    twin_ms = sum(twin_ms) / len(twin_ms)
    doc = whatif_json(tmp_path, PP4["slow"], "--balance")
    assert abs(doc["mean"]["predicted_ns"] / 1e6 - twin_ms) <= 0.10 * twin_ms, (doc["mean"], twin_ms)


def test_the_slow_stages_longer_parts_give_no_shares_that_add_past_the_wait(no_runtime_1f1b):
    """The 1F1B run's rank 1 runs three times the GEMMs of rank 0: measured at the hosts' arrivals (here, as
    before batches were paired), its longer kernels came each with its share of the others' wait ("13.31 ms
    more: 67.8% of the wait; ... 11.5 ms more: 58.6% of the wait"), shares adding up past the whole. Each part
    now gives its excess; only the largest excess and the kernels' excesses together (one stream: they add up)
    are set against the wait, and at most all of it."""
    finding = run_rule(run_of(no_runtime_1f1b), "stragglers")
    m = finding.metrics
    assert m["straggler_rank"] == 1
    wait = m["wait_caused_per_step_ns"]
    excesses = [r["slow_ns"] - r["median_ns"] for r in m["slow_rank_host"] + m["slow_rank_gpu"]]
    kernels = sum(r["slow_ns"] - r["median_ns"] for r in m["slow_rank_gpu"])
    assert len(m["slow_rank_gpu"]) > 1 and kernels > wait > max(excesses)  # the case: more than all of it
    largest = max(excesses)
    assert (f"Against the {fmt_ns(wait)} a step the others wait: the largest excess is {fmt_ns(largest)}, "
            f"{fmt_pct(100 * largest / wait)} of it; the {len(m['slow_rank_gpu'])} kernels of largest excess add "
            f"up to {fmt_ns(kernels)}, more than all of it.") in finding.message
    longer = finding.message.split("Longer on rank 1")[1].split("Against the")[0]
    assert "%" not in longer  # no share per part
