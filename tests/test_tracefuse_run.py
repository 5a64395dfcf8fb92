"""A real 4-rank DDP run on AMD GPUs nobody here made: TraceLens's TraceFuse merge of four Kineto traces (ROCm,
RCCL), from amd/HPCTrainingExamples (fixtures/torch/tracefuse_ddp4/SOURCE.md), split back into its ranks by the
fixture's ``split_ranks.py`` and read as a run. Figures against the raw files, parsed here with ``json``."""

from __future__ import annotations

import gzip
import importlib.util
import json
import re
from pathlib import Path

import pytest

from helpers import FIXTURES, intersect, read_torch, run_cli, union, us_to_ns, whatif_json
from traceparse.figures import fmt_ns, fmt_pct

FOLDER = FIXTURES / "torch" / "tracefuse_ddp4"
MERGED = FOLDER / "merged_all_events.json.gz"


def _split_module():
    spec = importlib.util.spec_from_file_location("split_ranks", FOLDER / "split_ranks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ranks_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tracefuse") / "ddp4"
    counts = _split_module().split(MERGED, out)
    assert sorted(counts) == [0, 1, 2, 3]
    return out


@pytest.fixture(scope="module")
def docs(ranks_dir) -> dict[int, list[dict]]:
    out = {}
    for rank in range(4):
        with gzip.open(ranks_dir / f"rank{rank}.json.gz", "rt") as f:
            out[rank] = json.load(f)["traceEvents"]
    return out


@pytest.fixture(scope="module")
def findings(ranks_dir, tmp_path_factory) -> dict[str, dict]:
    store = str(tmp_path_factory.mktemp("tracefuse_store") / "store")
    code, _, err = run_cli("--store", store, "ingest", "-q", str(ranks_dir), "--run", "amd_ddp4")
    assert code == 0, err
    code, out, err = run_cli("--store", store, "analyze", "amd_ddp4", "--json", "--all")
    assert code == 0, err
    return {f["rule"]: f for f in json.loads(out)["findings"] if f["rule"] in ("stragglers", "comm-compute-overlap", "gpu-idle")}


def _kernels(events: list[dict]) -> list[dict]:
    return [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]


def _interval(e: dict) -> tuple[int, int]:
    start = us_to_ns(e["ts"])
    return start, start + us_to_ns(e["dur"])


def _oracle_waits(docs) -> dict[int, int]:
    """Per rank: the n-th RCCL kernel of every rank is one collective (21 a rank: 15 all-reduces, 6 broadcasts);
    a rank waits from its kernel's start until the last rank's kernel starts, but not past its own kernel's end
    (a broadcast's root sends and is done); counted inside its ProfilerStep# windows where none of its other
    kernels runs."""
    comm = {r: sorted(_interval(e) for e in _kernels(ev) if "nccl" in e["name"].lower()) for r, ev in docs.items()}
    compute = {r: union(_interval(e) for e in _kernels(ev) if "nccl" not in e["name"].lower())
               for r, ev in docs.items()}
    steps = {r: union(_interval(e) for e in ev if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                      and e["name"].startswith("ProfilerStep#")) for r, ev in docs.items()}
    assert {r: len(c) for r, c in comm.items()} == {0: 21, 1: 21, 2: 21, 3: 21}
    out = {}
    for r in docs:
        waits = union((s, min(e, max(comm[q][i][0] for q in docs))) for i, (s, e) in enumerate(comm[r]))
        inside = [(max(s, a), min(e, b)) for s, e in waits for a, b in steps[r] if min(e, b) > max(s, a)]
        out[r] = sum(e - s - intersect(s, e, compute[r]) for s, e in inside)
    return out


def test_rank_3_is_last_at_every_collective(findings):
    m = findings["stragglers"]["metrics"]
    assert m["straggler_rank"] == 3 and m["collectives"] == 21
    assert {i["rank"]: i["last_count"] for i in findings["stragglers"]["items"]}[3] == 21
    # rank 3 runs less GPU work than the others (no kernel is longer there): the wait is not explained, and
    # the sentence says so rather than reading as a figure of rank 3
    assert m["slow_rank_host"] == [] and m["slow_rank_gpu"] == []
    assert ("Nothing the trace records on rank 3 runs longer than on the median rank by 463.6 us a step or more "
            "(1.0% of its step): it does not explain the wait.") in findings["stragglers"]["message"]


