"""What a CLI invocation works with: the store, the plugins, the consoles, trace resolution.

Reading and ingesting (:mod:`traceparse.ingest`, :mod:`traceparse.run`, and with them polars) and the progress
bars are imported when a command first needs them: ``traceparse list`` needs neither.
"""

from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from traceparse.errors import InputError, StoreError
from traceparse.plugins import Registry, registry
from traceparse.store import Store
from traceparse.text import SafeConsole, one_line, visible

if TYPE_CHECKING:
    from traceparse.ingest import IngestResult
    from traceparse.run import RunResult
    from traceparse.trace import Trace


#: Seconds a piece of work runs before its progress bar shows (``TRACEPARSE_PROGRESS_AFTER`` sets another).
PROGRESS_AFTER_S = 1.0


def progress_after() -> float:
    """Seconds before a progress bar shows: ``$TRACEPARSE_PROGRESS_AFTER`` (a number of seconds, 0 or more), else
    :data:`PROGRESS_AFTER_S`."""
    text = os.environ.get("TRACEPARSE_PROGRESS_AFTER")
    if text is None or not text.strip():
        return PROGRESS_AFTER_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):  # NaN too
        raise InputError(f"TRACEPARSE_PROGRESS_AFTER: expected a number of seconds (0 or more), got {text[:40]!r}")
    return value


