"""Cross-rank arithmetic that cannot wrap (issue 22 item 2): ranks whose clocks are 9.2e15 µs (9.2e18 ns, 292
years) off. The runs are hand-made mutants of the real rank fixtures in fixtures/torch/multirank (every ``ts``
of a rank, or of the later half of its events, moved by 9.2e15 µs); the expected figures are computed here from
the mutated JSON."""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path

import polars as pl

from helpers import FIXTURES, json_numbers, run_cli, us_to_ns

MULTIRANK = FIXTURES / "torch" / "multirank"
OFF_US = Decimal("9.2e15")
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}


def _mutant(tmp_path: Path, run: str, edit) -> Path:
    """The rank directory ``run`` with each rank's events passed through ``edit(rank_index, events)``."""
    out = tmp_path / run
    out.mkdir()
    for i, path in enumerate(sorted((MULTIRANK / run).iterdir())):
        doc = json.load(gzip.open(path), parse_float=Decimal)
        edit(i, doc["traceEvents"])
        with gzip.open(out / path.name, "wt") as f:
            json.dump(doc, f, default=str)
    return out


def _shift_all(rank: int):
    def edit(i, events):
        if i == rank:
            for e in events:
                if "ts" in e:
                    e["ts"] = Decimal(e["ts"]) + OFF_US
    return edit


