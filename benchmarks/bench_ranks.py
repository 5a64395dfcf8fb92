"""Benchmark: ingest + analyze runs of 8, 64 and 256 ranks; HolisticTraceAnalysis on the same 8 ranks.

Every measurement is a fresh process tree (``traceparse ingest DIR`` with its
worker processes; ``traceparse analyze RUN``; HTA's ``TraceAnalysis(trace_dir=...)``
with its own multiprocessing), sampled every 20 ms with psutil: wall time and
the peak of the *sum* of the resident memory of the process and all its
children (so a process pool's workers count). Runs alternate (traceparse
ingest, analyze, HTA, then again), each with a fresh store; the table gives
the median of ``--repeat`` runs and their spread (min–max). Usage::

    python benchmarks/bench_ranks.py [--ranks 8 64 256] [--repeat 3] [--hta-python PATH] [--out FILE]

The rank directories are ``benchmarks/data/ranks_N`` (made with
benchmarks/make_ranks.py from the shared 4-rank gloo sample if missing).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
BASE = HERE.parents[1] / "shared" / "samples" / "multirank" / "gloo4_resnet18_bs16" / "rank0.json.gz"

HTA_LOAD = """
import logging, sys
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
TraceAnalysis(trace_dir=sys.argv[1])
"""


def tree_rss(proc: psutil.Process) -> int:
    """Resident bytes of ``proc`` and all its descendants now."""
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


def measure(cmd: list[str], env: dict | None = None) -> dict:
    """Run ``cmd``; its wall time, its CPU time (user + system, of the process and the descendants it waited
    for), the peak summed RSS of its process tree (sampled every 20 ms), and the machine's 1-minute load
    average before it started (the box is shared: other work slows a run down)."""
    import resource

    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    ps = psutil.Process(proc.pid)
    peak = 0
    while proc.poll() is None:
        try:
            peak = max(peak, tree_rss(ps))
        except psutil.NoSuchProcess:
            break
        time.sleep(0.02)
    elapsed = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the process and the descendants it waited for
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    err = proc.stderr.read().decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {err[-2000:]}")
    return {"seconds": elapsed, "cpu_seconds": round(cpu, 2), "peak_rss_mb": peak / 2**20, "load_1min": round(load, 2)}


def summarize(runs: list[dict]) -> dict:
    out = {"runs": runs, "load_1min": [r.get("load_1min") for r in runs]}
    for key in ("seconds", "peak_rss_mb"):
        values = [r[key] for r in runs]
        out[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    return out


def rank_dir(n: int) -> Path:
    """``benchmarks/data/ranks_N``, made from the shared sample when missing."""
    path = DATA / f"ranks_{n}"
    if not (path.is_dir() and len(list(path.glob("rank*.json.gz"))) == n):
        subprocess.run([sys.executable, str(HERE / "make_ranks.py"), str(BASE), str(path), "--ranks", str(n),
                        "--slow-rank", "5"], check=True)
    return path


def bench(ranks: list[int], repeat: int, hta_python: str | None) -> dict:
    traceparse = [sys.executable, "-m", "traceparse.cli"]
    results: dict = {}
    for n in ranks:
        directory = rank_dir(n)
        runs: dict[str, list] = {"ingest": [], "analyze": [], "hta_load": []}
        for _ in range(repeat):
            store = tempfile.mkdtemp(prefix="bench-ranks-")
            try:
                runs["ingest"].append(measure([*traceparse, "--store", store, "-q", "ingest", str(directory)]))
                runs["analyze"].append(measure([*traceparse, "--store", store, "analyze", "--json", directory.name]))
            finally:
                shutil.rmtree(store, ignore_errors=True)
            if hta_python and n == min(ranks):
                runs["hta_load"].append(measure([hta_python, "-c", HTA_LOAD, str(directory)]))
        results[n] = {k: summarize(v) for k, v in runs.items() if v}
        results[n]["input_mb"] = sum(p.stat().st_size for p in directory.glob("*")) / 2**20
        print(f"{n} ranks: " + ", ".join(f"{k} {v['seconds']['median']:.2f} s {v['peak_rss_mb']['median']:.0f} MB "
                                         f"(load {v['load_1min']})"
                                         for k, v in results[n].items() if isinstance(v, dict)), file=sys.stderr)
    return results


def table(results: dict) -> str:
    def cell(s: dict | None, key: str, fmt: str) -> str:
        if not s:
            return "-"
        v = s[key]
        return f"{fmt.format(v['median'])} ({fmt.format(v['min'])}–{fmt.format(v['max'])})"

    lines = ["| ranks | input (gz) | ingest wall s | ingest peak RSS MB | analyze wall s | analyze peak RSS MB |"
             " HTA TraceAnalysis wall s | HTA peak RSS MB |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for n, r in results.items():
        lines.append(f"| {n} | {r['input_mb']:.0f} MB | {cell(r.get('ingest'), 'seconds', '{:.2f}')} | "
                     f"{cell(r.get('ingest'), 'peak_rss_mb', '{:.0f}')} | {cell(r.get('analyze'), 'seconds', '{:.2f}')} | "
                     f"{cell(r.get('analyze'), 'peak_rss_mb', '{:.0f}')} | {cell(r.get('hta_load'), 'seconds', '{:.2f}')} | "
                     f"{cell(r.get('hta_load'), 'peak_rss_mb', '{:.0f}')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--hta-python", help="python of a venv with HolisticTraceAnalysis installed")
    parser.add_argument("--out", type=Path, default=DATA / "bench_ranks.json")
    args = parser.parse_args(argv)
    results = bench(args.ranks, args.repeat, args.hta_python)
    machine = {"date": _dt.date.today().isoformat(), "cpus": os.cpu_count(), "python": platform.python_version(),
               "memory_gb": round(psutil.virtual_memory().total / 2**30, 1), "platform": platform.platform(),
               "uptime_after": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": machine, "results": results}, indent=1))
    print(f"{machine['date']}, {machine['cpus']} CPUs, {machine['memory_gb']} GB, Python {machine['python']}; "
          f"uptime at the end: {machine['uptime_after']}")
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
