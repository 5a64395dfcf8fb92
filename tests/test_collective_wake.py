"""A trace without runtime calls (a CPU-only run, a trimmed one): a thread resuming right after a collective on
another thread of its process ended waited for it, so the critical path follows the collective to the rank that
held it, instead of calling the wait time the trace does not show.

Real runs: ``gloo4_two_hosts`` (PyTorch 2.13 on the CPU, fixtures/make_hosts_run.py: ranks 2 and 3 sleep 40 ms a
step in an ``augment`` range, and DDP's reducer on the main thread waits for gloo's worker thread untraced), and
the trimmed ``gloo4_slow_rank2`` (only annotations and collective calls kept, fixtures/make_comm_fixtures.py:
rank 2 sleeps 60 ms a step in a gradient hook). The oracles read the raw JSON.
"""

from __future__ import annotations

import gzip
import json

from helpers import FIXTURES, run_cli

RUNS = FIXTURES / "torch" / "multirank"


def raw(path):
    with gzip.open(path, "rt") as f:
        return json.load(f)


def critical_path(store, folder) -> dict:
    code, out, err = run_cli("ingest", str(folder))
    assert code == 0, err
    code, out, err = run_cli("analyze", folder.name, "--rule", "critical-path", "--json")
    assert code == 0, err
    [finding] = [f for f in json.loads(out)["findings"] if f["rule"] == "critical-path"]
    return finding


def test_cpu_run_path_reaches_the_sleeping_ranks(store):
    folder = RUNS / "gloo4_two_hosts"
    # the oracle: the main thread of rank 0 waits, untraced, until just after gloo's worker thread ends its
    # all_reduce; ranks 2 and 3 spend about 40 ms a step in "augment"
    doc = raw(folder / "rank0.json.gz")
    assert not any(e.get("cat") == "cuda_runtime" for e in doc["traceEvents"])
    augment = {r: [e["dur"] for e in raw(folder / f"rank{r}.json.gz")["traceEvents"] if e.get("name") == "augment"]
               for r in range(4)}
    assert not augment[0] and not augment[1] and all(39_000 < d < 45_000 for r in (2, 3) for d in augment[r])
    finding = critical_path(store, folder)
    m = finding["metrics"]
    top = finding["items"][0]
    assert (top["name"], top["kind"]) == ("augment", "host op") and top["rank"] in (2, 3)
    assert finding["title"] == f"Rank {top['rank']}'s augment holds the step"
    assert m["other_rank_ns"] > 0 and m["inferred_pct"] > 0
    # before, every rank's path stayed on its own main thread: half of it "(nothing traced in ProfilerStep#N)"
    assert m["untraced_pct"] < 5


def test_trimmed_run_path_reaches_the_slow_rank(store):
    folder = RUNS / "gloo4_slow_rank2"
    doc = raw(folder / "rank2.json.gz")
    assert not any(e.get("cat") == "cuda_runtime" for e in doc["traceEvents"])
    finding = critical_path(store, folder)
    top = finding["items"][0]
    assert top["rank"] == 2  # the rank that slept 60 ms a step (make_comm_fixtures.py)
    assert finding["metrics"]["other_rank_ns"] > 0