def _shift_later_half(i, events):
    """The clock of every rank jumps by 9.2e15 µs halfway through its events."""
    times = sorted(Decimal(e["ts"]) for e in events if "ts" in e)
    middle = times[len(times) // 2]
    for e in events:
        if "ts" in e and Decimal(e["ts"]) >= middle:
            e["ts"] = Decimal(e["ts"]) + OFF_US


def _raw_spans(directory: Path) -> list[tuple[int, int]]:
    """(first ts, last ts + dur) in ns of each rank file's events, from the JSON."""
    spans = []
    for path in sorted(directory.iterdir()):
        events = [e for e in json.load(gzip.open(path), parse_float=Decimal)["traceEvents"] if "ts" in e]
        spans.append((min(us_to_ns(e["ts"]) for e in events),
                      max(us_to_ns(e["ts"]) + us_to_ns(e.get("dur", 0)) for e in events)))
    return spans


def _analyze(directory: Path, *options: str) -> tuple[dict, str]:
    code, out, err = run_cli("analyze", "--json", "--all", *options, str(directory))
    assert code == 0, err
    return json.loads(out), err


def test_a_rank_on_another_clock_is_aligned_with_a_warning(store, tmp_path):
    directory = _mutant(tmp_path, "gloo4_balanced", _shift_all(1))
    code, out, err = run_cli("ingest", "-q", "--jobs", "1", str(directory))
    assert code == 0, err
    assert err == ("traceparse: warning: ranks on another clock: rank 1 (its events never overlap those of rank 0 in "
                   "time; rank 1 is 9,200,000,000 s ahead of rank 0); their times are moved to start with the first "
                   "event of rank 0 (--set stragglers.align_clocks=true aligns the ranks on collective ends)\n")
    spans = _raw_spans(directory)
    assert spans[1][0] - spans[0][0] > 9 * 10**18  # the mutant is what it claims
    import warnings

    import traceparse

    with warnings.catch_warnings(record=True) as said:  # in Python, the keyword and not the flag
        warnings.simplefilter("always")
        traceparse.add(directory, store=tmp_path / "api")
    assert [str(w.message) for w in said] == [
        "ranks on another clock: rank 1 (its events never overlap those of rank 0 in time; rank 1 is 9,200,000,000 s "
        "ahead of rank 0); their times are moved to start with the first event of rank 0 (analyze(..., "
        'settings={"stragglers": {"align_clocks": True}}) aligns the ranks on collective ends)']
    doc, _ = _analyze(directory)
    run = json.loads((next((store / "runs").iterdir()) / "run.json").read_text())
    assert run["clock_shifts_ns"] == {"1": spans[0][0] - spans[1][0]}
    # rank 1 starts with rank 0: the run's span is at most the first start to the last end of the others or of
    # rank 1 moved, all computed from the JSON
    first = min(s for s, _ in spans)
    last = max([e for i, (_, e) in enumerate(spans) if i != 1] + [spans[1][1] - spans[1][0] + spans[0][0]])
    assert doc["summary"][0]["span_ns"] <= last - first < 10**9
    for path, value in json_numbers(doc):
        assert 0 <= value < 2**63, (path, value)
    stragglers = next(f for f in doc["findings"] if f["rule"] == "stragglers")
    assert stragglers["metrics"]["step_time_lost_pct"] <= 100
    for rank in stragglers["metrics"]["ranks"].values():
        assert rank["waited_ns"] <= rank["step_ns"]


def test_a_rank_that_cannot_be_moved_is_refused(store, tmp_path):
    """Rank 0 on a clock 9.2e18 ns ahead; rank 1 on its own clock, jumping by 5e16 ns inside its trace: moving
    rank 1 to start where rank 0 starts would carry its end past Int64."""
    def edit(i, events):
        times = sorted(Decimal(e["ts"]) for e in events if "ts" in e)
        for e in events:
            if "ts" in e and (i == 0 or Decimal(e["ts"]) >= times[len(times) // 2]):
                e["ts"] = Decimal(e["ts"]) + (OFF_US if i == 0 else Decimal("5e13"))
    directory = _mutant(tmp_path, "nccl2_balanced", edit)
    spans = _raw_spans(directory)
    assert spans[0][0] - spans[1][1] > 100 * (spans[1][1] - spans[1][0])  # far apart: another clock
    assert spans[0][0] + (spans[1][1] - spans[1][0]) > 2**63 - 1
    code, out, err = run_cli("ingest", "-q", "--jobs", "1", str(directory))
    assert code == 2 and err.count("\n") == 1
    assert err == (f"traceparse: error: {directory / 'rank1.json.gz'}: rank 1 is on another clock (its events never "
                   "overlap those of rank 0 in time) and its span of 50,000,000 s cannot be moved onto the clock of "
                   "rank 0 within Int64 nanoseconds\n")


def test_ranks_that_profiled_apart_are_left_alone(store, tmp_path):
    """Rank 1 profiled 10 s after rank 0 (its windows do not overlap, but by less than a minute): one clock."""
    directory = _mutant(tmp_path, "nccl2_balanced", lambda i, events: [
        e.update(ts=Decimal(e["ts"]) + 10**7) for e in events if i == 1 and "ts" in e])
    spans = _raw_spans(directory)
    assert spans[1][0] > spans[0][1]
    code, out, err = run_cli("ingest", "-q", "--jobs", "1", str(directory))
    assert code == 0 and err == ""
    run = json.loads((next((store / "runs").iterdir()) / "run.json").read_text())
    assert "clock_shifts_ns" not in run


def test_spans_that_add_up_past_int64_do_not_wrap(store, tmp_path):
    """Both ranks' clocks jump by 9.2e18 ns: each device's span fits Int64, their sum does not (polars' sum gave
    -46,744,073,560,592,231 ns). The figures summed over devices and ranks are exact."""
    directory = _mutant(tmp_path, "nccl2_balanced", _shift_later_half)
    expected = 0
    for path in sorted(directory.iterdir()):
        gpu = [e for e in json.load(gzip.open(path), parse_float=Decimal)["traceEvents"]
               if e.get("cat") in GPU_CATS and "ts" in e]
        for device in {e["args"]["device"] for e in gpu}:
            mine = [e for e in gpu if e["args"]["device"] == device]
            expected += (max(us_to_ns(e["ts"]) + us_to_ns(e["dur"]) for e in mine)
                         - min(us_to_ns(e["ts"]) for e in mine))
    assert expected > 2**63  # two spans of 9.2e18 ns
    doc, err = _analyze(directory)
    idle = next(f for f in doc["findings"] if f["rule"] == "gpu-idle")
    balance = next(f for f in doc["findings"] if f["rule"] == "rank-balance")
    assert idle["metrics"]["span_ns"] == expected == balance["metrics"]["span_ns"]
    assert 0 <= idle["metrics"]["idle_ns"] <= expected
    for path, value in json_numbers(doc):
        assert value >= 0, (path, value)
    assert sum(idle["metrics"][k] for k in ("host_wait_ns", "kernel_wait_ns", "other_wait_ns")) == \
        idle["metrics"]["idle_ns"]


def test_moved_arrivals_are_clipped_never_wrapped():
    """Collective waits with clocks aligned, on members 9.2e18 ns apart: arrivals move within Int64."""
    from traceparse.measures import collective_waits

    def rows(rank, base):
        return pl.DataFrame({
            "trace_id": f"t{rank}", "event_id": [0, 1], "kind": ["kernel", "kernel"], "rank": [rank, rank],
            "name": ["ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"] * 2,
            "start_ns": [base, base + 1000], "duration_ns": [500, 500], "device_id": [0, 0], "stream_id": [7, 7],
        }, schema_overrides={"rank": pl.Int32, "device_id": pl.Int32})

    from traceparse.schema import conform

    events = pl.concat([conform(rows(0, 0)), conform(rows(1, 9_200_000_000_000_000_000))])
    waits = collective_waits(events, align_clocks=True)
    assert waits["offset_ns"].to_list() == [0, 9_200_000_000_000_000_000] * 2
    assert waits["arrival_ns"].to_list() == [0, 0, 1000, 1000] and waits["wait_ns"].to_list() == [0, 0, 0, 0]
    edge = pl.concat([conform(rows(0, 2**63 - 2000)), conform(rows(1, 0))])
    waits = collective_waits(edge, align_clocks=True)
    assert waits["arrival_ns"].min() >= 0 and waits["wait_ns"].min() >= 0


def test_ranks_of_two_runs_are_said_to_be_so(store, tmp_path):
    """A rank folder that mixes two runs of one job (fsdp4_balanced's ranks 0-2 and fsdp4_slow_loader's rank 3,
    recorded 3.7 s apart on one machine): their collectives pair by number, and stragglers read "no rank stands
    out; rank 3 made the others wait 13.39 ms", waits clipped to the steps. The k-th collective of rank 3 ends
    seconds after the others' where members of one collective leave it together: the finding says the traces are
    of different runs (or clocks that far apart), with the gap and the step it exceeds."""
    from helpers import run_of
    from traceparse import measures
    from traceparse.figures import fmt_ns

    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for rank in range(3):
        (mixed / f"rank{rank}.json.gz").write_bytes((MULTIRANK / "fsdp4_balanced" / f"rank{rank}.json.gz").read_bytes())
    (mixed / "rank3.json.gz").write_bytes((MULTIRANK / "fsdp4_slow_loader" / "rank3.json.gz").read_bytes())
    offsets = measures.collective_waits(run_of(mixed).events, align_clocks=True).group_by("member").agg(
        pl.col("offset_ns").first())["offset_ns"]
    apart = int(offsets.max() - offsets.min())
    assert apart > 3 * 10**9
    doc, _ = _analyze(mixed)
    message = next(f for f in doc["findings"] if f["rule"] == "stragglers")["message"]
    assert (f"The ranks' collectives end up to {fmt_ns(apart)} apart (the median over the collectives), more than a "
            "step (") in message
    assert ("though ranks leave a collective together: these traces are of different runs, or their clocks differ by "
            "that much, and no wait here compares the same collectives") in message
    whole, _ = _analyze(MULTIRANK / "fsdp4_balanced")
    assert "more than a step" not in next(f for f in whole["findings"] if f["rule"] == "stragglers")["message"]


def test_a_rank_profiled_at_other_steps_is_named_with_its_steps(store, tmp_path):
    """fsdp4_balanced with rank 3's ProfilerStep#2-4 renumbered #12-14 (as a rank whose profiler's schedule
    started ten steps later would write them): its collectives are keyed by step and pair with none of the
    others'. Stragglers read "126 collectives are missing on some ranks" and no more; now it says which ranks
    lack how many (each rank's calls in the whole run, the same number on every rank, are collectives the others
    lack here: rank 3 lacks the others' n, each of them rank 3's n) and in which steps rank 3's calls are against
    the others' (read from the raw JSON)."""
    import re

    from helpers import run_of
    from traceparse import measures

    def renumber(i, events):
        if i == 3:
            for e in events:
                m = re.fullmatch(r"ProfilerStep#(\d+)", e.get("name", ""))
                if m:
                    e["name"] = f"ProfilerStep#{int(m.group(1)) + 10}"

    moved = _mutant(tmp_path, "fsdp4_balanced", renumber)
    steps = sorted({int(m.group(1)) for e in json.load(gzip.open(MULTIRANK / "fsdp4_balanced" / "rank0.json.gz"))[
        "traceEvents"] if (m := re.fullmatch(r"ProfilerStep#(\d+)", e.get("name", "")))})
    doc, _ = _analyze(moved)
    s = next(f for f in doc["findings"] if f["rule"] == "stragglers")
    text = re.sub(r"\s+", " ", s["message"])
    calls = measures.collectives(run_of(MULTIRANK / "fsdp4_balanced").events).group_by("member").len()
    assert calls["len"].n_unique() == 1 and calls.height == 4
    n = calls["len"][0]
    assert s["metrics"]["incomplete_collectives"] == 2 * n
    assert f"{2 * n} collectives are missing on some ranks: ranks 0, 1, 2 and 3 lack {n} each." in text
    assert (f"Rank 3 took part in none of the others' collectives: its calls are in ProfilerStep#{steps[0] + 10} "
            f"to #{steps[-1] + 10}, the others' in ProfilerStep#{steps[0]} to #{steps[-1]}, so the traces were "
            "profiled at different steps, and it is compared with no rank (no wait either way).") in text
    whole, _ = _analyze(MULTIRANK / "fsdp4_balanced")
    assert "missing on some" not in next(f for f in whole["findings"] if f["rule"] == "stragglers")["message"]
