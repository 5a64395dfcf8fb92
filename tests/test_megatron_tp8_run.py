"""A real 8-rank Megatron tensor-parallel run from another team (ASTRA-sim's published A100 traces, MIT;
fixtures/torch/megatron_tp8_a100/SOURCE.md): the profiler stopped while each rank's last all-reduce was queued, and
the stragglers' figures are checked against the raw JSON."""

from __future__ import annotations

import gzip
import html
import json
import re
from pathlib import Path

import pytest

from helpers import FIXTURES, intersect, run_cli, run_of, run_rule, union, us_to_ns, waited_first, whatif_json
from traceparse.figures import fmt_ns

MEGATRON = FIXTURES / "torch" / "megatron_tp8_a100"


def _rank_files(folder: Path) -> dict[int, Path]:
    return {int(p.name.split("_")[-1].split(".")[0]): p for p in sorted(folder.glob("megatron_kineto_*.json.gz"))}


@pytest.fixture(scope="module")
def docs() -> dict[int, list[dict]]:
    out = {}
    for rank, path in _rank_files(MEGATRON).items():
        with gzip.open(path, "rt") as f:
            out[rank] = json.load(f)["traceEvents"]
    return out


@pytest.fixture(scope="module")
def ranks_dir(tmp_path_factory) -> Path:
    """The ranks alone, named rank<N> (the fixture's folder holds its licence and source notes too)."""
    out = tmp_path_factory.mktemp("megatron_tp8")
    for rank, path in _rank_files(MEGATRON).items():
        (out / f"rank{rank}.json.gz").write_bytes(path.read_bytes())
    return out


def _complete(events, **match):
    return [e for e in events if e.get("ph") == "X" and all(e.get(k) == v for k, v in match.items())]


