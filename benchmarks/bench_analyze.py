"""Benchmark: where ``traceparse analyze`` spends its time on one stored trace or run (issue 25 item 4).

Three views, each of a fresh process:

- ``--repeat N``: ``traceparse analyze REF`` (every rule) N times: wall time, CPU seconds (user + sys, from
  ``wait4``), peak RSS, the 1-minute load average just before; median and min–max.
- ``--rule-threads 1 2``: the same with ``analyze --threads N`` for each N, alternating round after round.
- ``--per-rule``: the same, ``--rule NAME`` one rule at a time (each run pays the fixed costs once).
- ``--phases``: one in-process run, timed phase by phase with ``time.process_time``: imports, plugin loading,
  loading the stored table, each rule alone in the order ``analyze`` starts them, the summary, rendering, keeping the
  findings. ``POLARS_MAX_THREADS=1`` (unless ``--threads``) so that CPU time is where the work is.
  ``--profile FILE`` writes a cProfile of that run.

Usage::

    TRACEPARSE_STORE=DIR python benchmarks/bench_analyze.py [REF] [--repeat 3] [--per-rule] [--phases]

``REF`` is a trace or run id (default: the last ingested). Python's bytecode cache matters here: with
``PYTHONDONTWRITEBYTECODE`` set and no ``__pycache__`` (an editable install never compiled), every run
compiles traceparse's modules again (≈0.5 CPU s); ``python -m compileall -q traceparse plugins`` first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

PHASES = r"""
import json, os, sys, time
marks, last = [], [time.process_time(), time.perf_counter()]
def mark(name):
    c, w = time.process_time(), time.perf_counter()
    marks.append((name, c - last[0], w - last[1])); last[:] = [c, w]
import polars
mark("import polars")
from traceparse.analysis import analyze, findings_frame
from traceparse.report import render_findings
from traceparse.session import Session
from traceparse.summary import summarize
mark("import traceparse")
session = Session(quiet=True)
session.registry.rules
mark("load plugins")
ref = sys.argv[1] if len(sys.argv) > 1 else None
trace = session.resolve_all([ref] if ref else [], group=True, lazy_runs=True)[0]
mark("load the stored trace")
now = ["analyze: setup"]
def on_rule(name):
    mark(now[0]); now[0] = name
try:
    from traceparse.measures.base import sharing  # the rules and the summary share what they measure
except ImportError:  # traceparse before issue 25
    from contextlib import nullcontext as sharing
with sharing():
    found = analyze(trace, reg=session.registry, on_rule=on_rule, threads=1)  # one rule at a time: its own phase
    mark(now[0])
    summary = summarize(trace, found)
    mark("summary")
render_findings(session.out, found, {trace.id: trace.meta}, {trace.id: summary})
mark("render")
session.store.save_findings(trace.id, findings_frame(found))
mark("keep the findings")
print(json.dumps(marks), file=sys.stderr)
"""


def run(cmd: list[str], env: dict | None = None) -> dict:
    """Run ``cmd`` (output discarded); its wall time, CPU seconds and peak RSS (``wait4``), and the load before."""
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {err.decode(errors='replace')[-2000:]}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "rss_mb": usage.ru_maxrss / 1024,
            "load": load, "stderr": err.decode(errors="replace")}


def median_line(runs: list[dict]) -> str:
    """Median wall and CPU seconds with their spread, the largest peak RSS and the loads seen."""
    def span(key: str) -> str:
        values = [r[key] for r in runs]
        return f"{statistics.median(values):5.2f} ({min(values):.2f}–{max(values):.2f})"
    loads = [r["load"] for r in runs]
    return (f"wall {span('wall_s')} s, CPU {span('cpu_s')} s, peak {max(r['rss_mb'] for r in runs):,.0f} MB, "
            f"load {min(loads):.1f}–{max(loads):.1f}")


def rule_names() -> list[str]:
    from traceparse.plugins import registry

    return list(registry().rules)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ref", nargs="?", help="trace or run id (default: the last ingested)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--per-rule", action="store_true", help="also each rule alone (--rule NAME)")
    parser.add_argument("--phases", action="store_true", help="also one in-process run timed phase by phase")
    parser.add_argument("--threads", action="store_true", help="--phases with polars' default threads")
    parser.add_argument("--rule-threads", type=int, nargs="+", metavar="N",
                        help="instead of the plain runs: analyze --threads N for each N, alternating, --repeat rounds")
    parser.add_argument("--profile", metavar="FILE", help="with --phases: write a cProfile of that run to FILE")
    args = parser.parse_args(argv)
    ref = [args.ref] if args.ref else []
    cli = [sys.executable, "-m", "traceparse", "-q"]
    if args.rule_threads:  # each count in turn, round after round: the same load for each
        by_count: dict[int, list[dict]] = {n: [] for n in args.rule_threads}
        for _ in range(max(1, args.repeat)):
            for n in args.rule_threads:
                by_count[n].append(run([*cli, "analyze", "--threads", str(n), *ref]))
        for n, runs in by_count.items():
            print(f"analyze --threads {n}: {median_line(runs)}", flush=True)
    elif args.repeat:
        runs = [run([*cli, "analyze", *ref]) for _ in range(args.repeat)]
        print(f"analyze, every rule: {median_line(runs)}", flush=True)
    if args.per_rule:
        for name in rule_names():
            runs = [run([*cli, "analyze", "--rule", name, *ref]) for _ in range(max(1, args.repeat))]
            print(f"  --rule {name:24s} {median_line(runs)}", flush=True)
    if args.phases:
        env = dict(os.environ)
        if not args.threads:
            env["POLARS_MAX_THREADS"] = "1"
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as script:
            script.write(PHASES)
        try:
            profile = ["-m", "cProfile", "-o", args.profile] if args.profile else []
            result = run([sys.executable, *profile, script.name, *ref], env)
        finally:
            os.unlink(script.name)
        marks = json.loads(result["stderr"].strip().splitlines()[-1])
        print(f"phases (one process, POLARS_MAX_THREADS={env.get('POLARS_MAX_THREADS', 'default')}): "
              f"CPU {result['cpu_s']:.2f} s for the process, wall {result['wall_s']:.2f} s, load {result['load']:.1f}")
        for name, cpu, wall in sorted(marks, key=lambda m: -m[1]):
            print(f"  {name:28s} CPU {cpu:6.3f} s  wall {wall:6.3f} s")
        print(f"  {'(sum of the phases)':28s} CPU {sum(m[1] for m in marks):6.3f} s  wall {sum(m[2] for m in marks):6.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
