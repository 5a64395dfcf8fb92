"""A run one of whose ranks was killed mid-write: the real ddp4_slow_hook run (gloo, 4 ranks, rank 2's backward
hook sleeps) with rank 2's file cut at 60%. Kineto writes a trace's events thread by thread, so the cut kept rank
2's collective calls but lost its gloo worker's ``gloo:all_reduce`` annotation of half of them (the first of each
step's two). Matching each rank's k-th annotation to its k-th collective paired rank 2's with other collectives:
its clock read 62.8 ms off ("their clocks likely differ", and advice to align them), and the critical path's
replay without the hook gained 25.06 ms a step where the whole run's gains 40.26 ms."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import polars as pl
import pytest

from helpers import FIXTURES, cut_file, cut_run, run_cli, run_of
from traceparse import measures
from traceparse.measures.comm import _short_members

SOURCE = FIXTURES / "torch" / "multirank" / "ddp4_slow_hook"
CUT_RANK = 2


@pytest.fixture(scope="module")
def cut(tmp_path_factory) -> Path:
    """The run with rank 2's JSON cut at 60% of its bytes (each file gzipped whole again)."""
    return cut_run(SOURCE, tmp_path_factory.mktemp("cut_rank"), CUT_RANK, 0.6)


def _raw(folder: Path, rank: int) -> bytes:
    return gzip.decompress((folder / f"rank{rank}.json.gz").read_bytes())


def _analyzed(tmp_path: Path, folder: Path) -> dict:
    code, out, err = run_cli("--store", str(tmp_path / f"store_{folder.name}"), "analyze", "--json", str(folder))
    assert code == 0, err
    return {f["rule"]: f for f in json.loads(out)["findings"]}


def test_the_cut_kept_the_calls_and_lost_annotations(cut):
    """What the fixture is: every rank's 8 calls are still there, rank 2's worker annotations are not."""
    for rank in range(4):
        assert _raw(cut, rank).count(b'"name": "c10d::allreduce_"') == 8
    assert _raw(cut, CUT_RANK).count(b'"name": "gloo:all_reduce"') < _raw(SOURCE, CUT_RANK).count(
        b'"name": "gloo:all_reduce"')


def test_a_rank_that_lost_annotations_gets_no_clock_offset(cut):
    """The offsets come from the annotations where every rank has as many as its calls: rank 2's is unknown (no
    row: not moved), the others' are what they are in the whole run, under a millisecond."""
    whole = measures.collective_waits(run_of(SOURCE).events, align_clocks=True)
    waits = measures.collective_waits(run_of(cut).events, align_clocks=True)
    offsets = dict(waits.group_by("member").agg(pl.col("offset_ns").first()).iter_rows())
    assert offsets[CUT_RANK] == 0  # unknown: left where it is
    want = dict(whole.group_by("member").agg(pl.col("offset_ns").first()).iter_rows())
    assert {r: ns for r, ns in offsets.items() if r != CUT_RANK} == {r: ns for r, ns in want.items() if r != CUT_RANK}
    assert all(abs(ns) < 1_000_000 for ns in offsets.values())


def test_the_cut_run_reads_as_the_whole_one(cut, tmp_path):
    """The straggler's figures are the whole run's (its calls are complete), with no word of clocks; the critical
    path's replay without the hook gains what the whole run's does, within 1%."""
    whole, part = _analyzed(tmp_path, SOURCE), _analyzed(tmp_path, cut)
    s = part["stragglers"]
    assert s["metrics"]["straggler_rank"] == CUT_RANK
    assert s["metrics"]["wait_caused_ns"] == whole["stragglers"]["metrics"]["wait_caused_ns"]
    assert "apart" not in s["message"] and "align_clocks" not in s["message"]
    gain, want = part["critical-path"]["metrics"]["drop_gain_ns"], whole["critical-path"]["metrics"]["drop_gain_ns"]
    assert abs(gain - want) <= 0.01 * want, (gain, want)