def test_a_rank_waits_no_longer_than_its_own_collective_kernel(findings, docs):
    """Rank 0, the root of DDP's broadcasts, is done 1.5–3.3 ms before rank 3's kernel starts: the straggler
    table said it waited 46.19 ms, more than its 41.07 ms of exposed communication, where comm-compute-overlap
    (which cut each wait at the kernel's end) said 39.26 ms. Both now give the raw files' figure."""
    want = _oracle_waits(docs)
    waited = {i["rank"]: i["waited_ns"] for i in findings["stragglers"]["items"]}
    assert waited == want
    assert want[0] == 39_261_866  # as comm-compute-overlap printed it before (its own clipping, unchanged)
    overlap = {i["rank"]: i for i in findings["comm-compute-overlap"]["items"]}
    for rank, item in overlap.items():
        assert item["waiting_ns"] == min(want[rank], item["exposed_ns"])
        assert item["waiting_ns"] <= item["exposed_ns"]
    m = findings["stragglers"]["metrics"]
    assert m["wait_caused_ns"] == sum(want[r] for r in (0, 1, 2))


def test_the_merged_file_is_not_said_to_be_pytorch_1():
    """TraceFuse keeps none of the rank files' top-level keys: a missing schemaVersion does not tell PyTorch 1.x
    (this run's operators carry PyTorch 2's record_param_comms arguments) from a rewritten file."""
    assert read_torch(MERGED).meta.variant == "Kineto (no schemaVersion: PyTorch 1.x, or a file rewritten without it)"


def test_gpu_idle_names_hip_s_synchronize_on_a_hip_trace(findings):
    """The runtime calls are HIP's (hipLaunchKernel, hipMemcpyWithStream): the advice names hipDeviceSynchronize."""
    suggestion = findings["gpu-idle"]["suggestion"]
    assert "hipDeviceSynchronize" in suggestion and "cudaDeviceSynchronize" not in suggestion


def test_whatif_says_the_slowest_rank_s_step_beside_the_mean(ranks_dir, docs, tmp_path):
    """Ranks that meet at collectives step at the slowest one's pace: whatif says that pace beside the mean over the
    ranks' steps; the slowest rank's measured step is, per step, the longest ProfilerStep#N of the four raw files."""
    store = str(tmp_path / "store")
    doc = whatif_json(store, ranks_dir, "--balance")
    longest = {}
    for events in docs.values():
        for e in events:
            if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"):
                step = int(e["name"].split("#")[1])
                longest[step] = max(longest.get(step, 0), us_to_ns(e["dur"]))
    assert sorted(longest) == [9, 10, 11]
    predicted = {}
    for row in doc["steps"]:
        predicted[row["step"]] = max(predicted.get(row["step"], 0), row["predicted_ns"])
    slow = doc["slowest"]
    assert slow["steps"] == 3 and slow["measured_ns"] == round(sum(longest.values()) / 3)
    assert slow["predicted_ns"] == round(sum(predicted.values()) / 3)
    assert 0 <= slow["gain_ns"] <= doc["mean"]["gain_ns"]
    code, out, err = run_cli("--store", store, "--width", "200", "whatif", str(ranks_dir), "--balance")
    assert code == 0, err
    assert (f"job's pace: {fmt_ns(slow['measured_ns'])} measured, {fmt_ns(slow['predicted_ns'])} predicted: "
            f"gain {fmt_ns(slow['gain_ns'])} ({fmt_pct(slow['gain_pct'])})\n"
            "  (each step's slowest rank, the mean over the 3 steps every rank has)\n") in out
    assert "job's pace: 47.27 ms measured" in out


