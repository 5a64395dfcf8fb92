"""Benchmark: cutting a large trace to windows (``analyze --step/--window/--nvtx``), on a synthetic table.

A table of N timed rows (half kernels on one GPU, half API calls, random
starts over 10 s, durations 1-200 us) and S ``ProfilerStep#N`` host
annotations covering it; times (best of ``--repeat``, in this process, after
the table is built and conformed): cutting to all steps, to one step, and the
per-step table. Usage::

    python benchmarks/bench_window.py [--rows 2000000] [--steps 100] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    """Build the table, time the three operations, print one line each."""
    import numpy as np
    import polars as pl

    from traceparse import window
    from traceparse.trace import Trace, TraceMeta

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    span = 10**10
    events = pl.DataFrame({
        "kind": np.where(rng.random(args.rows) < 0.5, "kernel", "api"), "name": "k",
        "start_ns": np.sort(rng.integers(0, span, args.rows)), "duration_ns": rng.integers(1000, 200_000, args.rows),
    }).with_columns(device_id=pl.when(pl.col("kind") == "kernel").then(0))
    step = span // args.steps
    steps = pl.DataFrame({"kind": "marker", "name": [f"ProfilerStep#{i}" for i in range(args.steps)],
                          "start_ns": np.arange(args.steps) * step, "duration_ns": np.full(args.steps, step - 1000),
                          "pid": np.ones(args.steps, dtype=np.int64)})
    trace = Trace(pl.concat([events, steps], how="diagonal_relaxed"), TraceMeta(id="bench"))
    _ = trace.events

    def best(fn) -> float:
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    print(f"{args.rows:,} rows, {args.steps} steps")
    print(f"cut to all steps   {best(lambda: window.cut(trace, window.step_windows(trace), 'all').events):.2f} s")
    print(f"cut to one step    {best(lambda: window.cut(trace, window.step_windows(trace, 5), 's').events):.2f} s")
    print(f"per-step table     {best(lambda: window.step_table(trace)):.2f} s")


if __name__ == "__main__":
    main()
