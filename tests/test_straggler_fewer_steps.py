"""A straggler whose own trace holds fewer steps than the others' (its profiler ran over one step of three).

The run is fixtures/torch/multirank/fsdp4_slow_loader (rank 2's DataLoader sleeps 30 ms a step) with rank 2's
trace cut here to the events of its ProfilerStep#3: a hand-made mutant of a real run, said so. It read "made the
other ranks wait 98.4 ms (7.5% of their step time, under the 10% warning line)": the one step's waits over all
nine of the others' steps. It also read "their clocks likely differ" of one machine: the clock offsets paired
rank 2's k-th collective kernel with the others' k-th, one step (146 ms) apart.
"""

from __future__ import annotations

import gzip
import json
import re

import polars as pl
import pytest

from helpers import FIXTURES, raw_steps, run_cli, run_of
from test_rank_without_gpu import _edited
from traceparse import measures

RUN = FIXTURES / "torch" / "multirank" / "fsdp4_slow_loader"
STEP = 3


def _one_step(events: list[dict]) -> list[dict]:
    """The metadata and the events that start inside the host-side ProfilerStep#3, other steps' annotations not."""
    step = next(e for e in events if e.get("cat") == "user_annotation" and e.get("name") == f"ProfilerStep#{STEP}")
    lo, hi = float(step["ts"]), float(step["ts"]) + float(step["dur"])

    def kept(e: dict) -> bool:
        if e.get("ph") == "M" or "ts" not in e:
            return True
        other_step = e.get("name", "").startswith("ProfilerStep#") and e["name"] != step["name"]
        return lo <= float(e["ts"]) <= hi and not other_step

    return [e for e in events if kept(e)]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return _edited(tmp_path_factory.mktemp("fewer"), "fsdp4_slow_loader", 2, "one_step", _one_step)


@pytest.fixture(scope="module")
def analyzed(folder, tmp_path_factory):
    store = str(tmp_path_factory.mktemp("store"))
    out = {}
    for name, path in (("cut", folder), ("whole", RUN)):
        code, doc, err = run_cli("--store", store, "analyze", "--json", str(path))
        assert code == 0, err
        out[name] = {f["rule"]: f for f in json.loads(doc)["findings"]}
    return out


def test_the_mutant_holds_one_step_on_rank_2(folder):
    doc = json.loads(gzip.decompress((folder / "rank2.json.gz").read_bytes()))
    assert sorted({e["name"] for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")}) == \
        [f"ProfilerStep#{STEP}"]
    assert raw_steps(folder / "rank0.json.gz").keys() == {2, 3, 4}


def test_the_share_is_of_the_others_time_in_the_step_the_straggler_holds(analyzed, folder):
    f = analyzed["cut"]["stragglers"]
    m = f["metrics"]
    assert f["severity"] == "warning" and m["straggler_rank"] == 2
    # the others' step time: their own ProfilerStep#3, from their raw files
    others = sum(end - start for r in (0, 1, 3) for n, (start, end) in raw_steps(folder / f"rank{r}.json.gz").items()
                 if n == STEP)
    assert m["others_step_ns"] == others
    assert m["step_time_lost_pct"] == round(100 * m["step_time_at_stake_ns"] / others, 4)
    assert m["wait_caused_per_step_ns"] == round(m["wait_caused_ns"] / 3)  # three ranks, one step each
    # the whole run's figures, a step at a time, within 2%
    whole = analyzed["whole"]["stragglers"]["metrics"]
    assert abs(m["wait_caused_per_step_ns"] - whole["wait_caused_per_step_ns"]) <= 0.02 * whole["wait_caused_per_step_ns"]
    assert abs(m["step_time_lost_pct"] - whole["step_time_lost_pct"]) <= 0.02 * whole["step_time_lost_pct"]
    text = re.sub(r"\s+", " ", f["message"])
    assert ("Rank 2's trace holds ProfilerStep#3, the others' #2 to #4: the others' time is compared in the step "
            "its trace covers.") in text
    assert "clocks likely differ" not in text and "more than a step" not in text


def test_the_same_run_whole_says_nothing_of_compared_steps(analyzed):
    assert "is compared in the" not in analyzed["whole"]["stragglers"]["message"]


def test_clock_offsets_pair_the_same_collectives(folder):
    cut = measures.collective_waits(run_of(folder).events, align_clocks=True)
    whole = measures.collective_waits(run_of(RUN).events, align_clocks=True)

    def offsets(waits):
        return dict(waits.group_by("member").agg(pl.col("offset_ns").first()).iter_rows())

    a, b = offsets(cut), offsets(whole)
    assert a[0] == b[0] == 0 and a[1] == b[1] and a[3] == b[3]  # over the same 63 collectives against rank 0's
    assert abs(a[2] - b[2]) < 1_000_000  # over rank 2's 21 of them: one clock, well under a step (146 ms)


def test_critical_path_counts_its_paths(analyzed):
    text = re.sub(r"\s+", " ", analyzed["cut"]["critical-path"]["message"])
    assert "(10 paths over 3 steps of 4 ranks)" in text
    assert "(3 steps × 4 ranks)" in re.sub(r"\s+", " ", analyzed["whole"]["critical-path"]["message"])
