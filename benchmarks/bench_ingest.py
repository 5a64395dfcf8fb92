"""Benchmark: ingest and analyze a large torch.profiler trace, side by side with HolisticTraceAnalysis.

Each measurement runs in a fresh Python process that reports its own wall
time and peak resident memory (ru_maxrss), imports included, so the figures
are what a user waits for. Usage::

    python benchmarks/bench_ingest.py TRACE.json[.gz] [--hta-python PATH] [--repeat 3]
    python benchmarks/bench_ingest.py --synthesize-gb 7 --from TRACE.json.gz   # larger-than-RAM/4 check

``--hta-python`` is the interpreter of a virtual environment with the PyPI
package HolisticTraceAnalysis installed (kept apart: it pins its own
dependency versions). Results are printed as a table and written as JSON
next to the trace (``--out``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MEASURE = r"""
import json, resource, sys, time
t0 = time.perf_counter()
{body}
elapsed = time.perf_counter() - t0
print(json.dumps({{"seconds": elapsed, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))
"""

TRACEPARSE_INGEST = """
from traceparse.cli import main
assert main(["--store", {store!r}, "-q", "ingest", {trace!r}]) == 0
"""

TRACEPARSE_ANALYZE = """
import contextlib, io
from traceparse.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    main(["--store", {store!r}, "analyze", "--json", "--rule", "low-memcpy-overlap",
          "--rule", "low-kernel-concurrency", "--rule", "kernel-share"])
"""

HTA_LOAD = """
import logging
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
TraceAnalysis(trace_dir={trace_dir!r})
"""


def measure(python: str, body: str) -> dict:
    """Run ``body`` in a fresh interpreter and return its wall time and peak RSS."""
    out = subprocess.run([python, "-c", MEASURE.format(body=body)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "failed")
    return json.loads(out.stdout.strip().splitlines()[-1])


def summarize(runs: list[dict]) -> dict:
    return {"seconds": statistics.median(r["seconds"] for r in runs),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in runs), "runs": len(runs)}


def bench(trace: Path, hta_python: str | None, repeat: int) -> dict:
    results: dict = {"trace": str(trace), "size_mb": trace.stat().st_size / 2**20}
    ingest_runs, analyze_runs = [], []
    for _ in range(repeat):
        store = tempfile.mkdtemp(prefix="tp-bench-")
        try:
            ingest_runs.append(measure(sys.executable, TRACEPARSE_INGEST.format(store=store, trace=str(trace))))
            analyze_runs.append(measure(sys.executable, TRACEPARSE_ANALYZE.format(store=store)))
        finally:
            shutil.rmtree(store, ignore_errors=True)
    results["traceparse_ingest"] = summarize(ingest_runs)
    results["traceparse_analyze"] = summarize(analyze_runs)
    if hta_python:
        trace_dir = tempfile.mkdtemp(prefix="hta-bench-")
        try:
            os.symlink(trace.resolve(), Path(trace_dir) / trace.name)
            results["hta_load"] = summarize([measure(hta_python, HTA_LOAD.format(trace_dir=trace_dir))
                                             for _ in range(repeat)])
        finally:
            shutil.rmtree(trace_dir, ignore_errors=True)
    return results


def synthesize(source: Path, target: Path, gigabytes: float) -> int:
    """Write a trace of about ``gigabytes`` by repeating ``source``'s events shifted in time; returns event count."""
    opener = gzip.open if source.suffix == ".gz" else open
    with opener(source, "rt") as f:
        doc = json.load(f)
    events = doc.pop("traceEvents")
    span = max(e.get("ts", 0) + e.get("dur", 0) for e in events if isinstance(e.get("ts"), (int, float)))
    base = min(e["ts"] for e in events if isinstance(e.get("ts"), (int, float)))
    period = (span - base) * 1.01
    limit = gigabytes * 2**30
    written, count, copy = 0, 0, 0
    with open(target, "w") as out:
        header = json.dumps(doc)[:-1]
        out.write(header + ', "traceEvents": [\n')
        first = True
        while written < limit:
            shift = copy * period
            for e in events:
                if isinstance(e.get("ts"), (int, float)):
                    e = dict(e, ts=round(e["ts"] + shift, 3))
                line = ("" if first else ",\n") + json.dumps(e)
                first = False
                out.write(line)
                written += len(line)
                count += 1
            copy += 1
        out.write("\n]}\n")
    return count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", type=Path)
    parser.add_argument("--hta-python", help="python of a venv with HolisticTraceAnalysis installed")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--synthesize-gb", type=float, help="build a trace this large from --from and ingest it once")
    parser.add_argument("--from", dest="source", type=Path, help="source trace for --synthesize-gb")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()

    if args.synthesize_gb:
        work = Path(tempfile.mkdtemp(prefix="tp-big-"))
        try:
            big = work / "big.json"
            n = synthesize(args.source, big, args.synthesize_gb)
            store = work / "store"
            r = measure(sys.executable, TRACEPARSE_INGEST.format(store=str(store), trace=str(big)))
            results = {"synthetic_gb": big.stat().st_size / 2**30, "events_in_file": n, "ingest": r}
        finally:
            shutil.rmtree(work, ignore_errors=True)
    else:
        results = bench(args.trace, args.hta_python, args.repeat)
    print(json.dumps(results, indent=2))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
