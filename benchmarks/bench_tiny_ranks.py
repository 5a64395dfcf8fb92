"""Benchmark: a run of many tiny ranks (issue 22 item 7): N rank files of one kernel each, ingested and analyzed.

Each rank file is a minimal Kineto trace (``distributedInfo`` rank and world size, one device, a
``ProfilerStep#1`` annotation, a ``cudaLaunchKernel`` and its kernel, an NCCL all-reduce kernel), so the work is
per rank, not per event. ``traceparse ingest DIR`` and ``traceparse analyze --json`` each run in a fresh
process (the default workers: a run of many ranks is read by worker processes),
timed with ``time.perf_counter``; the figure is the median of ``--repeat`` runs. Usage::

    python benchmarks/bench_tiny_ranks.py [--ranks 1000] [--repeat 3]

The time should grow with the events (a few per rank), not with ranks × a fixed cost: compare 100 and 1,000.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from bench_ranks import measure


def rank_doc(rank: int, world: int) -> dict:
    base = 1_000_000.0 + rank * 0.5  # µs; a small skew per rank
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": base, "dur": 100},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": base + 1, "dur": 5,
         "args": {"correlation": 7, "External id": 3}},
        {"ph": "X", "cat": "kernel", "name": "void gemm_kernel<float>(float*)", "pid": 0, "tid": 7,
         "ts": base + 10, "dur": 20 + rank % 7, "args": {"device": 0, "stream": 7, "correlation": 7,
                                                         "grid": [128, 1, 1], "block": [256, 1, 1]}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, "
         "ncclWork*)", "pid": 0, "tid": 8, "ts": base + 40, "dur": 30, "args": {"device": 0, "stream": 8}},
    ]
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100", "numSms": 132,
                                                      "totalGlobalMem": 85_000_000_000, "computeMajor": 9,
                                                      "computeMinor": 0}],
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world}, "traceEvents": events}


def make(directory: Path, ranks: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for r in range(ranks):
        (directory / f"rank{r}.json").write_text(json.dumps(rank_doc(r, ranks)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for n in args.ranks:
        with tempfile.TemporaryDirectory() as tmp:
            run = Path(tmp) / f"tiny{n}"
            make(run, n)
            ingest, analyze = [], []
            for _ in range(args.repeat):  # alternating, each with a fresh store
                store = Path(tmp) / f"store{len(ingest)}"
                cli = [sys.executable, "-m", "traceparse", "--store", str(store)]
                ingest.append(measure([*cli, "ingest", "-q", str(run)]))
                analyze.append(measure([*cli, "analyze", "--json", "-q"]))
            print(f"{n:>6} ranks: ingest {_median(ingest)}, analyze {_median(analyze)}", flush=True)


def _median(runs: list[dict]) -> str:
    """Median wall time with its spread, the median CPU time, the largest peak RSS of the process tree, and the
    load averages the runs started at."""
    seconds = [r["seconds"] for r in runs]
    cpu = [r["cpu_seconds"] for r in runs]
    return (f"{statistics.median(seconds):6.2f} s ({min(seconds):.2f}–{max(seconds):.2f}), "
            f"CPU {statistics.median(cpu):.2f} s ({min(cpu):.2f}–{max(cpu):.2f}), "
            f"peak {max(r['peak_rss_mb'] for r in runs):.0f} MB, load {'/'.join(str(r['load_1min']) for r in runs)}")

if __name__ == "__main__":
    main()
