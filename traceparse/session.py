"""What a CLI invocation works with: the store, the plugins, the consoles, trace resolution."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from traceparse.ingest import IngestResult, ingest
from traceparse.plugins import Registry, registry
from traceparse.store import Store
from traceparse.trace import Trace


class Session:
    """The store, registry and consoles of one command, and how TRACE arguments become traces."""

    def __init__(self, store: Path | str | None = None, quiet: bool = False, reg: Registry | None = None):
        self.store = Store(store)
        self.registry = reg or registry()
        self.quiet = quiet
        self.out = Console(soft_wrap=False)
        self.err = Console(stderr=True)

    def warn(self, message: str) -> None:
        """Print a warning on stderr (always, even with --quiet: warnings matter)."""
        from traceparse.cli import one_line

        print(f"traceparse: warning: {one_line(message)}", file=sys.stderr)

    def progress_factory(self):
        """A factory for :func:`traceparse.ingest.ingest`'s progress bars; None when quiet or not a terminal."""
        if self.quiet or not self.err.is_terminal:
            return None

        @contextmanager
        def bar(description: str, total: int):
            with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                          TimeRemainingColumn(), console=self.err, transient=True) as progress:
                task = progress.add_task(description, total=total or None)
                yield lambda n: progress.advance(task, n)

        return bar

    def ingest(self, paths: list[str], fmt: str = "auto", tags: dict[str, str] | None = None,
               params: dict | None = None) -> list[IngestResult]:
        """Ingest paths into the store, printing the readers' warnings."""
        results = ingest(paths, store=self.store, fmt=fmt, tags=tags, params=params,
                         progress_factory=self.progress_factory(), reg=self.registry)
        for result in results:
            if not result.already_stored:
                for warning in result.meta.warnings:
                    self.warn(warning)
        return results

    def resolve(self, ref: str, fmt: str = "auto") -> list[Trace]:
        """The trace(s) a TRACE argument names: a path (ingested first if new) or a store id / unique prefix."""
        path = Path(ref)
        if path.exists():
            return [self.store.load(r.meta.id) for r in self.ingest([ref], fmt)]
        return [self.store.load(self.store.resolve_id(ref))]

    def resolve_all(self, refs: list[str], fmt: str = "auto") -> list[Trace]:
        """Resolve several TRACE arguments; none means the last ingested trace."""
        if not refs:
            return [self.store.load(self.store.last_id())]
        traces = []
        for ref in refs:
            traces.extend(self.resolve(ref, fmt))
        return traces