class Session:
    """The store, registry and consoles of one command, and how TRACE arguments become traces."""

    def __init__(self, store: Path | str | None = None, quiet: bool = False, reg: Registry | None = None,
                 width: int | None = None):
        self.store = Store(store)
        self.registry = reg or registry()
        self.quiet = quiet
        self.out = SafeConsole(soft_wrap=False, width=width)  # width None: the terminal's, or $COLUMNS, or 80
        self.err = SafeConsole(stderr=True)
        self._warned: set[str] = set()

    def warn(self, message: str) -> None:
        """Print a warning on stderr (always, even with --quiet: warnings matter), once per command: the same
        warning given again (a trace named twice, a reader's warning seen again) is not repeated."""
        line = one_line(message)
        if line in self._warned:
            return
        self._warned.add(line)
        print(f"traceparse: warning: {line}", file=sys.stderr)

    def progress_factory(self):
        """A factory for :func:`traceparse.ingest.ingest`'s progress bars; None when quiet or not a terminal."""
        if self.quiet or not self.err.is_terminal:
            return None

        @contextmanager
        def bar(description: str, total: int):
            from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                                       TransferSpeedColumn)

            with Progress(TextColumn("{task.description}", markup=False), BarColumn(), DownloadColumn(),
                          TransferSpeedColumn(), TimeRemainingColumn(), console=self.err, transient=True) as progress:
                task = progress.add_task(visible(description), total=total or None)
                yield lambda n: progress.advance(task, n)

        return bar

    def rank_progress_factory(self):
        """A factory for :func:`traceparse.run.ingest_run`'s bar counting ranks; None when quiet or not a terminal."""
        if self.quiet or not self.err.is_terminal:
            return None

        @contextmanager
        def bar(description: str, total: int):
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)

            with Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                          TextColumn("ranks"), TimeElapsedColumn(), TimeRemainingColumn(), console=self.err,
                          transient=True) as progress:
                task = progress.add_task(visible(description), total=total or None)
                yield lambda n: progress.advance(task, n)

        return bar

    @contextmanager
    def steps(self, description: str, total: int, unit: str, after: float | None = None):
        """A bar counting ``total`` steps of one piece of work (rules of ``analyze``), for work that can take
        seconds; yields ``advance(label)``, which names the step now under way. The bar shows once the work has
        run ``after`` seconds (default :func:`progress_after`: 1 s; 0: at once), so that quick work leaves the
        terminal as it was, and goes when the work is done. Nothing when quiet or piped."""
        after = progress_after() if after is None else after  # a bad setting is an error, piped or not
        if self.quiet or not self.err.is_terminal:
            yield lambda label=None: None
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        progress = Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                            TextColumn(unit), TextColumn("{task.fields[now]}", markup=False), TimeElapsedColumn(),
                            console=self.err, transient=True)
        task = progress.add_task(visible(description), total=total or None, now="")
        started = [False]
        lock = threading.Lock()
        state = {"shown": False, "done": False}

        def advance(label: str | None = None) -> None:
            progress.update(task, advance=1 if started[0] else 0, now=visible(label or ""))
            started[0] = True

        def show() -> None:
            with lock:
                if not state["done"]:
                    progress.start()
                    state["shown"] = True

        timer = threading.Timer(min(after, 86400.0), show)  # a wait past a day: a day (a longer one overflows)
        timer.daemon = True
        if after <= 0:
            show()
        else:
            timer.start()
        try:
            yield advance
        finally:
            timer.cancel()
            with lock:
                state["done"] = True
                if state["shown"]:
                    progress.stop()

    def ingest_run(self, paths: list[str], name: str | None = None, fmt: str = "auto",
                   tags: dict[str, str] | None = None, params: dict | None = None, jobs: int | None = None,
                   scheduler: str | None = None) -> RunResult:
        """Ingest a run (a rank directory, or one file per rank), printing its warnings."""
        from traceparse.run import ingest_run

        result = ingest_run(paths, store=self.store, name=name, fmt=fmt, params=params, jobs=jobs,
                            scheduler=scheduler, tags=tags, progress_factory=self.rank_progress_factory(),
                            reg=self.registry)
        for one in result.windows or [result]:  # a folder of several profiling windows: a run each
            if not one.already_stored:
                for warning in one.warnings:
                    self.warn(warning)
            for line in one.said:
                self.warn(line)
        return result

    def is_run_path(self, path: str | Path, fmt: str = "auto") -> bool:
        """True when ``path`` is a directory of per-rank traces (no reader reads it as one trace)."""
        if not Path(path).is_dir():  # a file is one trace: nothing to import (the run module brings polars)
            return False
        from traceparse.run import is_rank_directory

        return is_rank_directory(Path(path), fmt, self.registry)

    def load(self, ref_id: str, lazy_runs: bool = False) -> Trace:
        """A stored trace or run by its exact id (a run as its combined trace, :meth:`Store.load_run`)."""
        if self.store.has_run(ref_id) and not self.store.has(ref_id):
            return self.store.load_run(ref_id, lazy=lazy_runs)
        return self.store.load(ref_id)

    def ingest(self, paths: list[str], fmt: str = "auto", tags: dict[str, str] | None = None,
               params: dict | None = None, ahead=None) -> list[IngestResult]:
        """Ingest paths into the store, printing the readers' warnings (``ahead``: the files' hashes worked out
        ahead, :class:`traceparse.sources.FileHashes`)."""
        from traceparse.ingest import ingest

        results = ingest(paths, store=self.store, fmt=fmt, tags=tags, params=params,
                         progress_factory=self.progress_factory(), reg=self.registry, ahead=ahead)
        for result in results:
            if not result.already_stored:
                for warning in result.meta.warnings:
                    self.warn(warning)
        return results

    def resolve_one(self, ref: str, fmt: str = "auto", command: str = "this command", lazy_runs: bool = False) -> Trace:
        """The one trace or run ``ref`` names (:meth:`resolve`), for a command that takes one (``command``, its
        name): a path that makes several (a run folder of several profiling windows) is refused, naming their
        ids, rather than its first taken without a word."""
        found = self.resolve(ref, fmt, lazy_runs)
        if len(found) != 1:
            raise InputError(f"{ref}: {command} takes one trace or run; this makes {len(found):,} "
                             f"({', '.join(str(t.meta.id) for t in found)}): name one by its id")
        return found[0]

    def resolve(self, ref: str, fmt: str = "auto", lazy_runs: bool = False) -> list[Trace]:
        """The trace(s) a TRACE argument names: a path (ingested first if new; a rank directory as a run), or
        the id (or unique prefix) of a stored trace or run, or a run's name, or the trace id of one rank of a
        stored run (as its ranks table lists it: that rank alone). A run is its combined trace
        (with ``lazy_runs``, its events read rank by rank: :meth:`Store.load_run`)."""
        path = Path(ref)
        if path.exists():
            if self.is_run_path(path, fmt):
                result = self.ingest_run([ref], fmt=fmt)
                return [self.store.load_run(r.run["id"], lazy=lazy_runs) for r in result.windows or [result]]
            return [_as_given(self.store.load(r.meta.id), ref) for r in self.ingest([ref], fmt)]
        try:
            kind, ref_id = self.store.resolve(ref)
        except StoreError:
            rank = self.store.rank_of_trace(ref)  # one rank of a run, by the trace id its ranks table lists
            if rank is None:
                raise
            return [self.store.load_rank(*rank)]
        return [self.store.load_run(ref_id, lazy=lazy_runs) if kind == "run" else self.store.load(ref_id)]

    def resolve_all(self, refs: list[str], fmt: str = "auto", group: bool = False,
                    lazy_runs: bool = False) -> list[Trace]:
        """Resolve several TRACE arguments; none means the last ingested trace (or run).

        With ``group`` the files among them are grouped into traces as ``ingest`` groups them (the CSV
        reports of one nsys capture are one trace, not one trace per report); the traces of those files
        come where the first of them stands. With ``lazy_runs`` a run's events stay in the store's rank
        files (:class:`traceparse.measures.base.PartitionedEvents`).
        """
        if not refs:
            return [self.load(self.store.last_id(), lazy_runs)]
        for ref in dict.fromkeys(r for r in refs if refs.count(r) > 1):
            self.warn(f"{ref}: given {refs.count(ref)} times: read once")
        refs = list(dict.fromkeys(refs))
        files = [r for r in refs if Path(r).is_file()] if group else []
        traces, done, seen = [], False, {}

        def add(ref: str | None, found: list[Trace]) -> None:
            for trace in found:  # the same content twice (a path given twice, two copies of a file) is one trace
                if trace.meta.id in seen:
                    self.warn(f"{ref or 'a file given'}: the same content as {seen[trace.meta.id]}: read once")
                    continue
                seen[trace.meta.id] = ref or trace.meta.path
                traces.append(trace)

        for ref in refs:
            if len(files) > 1 and ref in files:
                if not done:
                    add(None, [self.store.load(r.meta.id) for r in self.ingest(files, fmt)])
                    done = True
                continue
            add(ref, self.resolve(ref, fmt, lazy_runs))
        return traces


def _as_given(trace, path: str):
    """``trace`` named by the path it was given as: content stored earlier from another path (a copy, a renamed
    file) is shown as the file the user named, the stored path after it."""
    paths = trace.meta.source_paths
    if paths and str(path) not in paths and len(paths) == 1 and Path(path).is_file():
        trace.meta.source_paths = [str(path), *paths]
    return trace
