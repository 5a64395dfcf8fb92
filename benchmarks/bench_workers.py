"""Benchmark: how ingest of one large torch trace scales with decoding workers (issue 25, item 2).

``traceparse ingest TRACE`` with ``TRACEPARSE_DECODE_WORKERS`` = each of ``--workers`` (0 = one process, no
pool), every run a fresh process tree and a fresh store (the content-hash cache never answers), the worker
counts alternated within each round (1, 2, 4, ..., then again), measured by ``bench_ranks.measure``: wall time,
peak summed RSS of the whole process tree, load before. The table gives the median of ``--repeat`` rounds, the
spread (min–max), MB/s of the file as read (uncompressed JSON) and the speed-up over one process. Usage::

    python benchmarks/bench_workers.py TRACE.json [--workers 0 1 2 4 8 16] [--threads N] [--repeat 3] [--out FILE]

Also prints the machine's CPU count, so the table says where the default (one fewer than the cores, at most
8) falls.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ranks import measure  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", type=Path)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2, 4, 8, 16])
    parser.add_argument("--threads", type=int, default=None,
                        help="decoding threads of the ingesting process where it has no worker (default: its own "
                             "choice); with --workers 0 this compares thread counts: run once per count")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    size_mb = args.trace.stat().st_size / 1e6
    runs: dict[int, list[dict]] = {w: [] for w in args.workers}
    for _ in range(args.repeat):
        for w in args.workers:
            store = tempfile.mkdtemp(prefix="tp_store_")
            env = dict(os.environ, TRACEPARSE_DECODE_WORKERS=str(w), TRACEPARSE_STORE=store)
            if args.threads is not None:
                env["TRACEPARSE_DECODE_THREADS"] = str(args.threads)
            runs[w].append(measure([sys.executable, "-m", "traceparse.cli", "-q", "ingest", str(args.trace)], env))
            shutil.rmtree(store, ignore_errors=True)
    base = statistics.median(r["seconds"] for r in runs[args.workers[0]])
    rows = []
    for w in args.workers:
        secs = [r["seconds"] for r in runs[w]]
        rss = [r["peak_rss_mb"] for r in runs[w]]
        med = statistics.median(secs)
        rows.append({"workers": w, "seconds": med, "min": min(secs), "max": max(secs), "mb_per_s": size_mb / med,
                     "speedup": base / med, "peak_rss_mb": statistics.median(rss),
                     "load_1min": [r["load_1min"] for r in runs[w]]})
    doc = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "machine": platform.node(),
           "cpus": os.cpu_count(), "python": platform.python_version(), "trace": args.trace.name,
           "size_mb": round(size_mb, 1), "repeat": args.repeat, "rows": rows}
    print(f"{args.trace.name}: {size_mb:.1f} MB, {os.cpu_count()} CPUs, median of {args.repeat} (min–max)")
    print(f"{'workers':>7} {'seconds':>18} {'MB/s':>7} {'speed-up':>8} {'peak RSS MB':>11}")
    for r in rows:
        print(f"{r['workers']:>7} {r['seconds']:>7.2f} ({r['min']:.2f}–{r['max']:.2f}) {r['mb_per_s']:>7.1f} "
              f"{r['speedup']:>7.2f}× {r['peak_rss_mb']:>11.0f}")
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