def test_short_members_are_those_with_fewer_rows_than_peers_with_as_many_calls():
    """Hand-written: members 0-2 made 8 calls, member 3 made 12 (a rank that profiled another step); member 1 has
    5 annotations where 0 and 2 have 8 (short), member 3's 12 are its own count. One or two fewer than a peer is
    the profiler stopping while the last were queued, which the k-th matching survives: not short."""
    calls = pl.DataFrame({"member": [0] * 8 + [1] * 8 + [2] * 8 + [3] * 12})
    found = pl.DataFrame({"member": [0] * 8 + [1] * 5 + [2] * 8 + [3] * 12})
    assert _short_members(found, calls) == [1]
    assert _short_members(found.filter(pl.col("member") != 1), calls) == [1]  # none at all
    assert _short_members(calls, calls) == []
    stopped = pl.DataFrame({"member": [0] * 7 + [1] * 8 + [2] * 6 + [3] * 12})
    assert _short_members(stopped, calls) == []


def test_one_rank_s_last_kernel_missing_keeps_the_device_arrivals(tmp_path):
    """ASTRA-sim's Megatron run with rank 0's last NCCL kernel taken out (edited here: as if its profiler stopped
    a kernel earlier than the others'): every arrival stays the device's, and the instance that kernel was of is
    the one left out, as the profiler stopping is (the waits of the whole run's other instances unchanged)."""
    source = FIXTURES / "torch" / "megatron_tp8_a100"
    out = tmp_path / "megatron"
    out.mkdir()
    for path in sorted(source.glob("megatron_kineto_*.json.gz")):
        doc = json.loads(gzip.decompress(path.read_bytes()))
        rank = int(path.name.split("_")[-1].split(".")[0])
        if rank == 0:
            kernels = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"
                       and e["name"].startswith("ncclDevKernel")]
            last = max(kernels, key=lambda e: e["ts"])
            doc["traceEvents"] = [e for e in doc["traceEvents"] if e is not last]
        (out / f"rank{rank}.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    waits = measures.collective_waits(run_of(out).events)
    assert set(waits["arrival"].unique().to_list()) == {"device"}
    whole = measures.collective_waits(run_of(_ranks(tmp_path, source)).events)
    kept = whole.join(waits.select("process_group", "instance").unique(), on=["process_group", "instance"],
                      how="semi", nulls_equal=True)
    assert whole["instance"].n_unique() - waits["instance"].n_unique() == 1
    assert sorted(kept.select("member", "instance", "wait_ns").rows()) == sorted(
        waits.select("member", "instance", "wait_ns").rows())


def _ranks(tmp_path: Path, source: Path) -> Path:
    """The Megatron fixture's ranks as rank<N>.json.gz (:func:`helpers.run_of` reads that naming)."""
    out = tmp_path / "whole"
    out.mkdir()
    for path in sorted(source.glob("megatron_kineto_*.json.gz")):
        (out / f"rank{path.name.split('_')[-1]}").write_bytes(path.read_bytes())
    return out


def _cut_run(tmp_path: Path, source: Path, rank: int | None, keep: float) -> Path:
    """``source``'s ranks in ``tmp_path``, rank ``rank``'s JSON (None: every rank's) cut at ``keep`` of its bytes."""
    return cut_run(source, tmp_path / f"{source.name}_cut{'all' if rank is None else rank}", rank, keep)


def test_rank_balance_leaves_a_cut_rank_out_of_the_comparison(tmp_path):
    """A rank cut short did less of everything: on the nccl2 twin with rank 1 cut at 60%, rank-balance warned
    "most work on rank 0 (14.86 ms), least on 1 (7.46 ms); imbalance 1.331×". A cut rank is left out of the
    comparison and said so; on fsdp4 with rank 3 cut, the other three compare as they do in the whole run (their
    figures from the whole run's own finding)."""
    two = _cut_run(tmp_path, FIXTURES / "torch" / "multirank" / "nccl2_slow_rank1", 1, 0.6)
    f = _analyzed(tmp_path, two)["rank-balance"]
    assert (f["severity"], f["metrics"]["imbalance"], f["metrics"]["incomplete_ranks"]) == ("info", None, [1])
    assert ("Rank 1's trace ends early (cut short): its figures cover what was read, and are left out of the "
            "comparison and the totals.") in f["message"]
    assert f["message"].startswith("1 whole rank: too few to compare.")
    source = FIXTURES / "torch" / "multirank" / "fsdp4_balanced"
    whole = _analyzed(tmp_path, source)["rank-balance"]["metrics"]["ranks"]
    four = _analyzed(tmp_path, _cut_run(tmp_path, source, 3, 0.8))["rank-balance"]
    work = {int(r): v["work_ns"] for r, v in whole.items() if r != "3"}
    m = four["metrics"]
    assert m["incomplete_ranks"] == [3] and {int(r): v["work_ns"] for r, v in m["ranks"].items() if r != "3"} == work
    assert m["imbalance"] == round(max(work.values()) / (sum(work.values()) / 3), 4)
    assert m["slowest_rank"] in work and m["fastest_rank"] in work


def test_every_rank_cut_reads_without_an_internal_error(tmp_path):
    """Every rank of gloo4_one_host_busy cut at 70%: analyze stopped with an internal error (every rank short of
    its gloo annotations, none left to pair with the calls). The run reads, and stragglers says the traces end
    early; whatif replays it."""
    source = FIXTURES / "torch" / "multirank" / "gloo4_one_host_busy"
    out = _cut_run(tmp_path, source, None, 0.7)
    s = _analyzed(tmp_path, out)["stragglers"]
    assert "The traces of ranks 0, 1, 2 and 3 end early (cut short): their collectives after the cut are missing" \
        in s["message"]
    code, out_, err = run_cli("--store", str(tmp_path / f"store_{out.name}"), "whatif", str(out), "--balance",
                              "--json")
    assert code == 0, err


def test_findings_say_which_rank_was_cut_where_it_changes_them(cut, tmp_path):
    """Where a rank cut short changes what a rule can measure, the finding says so instead of a reason that is not
    the cause: gpu-idle said rank 2 "recorded no GPU activity" (its GPU work was after the cut); stragglers said the
    calls and kernels did not pair "as batch_isend_irecv does", and that the ranks' clocks likely differ, advising
    to align them; comm-compute-overlap graded the others' spinning as exposed communication without a word."""
    found = _analyzed(tmp_path, cut)
    idle = found["gpu-idle"]
    assert "Rank 2's trace ends early (cut short) before any of its GPU activity: left out of these figures." \
        in idle["message"] and "recorded no GPU activity" not in idle["message"]
    assert ("Rank 2's trace ends early (cut short): its work after the cut is missing, and the path runs through what "
            "was read (the missing work is time the trace does not show).") in found["critical-path"]["message"]
    runs = FIXTURES / "torch" / "multirank"
    gloo = _analyzed(tmp_path, _cut_run(tmp_path, runs / "dp2pp2_gloo_slow_rank3", 0, 0.6))["stragglers"]["message"]
    assert "align_clocks" not in gloo and "clocks likely differ" not in gloo
    assert "with a rank's trace cut short that may be its collectives paired with others' after the cut" in gloo
    nccl = _analyzed(tmp_path, _cut_run(tmp_path, runs / "nccl2_slow_rank1", 1, 0.6))["comm-compute-overlap"]
    assert ("Rank 1's trace ends early (cut short): its communication kernels after the cut are missing, so how long "
            "the others' kernels spun waiting for a later rank cannot be told from the GPUs") in nccl["message"]


def test_a_rank_that_lost_its_kernels_is_left_out_not_the_gpus(tmp_path):
    """fsdp4_balanced with rank 0 cut at 60%: rank 0 kept 10 of its 63 collectives' kernels, from all through the
    run (a profiler writes each stream's activities as its buffers fill). Every arrival fell back to the hosts'
    and a balanced run named rank 3 a critical straggler (the others "waited" 29 ms a step for it); gpu-idle and
    the summary counted rank 0's GPU 67% idle (5% in the whole run), and named it the worst rank. Rank 0 is left
    out: the other three are compared on their kernels' starts, and their GPUs' figures are what the whole run
    gives for them (the oracle: the whole run's own measures, without rank 0)."""
    source = FIXTURES / "torch" / "multirank" / "fsdp4_balanced"
    cut = _cut_run(tmp_path, source, 0, 0.6)
    got = _analyzed(tmp_path, cut)
    s = got["stragglers"]
    assert s["title"] == "No straggler" and s["severity"] == "info"
    assert ("Rank 0 has fewer communication kernels than collective calls (10 kernels for 63 calls; its trace ends "
            "early (cut short)): which call each kernel ran for cannot be told, so its arrivals on the GPU are "
            "unknown; it is left out, and the other ranks are compared on their kernels' starts.") in s["message"]
    assert "missing on some ranks" not in s["message"] and "host" not in s["message"]
    assert sorted(s["metrics"]["ranks"]) == ["1", "2", "3"]
    # the cut run's waits are those of the whole run without rank 0, every one on the device
    whole = run_of(source).events
    three = measures.collective_waits(whole.filter(pl.col("rank") != 0))
    waits = measures.collective_waits(run_of(cut).events)
    assert set(waits["arrival"].unique().to_list()) == {"device"}
    assert sorted(waits.select("member", "instance", "wait_ns").rows()) == sorted(
        three.select("member", "instance", "wait_ns").rows())
    # comm-compute-overlap: rank 0's waiting unknown (not 0), the others' as the whole run without rank 0 gives
    c = got["comm-compute-overlap"]
    assert c["metrics"]["ranks"]["0"]["waiting_ns"] is None
    assert {r: v["waiting_ns"] for r, v in c["metrics"]["ranks"].items() if r != "0"} == {
        str(m): ns for m, ns in measures.comm.waiting_time(
            three, measures.comm.member_windows(whole, three), measures.comm.member_compute(whole, three)).iter_rows()}
    assert ("Rank 0 has fewer communication kernels than collective calls: how long it waited for a later rank "
            "is unknown") in c["message"]
    # gpu-idle, rank-balance's totals and the summary: ranks 1-3 as the whole run measures them
    whole_found = _analyzed(tmp_path, source)
    balance = whole_found["rank-balance"]["metrics"]["ranks"]
    assert {k: got["rank-balance"]["metrics"][k] for k in ("idle_ns", "span_ns", "compute_ns")} == {
        k: sum(balance[r][k] for r in ("1", "2", "3")) for k in ("idle_ns", "span_ns", "compute_ns")}
    assert "Over the 3 whole ranks: " in got["rank-balance"]["message"]
    devices = whole_found["gpu-idle"]["metrics"]["devices"]
    kept = {k: v for k, v in devices.items() if not k.startswith("rank 0:")}
    idle = got["gpu-idle"]["metrics"]
    assert sorted(idle["devices"]) == sorted(kept) and len(kept) == 3
    assert idle["idle_ns"] == sum(v["idle_ns"] for v in kept.values())
    assert idle["span_ns"] == sum(v["span_ns"] for v in kept.values())
    assert ("Rank 0's trace ends early (cut short): its GPU activity was written in part only (gaps where work went "
            "unwritten), so it is left out of these figures.") in got["gpu-idle"]["message"]
    code, out, err = run_cli("--store", str(tmp_path / f"store_{cut.name}"), "analyze", "--json", str(cut))
    summary = json.loads(out)["summary"][0]
    busy = sum(v["busy_ns"] for v in kept.values())
    assert summary["gpu_left_out_ranks"] == [0] and summary["gpu_devices"] == 3
    assert summary["gpu_busy_pct"] == round(100.0 * busy / idle["span_ns"], 4)
    code, screen, err = run_cli("--store", str(tmp_path / f"store_{cut.name}"), "analyze", str(cut))
    assert "(first to last activity; rank 0, cut short, left out)" in re.sub(r"[│\s]+", " ", screen)


def test_every_rank_cut_keeps_its_gpus_in_the_figures(tmp_path):
    """With no whole rank to show instead, a run whose every rank was cut keeps them all (nothing is left out,
    and the summary says every figure covers what was read)."""
    source = FIXTURES / "torch" / "multirank" / "nccl2_slow_rank1"
    out = _cut_run(tmp_path, source, None, 0.8)
    code, text, err = run_cli("--store", str(tmp_path / "store_both"), "analyze", "--json", str(out))
    doc = json.loads(text)
    assert doc["summary"][0]["gpu_left_out_ranks"] == [] and doc["summary"][0]["gpu_devices"] == 2
    idle = next(f for f in doc["findings"] if f["rule"] == "gpu-idle")
    assert len(idle["metrics"]["devices"]) == 2 and "left out" not in idle["message"]


def test_diff_says_a_side_ends_early(cut, tmp_path):
    """diff of a run with a rank cut short against the whole run read as if A's work had vanished (its GEMMs
    "grew" 84.9 ms per step in B on fsdp4): the differences line says which side ends early, for a run (which rank)
    and for a single trace."""
    store = str(tmp_path / "store_diff")
    code, out, err = run_cli("--store", store, "diff", "--json", str(cut), str(SOURCE))
    assert code == 0, err
    assert json.loads(out)["differences"] == [
        "A: rank 2's trace ends early (cut short), and its figures cover what was read"]
    whole = FIXTURES / "torch" / "resnet18_bs16.json.gz"
    one = cut_file(whole, tmp_path / "resnet_cut.json.gz", 0.6)
    code, out, err = run_cli("--store", store, "diff", "--json", str(whole), str(one))
    assert code == 0, err
    assert "B ends early (cut short): its figures cover what was read" in json.loads(out)["differences"]


def test_whatif_balance_leaves_a_cut_rank_as_it_is(tmp_path):
    """whatif --balance on fsdp4_balanced with rank 0 cut at 60% "evened out" rank 0 (1.503 ms a step taken off it:
    its names' time, lost with the cut, read as less work than the median rank's). A rank cut short is neither
    evened out nor counted in the medians, and the notes say so: the cut run's balance matches the whole run's
    (nothing to even out)."""
    source = FIXTURES / "torch" / "multirank" / "fsdp4_balanced"
    cut = _cut_run(tmp_path, source, 0, 0.6)
    docs = {}
    for name, folder in (("whole", source), ("cut", cut)):
        code, out, err = run_cli("--store", str(tmp_path / f"store_w_{name}"), "whatif", str(folder), "--balance",
                                 "--json")
        assert code == 0, err
        docs[name] = json.loads(out)
    (whole,), (part,) = docs["whole"]["edits"], docs["cut"]["edits"]
    assert (part["calls"], part["removed_per_step_ns"]) == (whole["calls"], whole["removed_per_step_ns"]) == (0, 0)
    assert docs["cut"]["notes"][0] == ("Rank 0's trace ends early (cut short): the replay is of what was read, and "
                                       "--balance leaves it as it is (work after the cut is missing, not undone).")


def test_a_run_missing_its_slow_rank_says_the_waits_for_it_are_nobodys(tmp_path):
    """fsdp4_slow_loader without rank 2's file (its slow rank): the others' kernels spin at every collective for a
    rank that is not there, and stragglers said only "63 collectives are missing on some ranks" beside "no rank
    stands out". It now names the missing rank and where a wait for it shows."""
    source = FIXTURES / "torch" / "multirank" / "fsdp4_slow_loader"
    out = tmp_path / "missing2"
    out.mkdir()
    for rank in (0, 1, 3):
        (out / f"rank{rank}.json.gz").write_bytes((source / f"rank{rank}.json.gz").read_bytes())
    whole = _analyzed(tmp_path, source)["stragglers"]["metrics"]
    s = _analyzed(tmp_path, out)["stragglers"]
    assert (whole["straggler_rank"], s["metrics"]["straggler_rank"]) == (2, None)
    assert s["metrics"]["incomplete_collectives"] == whole["collectives"] == 63
    assert (f"Rank 2 is missing from the run (1 of 4 ranks), so {whole['collectives']} collectives lack it: a wait "
            "for it is counted as no rank's here, and shows as the others' communication kernels running long with "
            "none of them late (comm-compute-overlap's exposed communication).") in s["message"]
    assert "missing on some ranks" not in s["message"]


def test_every_rank_cut_is_not_graded_on_the_hosts_calls(tmp_path):
    """Every rank of the balanced fsdp4 run cut at 70%: each kept 28 of its 63 collectives' kernels, the arrivals
    fell back to the hosts' calls, and stragglers read "critical: rank 3" where the whole run's GPUs name no
    straggler; gpu-idle read 61.4% idle (4.6% whole) and blamed the host. The straggler is not graded (the figure
    and what it would have been are said), gpu-idle says the lost work shows as idle time, and rank-balance does not
    claim to leave the cut ranks out of totals that are theirs."""
    source = FIXTURES / "torch" / "multirank" / "fsdp4_balanced"
    out = _cut_run(tmp_path, source, None, 0.7)
    got = _analyzed(tmp_path, out)
    s = got["stragglers"]
    assert (s["severity"], s["metrics"]["straggler_rank"]) == ("info", None)
    assert s["title"] == "Not graded: rank 3 most waited for on the hosts' calls"
    assert ("(25.0% of their step time, critical by the figure), on their hosts' calls: not graded, as ranks cut "
            "short lost the communication kernels that say when each GPU arrived") in s["message"]
    assert ("Every rank's trace ends early (cut short), and their streams' activities are written as their buffers "
            "fill: one stream's may stop before another's, and the work lost shows as idle time here.") in \
        got["gpu-idle"]["message"]
    rb = got["rank-balance"]["message"]
    assert rb.endswith("The traces of ranks 0, 1, 2 and 3 end early (cut short): their figures cover what was read.")
    assert "Over all ranks" in rb
    # a single trace of one stream cut short keeps the first part of its GPU work: nothing of the kind is said
    whole = FIXTURES / "torch" / "resnet18_bs16.json.gz"
    one = cut_file(whole, tmp_path / "one_cut.json.gz", 0.6)
    code, text, err = run_cli("--store", str(tmp_path / "store_one"), "analyze", "--json", str(one))
    assert code == 0, err
    idle = next(f for f in json.loads(text)["findings"] if f["rule"] == "gpu-idle")
    assert "buffers fill" not in idle["message"]


def test_a_rank_that_lost_its_kernels_makes_the_others_waits_a_floor(tmp_path):
    """Megatron's eight tensor-parallel ranks with rank 0 cut at 60% (18 of its 84 communication kernels kept):
    rank 0 is left out of the arrivals, so the others' waits for it are not counted. The whole run has 66.1 ms
    at stake per rank; the cut run read "critical, 202.5 ms lost per rank" (the exposed time less a floor of the
    waiting) and "GPU busy 92.5%: 57.9% work, 34.6% waiting". Now every rank's waiting is at most its whole-run
    figure (a floor), no time is at stake, the finding is at most a warning, and the split says which way each
    figure is off."""
    whole = _analyzed(tmp_path, _ranks(tmp_path, FIXTURES / "torch" / "megatron_tp8_a100"))["comm-compute-overlap"]
    cut = _cut_run(tmp_path, tmp_path / "whole", 0, 0.6)
    found = _analyzed(tmp_path, cut)
    c = found["comm-compute-overlap"]
    assert whole["severity"] == "critical" and whole["impact_ns"] > 0
    assert (c["severity"], c["impact_ns"]) == ("warning", None)
    assert c["metrics"]["ranks"]["0"]["waiting_ns"] is None
    floors = {r: v["waiting_ns"] for r, v in c["metrics"]["ranks"].items() if r != "0"}
    assert len(floors) == 7 and all(0 < ns <= whole["metrics"]["ranks"][r]["waiting_ns"] for r, ns in floors.items())
    assert c["metrics"]["waiting_ns"] == sum(floors.values())
    text = re.sub(r"\s+", " ", c["message"])
    assert text.count("At least ") == 1 and "and so is how long the others' kernels spun waiting for it" in text
    code, out, err = run_cli("--store", str(tmp_path / f"store_{cut.name}"), "analyze", "--json", str(cut))
    summary = json.loads(out)["summary"][0]
    assert summary["gpu_spin_unknown_ranks"] == [0] and summary["gpu_bound"] is False
    assert summary["bottleneck"]["rule"] != "comm-compute-overlap"
    code, screen, err = run_cli("--store", str(tmp_path / f"store_{cut.name}"), "analyze", str(cut))
    shown = re.sub(r"[│\s]+", " ", screen)
    spin = round(summary["gpu_spin_pct"], 1)
    work = round(summary["gpu_busy_pct"] - spin, 1)
    assert (f"at most {work}% work, at least {spin}% communication kernels waiting for another GPU's "
            "(comm-compute-overlap; rank 0 lost its collectives' kernels: waits for it are not counted)") in shown
    code, screen, err = run_cli("--store", str(tmp_path / "store_whole"), "analyze", str(tmp_path / "whole"))
    shown = re.sub(r"[│\s]+", " ", screen)
    assert "% communication kernels waiting for another GPU's (comm-compute-overlap)" in shown
    assert not re.search(r"at most [\d.]+% work", shown)
