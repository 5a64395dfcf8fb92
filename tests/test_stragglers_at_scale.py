"""stragglers on generated runs (``benchmarks/make_ranks.py``, copies of one real gloo rank): two ranks as slow as
each other are both named, and ranks whose clocks differ are told so.

The copies make the figures known without profiling: a slow rank computes ``--delay-ms`` longer before each
collective, and each rank's clock is shifted by a skew drawn from ``random.Random(seed)`` as the script draws it.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys

import pytest

from helpers import FIXTURES, REPO, run_cli
from traceparse.analysis import analyze, parse_settings
from traceparse.figures import fmt_ns
from traceparse.run import ingest_run
from traceparse.store import Store

BASE = FIXTURES / "torch" / "multirank" / "gloo4_slow_rank2" / "rank0.json.gz"


def make_ranks(out, *args) -> None:
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "make_ranks.py"), str(BASE), str(out), *args],
                   check=True, capture_output=True)


def stragglers(tmp_path, ranks, settings=None):
    store = Store(tmp_path / "store")
    run_id = ingest_run([ranks], store=store, jobs=1).run["id"]
    trace = store.load_run(run_id)
    [f] = [f for f in analyze(trace, rules=["stragglers"], settings=settings) if f.rule == "stragglers"]
    return f


def test_two_ranks_as_slow_are_both_named(tmp_path):
    """Ranks 3 and 5 each compute 20 ms longer before every collective; the others wait for both. Rank 3 is the
    last to arrive (of equal arrivals, the lowest rank) and causes every wait; rank 5 causes none, waits none,
    and was named nowhere but a table row."""
    make_ranks(tmp_path / "a", "--ranks", "6", "--skew-us", "0", "--slow-rank", "3")
    make_ranks(tmp_path / "b", "--ranks", "6", "--skew-us", "0", "--slow-rank", "5")
    shutil.copy(tmp_path / "b" / "rank5.json.gz", tmp_path / "a" / "rank5.json.gz")
    f = stragglers(tmp_path, tmp_path / "a")
    m = f.metrics
    assert m["straggler_rank"] == 3 and m["as_slow"] == ["5"]
    assert f.title == "Stragglers: ranks 3 and 5"
    assert m["ranks"]["5"]["waited_ns"] == 0 and m["ranks"]["5"]["wait_caused_ns"] == 0
    median = sorted(m["ranks"][r]["waited_ns"] for r in ("0", "1", "2", "4"))[2]
    assert (f" Rank 5 is as slow: it waited 0 ns in all where the median other rank waited {fmt_ns(median)}, "
            "arriving with rank 3; the others wait for both.") in f.message
    assert [i["rank"] for i in f.items[:2]] == [3, 5]
    assert f.summary[1].startswith("rank 3 (as slow: rank 5): the others wait")
    assert f.suggestion.endswith("Find what ranks 3 and 5 do before their collectives that the others do not: uneven "
                                 "data (batch sizes, sequence lengths), a slower input pipeline or host, extra work "
                                 "in hooks or logging on those ranks, or a slower GPU or link.")


def test_one_slow_rank_is_named_alone(tmp_path):
    make_ranks(tmp_path / "a", "--ranks", "6", "--skew-us", "0", "--slow-rank", "3")
    f = stragglers(tmp_path, tmp_path / "a")
    assert f.title == "Straggler: rank 3" and f.metrics["as_slow"] == []
    assert "is as slow" not in f.message and "(as slow" not in f.summary[1]


def test_ranks_on_clocks_apart_are_told_so(tmp_path):
    """Eight copies of one rank, nothing slow, each clock shifted by up to 50 ms: the rank shifted most arrives
    last everywhere, a "straggler" of the clocks alone. The finding says the collectives end as far apart as the
    clocks' shifts, which one clock cannot give, and how to align them; aligned, no rank stands out."""
    make_ranks(tmp_path / "a", "--ranks", "8", "--skew-us", "50000")
    rng = random.Random(0)  # make_ranks.py's draws, in its order
    skews_ns = [round(round(rng.uniform(0, 50000), 3) * 1000) for _ in range(8)]
    f = stragglers(tmp_path, tmp_path / "a")
    assert f.metrics["straggler_rank"] == max(range(8), key=lambda r: skews_ns[r])
    assert (f" The ranks' collectives end up to {fmt_ns(max(skews_ns) - min(skews_ns))} apart (the median over "
            "the collectives), which ranks on one clock cannot do, as they leave a collective together: their "
            "clocks likely differ (several hosts), and the waits may be that difference; "
            'settings={"stragglers": {"align_clocks": True}} aligns them on the collectives\' ends.') in f.message
    # the command line's user is told the flag, the Python caller (above) the keyword
    code, out, err = run_cli("--store", str(tmp_path / "cli"), "analyze", "--json", "--rule", "stragglers",
                             str(tmp_path / "a"))
    assert code == 0, err
    assert ("and the waits may be that difference; --set stragglers.align_clocks=true aligns them on the "
            "collectives' ends.") in json.loads(out)["findings"][0]["message"]
    aligned = stragglers(tmp_path / "again", tmp_path / "a", parse_settings(["stragglers.align_clocks=true"]))
    assert aligned.title == "No straggler" and "clocks likely differ" not in aligned.message


@pytest.mark.parametrize("run", ["gloo4_slow_rank2", "ddp4_slow_loader"])
def test_real_ranks_of_one_host_are_not_told_their_clocks_differ(run):
    from helpers import run_of, run_rule

    f = run_rule(run_of(FIXTURES / "torch" / "multirank" / run), "stragglers")
    assert f.metrics["straggler_rank"] is not None and "clocks likely differ" not in f.message


def test_a_slow_rank_the_others_wait_for_on_one_clock_is_no_clock_difference(tmp_path):
    """With --others-wait the other ranks wait 20 ms inside each of the 12 collectives, as on one clock: every
    rank leaves each collective together, so the straggler is named and its clocks are not doubted."""
    make_ranks(tmp_path / "a", "--ranks", "6", "--skew-us", "0", "--slow-rank", "3", "--others-wait")
    f = stragglers(tmp_path, tmp_path / "a")
    m = f.metrics
    assert f.title == "Straggler: rank 3" and m["collectives"] == 12
    assert {r: v["waited_ns"] for r, v in m["ranks"].items() if r != "3"} == dict.fromkeys("01245", 12 * 20_000_000)
    assert len({v["step_ns"] for v in m["ranks"].values()}) == 1  # every rank's steps as long: they waited
    assert "clocks likely differ" not in f.message
