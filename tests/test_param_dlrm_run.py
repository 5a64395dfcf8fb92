"""A real 8-rank run nobody here made: facebookresearch/param's DLRM over NCCL on eight V100s, one profiled step a
rank (fixtures/torch/param/SOURCE.md). Figures checked against the raw files, parsed here with ``json``."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from helpers import FIXTURES, run_cli

RUN = FIXTURES / "torch" / "param" / "dlrm_8rank"
FILES = sorted(RUN.glob("*.json.gz"))


def _raw(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def _us_ns(value) -> int:
    return round(float(value) * 1000)


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    store = str(tmp_path_factory.mktemp("dlrm") / "store")
    code, out, err = run_cli("--store", store, "ingest", "-q", str(RUN))
    assert code == 0, err
    return store


def test_the_run_reads_eight_ranks_with_the_files_kernels(stored):
    """Eight ranks (``distributedInfo``), and each rank's kernels as many, and as long, as its file's."""
    code, out, err = run_cli("--store", stored, "sql", "--json",
                             "select rank, count(*) as n, sum(duration_ns) as ns from events where kind = 'kernel' "
                             "group by rank order by rank")
    assert code == 0, err
    got = {row["rank"]: (row["n"], row["ns"]) for row in json.loads(out)["rows"]}
    want = {}
    for path in FILES:
        doc = _raw(path)
        kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e.get("ph") == "X"]
        want[doc["distributedInfo"]["rank"]] = (len(kernels), sum(_us_ns(e["dur"]) for e in kernels))
    assert len(want) == 8 and got == want


def test_whatif_on_a_run_of_one_step_prints_each_rank_once(stored):
    """One step a rank: each rank's row once (no "mean" row repeating it), the edit's events counted "in 1 step of
    each of 8 ranks", not "in 8 steps"; the table's measured step of each rank is its ``ProfilerStep#10``."""
    code, out, err = run_cli("--store", stored, "--width", "200", "whatif", "--scale", "comm=0.5")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].endswith("(1 step × 8 ranks)")
    assert " in 1 step of each of 8 ranks" in lines[1] and "8 steps" not in out
    body = [line for line in lines if "│" in line and line.split("│")[0].strip() in ("10", "mean")]
    assert [line.split("│")[0].strip() for line in body] == ["10"] * 8
    steps = {}
    for path in FILES:
        doc = _raw(path)
        step = next(e for e in doc["traceEvents"] if e.get("name") == "ProfilerStep#10")
        steps[doc["distributedInfo"]["rank"]] = _us_ns(step["dur"])
    shown = {int(line.split("│")[1]): float(line.split("│")[2]) for line in body}
    assert shown == {rank: round(ns / 1e6, 2) for rank, ns in steps.items()}
