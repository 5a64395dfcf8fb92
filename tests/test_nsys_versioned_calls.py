"""nsys 2022's doubled CUDA runtime records, on a real export nobody here made (fixtures/nsys/public/pipit_saxpy_2022).

That version writes a call and, nested inside it on the same thread with the same ``correlationId``, its versioned
entry point (``cudaMalloc`` over ``cudaMalloc_v3020``). The figures here are computed from the SQLite file itself.
"""

from __future__ import annotations

import gzip
import json
import sqlite3
from collections import Counter

import pytest

from helpers import FIXTURES, run_cli

EXPORT = FIXTURES / "nsys" / "public" / "pipit_saxpy_2022" / "saxpy-mpi-cuda_nsys_perlmutter0.sqlite.gz"


@pytest.fixture(scope="module")
def calls(tmp_path_factory) -> list[tuple[str, int]]:
    """(name without a version suffix, duration ns) of each call: the outermost record of each (thread,
    correlationId), every other record of that pair checked to lie inside it."""
    db = tmp_path_factory.mktemp("pipit") / "export.sqlite"
    db.write_bytes(gzip.decompress(EXPORT.read_bytes()))
    rows = sqlite3.connect(db).execute(
        "SELECT r.globalTid, r.correlationId, r.start, r.end, s.value FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
        "JOIN StringIds s ON s.id = r.nameId").fetchall()
    assert len(rows) == 95
    by_call: dict[tuple, list] = {}
    for tid, corr, start, end, name in rows:
        by_call.setdefault((tid, corr), []).append((start, -(end - start), end, name))
    out = []
    for records in by_call.values():
        records.sort()
        start, _, end, name = records[0]
        assert all(s >= start and e <= end for s, _, e, _ in records[1:])
        out.append((name.split("_v")[0], end - start))
    return out


def test_each_runtime_call_counts_once(calls, tmp_path):
    assert len(calls) == 57 and Counter(n for n, _ in calls)["cudaMemcpy"] == 15
    total = sum(d for _, d in calls)
    memcpy = sum(d for n, d in calls if n == "cudaMemcpy")
    code, out, err = run_cli("--store", str(tmp_path), "analyze", str(EXPORT), "--json")
    assert code == 0, err
    doc = json.loads(out)
    [share] = [f for f in doc["findings"] if f["rule"] == "api-share"]
    assert (share["metrics"]["api_time_ns"], share["metrics"]["api_calls"]) == (total, 57) and total == 703_121_008
    assert share["message"].startswith("57 API calls (7 distinct) take 703.1 ms; memcpy 53.2%")
    [top] = [i for i in share["items"] if i["name"] == "cudaMemcpy"]
    assert (top["calls"], top["time_ns"]) == (15, memcpy)
    [launch] = [f for f in doc["findings"] if f["rule"] == "launch-stats"]
    assert launch["metrics"]["launches"] == Counter(n for n, _ in calls)["cudaLaunchKernel"] == 5
    assert launch["metrics"]["launch_time_ns"] == sum(d for n, d in calls if n == "cudaLaunchKernel")
