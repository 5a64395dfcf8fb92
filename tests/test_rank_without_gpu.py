"""A run one of whose ranks recorded no GPU activity (its kernels, copies and GPU annotations cut from a real gloo
rank, as a profiler without CUDA activities records them): the figures over GPUs say they are over the others,
and name the rank left out, instead of a "per rank" mean of three ranks beside a run of four."""

from __future__ import annotations

import gzip
import json
import shutil

from helpers import FIXTURES
from traceparse.analysis import analyze
from traceparse.report import mean_of
from traceparse.run import ingest_run
from traceparse.store import Store
from traceparse.summary import summarize

RUN = FIXTURES / "torch" / "multirank" / "gloo4_slow_rank2"
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}


def test_a_rank_without_gpu_activity_is_named_and_left_out(tmp_path):
    ranks = tmp_path / "ranks"
    shutil.copytree(RUN, ranks)
    path = ranks / "rank3.json.gz"
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") not in GPU_CATS]
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)
    store = Store(tmp_path / "store")
    trace = store.load_run(ingest_run([ranks], store=store, jobs=1).run["id"])
    findings = analyze(trace)
    [idle] = [f for f in findings if f.rule == "gpu-idle"]
    assert idle.metrics["ranks_without_gpu"] == [3] and len(idle.metrics["devices"]) == 3
    assert " Rank 3 recorded no GPU activity and is left out of these figures." in idle.message
    assert idle.message.startswith("The 3 GPUs ran nothing")
    assert idle.impact_range["parts"] == 3
    assert mean_of(idle.impact_range, 4).startswith(" per rank (mean of 3 of 4 ranks, from ")
    assert summarize(trace, findings)["ranks"] == 4
    [share] = [f for f in findings if f.rule == "kernel-share"]
    assert " of kernel time over 3 of 4 ranks (the others ran no kernel); " in share.message


def test_a_run_whose_ranks_all_ran_kernels_says_so_plainly(tmp_path):
    store = Store(tmp_path / "store")
    trace = store.load_run(ingest_run([RUN], store=store, jobs=1).run["id"])
    findings = analyze(trace, rules=["gpu-idle", "kernel-share"])
    [idle] = [f for f in findings if f.rule == "gpu-idle"]
    [share] = [f for f in findings if f.rule == "kernel-share"]
    assert idle.metrics["ranks_without_gpu"] == [] and "recorded no GPU activity" not in idle.message
    assert " of kernel time over 4 ranks; " in share.message
    assert mean_of(idle.impact_range, 4).startswith(" per rank (mean of 4, from ")


def test_a_few_ranks_are_named_and_the_rest_counted():
    """The one way gpu-idle and stragglers name ranks: all of a few, the first of many and how many more."""
    from traceparse.figures import listed

    assert listed("rank", [3]) == "rank 3"
    assert listed("rank", [7, 3]) == "ranks 7 and 3"
    assert listed("rank", list(range(16)), shown=8) == "ranks 0, 1, 2, 3, 4, 5, 6 and 9 more"
    assert listed("device", [1, 2, 3, 4]) == "devices 1, 2, 3 and 4"
