"""Benchmark: traceparse ingest and analyze side by side with HolisticTraceAnalysis, on one trace, a rank set and large sizes.

Every measurement is a fresh process tree (the command, its worker processes, HTA's fork pool), sampled
every 20 ms with psutil: wall time, peak of the *summed* resident memory of the tree (shared pages of forked
workers count once per process, for both tools alike), and the CPU seconds the tree used. The machine's load
average is recorded before each run: on a shared box the wall times move with it, and alternating the tools
(traceparse, HTA, traceparse, HTA, ...) makes the ratio fair under the same load. Each traceparse run gets a
fresh store, so the content-hash cache never answers instead of the parser. Usage::

    python benchmarks/bench_ingest.py TRACE.json --hta-python /path/to/hta-venv/bin/python \\
        [--traceinsight-python /path/to/traceinsight-venv/bin/python] [--repeat 3] [--ranks 8 --rank-repeat 3] \\
        [--sizes-gb 1 7 --size-repeat 1] [--workers 0 1 2 4 8 16 --workers-repeat 3] [--perfetto-shell PATH] \\
        [--out FILE]

    # the decoding-worker scaling alone (no HTA needed), e.g. on the 16-core GPU machine:
    python benchmarks/bench_ingest.py TRACE.json --repeat 0 --ranks 0 --workers 1 2 4 8 16

Sections (each can be left out: ``--repeat 0``, ``--ranks 0``, no ``--sizes-gb``, no ``--workers``):

1. *one trace*: ``traceparse ingest TRACE`` (default decoding: worker processes on 4 cores or more),
   ``traceparse analyze`` with every rule on the stored trace, HTA 0.5's ``TraceAnalysis(trace_dir=...)`` on a
   directory holding only TRACE, and the same with ``traceinsight`` (HTA's new name: it installs the same
   ``hta`` module); Perfetto's ``trace_processor_shell`` when ``--perfetto-shell`` names one (the ``perfetto``
   PyPI package downloads it on first use, which a machine without the network cannot: then the table says so);
2. *rank set*: N ranks made from TRACE (copies, each with its own ``distributedInfo.rank``; kept in
   benchmarks/data/) ingested as one run, against HTA's ``TraceAnalysis`` on the same directory;
3. *sizes*: traces of about 1 and 7 GB synthesized from TRACE (its events repeated, shifted in time; kept in
   benchmarks/data/), each ingested: throughput in MB/s and peak memory, to show that memory stays flat;
4. *workers*: ``traceparse ingest TRACE`` with each ``--workers`` count of decoding worker processes
   (``TRACEPARSE_DECODE_WORKERS``; 0 decodes in the ingesting process), alternating: the scaling table.

Every row gives MB/s (the trace's JSON bytes over the median wall time). The traceparse sources are compiled
to bytecode first, as an installed package's are, so that no run pays for it.

The table printed at the end is what the README's Performance section quotes.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gzip
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

PERFETTO_NOT_RUN = ("not run: the `perfetto` PyPI package (0.59.1, a pure-Python wheel) downloads "
                    "trace_processor_shell on first use, which this machine cannot, and no wheel on the registry "
                    "carries the binary; its own published figure: 177 MB/s (453.8 MB of Chrome JSON in 2.56 s)")
PERFETTO_QUERY = "select count(1) from slice"

HTA_LOAD = """
import logging, sys
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
TraceAnalysis(trace_dir=sys.argv[1])
"""


# -- measuring ---------------------------------------------------------------------------------------------
def measure(cmd: list[str], env: dict | None = None) -> dict:
    """Run ``cmd``: wall seconds, peak summed RSS of its process tree (MB), CPU seconds of the tree, load before."""
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    root = psutil.Process(proc.pid)
    peak, cpu = 0, {}
    while proc.poll() is None:
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            procs = []
        rss = 0
        for p in procs:
            try:
                rss += p.memory_info().rss
                times = p.cpu_times()
                cpu[p.pid] = max(cpu.get(p.pid, 0.0), times.user + times.system)
            except psutil.Error:
                pass
        peak = max(peak, rss)
        time.sleep(0.02)
    elapsed = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {err[-2000:]}")
    return {"seconds": round(elapsed, 3), "peak_rss_mb": round(peak / 2**20, 1), "cpu_s": round(sum(cpu.values()), 2),
            "load": round(load, 2)}


def summarize(runs: list[dict]) -> dict:
    """Median, min and max of each figure over the runs (and the runs themselves)."""
    out: dict = {"runs": runs, "n": len(runs)}
    for key in ("seconds", "peak_rss_mb", "cpu_s", "load"):
        values = [r[key] for r in runs]
        out[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    return out


def traceparse_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "traceparse.cli", *args]


def env_with(**values: str) -> dict:
    env = dict(os.environ)
    env.update(values)
    return env


# -- 1. one trace ------------------------------------------------------------------------------------------
def bench_one(trace: Path, hta_python: str | None, repeat: int, traceinsight_python: str | None = None,
              perfetto_shell: str | None = None) -> dict:
    """Alternate traceparse ingest (default decoding), analyze (every rule), HTA, traceinsight and Perfetto."""
    runs: dict[str, list] = {"ingest": [], "analyze": [], "hta": [], "traceinsight": [], "perfetto": []}
    hta_dir = Path(tempfile.mkdtemp(prefix="hta-one-"))
    os.symlink(trace.resolve(), hta_dir / trace.name)
    try:
        for i in range(repeat):
            store = tempfile.mkdtemp(prefix="tp-bench-")
            try:
                runs["ingest"].append(measure(traceparse_cmd("--store", store, "-q", "ingest", str(trace))))
                runs["analyze"].append(measure(traceparse_cmd("--store", store, "analyze", "--json")))
            finally:
                shutil.rmtree(store, ignore_errors=True)
            if hta_python:
                runs["hta"].append(measure([hta_python, "-c", HTA_LOAD, str(hta_dir)]))
            if traceinsight_python:
                runs["traceinsight"].append(measure([traceinsight_python, "-c", HTA_LOAD, str(hta_dir)]))
            if perfetto_shell:
                runs["perfetto"].append(measure([perfetto_shell, "-Q", PERFETTO_QUERY, str(trace)]))
            print(f"  one trace, round {i + 1}: " + ", ".join(f"{k} {v[-1]['seconds']:.2f} s" for k, v in runs.items()
                                                              if v), file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(hta_dir, ignore_errors=True)
    return {k: summarize(v) for k, v in runs.items() if v}


# -- 2. a rank set -----------------------------------------------------------------------------------------
def rank_dir(trace: Path, n: int) -> Path:
    """``benchmarks/data/ranks{n}_<trace>/rank{r}.json``: N copies of ``trace``, each its own rank (made once).

    Each copy is the trace's bytes with ``"distributedInfo": {"backend": "nccl", "rank": r, "world_size": N}``
    written as its first key (a trace that has a ``distributedInfo`` already is refused). Plain JSON, so
    that neither tool spends the run decompressing; benchmarks/make_ranks.py makes skewed gzip ranks.
    """
    path = DATA / f"ranks{n}_{trace.name.split('.')[0]}"
    if path.is_dir() and len(list(path.glob("rank*.json"))) == n:
        return path
    data = trace.read_bytes() if trace.suffix != ".gz" else gzip.decompress(trace.read_bytes())
    if b'"distributedInfo"' in data[: 1 << 20]:
        raise SystemExit(f"{trace}: already has distributedInfo; make the ranks with benchmarks/make_ranks.py")
    start = data.index(b"{") + 1
    path.mkdir(parents=True, exist_ok=True)
    for rank in range(n):
        info = json.dumps({"backend": "nccl", "rank": rank, "world_size": n}).encode()
        with open(path / f"rank{rank}.json", "wb") as f:
            f.write(data[:start] + b'\n  "distributedInfo": ' + info + b",")
            f.write(memoryview(data)[start:])
    return path


def bench_ranks(trace: Path, n: int, hta_python: str | None, repeat: int) -> dict:
    """Alternate ``traceparse ingest DIR`` (a run of N ranks) and HTA's ``TraceAnalysis(trace_dir=DIR)``."""
    directory = rank_dir(trace, n)
    runs: dict[str, list] = {"ingest": [], "hta": []}
    for i in range(repeat):
        store = tempfile.mkdtemp(prefix="tp-ranks-")
        try:
            runs["ingest"].append(measure(traceparse_cmd("--store", store, "-q", "ingest", str(directory))))
        finally:
            shutil.rmtree(store, ignore_errors=True)
        if hta_python:
            runs["hta"].append(measure([hta_python, "-c", HTA_LOAD, str(directory)]))
        print(f"  {n} ranks, round {i + 1}: " + ", ".join(f"{k} {v[-1]['seconds']:.2f} s" for k, v in runs.items()
                                                          if v), file=sys.stderr, flush=True)
    out = {k: summarize(v) for k, v in runs.items() if v}
    out["ranks"] = n
    out["input_mb"] = round(sum(p.stat().st_size for p in directory.glob("rank*.json")) / 2**20, 1)
    return out