def _oracle(docs: dict[int, list[dict]], whole: bool = False) -> dict:
    """From the raw JSON: the k-th NCCL kernel of a rank is its k-th all-reduce's arrival; an all-reduce whose
    kernel no rank recorded (the profiler stopped first) is left out. A rank waits from its kernel's start to the
    last rank's kernel start, at most until its own kernel ends, inside its ProfilerStep#N (``whole``: anywhere
    in the trace), where none of its compute kernels runs; counted once (union)."""
    kernels, calls, windows, compute = {}, {}, {}, {}
    for rank, events in docs.items():
        ks = sorted((us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"]))
                    for e in _complete(events, cat="kernel") if e["name"].startswith("ncclDevKernel"))
        kernels[rank] = ks
        calls[rank] = len([e for e in _complete(events, name="nccl:all_reduce") if e.get("cat") != "kernel"])
        windows[rank] = union((us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"]))
                              for e in _complete(events, cat="user_annotation")
                              if e["name"].startswith("ProfilerStep#"))
        if whole:
            windows[rank] = [(-(1 << 63), 1 << 63)]
        compute[rank] = union((us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"]))
                              for e in _complete(events, cat="kernel") if not e["name"].startswith("ncclDevKernel"))
    n = min(len(k) for k in kernels.values())
    waited, waited_for = {}, {}
    for rank in docs:
        waits = []
        for k in range(n):
            last = max(kernels[r][k][0] for r in docs)
            whom = min(r for r in docs if kernels[r][k][0] == last)  # of ranks joining at once, the lowest
            start, end = kernels[rank][k]
            if min(last, end) > start:
                waits.append((start, min(last, end), whom))
        inside = [(max(s, a), min(e, b)) for s, e in union((s, e) for s, e, _ in waits) for a, b in windows[rank]
                  if min(e, b) > max(s, a)]
        waited[rank] = sum(e - s - intersect(s, e, compute[rank]) for s, e in inside)
        waited_for[rank] = waited_first(waits, windows[rank], compute[rank])  # {whom: ns}, adding up to waited
    return {"calls": calls, "kernels": {r: len(k) for r, k in kernels.items()}, "instances": n, "waited": waited,
            "waited_for": waited_for}


def test_the_collective_the_profiler_stopped_in_is_left_out_not_every_arrival_moved_to_the_host(docs, ranks_dir):
    """Every rank has 85 all-reduce calls and 84 NCCL kernels: the last call's kernel was still queued when the
    profiler stopped. That one instance made every arrival of the run the host's call, and the hosts run up to
    23 ms ahead of their GPUs: the straggler caused 2.973 s of waiting, 70.0% of the others' step time, where
    their devices waited 1.476 s (34.7%). The instance is left out; the waits are the devices', to the
    nanosecond of the raw files."""
    want = _oracle(docs)
    assert set(want["calls"].values()) == {85} and set(want["kernels"].values()) == {84}
    f = run_rule(run_of(ranks_dir), "stragglers")
    m = f.metrics
    assert {int(r): v["waited_ns"] for r, v in m["ranks"].items()} == want["waited"]
    assert f.message.startswith(f"rank 0 arrived last at 32 of {want['instances']} collectives and made the other "
                                "ranks wait 1.476 s (210.8 ms per rank per step)")
    assert m["wait_caused_ns"] == 1_475_893_000 and round(100 * m["wait_caused_ns"] / m["others_step_ns"], 1) == 34.7
    assert m["cut_collectives"] == 85 - want["instances"] == 1
    assert ("1 more collective at the trace's end is left out: the profiler stopped before its kernels ran."
            in f.message)


#: The runtime calls a host waits in for its GPU (traceparse.measures.critical_path.SYNC_CALLS, as Kineto names them).
SYNC = re.compile(r"Synchronize$|^cudaMemcpy$")


def _held_oracle(docs: dict[int, list[dict]]) -> dict[int, int]:
    """From the raw JSON, per rank: how long its host could have waited for its GPU in its one ProfilerStep#N —
    the union of its synchronising runtime calls, runtime calls of 1 ms or more and its collective calls
    (``c10d::allreduce_``, ``nccl:all_reduce``) inside the step, plus how far the GPU work started in the step
    runs past its end; at most the step."""
    held = {}
    for rank, events in docs.items():
        (step,) = [e for e in _complete(events, cat="user_annotation") if e["name"].startswith("ProfilerStep#")]
        a, b = us_to_ns(step["ts"]), us_to_ns(step["ts"]) + us_to_ns(step["dur"])
        blocking = [(us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"])) for e in _complete(events)
                    if (e.get("cat") in ("cuda_runtime", "cuda_driver")
                        and (SYNC.search(e["name"]) or us_to_ns(e["dur"]) >= 1_000_000))
                    or (e.get("cat") in ("cpu_op", "user_annotation")
                        and e["name"] in ("c10d::allreduce_", "nccl:all_reduce"))]
        gpu_ends = [us_to_ns(e["ts"]) + us_to_ns(e["dur"]) for e in _complete(events)
                    if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and a <= us_to_ns(e["ts"]) < b]
        tail = max(0, max(gpu_ends, default=b) - b)
        held[rank] = min(b - a, intersect(a, b, union(blocking)) + tail)
    return held


def test_a_wait_the_hosts_ran_through_is_not_counted_as_step_time_lost(docs, ranks_dir):
    """The GPUs of ranks 1-7 spin 340-429 ms in all-reduces waiting for ranks 0 and 6, but their hosts, which
    issue 130 ms of GPU compute in 600 ms steps, wait for their GPUs 45-124 ms at most: the wait was said to cost
    the others 34.7% of their step time (critical, the run's bottleneck) where whatif --balance predicts 0-7.9%
    and the critical path finds no wait. Each rank's wait counts toward its lost step time only up to how long
    its host waited for its GPU; the waits themselves stay as measured."""
    want = _oracle(docs)
    held = _held_oracle(docs)
    f = run_rule(run_of(ranks_dir), "stragglers")
    m = f.metrics
    assert {int(r): v["host_held_ns"] for r, v in m["ranks"].items()} == held
    assert all(held[r] < want["waited"][r] for r in held if r != 0)
    # the wait rank 0 caused, each waiting rank's part of it scaled to what its host could have waited
    on = m["ranks"]
    assert m["wait_caused_ns"] == sum(want["waited_for"][r].get(0, 0) for r in docs)
    stake = sum(round(want["waited_for"][r].get(0, 0) * min(1.0, held[r] / want["waited"][r]))
                for r in docs if want["waited"][r])
    assert m["step_time_at_stake_ns"] == stake < m["wait_caused_ns"]
    assert round(100 * stake / m["others_step_ns"], 4) == m["step_time_lost_pct"]
    assert f.severity == "info" and m["straggler_rank"] is None and m["step_time_lost_pct"] < 10
    assert f.title == "Most waited for: ranks 0 and 6, under the warning line"
    assert (f"Their steps could be shorter by at most {fmt_ns(stake)} of it ({m['step_time_lost_pct']:.1f}% of "
            f"their step time, {fmt_ns(m['step_time_lost_per_step_ns'])} per rank per step)") in f.message
    assert f.impact_ns == round(stake / 8)
    assert sum(v["waited_ns"] for v in on.values()) == sum(v["wait_caused_ns"] for v in on.values())


def test_the_run_s_bottleneck_is_not_a_wait_its_hosts_ran_through(ranks_dir, tmp_path):
    """The summary named "Stragglers: ranks 0 and 6, 184.5 ms lost per rank, 28.3% of the span" as the run's
    bottleneck."""
    code, out, err = run_cli("--store", str(tmp_path / "store"), "analyze", "--json", str(ranks_dir))
    assert code == 0, err
    summary = json.loads(out)["summary"][0]
    assert summary["bottleneck"]["rule"] != "stragglers"
    assert not any(h["rule"] == "stragglers" for h in summary["highlights"])


def test_the_wait_the_ranks_cause_adds_up_to_the_wait_they_waited(ranks_dir):
    """Each moment a rank waited goes to one collective, and so to one rank that caused it: the ranks' "wait
    caused" add up to their "waited" (it added up to 6.221 s against 3.928 s waited, two ranks "causing" 70.0%
    and 59.5% of the others' step time, while each caused wait was said to be counted once)."""
    m = run_rule(run_of(ranks_dir), "stragglers").metrics
    caused = sum(v["wait_caused_ns"] for v in m["ranks"].values())
    waited = sum(v["waited_ns"] for v in m["ranks"].values())
    assert caused == waited > 0
    assert all(v["waited_ns"] <= v["step_ns"] for v in m["ranks"].values())


@pytest.mark.parametrize("run", ["gloo4_slow_rank2", "gloo4_two_hosts", "fsdp4_gloo_slow_loader", "ddp4_slow_hook",
                                 "pp2_1f1b_slow_stage1", "dp2pp4_gloo_slow_rank7"])
def test_on_every_kind_of_run_the_wait_caused_adds_up_to_the_wait_waited(run):
    """gloo keeps two collectives in flight, whose waits cover the same time: the moment goes to the one a rank
    began waiting at first, never to both of their last ranks."""
    m = run_rule(run_of(FIXTURES / "torch" / "multirank" / run), "stragglers").metrics
    ranks = m["ranks"].values()
    assert sum(v["wait_caused_ns"] for v in ranks) == sum(v["waited_ns"] for v in ranks)


def test_the_run_folder_with_its_licence_beside_the_ranks_reads(tmp_path):
    """The fixture's folder as a user would give it: the notes beside the traces are left out with a warning."""
    code, out, err = run_cli("--store", str(tmp_path / "store"), "ingest", "-q", str(MEGATRON))
    assert code == 0, err
    assert "2 files are no trace and were left out: LICENSE-astra-sim.md, SOURCE.md" in err


def test_balance_leaves_no_rank_with_less_work_than_the_median_rank(ranks_dir, tmp_path):
    """--balance took each name's excess over that name's median rank: a rank's stalls fall in different operators
    on different ranks (aten::reshape 57 ms a step on rank 0, aten::empty 75 ms on rank 2), so every rank lost
    255-283 ms of work a step and came out 23-43% faster than measured, the fastest (588.8 ms) predicted at
    334.1 ms: faster than any rank ran. Each rank now keeps at least the median rank's work: the ranks at or
    under it (half of them, of either kind of work) lose nothing, and no step gains a tenth."""
    doc = whatif_json(str(tmp_path / "store"), ranks_dir, "--balance")
    removed = doc["edits"][0]["removed_per_step_by_rank"]
    assert 0 < len(removed) <= 4  # of 8 ranks
    # the events it changed inside the steps, and those steps: one of each rank it touched (it said 0 and 0)
    assert doc["edits"][0]["calls_in_steps"] > 0 and doc["edits"][0]["step_windows"] == len(removed)
    untouched = [r for r in doc["steps"] if str(r["rank"]) not in removed]
    assert len(untouched) >= 4 and all(r["predicted_ns"] == r["measured_ns"] for r in untouched)
    assert all(0 <= r["gain_pct"] < 10 for r in doc["steps"])
    assert all(r["gain_ns"] <= removed[str(r["rank"])] + 1_000 for r in doc["steps"] if str(r["rank"]) in removed)


def test_a_part_of_one_rank_s_path_is_said_as_that_path_s_not_as_the_mean_path_s(ranks_dir):
    """The critical path's largest part is untraced time on rank 7's main thread, on rank 7's path alone: given
    per mean path of the 8 ranks' only, "28.05 ms per step" read as rank 7's per step, where it took 224.4 ms of
    rank 7's step. The sentence gives both; a part on every path (the README's gloo run) keeps "per step"."""
    f = run_rule(run_of(ranks_dir), "critical-path")
    lead = f.items[0]
    assert (lead["rank"], lead["kind"], lead["paths"], f.metrics["paths"]) == (7, "untraced", 1, 8)
    assert abs(lead["per_path_ns"] - 8 * lead["per_step_ns"]) <= 8
    assert (f"{fmt_ns(lead['per_path_ns'])} of the one path it lies on ({fmt_ns(lead['per_step_ns'])} of the mean "
            "path).") in " ".join(f.message.split())


def _comm_work_oracle(docs: dict[int, list[dict]]) -> dict[int, int]:
    """From the raw JSON, per rank: the communication work of its step — the union of its collective calls
    (``c10d::allreduce_``, ``record_param_comms``, ``nccl:all_reduce``) plus each NCCL kernel's time after the
    last rank's kernel of its all-reduce started (the time before is waiting, no work)."""
    kernels = {r: sorted((us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"]))
                         for e in _complete(ev, cat="kernel") if e["name"].startswith("ncclDevKernel"))
               for r, ev in docs.items()}
    out = {}
    for rank, events in docs.items():
        (step,) = [e for e in _complete(events, cat="user_annotation") if e["name"].startswith("ProfilerStep#")]
        a, b = us_to_ns(step["ts"]), us_to_ns(step["ts"]) + us_to_ns(step["dur"])
        calls = [(us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"])) for e in _complete(events)
                 if e.get("cat") in ("cpu_op", "user_annotation") and a <= us_to_ns(e["ts"]) < b
                 and e["name"] in ("c10d::allreduce_", "record_param_comms", "nccl:all_reduce")]
        own = sum(end - max(start, max(kernels[r][k][0] for r in docs))
                  for k, (start, end) in enumerate(kernels[rank]) if a <= start < b)
        out[rank] = sum(e - s for s, e in union(calls)) + own
    return out


def test_taking_all_communication_out_takes_no_more_than_its_work(docs, ranks_dir, tmp_path):
    """`whatif --scale comm=0` said each rank's step lost more communication work than the rank had: a kernel's
    own edge and the edge by which it leaves its all-reduce both counted (rank 0: 138.5 ms a step against 115.0 ms
    of collective calls and kernels' own time)."""
    doc = whatif_json(str(tmp_path / "store"), ranks_dir, "--scale", "comm=0")
    removed = {int(r): ns for r, ns in doc["edits"][0]["removed_per_step_by_rank"].items()}
    work = _comm_work_oracle(docs)
    assert sorted(removed) == sorted(work) == list(range(8))
    assert all(0 < removed[r] <= work[r] for r in work), (removed, work)



def test_one_row_above_its_roof_is_said_in_the_singular(ranks_dir, tmp_path):
    """"1 row runs faster than their roof allows for their derived bytes": one row, its roof (the run as stored,
    with its GPU named by the traces' deviceProperties)."""
    code, out, err = run_cli("--store", str(tmp_path / "store"), "analyze", "--json", "--rule",
                             "arithmetic-intensity", str(ranks_dir))
    assert code == 0, err
    (f,) = json.loads(out)["findings"]
    assert f["metrics"]["items_above_roof"] == 1
    assert ("1 row runs faster than its roof allows for its derived bytes (its tensors came partly from cache, or "
            "the peak is not the one it ran at): its % of roof is left out.") in f["message"]


def test_gpu_busy_says_how_much_of_it_is_kernels_spinning_for_another_gpu(docs, ranks_dir, tmp_path, monkeypatch):
    """The summary read "GPU busy 88.9%" on a run whose GPUs spend most of that in all-reduces spinning for ranks
    0 and 6: busy, not working. The part that is waiting (the raw JSON's waits, as stragglers and
    comm-compute-overlap count them) is said beside it, and the work left is what calls a run GPU-bound. Each
    figure is recomputed from the raw JSON: Σ busy (union of every GPU activity per rank), Σ span (first to last
    GPU activity per rank), Σ waited over the whole trace, as the busy time and the span are (inside the steps
    only, the waiting outside them counted as work)."""
    want = _oracle(docs, whole=True)
    assert sum(want["waited"].values()) > sum(_oracle(docs)["waited"].values())  # some waiting is outside steps
    busy = whole = 0
    for events in docs.values():
        gpu = [(us_to_ns(e["ts"]), us_to_ns(e["ts"]) + us_to_ns(e["dur"])) for e in events
               if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
        busy += sum(b - a for a, b in union(gpu))
        whole += max(b for _, b in gpu) - min(a for a, _ in gpu)
    code, out, err = run_cli("--store", str(tmp_path / "store"), "analyze", "--json", str(ranks_dir))
    assert code == 0, err
    doc = json.loads(out)
    summary = doc["summary"][0]
    spin = sum(want["waited"].values())
    assert summary["gpu_busy_pct"] == round(100 * busy / whole, 4)
    assert summary["gpu_spin_pct"] == round(100 * spin / whole, 4)
    assert summary["gpu_work_pct"] == round(summary["gpu_busy_pct"] - summary["gpu_spin_pct"], 4)
    assert 25 < summary["gpu_work_pct"] < 30 and summary["gpu_spin_pct"] > 55 and not summary["gpu_bound"]
    overlap = next(f for f in doc["findings"] if f["rule"] == "comm-compute-overlap")
    assert overlap["metrics"]["waiting_ns"] == spin  # one quantity, said alike in the summary and the finding
    monkeypatch.setenv("COLUMNS", "300")  # the line whole
    code, out, err = run_cli("--store", str(tmp_path / "store"), "analyze", str(ranks_dir))
    assert code == 0, err
    busy, spin = round(summary["gpu_busy_pct"], 1), round(summary["gpu_spin_pct"], 1)
    assert (f"GPU busy     {busy:.1f}% of the mean GPU's span (first to last activity): {busy - spin:.1f}% work, "
            f"{spin:.1f}% communication kernels waiting for another GPU's (comm-compute-overlap)") in out


def test_the_page_says_the_spin_as_the_terminal_does(ranks_dir, tmp_path):
    """The HTML page's GPU busy card gives the same split of the busy share as the terminal's summary line."""
    pytest.importorskip("plotly")
    store = str(tmp_path / "store")
    code, out, err = run_cli("--store", store, "analyze", "--json", str(ranks_dir))
    assert code == 0, err
    summary = json.loads(out)["summary"][0]
    busy, spin = round(summary["gpu_busy_pct"], 1), round(summary["gpu_spin_pct"], 1)
    page = tmp_path / "run.html"
    code, out, err = run_cli("--store", store, "report", "--html", str(page), str(ranks_dir))
    assert code == 0, err
    card = re.search(r'<div class="label">GPU busy</div><div class="big">([^<]*)</div>'
                     r'<div class="muted">([^<]*)</div>', page.read_text()).groups()
    assert tuple(html.unescape(part) for part in card) == (
        f"{busy:.1f}%", f"of the mean GPU's span (first to last activity): {busy - spin:.1f}% work, "
                        f"{spin:.1f}% communication kernels waiting for another GPU's")
