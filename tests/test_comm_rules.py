"""Communication: the collective tables, the torch reader's collective columns, the comm measures and the rules
comm-compute-overlap, stragglers and rank-balance, every figure against an independent computation.

The oracles read the raw JSON (gzip + json, plain Python loops and sorted lists) and share no code with
traceparse. The multi-rank traces are combined here the way a run is (each rank's events with ``rank`` and
its own ``trace_id``), from the committed trimmed fixtures (fixtures/make_comm_fixtures.py) and, where they
exist, from the shared samples they were made from.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest

from helpers import (FIXTURES, REPO, intersect, read_torch, run_cli, run_of, run_rule, union, us_to_ns,
                     waited_first)
from traceparse import expr, measures
from traceparse.measures import partitioned
from traceparse.schema import conform
from traceparse.trace import Trace, TraceMeta

SAMPLES = REPO.parent / "shared" / "samples"
MULTIRANK = {"slow": [FIXTURES / "torch" / "multirank" / "gloo4_slow_rank2",
                      SAMPLES / "multirank" / "gloo4_resnet18_bs16_slow_rank2"],
             "balanced": [FIXTURES / "torch" / "multirank" / "gloo4_balanced",
                          SAMPLES / "multirank" / "gloo4_resnet18_bs16"]}
DP2 = [FIXTURES / "torch" / "multigpu" / "dp2_resnet18_bs16.json.gz", SAMPLES / "torch" / "dp2_resnet18_bs16.json.gz"]


def available(paths):
    return [pytest.param(p, id=str(p.relative_to(REPO.parent))) for p in paths if p.exists()]



def raw(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def length(intervals) -> int:
    return sum(e - s for s, e in union(intervals))


# -- independent oracles -------------------------------------------------------------------------------------
def _collective(name: str) -> str | None:
    """all_reduce or broadcast, of an NCCL kernel or a c10d operator (the collectives of these runs)."""
    letters = "".join(ch for ch in name.lower() if ch.isalpha())
    return "all_reduce" if "allreduce" in letters else "broadcast" if "broadcast" in letters else None


def oracle_stragglers(folder: Path) -> dict:
    """From the raw JSON: the n-th c10d::* operator of each rank is one instance (one process group).

    A rank's arrival is its call's start, or on NCCL ranks the start of the call's kernel (an NCCL call only
    queues it; the device waits). A rank's wait at an instance is [its arrival, the last arrival), on NCCL ranks
    cut at its kernel's end (a kernel done waits no more); its waited
    time is the length of the union of its waits inside its ProfilerStep# windows (waits of two collectives in
    flight count once), on NCCL ranks less the part its compute kernels cover, and the wait a rank causes is,
    over the other ranks, their time waited at the instances it was last to, each moment of a rank's waiting
    put down to the wait that began first (collectives in flight at once).
    """
    arrivals, windows, compute, device_of, ends = {}, {}, {}, {}, {}
    for path in sorted(folder.glob("rank*.json.gz")):
        rank = int(path.name[4:].split(".")[0])
        events = raw(path)["traceEvents"]
        ops = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"
                      and e["name"].startswith("c10d::")), key=lambda e: e["ts"])
        arrivals[rank] = [us_to_ns(e["ts"]) for e in ops]
        ends[rank] = [None] * len(ops)  # where a wait ends at the latest: on the device, the rank's kernel's end
        nccl = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"
                       and e["name"].startswith("nccl")), key=lambda e: e["ts"])
        device_of[rank] = bool(nccl)
        compute[rank] = union([(us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"])) for e in events
                               if e.get("ph") == "X" and e.get("cat") == "kernel" and not e["name"].startswith("nccl")])
        if nccl:  # the device's arrival: the k-th call of a collective runs the k-th kernel of that collective
            kernels: dict = {}
            for e in nccl:
                kernels.setdefault(_collective(e["name"]), []).append((us_to_ns(e["ts"]),
                                                                       us_to_ns(e["ts"]) + us_to_ns(e["dur"])))
            seen: dict = {}
            for i, e in enumerate(ops):
                k = _collective(e["name"])
                arrivals[rank][i], ends[rank][i] = kernels[k][seen.get(k, 0)]
                seen[k] = seen.get(k, 0) + 1
            assert {k: len(v) for k, v in kernels.items()} == seen
        windows[rank] = union([(us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"])) for e in events
                               if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                               and e["name"].startswith("ProfilerStep#")])
    steps = {r: length(w) for r, w in windows.items()}
    device = all(device_of.values())
    ranks = sorted(arrivals)
    n = len(arrivals[ranks[0]])
    assert all(len(arrivals[r]) == n for r in ranks)
    last_count = {r: 0 for r in ranks}
    last_of = []
    for i in range(n):
        latest = max(arrivals[r][i] for r in ranks)
        last = min(r for r in ranks if arrivals[r][i] == latest)
        last_of.append((last, latest))
        last_count[last] += 1

    def waited(r: int) -> int:  # |union of r's waits ∩ r's steps|
        # a rank waits in its kernel until the last rank's starts, or until its own ends (a broadcast's root)
        until = [latest if ends[r][i] is None else min(latest, ends[r][i]) for i, (_, latest) in enumerate(last_of)]
        waits = union([(arrivals[r][i], until[i]) for i, (last, latest) in enumerate(last_of)
                       if until[i] > arrivals[r][i]])
        inside = [(max(s, a), min(e, b)) for s, e in waits for a, b in windows[r] if min(e, b) > max(s, a)]
        busy = compute[r] if device else []  # a kernel's wait counts where no compute kernel runs
        return sum(e - s - intersect(s, e, busy) for s, e in inside)

    waited_ns = {r: waited(r) for r in ranks}
    caused = {c: 0 for c in ranks}  # each moment a rank waited, to the wait that began first
    for r in ranks:
        until = [latest if ends[r][i] is None else min(latest, ends[r][i]) for i, (_, latest) in enumerate(last_of)]
        for c, ns in waited_first([(arrivals[r][i], until[i], last) for i, (last, _) in enumerate(last_of)
                                   if last != r], windows[r], compute[r] if device else []).items():
            caused[c] += ns
    candidate = max(ranks, key=lambda r: (caused[r], -r))
    others_step = sum(steps[r] for r in ranks if r != candidate)
    return {"candidate": candidate, "collectives": n, "last_count": last_count, "wait_caused_ns": caused,
            "waited_ns": waited_ns, "step_ns": steps, "others_step_ns": others_step,
            "pct": round(100.0 * caused[candidate] / others_step, 4)}


def gpu_intervals(events: list[dict]) -> dict:
    """Per device: compute-kernel, communication-kernel and other GPU (copy, memset) intervals."""
    out: dict = {}
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        dev = e["args"].get("device", e["args"].get("inDevice"))  # a P2P copy runs on its inDevice
        s = us_to_ns(e["ts"])
        iv = (s, s + us_to_ns(e["dur"]))
        layer = ("comm" if e["name"].startswith("nccl") else "compute") if e["cat"] == "kernel" else "copy"
        out.setdefault(dev, {"compute": [], "comm": [], "copy": []})[layer].append(iv)
    return out


def oracle_overlap(path: Path) -> dict:
    out = {}
    for dev, layers in gpu_intervals(raw(path)["traceEvents"]).items():
        if not layers["comm"]:
            continue
        compute = union(layers["compute"])
        out[dev] = {"kernels": len(layers["comm"]), "comm_time_ns": sum(e - s for s, e in layers["comm"]),
                    "overlapped_ns": sum(intersect(s, e, compute) for s, e in layers["comm"])}
    return out


def oracle_breakdown(layers: dict) -> dict:
    everything = layers["compute"] + layers["comm"] + layers["copy"]
    span = max(e for _, e in everything) - min(s for s, _ in everything)
    compute = length(layers["compute"])
    kernels = length(layers["compute"] + layers["comm"])
    busy = length(everything)
    return {"span_ns": span, "compute_ns": compute, "comm_exposed_ns": kernels - compute,
            "memcpy_ns": busy - kernels, "idle_ns": span - busy, "busy_ns": busy}


# -- the collective tables ------------------------------------------------------------------------------------
RENAMES = [  # (old name, new name) of one collective across NCCL versions
    ("ncclAllReduceRingLLKernel_sum_f32(ncclColl)", "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL128(ncclDevComm*, unsigned long, ncclWork*)"),
    ("ncclKernel_ReduceScatter_RING_LL_Sum___nv_bfloat16(ncclDevComm*, unsigned long, ncclWork*)", "ncclDevKernel_ReduceScatter_Sum_bf16_RING_SIMPLE(ncclDevKernelArgsStorage<4096ul>)"),
    ("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"),
    ("ncclBroadcastRingLLKernel_copy_i8(ncclColl)", "ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)"),
    ("ncclKernel_Reduce_RING_LL_Sum_float(ncclWorkElem)", "ncclDevKernel_Reduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"),
    ("ncclSendRecvKernel_copy_i8(ncclColl)", "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", "nccldevkernel_sendrecv"),
]


def collectives_of(names: list[str]) -> list[str | None]:
    return pl.select(expr.collective(pl.lit(pl.Series(names, dtype=pl.String)))).to_series().to_list()


def test_nccl_renames_classify_the_same():
    old, new = zip(*RENAMES)
    assert collectives_of(list(old)) == collectives_of(list(new))
    assert collectives_of(list(old)) == ["all_reduce", "all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                         "reduce", "send_recv", "send_recv"]


def test_other_communication_names():
    names = ["ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "ncclDevKernelDebug_Generic(x)",
             "mscclKernel_Sum_float_LL_fullOps", "c10d::allreduce_", "c10d::_allgather_base_",
             "c10d::reduce_scatter_tensor_coalesced_", "_c10d_functional::all_reduce", "c10d::recv_any_source_",
             "c10d::barrier", "gloo:all_reduce", "gloo:broadcast", "nccl:all_reduce", "ncclAllReduce",
             "_c10d_functional::wait_tensor", "record_param_comms", "ncclGroupEnd", "reduce_kernel",
             "void at::native::reduce_kernel<512, 1>(...)", "cudaLaunchKernel", None]
    assert collectives_of(names) == [
        "unknown", "unknown", "unknown", "all_reduce", "all_gather", "reduce_scatter", "all_reduce", "recv",
        "barrier", "all_reduce", "broadcast", "all_reduce", "all_reduce", None, None, None, None, None, None,
        None]
    said = pl.Series(["allreduce", "_allgather_base", "reduce_scatter_tensor_coalesced", "send", "wait", None])
    assert pl.select(expr.normalize_collective(pl.lit(said))).to_series().to_list() == [
        "all_reduce", "all_gather", "reduce_scatter", "send", None, None]


# -- the torch reader -----------------------------------------------------------------------------------------
def kineto(tmp_path: Path, events: list[dict], **top) -> Path:
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "GPU"}], **top, "traceEvents": events}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    return path


def test_torch_reader_reads_record_param_comms_and_distributed_info(tmp_path):
    info = {"backend": "nccl", "rank": 1, "world_size": 2, "pg_count": 2,
            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": 2,
                           "ranks": [0, 1]},
                          {"pg_name": "3", "pg_desc": "tp", "backend_config": "cuda:nccl", "pg_size": 1,
                           "ranks": [1]}],
            "nccl_version": "2.27.5"}
    comm_args = {"Collective name": "allreduce", "dtype": "BFloat16", "In msg nelems": 1000,
                 "Out msg nelems": 1000, "Group size": 2, "Process Group Name": "0",
                 "Process Group Description": "default_pg", "Process Group Ranks": "[0, 1]", "Seq": 7}
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 1, "tid": 1, "ts": 10, "dur": 5, "args": {}},
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 11, "dur": 1,
         "args": comm_args},
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 12, "dur": 1,
         "args": {**comm_args, "Collective name": "_allgather_base", "dtype": "Float", "In msg nelems": 10,
                  "Out msg nelems": 20, "Seq": "8"}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "pid": 0,
         "tid": 7, "ts": 20, "dur": 3, "args": {"device": 0, "stream": 7}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "pid": 0,
         "tid": 7, "ts": 30, "dur": 3, "args": {"device": 0, "stream": 7, **comm_args,
                                                 "In msg size": 5, "In msg nelems": None, "Out msg nelems": None}},
        {"ph": "X", "cat": "kernel", "name": "at::native::reduce_kernel", "pid": 0, "tid": 7, "ts": 40, "dur": 3,
         "args": {"device": 0, "stream": 7}},
    ]
    trace = read_torch(kineto(tmp_path, events, distributedInfo=info))
    ev = trace.events
    assert ev["collective"].to_list() == ["all_reduce", "all_reduce", "all_gather", "unknown", "all_reduce", None]
    assert ev["seq"].to_list() == [None, 7, 8, None, 7, None]
    assert ev["process_group"].to_list() == [None, "0", "0", None, "0", None]
    # the larger of In/Out msg nelems x dtype size: 1000 x 2 (BFloat16), 20 x 4 (Float), 5 x 2 (the old key)
    assert ev["bytes"].to_list() == [None, 2000, 80, None, 10, None]
    assert ev["rank"].null_count() == ev.height  # a run sets the rank, not the reader
    assert trace.meta.distributed == {
        "rank": 1, "world_size": 2, "backend": "nccl", "nccl_version": "2.27.5",
        "process_groups": [{"name": "0", "desc": "default_pg", "size": 2, "ranks": [0, 1]},
                           {"name": "3", "desc": "tp", "size": 1, "ranks": [1]}]}
    assert trace.meta.tags == {"rank": "1", "world_size": "2", "backend": "nccl"}  # the tags stay


def test_a_trace_without_distributed_info_has_an_empty_field(fixtures_dir):
    trace = read_torch(fixtures_dir / "torch" / "resnet18_bs4.json.gz")
    assert trace.meta.distributed == {} and trace.events["collective"].null_count() == trace.events.height


# -- stragglers -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("folder", available(MULTIRANK["slow"]))
def test_stragglers_names_rank_2_on_the_slow_run(folder):
    want = oracle_stragglers(folder)
    f = run_rule(run_of(folder), "stragglers")
    m = f.metrics
    assert want["candidate"] == 2 and m["straggler_rank"] == 2
    assert f.severity == "critical"  # > 25% of the others' step time
    assert m["collectives"] == want["collectives"] == 12
    assert m["wait_caused_ns"] == want["wait_caused_ns"][2] and m["others_step_ns"] == want["others_step_ns"]
    assert m["step_time_lost_pct"] == want["pct"]
    assert m["wait_caused_per_step_ns"] == round(want["wait_caused_ns"][2] / 3 / 3)  # 3 other ranks, 3 steps
    # counted once, no rank waits longer than its steps (gloo keeps two collectives in flight)
    assert all(row["waited_ns"] <= row["step_ns"] for row in m["ranks"].values())
    for rank, row in m["ranks"].items():
        r = int(rank)
        assert row == {"last_count": want["last_count"][r], "wait_caused_ns": want["wait_caused_ns"][r],
                       "waited_ns": want["waited_ns"][r], "step_ns": want["step_ns"][r]}
    assert m["ranks"]["2"]["last_count"] == 8  # all six all_reduces and two of the six broadcasts
    assert [i["rank"] for i in f.items][0] == 2


@pytest.mark.parametrize("folder", available(MULTIRANK["balanced"]))
def test_the_balanced_run_has_no_straggler(folder):
    want = oracle_stragglers(folder)
    trace = run_of(folder)
    f = run_rule(trace, "stragglers")
    assert f.severity == "info" and f.metrics["straggler_rank"] is None
    assert f.metrics["step_time_lost_pct"] == want["pct"] < 10
    assert {int(k): v["wait_caused_ns"] for k, v in f.metrics["ranks"].items()} == want["wait_caused_ns"]
    assert all(g.severity == "info" for g in [run_rule(trace, r) for r in ("stragglers", "rank-balance")])


@pytest.mark.parametrize("folder", available(MULTIRANK["slow"]))
def test_aligned_clocks_undo_a_shifted_rank(folder):
    trace = run_of(folder)
    shifted = Trace(trace.events.with_columns(
        start_ns=pl.when(pl.col("rank") == 1).then(pl.col("start_ns") + 5_000_000_000).otherwise(pl.col("start_ns"))),
        TraceMeta(format="run"))
    aligned = run_rule(trace, "stragglers", "stragglers.align_clocks=true").metrics
    assert run_rule(shifted, "stragglers", "stragglers.align_clocks=true").metrics["ranks"] == aligned["ranks"]
    assert aligned["straggler_rank"] == 2 and aligned["clock"] == "aligned on collective ends"
    assert run_rule(shifted, "stragglers").metrics["straggler_rank"] == 1  # unaligned, the shift decides


def one_rank(rank: int, times: list[tuple[int, int]], seqs=None, name="record_param_comms") -> list[dict]:
    return [{"kind": "op", "name": name, "start_ns": s, "duration_ns": 10, "pid": 100 + rank, "tid": 1,
             "rank": rank, "trace_id": f"r{rank}", "collective": "all_reduce", "process_group": "0",
             "seq": None if seqs is None else seqs[i]}
            for i, (s, _) in enumerate(times)]


def test_a_rank_missing_a_collective_is_matched_by_sequence_number():
    # rank 1 lacks seq 2: seq 3 still meets seq 3 (rank 1 is last there, 50 late)
    rows = (one_rank(0, [(0, 0), (100, 0), (200, 0)], [1, 2, 3])
            + one_rank(1, [(30, 0), (250, 0)], [1, 3]))
    trace = Trace(conform(pl.DataFrame(rows)), TraceMeta(format="run"))
    w = measures.collective_waits(trace.events)
    assert w.select("member", "instance", "wait_ns", "members").rows() == [
        (0, 1, 30, 2), (1, 1, 0, 2), (0, 2, 0, 1), (0, 3, 50, 2), (1, 3, 0, 2)]
    f = run_rule(trace, "stragglers")
    # rank 0 waits [0, 30) and [200, 250) for rank 1, but its events end at 210 (no steps: its span is its
    # window), so 30 + 10 of it count
    assert f.metrics["incomplete_collectives"] == 1 and f.metrics["ranks"]["1"]["wait_caused_ns"] == 40
    assert f.metrics["ranks"]["1"]["last_count"] == 2 and f.metrics["ranks"]["0"]["last_count"] == 0


def test_without_sequence_numbers_the_nth_collective_meets_the_nth():
    rows = one_rank(0, [(0, 0), (100, 0)], name="c10d::allreduce_") + one_rank(1, [(5, 0)], name="c10d::allreduce_")
    w = measures.collective_waits(conform(pl.DataFrame(rows)))
    assert w.select("member", "instance", "wait_ns", "last").rows() == [
        (0, 0, 5, False), (1, 0, 0, True), (0, 1, 0, True)]


def test_old_and_new_nccl_kernel_names_meet_as_one_collective():
    # two devices of one process (rank null): device 0 runs NCCL 2.7 names, device 1 NCCL 2.19 names
    old, new = RENAMES[0][0], RENAMES[0][1]
    rows = [{"kind": "kernel", "name": n, "start_ns": s, "duration_ns": 10, "device_id": d, "stream_id": 7}
            for d, n, starts in ((0, old, (0, 100)), (1, new, (4, 130))) for s in starts]
    rows.append({"kind": "kernel", "name": "sgemm", "start_ns": 5, "duration_ns": 10, "device_id": 1, "stream_id": 8})
    trace = Trace(conform(pl.DataFrame(rows)), TraceMeta())
    w = measures.collective_waits(trace.events)
    assert w.select("member", "instance", "collective", "source", "wait_ns").rows() == [
        (0, 0, "all_reduce", "kernel", 4), (1, 0, "all_reduce", "kernel", 0),
        (0, 1, "all_reduce", "kernel", 30), (1, 1, "all_reduce", "kernel", 0)]
    f = run_rule(trace, "comm-compute-overlap")
    # device 1's first NCCL kernel [4, 14) runs beside sgemm [5, 15): 9 ns of its 10. Device 0's kernels wait for
    # device 1's: [0, 4) spinning, and all of [100, 110), which ends before device 1's starts at 130
    assert f.metrics["ranks"] == {
        "0": {"kernels": 2, "comm_time_ns": 20, "overlapped_ns": 0, "overlap_pct": 0.0, "waiting_ns": 14},
        "1": {"kernels": 2, "comm_time_ns": 20, "overlapped_ns": 9, "overlap_pct": 45.0, "waiting_ns": 0}}
    assert f.metrics["waiting_ns"] == 14 and f.metrics["moving_overlap_pct"] == round(100 * 9 / (40 - 14), 4)
    # exposed: device 0's 20, device 1's 1 + 10 ([130, 140) beside no compute); device 0's 14 of waiting no
    # overlap could hide
    assert f.impact_ns == 20 + 11 - 14


def test_one_rank_alone_says_so(fixtures_dir):
    trace = read_torch(fixtures_dir / "torch" / "multirank" / "gloo4_slow_rank2" / "rank2.json.gz")
    f = run_rule(trace, "stragglers")
    assert f.severity == "info" and f.title == "One rank alone" and "rank 2 of 4" in f.message
    g = run_rule(trace, "rank-balance")
    assert g.severity == "info" and g.title == "One rank alone" and "rank 2 of 4" in g.message


# -- comm-compute-overlap -------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", available(DP2))
def test_comm_compute_overlap_on_dp2_equals_an_independent_sweep(path):
    want = oracle_overlap(path)
    f = run_rule(read_torch(path), "comm-compute-overlap")
    assert f.metrics["members"] == "device"
    assert {int(k): {c: v[c] for c in ("kernels", "comm_time_ns", "overlapped_ns")}
            for k, v in f.metrics["ranks"].items()} == want
    assert f.metrics["comm_time_ns"] == sum(v["comm_time_ns"] for v in want.values())
    assert f.metrics["overlapped_ns"] == sum(v["overlapped_ns"] for v in want.values())
    assert sorted(want) == [0, 1] and all(v["kernels"] == 24 for v in want.values())
    # no ranks: one table of the devices, without an empty rank column, and not a second of the same rows
    assert f.tables == {} and [c.key for c in f.columns][:2] == ["device", "kernels"]


def test_comm_compute_overlap_with_compute_beside_it():
    # device 0: an all_reduce [0, 100) beside compute [50, 80) and [90, 150): 30 + 10 = 40 overlapped
    rows = [{"kind": "kernel", "name": n, "start_ns": s, "duration_ns": d, "device_id": 0, "stream_id": st}
            for n, s, d, st in (("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 0, 100, 20), ("gemm", 50, 30, 7),
                                ("relu", 90, 60, 7))]
    f = run_rule(Trace(conform(pl.DataFrame(rows)), TraceMeta()), "comm-compute-overlap")
    assert (f.metrics["comm_time_ns"], f.metrics["overlapped_ns"], f.metrics["overlap_pct"]) == (100, 40, 40.0)
    assert f.severity == "warning" and "One device alone" in f.message


# -- rank-balance ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("folder", available(MULTIRANK["slow"] + MULTIRANK["balanced"]))
def test_rank_balance_equals_an_independent_breakdown(folder):
    want = {}
    for path in sorted(folder.glob("rank*.json.gz")):
        layers = gpu_intervals(raw(path)["traceEvents"])
        assert list(layers) == [0]  # four ranks on one GPU
        want[int(path.name[4:].split(".")[0])] = oracle_breakdown(layers[0])
    f = run_rule(run_of(folder), "rank-balance")
    got = {int(k): {c: v[c] for c in ("span_ns", "compute_ns", "comm_exposed_ns", "memcpy_ns", "idle_ns", "busy_ns")}
           for k, v in f.metrics["ranks"].items()}
    assert got == want
    work = {r: w["compute_ns"] + w["memcpy_ns"] for r, w in want.items()}  # exposed communication is no work
    assert {int(k): v["work_ns"] for k, v in f.metrics["ranks"].items()} == work
    assert f.metrics["imbalance"] == round(max(work.values()) / (sum(work.values()) / len(work)), 4)
    assert f.metrics["slowest_rank"] == max(work, key=lambda r: (work[r], -r))
    assert f.metrics["fastest_rank"] == min(work, key=lambda r: (work[r], r))


@pytest.mark.parametrize("path", available(DP2))
def test_rank_balance_on_two_devices_of_one_process(path):
    layers = gpu_intervals(raw(path)["traceEvents"])
    want = {d: oracle_breakdown(v) for d, v in layers.items() if d is not None}
    f = run_rule(read_torch(path), "rank-balance")
    assert f.metrics["members"] == "device"
    got = {int(k): {c: v[c] for c in ("span_ns", "compute_ns", "comm_exposed_ns", "memcpy_ns", "idle_ns", "busy_ns")}
           for k, v in f.metrics["ranks"].items()}
    assert got == want


# -- measures: partitioned equals whole -----------------------------------------------------------------------
@pytest.mark.parametrize("folder", available(MULTIRANK["slow"][:1]))
def test_comm_measures_partitioned_by_rank_and_trace_equal_whole(folder):
    events = run_of(folder).events
    for m, params in ((measures.comm_overlap, {}), (measures.collectives, {}), (measures.collective_waits, {}),
                      (measures.collective_waits, {"align_clocks": True}), (measures.rank_time, {})):
        whole = m(events, **params)
        for split in ({"by": "rank"}, {"by": "trace_id"}, {"by": "device_id"}, {"chunks": 5}):
            got = partitioned(m, events, **split, **params)
            assert got.sort(got.columns, nulls_last=True).equals(whole.sort(whole.columns, nulls_last=True)), (m, split)


# -- real NCCL: DistributedDataParallel on two H200s, one process per GPU (fixtures/make_nccl_ddp.py) -----------
NCCL = {"slow": FIXTURES / "torch" / "multirank" / "nccl2_slow_rank1",
        "balanced": FIXTURES / "torch" / "multirank" / "nccl2_balanced"}


@pytest.mark.parametrize("kind", sorted(NCCL))
def test_nccl_ranks_say_who_they_are_and_their_collectives(kind):
    """distributedInfo (backend, NCCL version, world size) and the NCCL kernels' collectives, from the raw JSON;
    this PyTorch (2.11) writes no "Seq" on record_param_comms, so instances meet as the n-th of each rank."""
    for path in sorted(NCCL[kind].glob("rank*.json.gz")):
        doc = raw(path)
        trace = read_torch(path)
        info = doc["distributedInfo"]
        assert trace.meta.distributed["rank"] == info["rank"] == int(path.name[4])
        assert (trace.meta.distributed["world_size"], trace.meta.distributed["backend"]) == (2, "nccl")
        kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e["name"].startswith("nccl")]
        comm = trace.events.filter(pl.col("kind") == "kernel", pl.col("collective").is_not_null())
        assert comm.height == len(kernels)
        want = {"all_reduce": sum("AllReduce" in e["name"] for e in kernels),
                "broadcast": sum("Broadcast" in e["name"] for e in kernels)}
        assert dict(comm.group_by("collective").len().iter_rows()) == want and sum(want.values()) == len(kernels)
        assert not any("Seq" in (e.get("args") or {}) for e in doc["traceEvents"])
        assert trace.events["seq"].null_count() == trace.events.height


def test_stragglers_names_rank_1_on_the_real_nccl_run():
    want = oracle_stragglers(NCCL["slow"])
    f = run_rule(run_of(NCCL["slow"]), "stragglers")
    m = f.metrics
    assert want["candidate"] == m["straggler_rank"] == 1 and f.severity == "critical"
    assert m["collectives"] == want["collectives"] == 15
    assert (m["wait_caused_ns"], m["others_step_ns"]) == (want["wait_caused_ns"][1], want["others_step_ns"])
    assert m["step_time_lost_pct"] == want["pct"] > 25
    for rank, row in m["ranks"].items():
        r = int(rank)
        assert row == {"last_count": want["last_count"][r], "wait_caused_ns": want["wait_caused_ns"][r],
                       "waited_ns": want["waited_ns"][r], "step_ns": want["step_ns"][r]}


def test_the_balanced_nccl_run_figures_equal_the_raw_json():
    """Without a planted sleep, rank 0 still arrives last at most collectives here (the figures, whatever they
    say, must be the raw JSON's)."""
    want = oracle_stragglers(NCCL["balanced"])
    f = run_rule(run_of(NCCL["balanced"]), "stragglers")
    assert f.metrics["step_time_lost_pct"] == want["pct"]
    assert {int(k): v["wait_caused_ns"] for k, v in f.metrics["ranks"].items()} == want["wait_caused_ns"]
    assert f.metrics["straggler_rank"] in (None, want["candidate"])


@pytest.mark.parametrize("kind", sorted(NCCL))
def test_comm_overlap_and_rank_balance_on_real_nccl_ranks(kind):
    """Each rank drives its own GPU (device = local rank): per-rank overlap and breakdown from the raw JSON."""
    trace = run_of(NCCL[kind])
    overlap = run_rule(trace, "comm-compute-overlap").metrics
    balance = run_rule(trace, "rank-balance").metrics
    assert overlap["members"] == balance["members"] == "rank"
    for path in sorted(NCCL[kind].glob("rank*.json.gz")):
        rank = int(path.name[4])
        layers = gpu_intervals(raw(path)["traceEvents"])
        assert list(layers) == [rank]  # rank r runs on GPU r
        (dev_overlap,) = oracle_overlap(path).values()
        assert {c: overlap["ranks"][str(rank)][c] for c in ("kernels", "comm_time_ns", "overlapped_ns")} == dev_overlap
        got = {c: balance["ranks"][str(rank)][c]
               for c in ("span_ns", "compute_ns", "comm_exposed_ns", "memcpy_ns", "idle_ns", "busy_ns")}
        assert got == oracle_breakdown(layers[rank])
    # one GPU per rank: the devices' table says it all (rank and device columns), no ranks' table repeats it
    f = run_rule(trace, "comm-compute-overlap")
    assert f.tables == {} and [c.key for c in f.columns][:2] == ["rank", "device"]


def test_a_rank_with_two_devices_gets_a_table_of_ranks_beside_the_devices():
    rows = [{"kind": "kernel", "name": n, "start_ns": s, "duration_ns": 100, "device_id": d, "stream_id": 20, "rank": r}
            for r in (0, 1) for d in (0, 1) for n, s in (("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 0),
                                                         ("gemm", 50))]
    f = run_rule(Trace(conform(pl.DataFrame(rows)), TraceMeta()), "comm-compute-overlap")
    assert len(f.items) == 4 and list(f.tables) == ["ranks"] and sorted(f.metrics["ranks"]) == ["0", "1"]
    assert f.metrics["ranks"]["0"]["comm_time_ns"] == 200 and f.metrics["ranks"]["0"]["overlapped_ns"] == 100


def test_the_real_nccl_run_through_the_store(tmp_path):
    """`traceparse analyze DIR` on the rank directory: a run of two ranks, rank 1 the straggler, as in memory."""
    want = run_rule(run_of(NCCL["slow"]), "stragglers").metrics
    code, out, err = run_cli("--store", str(tmp_path), "analyze", str(NCCL["slow"]), "--rule", "stragglers", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["traces"][0]["run"]["world_size"] == 2 and sorted(doc["traces"][0]["run"]["ranks"]) == ["0", "1"]
    (finding,) = doc["findings"]
    assert finding["metrics"]["straggler_rank"] == 1
    # a run's time at stake is per rank: the wait rank 1 causes over the 2 ranks
    assert finding["metrics"]["wait_caused_ns"] == want["wait_caused_ns"]
    assert finding["impact_ns"] == round(want["wait_caused_ns"] / 2)
    code, out, err = run_cli("--store", str(tmp_path), "analyze", str(NCCL["slow"]), "--rule", "stragglers")
    assert code == 0 and "run nccl2_slow_rank1 (2 ranks)" in out.splitlines()[0], out[:300]  # the run, not rank 0's file


@pytest.mark.parametrize("folder", available(MULTIRANK["slow"][:1]))
def test_hotspots_splits_no_wait_off_gloo_collectives(folder):
    """gloo's collectives run on the host (no communication kernel whose spinning would be waiting): hotspots
    adds no waiting column and says nothing of it."""
    from traceparse.analysis import analyze

    [f] = [f for f in analyze(run_of(folder), rules=["hotspots"]) if f.title == "Hotspots: routines by exclusive time"]
    assert all("waiting_ns" not in i for i in f.items) and "comm_waiting_ns" not in f.metrics
    assert "waiting_ns" not in [c.key for c in f.columns] and "spinning" not in f.message


@pytest.mark.parametrize("cut", [[], ["--step", "all"]])
def test_the_wait_per_step_is_over_the_steps_not_the_merged_windows(cut, tmp_path):
    """``--step all`` lays the steps it cuts end to end, and the rule counted its steps as its merged windows: one,
    so "the others wait 214.9 ms per step" of steps of at most 84.7 ms. The steps are ProfilerStep#N, counted
    here from the raw JSON of the straggler's rank; the wait per step is the wait over them."""
    steps = {e["name"] for e in raw(NCCL["slow"] / "rank1.json.gz")["traceEvents"]
             if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")}
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(NCCL["slow"]), *cut, "--json")
    assert code == 0, err
    doc = json.loads(out)
    m = next(f for f in doc["findings"] if f["rule"] == "stragglers")["metrics"]
    assert len(steps) == doc["summary"][0]["steps"] == 3
    assert m["wait_caused_per_step_ns"] == round(m["wait_caused_ns"] / 1 / len(steps))  # two ranks: one waits
    assert m["wait_caused_per_step_ns"] < doc["summary"][0]["step_max_ns"]


def test_a_run_missing_a_rank_says_so_in_every_analysis(tmp_path):
    """Three of the four ranks of the DDP fixture: the ingest warned "1 of 4 ranks missing", once, on stderr; later
    analyses said nothing, and stragglers counted no collective incomplete (each has the 3 members present, of
    the group of 4 every rank's distributedInfo names). The summary now opens with it, every time, and every
    collective lacks a member."""
    import shutil

    run = tmp_path / "ddp3of4"
    run.mkdir()
    for r in (0, 1, 3):
        shutil.copy(REPO / "fixtures" / "torch" / "multirank" / "ddp4_balanced" / f"rank{r}.json.gz", run)
    store = str(tmp_path / "s")
    assert run_cli("--store", store, "ingest", str(run))[0] == 0
    for _ in range(2):  # the ingest's analysis and a later one alike
        code, out, err = run_cli("--store", store, "analyze", str(run), "--json")
        assert code == 0, err
        doc = json.loads(out)
        assert doc["summary"][0]["incomplete"] == ["1 of 4 ranks missing from the run: 2"]
        m = next(f for f in doc["findings"] if f["rule"] == "stragglers")["metrics"]
        assert m["incomplete_collectives"] == m["collectives"] > 0
    code, out, err = run_cli("--store", store, "--width", "80", "analyze", str(run))
    assert "incomplete   1 of 4 ranks missing from the run: 2; every figure here covers" in out


def test_gpu_idle_of_a_trace_without_runtime_calls_does_not_blame_other_streams(tmp_path):
    """The NCCL fixture keeps no runtime calls (its raw JSON has no cuda_runtime events), so no gap can be told to
    be a host wait: gpu-idle said "host wait 0.0%" and pointed at cross-stream waits for gaps that were rank 1's
    60 ms sleep. It says it cannot tell, and asks for the runtime calls."""
    for path in sorted(NCCL["slow"].glob("rank*.json.gz")):
        assert not any(e.get("cat") in ("cuda_runtime", "cuda_driver") for e in raw(path)["traceEvents"])
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", str(NCCL["slow"]), "--rule", "gpu-idle",
                             "--json")
    assert code == 0, err
    f = json.loads(out)["findings"][0]
    assert f["message"].endswith(" The trace has no runtime calls (launches): whether work was queued in a gap "
                                 "cannot be told, so host waits count as other.")
    assert f["suggestion"].startswith("Record the runtime calls") and "cross-stream" not in f["suggestion"]


@pytest.mark.parametrize("folder", available(MULTIRANK["slow"]))
def test_the_page_s_wait_at_each_collective_adds_up_to_the_time_waited(folder):
    """The page's chart of the wait caused at each collective counts each moment of a rank's waiting once and
    inside its steps: its bars add up to the ranks' time waited (the raw waits, gloo keeping two collectives in
    flight, added up to 1,146.8 ms where the ranks waited 665.9), and the straggler's bars to its wait caused."""
    from traceparse_plugins.commands.report.data import collective_lateness

    want = oracle_stragglers(folder)
    late = collective_lateness(run_of(folder).events)
    bars = late["collectives"]
    assert len(bars) == want["collectives"] == 12
    assert sum(c["caused_ns"] for c in bars) == sum(want["waited_ns"].values())
    assert sum(c["caused_ns"] for c in bars if c["last"] == "rank 2") == want["wait_caused_ns"][2]


@pytest.mark.parametrize("folder", ["nccl2_slow_rank1", "gloo4_balanced", "pp4_gloo_balanced"])
def test_has_communication_answers_as_the_rows_do(folder):
    """measures.comm.has_communication (asked of the distinct names) says what the per-row expressions say, on
    real runs (NCCL kernels; gloo's host calls and no communication kernel) and on one rank's host rows alone."""
    from helpers import run_of
    from traceparse import expr
    from traceparse.measures.comm import has_communication

    events = run_of(FIXTURES / "torch" / "multirank" / folder).events
    for table in (events, events.filter(pl.col("kind") != "kernel"), events.filter(~expr.is_communication())):
        rows = table.select(any=expr.is_communication().any(),
                            kernel=(expr.kind_is("kernel") & expr.is_communication()).any()).row(0)
        assert (has_communication(table), has_communication(table, kernels_only=True)) == rows
    assert has_communication(events) is True
    assert has_communication(events, kernels_only=True) is (folder == "nccl2_slow_rank1")
