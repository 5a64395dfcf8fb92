"""Benchmark: cutting a Chrome trace into chunks when names hold fake event boundaries (issue 22 item 7).

Four files, each ingested in a fresh ``traceparse ingest`` with one decoding process and with two
(``TRACEPARSE_DECODE_WORKERS``), timed with ``time.perf_counter``, peak RSS of the ingest process from
``resource.getrusage(RUSAGE_CHILDREN)`` (the decoding workers' own memory is not in it):

- ``fake``: 2,000 events whose names hold ``},{`` 2,000 times each (16 MB);
- ``empty``: an empty event list followed by 200,000 objects of ``},{`` (2.8 MB);
- ``escapes``: one name of 50 MB of ``{"\\`` (JSON-escaped: 62 MB);
- ``braces``: one name of 50 MB of ``},{``.

Usage: ``python benchmarks/bench_chunk_cutting.py``. Before the linear cut (event_ends), ``braces`` took 283 s
in one process and 24 s with two workers on the 2-core development box.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def make(directory: Path) -> dict[str, Path]:
    files = {}
    event = '{{"ph":"X","cat":"cpu_op","name":{},"pid":1,"tid":1,"ts":{},"dur":1}}'
    files["fake"] = directory / "fake.json"
    files["fake"].write_text('{"traceEvents": [' + ",".join(
        event.format(json.dumps("x},{" * 2000 + str(i)), i) for i in range(2000)) + "]}")
    files["empty"] = directory / "empty.json"
    files["empty"].write_text('{"traceEvents": [], "x": [' + ",\n".join('{"a": "},{"}' for _ in range(200_000)) + "]}")
    files["escapes"] = directory / "escapes.json"
    files["escapes"].write_text('{"traceEvents": [' + event.format(json.dumps('{"\\' * 12_500_000), 1) + ","
                                + event.format('"b"', 2) + "]}")
    files["braces"] = directory / "braces.json"
    files["braces"].write_text('{"traceEvents": [' + event.format(json.dumps("},{" * 16_666_666), 1) + "]}")
    return files


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in make(Path(tmp)).items():
            for workers in (0, 2):
                store = Path(tmp) / f"store-{name}-{workers}"
                env = dict(os.environ, TRACEPARSE_DECODE_WORKERS=str(workers))
                start = time.perf_counter()
                result = subprocess.run([sys.executable, "-m", "traceparse.cli", "--store", str(store), "ingest", "-q",
                                         str(path)], capture_output=True, text=True, env=env)
                took = time.perf_counter() - start
                rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
                print(f"{name:8} workers {workers}: {took:6.2f} s, exit {result.returncode}, "
                      f"peak RSS so far {rss:,.0f} MB", flush=True)


if __name__ == "__main__":
    main()
