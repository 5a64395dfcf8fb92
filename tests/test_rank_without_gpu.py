"""A rank whose GPU activities were not recorded (profiled with ``activities=[ProfilerActivity.CPU]`` by mistake,
or CUPTI unavailable on it) in a run whose other ranks have theirs.

The runs are real rank folders of fixtures/torch/multirank with one rank's GPU-side events taken out here (its
kernels, copies, memsets, GPU annotations, launch flows and runtime calls: what a CPU-only profile of that rank
writes): hand-made mutants of real files, said so. Every rank fell back to its host's calls: fsdp4_slow_loader
with rank 1 so read "critical: 89.49 ms a step" where its GPUs say 31.94, and "their clocks likely differ" of one
machine; with rank 2 (the slow one) so, "No straggler"; nccl2 with rank 0 so, "critical: rank 1, 75.63 ms a
step" (70.25 on the GPUs) and "GPU idle ... (mean of 2)" of one GPU's figure.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import polars as pl
import pytest

from helpers import FIXTURES, run_cli, run_of
from traceparse import measures

MULTIRANK = FIXTURES / "torch" / "multirank"
#: What a CPU-only profile of a rank lacks.
GPU_SIDE = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "ac2g", "cuda_runtime", "cuda_driver"}


def _edited(tmp_path: Path, run: str, rank: int, name: str, edit) -> Path:
    """``run``'s rank files in ``tmp_path / name``, rank ``rank``'s trace events passed through ``edit`` (a list of
    events in, the list to keep out)."""
    out = tmp_path / name
    out.mkdir()
    for path in sorted((MULTIRANK / run).glob("rank*.json.gz")):
        data = gzip.decompress(path.read_bytes())
        if path.name == f"rank{rank}.json.gz":
            doc = json.loads(data)
            doc["traceEvents"] = edit(doc["traceEvents"])
            data = json.dumps(doc).encode()
        (out / path.name).write_bytes(gzip.compress(data, compresslevel=1))
    return out


def _without_gpu(tmp_path: Path, run: str, rank: int) -> Path:
    """``run``'s rank files, rank ``rank``'s without its GPU-side events."""
    return _edited(tmp_path, run, rank, f"{run}_nogpu{rank}",
                   lambda events: [e for e in events if e.get("cat") not in GPU_SIDE])


def _analyzed(tmp_path: Path, folder: Path) -> tuple[dict, dict, str]:
    store = str(tmp_path / f"store_{folder.name}")
    code, out, err = run_cli("--store", store, "analyze", "--json", str(folder))
    assert code == 0, err
    doc = json.loads(out)
    code, screen, err = run_cli("--store", store, "analyze", "--width", "200", str(folder))
    return {f["rule"]: f for f in doc["findings"]}, doc["summary"][0], re.sub(r"[│\s]+", " ", screen)


def test_the_others_are_compared_on_their_gpus(tmp_path):
    """fsdp4_slow_loader with rank 1 CPU-only: ranks 0, 2 and 3 are compared on their kernels' starts, their waits
    those of the whole run without rank 1 (the oracle: the whole run's own measure on the other three), and the
    verdict is the whole run's: rank 2, its DataLoader."""
    folder = _without_gpu(tmp_path, "fsdp4_slow_loader", 1)
    whole = run_of(MULTIRANK / "fsdp4_slow_loader").events
    three = measures.collective_waits(whole.filter(pl.col("rank") != 1), align_clocks=False)
    waits = measures.collective_waits(run_of(folder).events, align_clocks=False)
    assert set(waits["arrival"].to_list()) == {"device"} and sorted(waits["member"].unique().to_list()) == [0, 2, 3]
    assert sorted(waits.select("member", "instance", "wait_ns").rows()) == sorted(
        three.select("member", "instance", "wait_ns").rows())
    found, summary, screen = _analyzed(tmp_path, folder)
    whole_found, whole_summary, _ = _analyzed(tmp_path, MULTIRANK / "fsdp4_slow_loader")
    s = found["stragglers"]
    assert s["metrics"]["straggler_rank"] == whole_found["stragglers"]["metrics"]["straggler_rank"] == 2
    assert "clocks likely differ" not in s["message"]
    assert "Rank 1 has fewer communication kernels than collective calls (0 kernels for 63 calls)" in s["message"]
    assert found["critical-path"]["title"] == whole_found["critical-path"]["title"] == (
        "Rank 2's DataLoader holds the step")
    assert found["comm-compute-overlap"]["impact_ns"] is None
    overlap = found["comm-compute-overlap"]
    assert sorted(overlap["metrics"]["ranks"]) == ["0", "2", "3"]  # rank 1 ran no communication kernel to show
    assert "Rank 1 has fewer communication kernels than collective calls: how long it waited" in overlap["message"]
    assert summary["gpu_spin_unknown_ranks"] == [1] and summary["bottleneck"]["rule"] == "stragglers"


def test_the_straggler_without_its_gpu_is_named_from_its_host_calls(tmp_path):
    """fsdp4_slow_loader with rank 2, the slow one, CPU-only: among the other three no rank stands out, but rank
    2's calls started after their kernels had, so they waited at least that long for it. The floor is never more
    than what the whole run's GPUs say they waited for it, and on this run close to it."""
    folder = _without_gpu(tmp_path, "fsdp4_slow_loader", 2)
    found, summary, screen = _analyzed(tmp_path, folder)
    whole = _analyzed(tmp_path, MULTIRANK / "fsdp4_slow_loader")[0]["stragglers"]["metrics"]
    s = found["stragglers"]
    assert (s["title"], s["metrics"]["straggler_rank"]) == ("Straggler: rank 2", 2)
    assert s["message"].startswith("Rank 2's arrivals on its GPU are not recorded, but its calls started on its host "
                                   "after every other rank's kernel of the collective had started, at ")
    floor, device = s["metrics"]["wait_caused_ns"], whole["wait_caused_ns"]
    assert 0.9 * device <= floor <= device, (floor, device)
    assert s["severity"] == "warning" and 0 < s["metrics"]["step_time_lost_pct"] <= whole["step_time_lost_pct"]
    assert summary["bottleneck"]["rule"] == "stragglers"
    per_step = s["metrics"]["wait_caused_per_step_ns"]
    from traceparse.figures import fmt_ns
    assert f"straggler rank 2: the others wait at least {fmt_ns(per_step)} per step for it" in screen


def test_two_ranks_one_without_its_gpu_are_not_graded(tmp_path):
    """nccl2_slow_rank1 with rank 0 CPU-only: one rank's kernels compare with nothing, the arrivals are the hosts'
    calls, and no verdict is graded on them; gpu-idle's figure is rank 1's alone, and the summary says so."""
    folder = _without_gpu(tmp_path, "nccl2_slow_rank1", 0)
    found, summary, screen = _analyzed(tmp_path, folder)
    s = found["stragglers"]
    assert (s["severity"], s["impact_ns"], s["metrics"]["straggler_rank"]) == ("info", None, None)
    assert s["title"] == "Not graded: rank 1 most waited for on the hosts' calls"
    assert "not graded, as rank 0 recorded no communication kernel, and the kernels say when each GPU arrived" in (
        s["message"])
    assert "rank 0 recorded no communication kernel at all (its GPU's activities not recorded)" in s["message"]
    idle = found["gpu-idle"]
    assert len(idle["metrics"]["devices"]) == 1 and next(iter(idle["metrics"]["devices"])).startswith("rank 1")
    assert idle["metrics"]["ranks_without_gpu"] == [0]
    assert summary["bottleneck"]["rule"] == "gpu-idle"
    from traceparse.figures import fmt_ns
    assert f"GPU idle, {fmt_ns(idle['impact_ns'])} lost on rank 1 alone (1 of 2 ranks)" in screen


def _one_step(tmp_path: Path, run: str, rank: int) -> Path:
    """``run``'s rank files, rank ``rank``'s kept to its first ProfilerStep (its events starting in it, and the
    metadata): a rank whose profiler recorded one step where the others recorded three."""
    def first_step(events: list) -> list:
        step = min((e for e in events if e.get("cat") == "user_annotation"
                    and str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])
        lo, hi = step["ts"], step["ts"] + step["dur"]
        return [e for e in events if e.get("ph") == "M" or lo <= e.get("ts", -1) <= hi]

    return _edited(tmp_path, run, rank, f"{run}_onestep{rank}", first_step)


def test_a_rank_of_fewer_steps_is_compared_per_step(tmp_path):
    """fsdp4_slow_loader with rank 1 kept to one step of three: rank-balance compared its one step of GPU work with
    the others' three ("Ranks unevenly busy, imbalance 1.206x", the run's bottleneck) and stragglers spread the
    waits over three steps of rank 1 ("24.89 ms per rank per step" beside 21.9%). Work is compared per step where
    the ranks' traces hold different numbers of steps (each rank's work over its steps, from its own figures), and
    a wait per step is over the waiting ranks' own steps (the whole run: 31.94 ms)."""
    folder = _one_step(tmp_path, "fsdp4_slow_loader", 1)
    found, summary, screen = _analyzed(tmp_path, folder)
    b = found["rank-balance"]
    ranks = b["metrics"]["ranks"]
    assert {r: v["steps"] for r, v in ranks.items()} == {"0": 3, "1": 1, "2": 3, "3": 3}
    per_step = {r: round(v["work_ns"] / v["steps"]) for r, v in ranks.items()}
    mean = sum(per_step.values()) / 4
    assert b["metrics"]["imbalance"] == round(max(per_step.values()) / mean, 4) < 1.01
    assert b["severity"] == "info" and summary["bottleneck"]["rule"] != "rank-balance"
    assert ("The ranks' traces hold different numbers of steps (rank 0 3, rank 1 1, rank 2 3, rank 3 3): their work "
            "is compared per step.") in b["message"]
    s = found["stragglers"]["metrics"]
    steps = {r: v["steps"] for r, v in ranks.items() if r != "2"}  # the waiting ranks' own steps
    assert s["wait_caused_per_step_ns"] == round(s["wait_caused_ns"] / sum(steps.values()))
    whole = _analyzed(tmp_path, MULTIRANK / "fsdp4_slow_loader")[0]
    assert "steps" not in whole["rank-balance"]["metrics"]["ranks"]["0"]
    w = whole["stragglers"]["metrics"]
    assert w["wait_caused_per_step_ns"] == round(w["wait_caused_ns"] / 9)  # 3 ranks x 3 steps, as before
    assert abs(s["wait_caused_per_step_ns"] - w["wait_caused_per_step_ns"]) < 0.02 * w["wait_caused_per_step_ns"]


def test_a_rank_without_steps_gets_no_path_of_its_whole_span(tmp_path):
    """fsdp4_slow_loader with rank 1's ProfilerStep annotations taken out (hand-made): its whole span was walked as
    one "step" beside the others' steps ("175.4 ms of a 175.4 ms step", DataLoader "36.42 ms per step"). It gets
    no path of its own now, and the per-step figures are the whole run's but for rank 1's three paths."""
    out = _edited(tmp_path, "fsdp4_slow_loader", 1, "nosteps1",
                  lambda events: [e for e in events if not str(e.get("name", "")).startswith("ProfilerStep#")])
    found, summary, screen = _analyzed(tmp_path, out)
    whole = _analyzed(tmp_path, MULTIRANK / "fsdp4_slow_loader")[0]["critical-path"]
    c = found["critical-path"]
    assert (c["metrics"]["steps"], c["metrics"]["paths"], c["metrics"]["unstepped_ranks"]) == (3, 9, [1])
    assert whole["metrics"]["paths"] == 12 and "unstepped_ranks" not in whole["metrics"]
    assert abs(c["metrics"]["step_ns"] - whole["metrics"]["step_ns"]) <= 0.01 * whole["metrics"]["step_ns"]
    loader = [i["per_step_ns"] for f in (c, whole) for i in f["items"] if i["name"] == "DataLoader"]
    assert len(loader) == 2 and abs(loader[0] - loader[1]) <= 0.01 * loader[1]
    assert ("Rank 1 marks no step (no ProfilerStep or other step in its trace): it has no path of its own, and its "
            "work is on the paths only where another rank's path crosses to it.") in c["message"]