def test_balance_takes_no_wait_in_a_synchronous_copy_for_work(ranks_dir, docs, tmp_path):
    """On ROCm PyTorch copies and waits in one call, ``hipMemcpyWithStream``. Rank 0 spends 3.7 ms a step more in it
    than the median rank (computed here from the raw files): the time its GPU waits at the collective for the late
    rank 3, not work. --balance took it out as rank 0's excess and predicted rank 0's step 25.5% shorter (47.23 ->
    35.17 ms), while every other rank, which rank 0 meets at each step's all-reduce, kept its 46-49 ms. It is
    waiting, as a synchronisation's time is: left as it is, and no rank's step gains more than 1%."""
    per_step = {}
    for rank, events in docs.items():
        copy = sum(e["dur"] for e in events if e.get("ph") == "X" and e.get("name") == "hipMemcpyWithStream")
        steps = sum(1 for e in events if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#"))
        per_step[rank] = us_to_ns(copy) / steps
    ordered = sorted(per_step.values())
    assert per_step[0] - ordered[1] > 3_000_000  # rank 0's excess over the (lower) median rank, a step
    doc = whatif_json(str(tmp_path / "store"), ranks_dir, "--balance")
    assert "hipMemcpyWithStream" not in doc["edits"][0]["names"]
    assert all(row["gain_pct"] < 1 for row in doc["steps"])


def test_the_overlap_of_the_kernels_own_work_leaves_out_all_their_spinning(findings, docs):
    """The RCCL kernels spin until the last rank's kernel of their collective starts. "Of the time the kernels do
    their own work, 81.7% overlaps compute" took off only the spin while no compute ran (111.8 ms), and so counted
    the spin beside compute as overlapped work, and graded the run info. Here, from the raw files: each kernel's
    own work is from the last rank's start to its end; its overlap is that interval's overlap with its rank's
    compute kernels; summed over the 84 kernels: 30.8%, under the 50% warning."""
    comm = {r: sorted(_interval(e) for e in _kernels(ev) if "nccl" in e["name"].lower()) for r, ev in docs.items()}
    compute = {r: union(_interval(e) for e in _kernels(ev) if "nccl" not in e["name"].lower())
               for r, ev in docs.items()}
    own = overlapped = 0
    for r in docs:
        for i, (s, e) in enumerate(comm[r]):
            begin = min(e, max(s, max(comm[q][i][0] for q in docs)))  # the spin ends at the last rank's start
            own += e - begin
            overlapped += intersect(begin, e, compute[r])
    f = findings["comm-compute-overlap"]
    assert f["metrics"]["moving_overlap_pct"] == round(100 * overlapped / own, 4)
    assert round(100 * overlapped / own, 1) == 30.8 and f["severity"] == "warning"
    assert f"Of the {fmt_ns(own)} the kernels do their own work" in f["message"]
    assert f"{fmt_pct(100 * overlapped / own)} overlaps compute." in f["message"]


def test_the_step_table_keeps_every_start_whole_at_80_columns(ranks_dir, docs, tmp_path):
    """At 80 columns the step table cut its start cells, each in its own unit: rank 0's steps started "135.2 …"
    and then "47.39 …", which read as going backwards. Each time column now has one unit, in its header; the
    starts (from the run's first event, from the raw files) read in order."""
    store = str(tmp_path / "s")
    code, _, err = run_cli("--store", store, "ingest", "-q", str(ranks_dir), "--run", "tf4")
    assert code == 0, err
    code, out, err = run_cli("--store", store, "--width", "80", "analyze", "tf4", "--step", "all", "--rule",
                             "gpu-idle")
    assert code == 0, err
    assert "…" not in out.split("top category")[1].split("──")[0].replace("communicati…", "")
    rows = [(int(r), int(s), float(t)) for r, s, t in re.findall(r"^ +(\d) │ +(\d+) │ +([\d.]+) │", out, re.M)]
    assert len(rows) == 12 and re.search(r"┃ start ┃ +time ┃", out) and re.search(r"┃ +\(ms\) ┃ +\(ms\) ┃", out)
    # the run's ranks share one clock: every start is from the run's first timed event
    origin = min(us_to_ns(e["ts"]) for events in docs.values() for e in events if e.get("ph") == "X")
    for rank in range(4):
        steps = sorted(us_to_ns(e["ts"]) for e in docs[rank] if e.get("ph") == "X"
                       and e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
        want = [round((ts - origin) / 1e6, 2) for ts in steps]
        assert [t for r, _, t in rows if r == rank] == want


def test_skipped_copies_are_counted_with_separators_and_their_host_device_part(ranks_dir, docs, tmp_path):
    """ROCm's copies carry no size: low-memcpy-throughput said "3906 copies skipped" beside pageable-memcpy's "42
    host-device copies": both true (every copy against the host-device ones), but the first read as a count of
    host-device copies, without a thousands separator. Counted here in the raw files."""
    copies = [e["name"] for events in docs.values() for e in events
              if e.get("ph") == "X" and e.get("cat") == "gpu_memcpy"]
    host = sum(1 for name in copies if "HtoD" in name or "DtoH" in name)
    assert (len(copies), host) == (3_906, 42)
    store = str(tmp_path / "s")
    code, _, err = run_cli("--store", store, "ingest", "-q", str(ranks_dir), "--run", "tf4")
    assert code == 0, err
    code, out, err = run_cli("--store", store, "analyze", "tf4", "--json", "--rule", "low-memcpy-throughput")
    assert code == 0, err
    (f,) = json.loads(out)["findings"]
    assert f["metrics"]["skipped_copies"] == len(copies)
    assert (f"{len(copies):,} copies skipped ({host} of them host-device): direction, size or duration unknown."
            in f["message"])


def test_the_rank_with_the_most_gpu_work_is_not_called_the_slowest(ranks_dir, tmp_path):
    """rank-balance's "slowest rank 0" (the most GPU work) read in the HTML report beside stragglers' rank 3,
    which the others wait for while its GPU does the least work. Its figures read "most GPU work" now."""
    import traceparse
    from traceparse.report import shown_figures

    run = traceparse.load(ranks_dir, store=tmp_path / "api")
    found = {f.rule: f for f in traceparse.analyze(run, rules=["rank-balance", "stragglers"])}
    figures = dict(shown_figures(found["rank-balance"]))
    assert (figures["most GPU work"], figures["least GPU work"]) == ("0", "3")
    assert "slowest rank" not in figures and found["stragglers"].metrics["straggler_rank"] == 3