# -- 3. sizes ----------------------------------------------------------------------------------------------
def synthesize(source: Path, target: Path, gigabytes: float) -> int:
    """Write a trace of about ``gigabytes`` GiB: ``source``'s header, then its ``traceEvents`` repeated, each copy
    after the one before, as one longer run of the same job.

    Copy k has its times moved by k spans of the source (plus a millisecond), its ids that link events
    (``correlation``, ``External id``, a flow's ``id``) moved by k × 10^9 and its steps renumbered
    (``ProfilerStep#N`` → N + k × 10^6): without that the copies' kernels would link to every copy's launch, their
    steps would be one, and the analysis of the copy would not be an analysis of a longer trace (an earlier
    version repeated the events as they were). Returns the number of events written.
    """
    import re

    data = source.read_bytes() if source.suffix != ".gz" else gzip.decompress(source.read_bytes())
    start = data.index(b"[", data.index(b'"traceEvents"')) + 1
    end = data.rindex(b"]")
    events = memoryview(data)[start:end].tobytes().rstrip()
    parsed = json.loads(b"[" + events + b"]")
    count = len(parsed)
    times = [e["ts"] for e in parsed if isinstance(e.get("ts"), (int, float))]
    ends = [e["ts"] + e.get("dur", 0) for e in parsed if isinstance(e.get("ts"), (int, float))]
    del parsed
    span_us = int(max(ends) - min(times)) + 1000
    copies = max(1, int(gigabytes * 2**30 // len(events)))
    field = re.compile(rb'("ts": ?|"correlation": ?|"External id": ?|"id": ?|ProfilerStep#)(\d+)')

    def copy(k: int) -> bytes:
        if k == 0:
            return events
        moves = {b"ts": k * span_us, b"ProfilerStep#": k * 10**6}

        def moved(m):
            key = m.group(1).split(b'"')[1] if m.group(1).startswith(b'"') else m.group(1)
            return m.group(1) + str(int(m.group(2)) + moves.get(key, k * 10**9)).encode()

        return field.sub(moved, events)

    tmp = target.with_suffix(".part")
    with open(tmp, "wb") as out:
        out.write(data[:start])
        for i in range(copies):
            out.write(copy(i) if i == 0 else b",\n" + copy(i))
        out.write(data[end:])
    os.replace(tmp, target)
    return count * copies


def bench_workers(trace: Path, workers: list[int], repeat: int) -> dict:
    """``traceparse ingest TRACE`` with each count of decoding worker processes, alternating, a fresh store each."""
    runs: dict[int, list] = {n: [] for n in workers}
    for i in range(repeat):
        for n in workers:
            store = tempfile.mkdtemp(prefix="tp-workers-")
            try:
                runs[n].append(measure(traceparse_cmd("--store", store, "-q", "ingest", str(trace)),
                                       env_with(TRACEPARSE_DECODE_WORKERS=str(n))))
            finally:
                shutil.rmtree(store, ignore_errors=True)
        print(f"  workers, round {i + 1}: " + ", ".join(f"{n}: {v[-1]['seconds']:.2f} s" for n, v in runs.items()),
              file=sys.stderr, flush=True)
    return {str(n): summarize(v) for n, v in runs.items()}


def bench_sizes(trace: Path, sizes: list[float], repeat: int) -> list[dict]:
    """Ingest traces of each size (synthesized once into benchmarks/data/): MB/s and peak memory."""
    out = []
    for gb in sizes:
        big = DATA / f"synth_{gb:g}gb_{trace.name.split('.')[0]}.json"
        if not big.is_file():
            t0 = time.perf_counter()
            n = synthesize(trace, big, gb)
            print(f"  synthesized {big.name}: {n} events in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        runs, base = [], []
        for i in range(repeat):
            for target, into in ((trace, base), (big, runs)):  # the trace itself just before: the same load
                store = tempfile.mkdtemp(prefix="tp-size-", dir=DATA)
                try:
                    into.append(measure(traceparse_cmd("--store", store, "-q", "ingest", str(target))))
                finally:
                    shutil.rmtree(store, ignore_errors=True)
            print(f"  {gb:g} GB, round {i + 1}: {runs[-1]['seconds']:.1f} s, {runs[-1]['peak_rss_mb']:.0f} MB; "
                  f"the trace just before: {base[-1]['seconds']:.1f} s", file=sys.stderr, flush=True)
        size_mb = big.stat().st_size / 2**20
        result = summarize(runs)
        base_mb_per_s = _json_bytes(trace) / 2**20 / statistics.median(r["seconds"] for r in base)
        result.update(file=big.name, size_mb=round(size_mb, 1),
                      mb_per_s=round(size_mb / result["seconds"]["median"], 1), base=summarize(base),
                      base_mb_per_s=round(base_mb_per_s, 1))
        out.append(result)
    return out


def _json_bytes(trace: Path) -> int:
    if trace.suffix != ".gz":
        return trace.stat().st_size
    with gzip.open(trace, "rb") as f:
        return sum(len(b) for b in iter(lambda: f.read(1 << 24), b""))


# -- report ------------------------------------------------------------------------------------------------
def machine() -> dict:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "cpus": os.cpu_count(),
            "cpu": cpu, "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(), "platform": platform.platform()}


def _cell(s: dict | None, key: str, fmt: str) -> str:
    if not s:
        return "-"
    v = s[key]
    return f"{fmt.format(v['median'])} ({fmt.format(v['min'])}–{fmt.format(v['max'])})"


def _mb_per_s(mb: float, s: dict) -> str:
    return f"{mb / s['seconds']['median']:.1f}"


def report(results: dict) -> str:
    """The Markdown tables of the results (median, then min–max over the runs), MB/s beside each row."""
    lines = []
    one = results.get("one_trace")
    mb = results.get("trace_mb", 0.0)
    if one:
        lines += [f"One trace: {results['trace']} ({mb:.0f} MB)", "",
                  "| | runs | wall s | MB/s | peak RSS MB (tree) | CPU s (tree) | load avg |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        names = {"hta": "HTA 0.5 `TraceAnalysis` load", "traceinsight": "traceinsight `TraceAnalysis` load",
                 "perfetto": "Perfetto `trace_processor_shell`", "ingest": "`traceparse ingest` (default)",
                 "analyze": "`traceparse analyze`, every rule, stored trace"}
        for key, label in names.items():
            if key in one:
                s = one[key]
                rate = "-" if key == "analyze" else _mb_per_s(mb, s)
                lines.append(f"| {label} | {s['n']} | {_cell(s, 'seconds', '{:.2f}')} | {rate} | "
                             f"{_cell(s, 'peak_rss_mb', '{:.0f}')} | {_cell(s, 'cpu_s', '{:.1f}')} | "
                             f"{_cell(s, 'load', '{:.1f}')} |")
        if "perfetto" not in one:
            lines.append(f"| Perfetto `trace_processor_shell` | 0 | - | - | - | - | - |\n\nPerfetto: {PERFETTO_NOT_RUN}.")
        for peer in ("hta", "traceinsight"):
            if peer in one and "ingest" in one:
                ratio = one[peer]["seconds"]["median"] / one["ingest"]["seconds"]["median"]
                memory = one["ingest"]["peak_rss_mb"]["median"] / one[peer]["peak_rss_mb"]["median"]
                lines.append(f"\n`traceparse ingest`: {ratio:.1f}× faster than {names[peer].split(' `')[0]} "
                             f"(median wall; {_mb_per_s(mb, one['ingest'])} MB/s against "
                             f"{_mb_per_s(mb, one[peer])} MB/s), peak memory {memory:.2f}× its")
        lines.append("")
    ranks = results.get("ranks")
    if ranks:
        lines += [f"Rank set: {ranks['ranks']} ranks made from the trace ({ranks['input_mb']:.0f} MB of JSON)", "",
                  "| | runs | wall s | MB/s | peak RSS MB (tree) | CPU s (tree) | load avg |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for key, label in (("hta", "HTA `TraceAnalysis(trace_dir=...)`"), ("ingest", "`traceparse ingest DIR`")):
            if key in ranks:
                s = ranks[key]
                lines.append(f"| {label} | {s['n']} | {_cell(s, 'seconds', '{:.1f}')} | "
                             f"{_mb_per_s(ranks['input_mb'], s)} | {_cell(s, 'peak_rss_mb', '{:.0f}')} | "
                             f"{_cell(s, 'cpu_s', '{:.1f}')} | {_cell(s, 'load', '{:.1f}')} |")
        if "hta" in ranks:
            ratio = ranks["hta"]["seconds"]["median"] / ranks["ingest"]["seconds"]["median"]
            mem = ranks["ingest"]["peak_rss_mb"]["median"] / ranks["hta"]["peak_rss_mb"]["median"]
            lines.append(f"\n{ranks['ranks']} ranks: {ratio:.1f}× faster than HTA "
                         f"({_mb_per_s(ranks['input_mb'], ranks['ingest'])} MB/s against "
                         f"{_mb_per_s(ranks['input_mb'], ranks['hta'])} MB/s), peak memory {mem:.2f}× HTA's")
        lines.append("")
    sizes = results.get("sizes")
    if sizes:
        lines += ["Sizes (`traceparse ingest`, one file; each size right after the trace itself, same load)", "",
                  "| file | MB | runs | wall s | MB/s | MB/s of the trace just before | peak RSS MB (tree) | "
                  "the trace's peak RSS MB | load avg |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for s in sizes:
            lines.append(f"| {s['file']} | {s['size_mb']:.0f} | {s['n']} | {_cell(s, 'seconds', '{:.1f}')} | "
                         f"{s['mb_per_s']:.1f} | {s['base_mb_per_s']:.1f} | {_cell(s, 'peak_rss_mb', '{:.0f}')} | "
                         f"{_cell(s['base'], 'peak_rss_mb', '{:.0f}')} | {_cell(s, 'load', '{:.1f}')} |")
    workers = results.get("workers")
    if workers:
        lines += ["", f"Decoding workers (`TRACEPARSE_DECODE_WORKERS`; 0: the ingesting process decodes), "
                      f"{results['machine']['cpus']} CPUs", "",
                  "| workers | runs | wall s | MB/s | peak RSS MB (tree) | CPU s (tree) | load avg |",
                  "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for n, s in workers.items():
            lines.append(f"| {n} | {s['n']} | {_cell(s, 'seconds', '{:.2f}')} | {_mb_per_s(mb, s)} | "
                         f"{_cell(s, 'peak_rss_mb', '{:.0f}')} | {_cell(s, 'cpu_s', '{:.1f}')} | "
                         f"{_cell(s, 'load', '{:.1f}')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path, help="the benchmark trace (fixtures/make_benchmark_trace.py)")
    parser.add_argument("--hta-python", help="python of a venv with HolisticTraceAnalysis installed")
    parser.add_argument("--traceinsight-python", help="python of a venv with traceinsight (HTA's new name) installed")
    parser.add_argument("--perfetto-shell", help="a trace_processor_shell binary (not run without one)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds on the one trace (0: leave out)")
    parser.add_argument("--workers", type=int, nargs="*", default=[],
                        help="decoding-worker counts to ingest the trace with, alternating (the scaling table)")
    parser.add_argument("--workers-repeat", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=8, help="ranks in the rank set (0: leave out)")
    parser.add_argument("--rank-repeat", type=int, default=3)
    parser.add_argument("--sizes-gb", type=float, nargs="*", default=[], help="synthesized sizes to ingest, GiB")
    parser.add_argument("--size-repeat", type=int, default=1)
    parser.add_argument("--out", type=Path, default=DATA / "bench_ingest.json", help="results as JSON")
    args = parser.parse_args(argv)
    DATA.mkdir(parents=True, exist_ok=True)
    results: dict = {"machine": machine(), "trace": str(args.trace), "trace_mb": _json_bytes(args.trace) / 2**20,
                     "load_at_start": os.getloadavg()}
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(HERE.parent / "traceparse"),
                    str(HERE.parent / "plugins")], stdout=subprocess.DEVNULL, check=False)
    if args.repeat:
        results["one_trace"] = bench_one(args.trace, args.hta_python, args.repeat, args.traceinsight_python,
                                         args.perfetto_shell)
    if args.ranks:
        results["ranks"] = bench_ranks(args.trace, args.ranks, args.hta_python, args.rank_repeat)
    if args.sizes_gb:
        results["sizes"] = bench_sizes(args.trace, args.sizes_gb, args.size_repeat)
    if args.workers:
        results["workers"] = bench_workers(args.trace, args.workers, args.workers_repeat)
    results["load_at_end"] = os.getloadavg()
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    m = results["machine"]
    print(f"{m['date']}: {m['cpus']} CPUs ({m['cpu']}), {m['memory_gb']} GiB, Python {m['python']}; "
          f"load average {results['load_at_start'][0]:.1f} at the start, {results['load_at_end'][0]:.1f} at the end")
    print(report(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
