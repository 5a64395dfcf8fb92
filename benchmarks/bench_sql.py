"""Benchmark: `traceparse sql` over synthetic runs of 8 and 64 ranks, on DuckDB and on polars.

Each run is made by benchmarks/make_ranks.py from rank 0 of the shared 4-rank gloo sample (as
bench_ranks.py makes it) and ingested once into a fresh store. Every query is a fresh process tree
(``traceparse sql --engine E QUERY --csv``), sampled every 20 ms with psutil: wall time and the peak of the
summed resident memory of the process and its children (bench_ranks.measure). For scale, the same store is
also loaded whole (``Store.load_run``: every rank's events in memory), which is what a query would cost
without the lazy scans. Queries alternate between engines; the table gives the median of ``--repeat`` runs
and their spread (min-max). Usage::

    python benchmarks/bench_sql.py [--ranks 8 64] [--repeat 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil

from bench_ranks import DATA, measure, rank_dir, summarize

#: (label, query): the process floor, a projection (3 columns of kernels), a predicate (one rank of 64),
#: a scan of every row (3 columns), and the steps view (computed per rank from 6 columns).
QUERIES = [
    ("floor", "SELECT 1 AS x"),
    ("kernel time by rank, one category",
     "SELECT rank, SUM(duration_ns) AS kernel_ns FROM kernels WHERE category = 'convolution' "
     "GROUP BY rank ORDER BY rank"),
    ("top kernels of rank 5", "SELECT name, COUNT(*) AS calls, SUM(duration_ns) AS kernel_ns FROM kernels "
                              "WHERE rank = 5 GROUP BY name ORDER BY kernel_ns DESC LIMIT 10"),
    ("every event by rank and kind", "SELECT rank, kind, COUNT(*) AS n, SUM(duration_ns) AS ns FROM events "
                                     "GROUP BY rank, kind ORDER BY rank, kind"),
    ("slowest steps", "SELECT rank, step, duration_ns FROM steps ORDER BY duration_ns DESC LIMIT 5"),
]
LOAD_WHOLE = "import sys; from traceparse.store import Store; Store(sys.argv[1]).load_run(sys.argv[2]).events"


def bench(ranks: list[int], repeat: int) -> dict:
    traceparse = [sys.executable, "-m", "traceparse.cli"]
    results: dict = {}
    for n in ranks:
        directory = rank_dir(n)
        store = tempfile.mkdtemp(prefix="bench-sql-")
        try:
            subprocess.run([*traceparse, "--store", store, "-q", "ingest", str(directory)], check=True,
                           stdout=subprocess.DEVNULL)
            run_id = json.loads(subprocess.run([*traceparse, "--store", store, "list", "--json"], check=True,
                                               capture_output=True, text=True).stdout)["runs"][0]["id"]
            events = sum(1 for _ in Path(store, "runs", run_id).glob("rank=*/events.parquet"))
            runs: dict[str, list] = {}
            for _ in range(repeat):
                for label, query in QUERIES:
                    for engine in ("duckdb", "polars"):
                        cmd = [*traceparse, "--store", store, "sql", "--engine", engine, "--csv", query]
                        runs.setdefault(f"{label} | {engine}", []).append(measure(cmd))
                runs.setdefault("load whole run (Store.load_run)", []).append(
                    measure([sys.executable, "-c", LOAD_WHOLE, store, run_id]))
            results[n] = {k: summarize(v) for k, v in runs.items()}
            results[n]["store_mb"] = sum(p.stat().st_size for p in Path(store).rglob("*") if p.is_file()) / 2**20
            results[n]["rank_files"] = events
        finally:
            shutil.rmtree(store, ignore_errors=True)
        print(f"{n} ranks done", file=sys.stderr)
    return results


def table(results: dict) -> str:
    ranks = list(results)
    keys = [k for k in results[ranks[0]] if isinstance(results[ranks[0]][k], dict)]
    head = "| query | engine | " + " | ".join(f"{n} ranks: wall s | {n} ranks: peak RSS MB" for n in ranks) + " |"
    lines = [head, "| --- | --- | " + " | ".join("---: | ---:" for _ in ranks) + " |"]
    for key in keys:
        label, _, engine = key.partition(" | ")
        cells = []
        for n in ranks:
            s = results[n][key]
            cells.append(f"{s['seconds']['median']:.2f} ({s['seconds']['min']:.2f}–{s['seconds']['max']:.2f})")
            cells.append(f"{s['peak_rss_mb']['median']:.0f} ({s['peak_rss_mb']['min']:.0f}–"
                         f"{s['peak_rss_mb']['max']:.0f})")
        lines.append(f"| {label} | {engine or '-'} | " + " | ".join(cells) + " |")
    sizes = ", ".join(f"{n} ranks {results[n]['store_mb']:.0f} MB" for n in ranks)
    return "\n".join(lines) + f"\n\nStore size on disk: {sizes}."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=DATA / "bench_sql.json")
    args = parser.parse_args(argv)
    results = bench(args.ranks, args.repeat)
    import duckdb
    import polars

    machine = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="minutes"), "cpus": os.cpu_count(),
               "python": platform.python_version(), "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
               "duckdb": duckdb.__version__, "polars": polars.__version__,
               "uptime_after": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": machine, "results": results}, indent=1))
    print(f"{machine['date']}, {machine['cpus']} CPUs, {machine['memory_gb']} GB, Python {machine['python']}, "
          f"DuckDB {machine['duckdb']}, polars {machine['polars']}; uptime at the end: {machine['uptime_after']}")
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
