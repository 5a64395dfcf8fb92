"""Benchmark: cutting a Chrome trace into chunks when names hold fake event boundaries (issue 22 item 7).

Four files, each ingested in a fresh ``traceparse ingest`` with one decoding process and with two
(``TRACEPARSE_DECODE_WORKERS``), measured by ``bench_ranks.measure``: wall time and the peak RSS of the whole process tree (the decoding
workers included), sampled every 20 ms:

- ``fake``: 2,000 events whose names hold ``},{`` 2,000 times each (16 MB);
- ``empty``: an empty event list followed by 200,000 objects of ``},{`` (2.8 MB);
- ``escapes``: one name of 50 MB of ``{"\\`` (JSON-escaped: 62 MB);
- ``braces``: one name of 50 MB of ``},{``.

Usage: ``python benchmarks/bench_chunk_cutting.py``. Before the linear cut (event_ends), ``braces`` took 283 s
in one process and 24 s with two workers on the 2-core development box. With two workers it then peaked at
1,969 MB (process tree): each 8 MB piece of the name, cut at a ``},{``, decoded in a worker as millions of empty
events (``{},{},...``) that the merge then threw away. Since issue 25 no cut is made before an empty object, a
piece merged after a false cut is decoded in the main process (no copy sent to a worker), and the end of the
file is decoded there when its turn comes: 805 MB peak, 12.9 s (load 7.6; one process: 680 MB, 10.4 s).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from bench_ranks import measure


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
                try:
                    run = measure([sys.executable, "-m", "traceparse", "--store", str(store), "ingest", "-q",
                                   str(path)], env=env)
                except RuntimeError as refused:  # a refusal in one line is an answer too: say it
                    print(f"{name:8} workers {workers}: {str(refused)[-200:]}", flush=True)
                    continue
                print(f"{name:8} workers {workers}: {run['seconds']:6.2f} s, peak RSS of the process tree "
                      f"{run['peak_rss_mb']:,.0f} MB (load {run['load_1min']})", flush=True)

if __name__ == "__main__":
    main()
