"""Profile: where one ``traceparse ingest`` of a torch trace spends its CPU, stage by stage (issue 25).

Runs ``traceparse ingest TRACE`` in this process with everything on one thread (decoding threads 0, the
Parquet writer called in place), each stage wrapped in a timer of the process's CPU time (``getrusage``: polars'
and Arrow's own threads count), nested stages subtracted from the stage around them. Usage::

    python benchmarks/profile_ingest.py TRACE.json [--repeat 3]

The first run pays the imports (polars, pyarrow, rich, the plugins) and first calls; the table gives the later
runs' median per stage and, as "start-up", what the first run spent beyond them.

Prints one table (median CPU seconds per stage over the runs, and its share of the whole) and the wall time
of the same single-threaded ingest. The stages are the named functions of the torch reader's fast path
(``plugins/readers/torch_profiler/columnar.py``), of the shared Chrome-JSON decoder and of the core's
validate/conform/store write; "start-up" is the interpreter's imports before the command runs (polars,
pyarrow, rich, the plugins). A fresh store per run: the content-hash cache never answers.

Compile the sources first (``python -m compileall -q traceparse plugins``) where ``PYTHONDONTWRITEBYTECODE``
is set on an editable install, or the start-up counts Python compiling its own modules.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import io
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time

os.environ["TRACEPARSE_DECODE_THREADS"] = "0"  # every stage on this thread: its CPU is its own
os.environ["TRACEPARSE_DECODE_WORKERS"] = "0"


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Timers:
    """CPU seconds per stage label; a stage's time excludes the stages called inside it."""

    def __init__(self):
        self.total: collections.Counter = collections.Counter()
        self.stack: list[float] = []

    def _enter(self) -> float:
        self.stack.append(0.0)
        return cpu()

    def _leave(self, label: str, began: float) -> None:
        spent = cpu() - began
        inner = self.stack.pop()
        self.total[label] += spent - inner
        if self.stack:
            self.stack[-1] += spent

    def wrap(self, label: str, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            began = self._enter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._leave(label, began)
        return timed

    def wrap_iter(self, label: str, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            items = fn(*args, **kwargs)
            while True:
                began = self._enter()
                try:
                    item = next(items)
                except StopIteration:
                    return
                finally:
                    self._leave(label, began)
                yield item
        return timed


def profile_once(trace: str) -> tuple[dict, float]:
    """One ingest of ``trace`` into a fresh store: CPU seconds per stage, and the wall seconds of the command."""
    import traceparse.cli
    import traceparse.ingest as ingest
    import traceparse.plugins as plugins
    import traceparse.store as store
    import traceparse.trace as trace_module
    import traceparse.validate as validate
    import traceparse_plugins.readers.chrome_json.decoder as decoder
    import traceparse_plugins.readers.torch_profiler as torch_reader
    import traceparse_plugins.readers.torch_profiler.columnar as columnar
    import traceparse_plugins.readers.torch_profiler.events as events

    timers = Timers()
    saved = []

    def patch(module, name: str, label: str, iterator: bool = False) -> None:
        original = getattr(module, name, None)
        if original is None:  # a stage this version has not (the profile serves before and after a change)
            return
        saved.append((module, name, original))
        setattr(module, name, (timers.wrap_iter if iterator else timers.wrap)(label, original))

    class InPlace:  # the content hash, which ingest works out in a thread, worked out here: its CPU is its own
        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def submit(self, fn, *args):
            from concurrent.futures import Future

            future = Future()
            future.set_result(fn(*args))
            return future

    saved.append((ingest, "ThreadPoolExecutor", ingest.ThreadPoolExecutor))
    ingest.ThreadPoolExecutor = InPlace
    patch(plugins, "load_registry", "plugins loaded (entry points)")
    patch(ingest, "plan", "sniff (choose the reader)")
    patch(ingest, "sha256_of", "sha256 of the file")
    patch(torch_reader, "map_chunks", "chunk cutting (one copy), file read", iterator=True)
    patch(decoder, "_decode_piece", "careful path (the last chunk)")
    patch(torch_reader, "fast_rows", "fast path: UTF-8 check, glue")
    patch(columnar, "_check", "msgspec check")
    patch(columnar, "_read", "Arrow JSON parse")
    patch(columnar, "_frame", "Arrow -> polars frame")
    patch(columnar, "_rows", "rows: polars queries (kinds, event columns, counters)")
    patch(columnar, "_event_rows", "rows: polars queries (kinds, event columns, counters)")
    patch(columnar, "_comm", "rows: collectives")
    patch(columnar, "_with_collectives", "rows: collectives")
    for module in (columnar, events):
        if hasattr(module, "_raw_text"):
            patch(module, "_raw_text", "rows: raw argument texts")
        if hasattr(module, "compact_json_text"):
            patch(module, "compact_json_text", "rows: raw argument texts")
    patch(validate.Validator, "check", "validate")
    patch(trace_module, "conform", "conform")
    patch(store._Summary, "add", "summary")
    patch(store, "_write_json", "meta.json, fsync, rename")
    patch(store, "_fsync_dir", "meta.json, fsync, rename")
    sink = store._ParquetSink
    saved += [(sink, "put", sink.put), (sink, "__exit__", sink.__exit__)]
    def put(self, batch):  # write in the caller: the writer thread's CPU counted as its own stage
        table = batch.to_arrow()
        if getattr(self, "_writer", None) is None:
            self._writer = store.parquet_writer(self.path, table.schema)
        self._writer.write_table(table, row_group_size=256 * 1024)

    def leave(self, *exc):
        if getattr(self, "_writer", None) is not None:
            self._writer.close()

    sink.put, sink.__exit__ = timers.wrap("Parquet write", put), timers.wrap("Parquet write", leave)
    root = tempfile.mkdtemp(prefix="tp_profile_")
    argv = sys.argv
    sys.argv = ["traceparse", "-q", "ingest", trace, "--store", root]
    began, wall = cpu(), time.perf_counter()
    try:
        traceparse.cli.main()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    finally:
        sys.argv = argv
        wall = time.perf_counter() - wall
        whole = cpu() - began
        for module, name, original in reversed(saved):
            setattr(module, name, original)
        shutil.rmtree(root, ignore_errors=True)
    stages = dict(timers.total)
    stages["other (command, rendering)"] = whole - sum(timers.total.values())
    return stages, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace")
    parser.add_argument("--repeat", type=int, default=3, help="runs after the first (which pays the imports)")
    args = parser.parse_args()
    began = cpu()
    import traceparse.cli  # noqa: F401
    import traceparse.plugins

    startup = cpu() - began
    runs = []
    for _ in range(args.repeat + 1):
        traceparse.plugins._registry = None  # each run loads the plugins, as a fresh process does (imports cached)
        with contextlib.redirect_stdout(io.StringIO()):
            runs.append(profile_once(args.trace))
    later = runs[1:]
    labels = sorted({k for stages, _ in later for k in stages})
    median = {k: statistics.median(s.get(k, 0.0) for s, _ in later) for k in labels}
    # what the first run spent beyond the later ones: importing polars, pyarrow, rich, the plugins, first calls
    median["start-up: imports and first calls (first run - later ones)"] = (
        startup + sum(runs[0][0].values()) - statistics.median(sum(s.values()) for s, _ in later))
    whole = sum(median.values())
    size_mb = os.path.getsize(args.trace) / 1e6
    print(f"{args.trace}: {size_mb:.1f} MB; CPU seconds per stage, median of runs 2-{len(runs)}; "
          f"load {os.getloadavg()[0]:.2f}")
    for k in sorted(median, key=lambda k: -median[k]):
        print(f"  {k:<60} {median[k]:6.3f}  {100 * median[k] / whole:5.1f}%")
    print(f"  {'total':<60} {whole:6.3f}")
    print(f"wall, one thread: first run {runs[0][1]:.2f} s, later runs {statistics.median(w for _, w in later):.2f} s")


if __name__ == "__main__":
    main()
