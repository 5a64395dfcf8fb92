"""gpu-idle's streams table on a run: streams idle alike are listed in rank order, not by their trace ids' hashes.

The ranks are copies of one real gloo rank (``benchmarks/make_ranks.py``, no clock skew, no slow rank): every
stream is idle to the nanosecond alike, so only the tie-break orders them.
"""

from __future__ import annotations

import subprocess
import sys

from helpers import FIXTURES, REPO
from traceparse.analysis import analyze
from traceparse.run import ingest_run
from traceparse.store import Store


def test_streams_idle_alike_are_in_rank_order(tmp_path):
    ranks = tmp_path / "ranks"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "make_ranks.py"),
                    str(FIXTURES / "torch" / "multirank" / "gloo4_slow_rank2" / "rank0.json.gz"), str(ranks),
                    "--ranks", "5", "--skew-us", "0", "--delay-ms", "0"], check=True, capture_output=True)
    store = Store(tmp_path / "store")
    run_id = ingest_run([ranks], store=store, jobs=1).run["id"]
    trace = store.load_run(run_id, lazy=True)
    [idle] = [f for f in analyze(trace, rules=["gpu-idle"]) if f.rule == "gpu-idle"]
    streams = idle.metrics["streams"]
    rows = [(int(key.split(":")[0].removeprefix("rank ")), key.split(":", 1)[1], row["idle_ns"])
            for key, row in streams.items()]
    per_stream = {}
    for rank, stream, idle_ns in rows:
        per_stream.setdefault(stream, set()).add(idle_ns)
    assert len(rows) == 5 * len(per_stream) and all(len(v) == 1 for v in per_stream.values())  # alike on every rank
    assert [(-idle_ns, rank) for rank, _, idle_ns in rows] == sorted((-idle_ns, rank) for rank, _, idle_ns in rows)
    by_hash = [int(rank) for rank, _ in sorted(trace.meta.extra["run"]["ranks"].items(), key=lambda kv: kv[1])]
    assert by_hash != list(range(5))  # the trace ids' order is not the ranks': the tie-break is what is tested
