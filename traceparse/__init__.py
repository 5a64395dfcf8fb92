"""traceparse: GPU and deep-learning profiler output as one normalized event table, and analyses over it.

Python API::

    import traceparse
    trace = traceparse.load("trace.json.gz")      # a path (read, not stored), or a store id / prefix
    trace.events                                  # polars DataFrame (traceparse.schema)
    trace.to_pandas()
    findings = traceparse.analyze(trace, rules=["kernel-share"])
    trace_id = traceparse.add("trace.json.gz")     # into the store, for SQL
    traceparse.sql("SELECT name, SUM(duration_ns) AS ns FROM kernels GROUP BY name ORDER BY ns DESC",
                   traces=[trace_id])             # polars; traceparse.pandas_frame(df): pandas, exact integers
"""

from __future__ import annotations

__version__ = "0.1.0"

import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from traceparse.errors import InputError, StoreError, TraceparseError

if TYPE_CHECKING:
    from traceparse.plugins import hookimpl
    from traceparse.rule import Finding
    from traceparse.trace import Device, Trace, TraceMeta, pandas_frame

#: Names imported when first used (PEP 562): ``import traceparse`` (and ``traceparse --version``) does not
#: load polars, pluggy or the plugins.
_LAZY = {"hookimpl": "traceparse.plugins", "Finding": "traceparse.rule", "Device": "traceparse.trace",
         "Trace": "traceparse.trace", "TraceMeta": "traceparse.trace", "pandas_frame": "traceparse.trace"}


def __getattr__(name: str):
    """The public names that need polars or pluggy, imported on first use."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'traceparse' has no attribute {name!r}")


class TraceparseWarning(UserWarning):
    """What a reader noticed and read past (a file cut short, a value it coerced): the CLI prints these on stderr,
    a notebook shows them as warnings (each is also in ``trace.meta.warnings``)."""


def load(path_or_id: "str | Path | list[str | Path]", fmt: str = "auto", store: str | Path | None = None) -> "Trace":
    """Load a trace from a file (read directly, the store untouched) or from the store by id or unique prefix.

    A run's id (or name) gives the run as one trace (:meth:`traceparse.store.Store.load_run`), and so does a
    folder of one trace per rank, which is ingested into the store as a run first (as ``traceparse analyze
    DIR`` does: a run is assembled in the store). A list of paths is the files of one trace (an nsys capture's
    CSV reports). What the reader noticed and read past (a file cut short) is warned of
    (:class:`TraceparseWarning`), as the CLI prints it.
    """
    from traceparse.ingest import read_paths
    from traceparse.store import Store

    paths = _paths(path_or_id, "load")
    if len(paths) == 1 and paths[0].is_dir() and _is_run(paths[0], fmt):
        run = _ingest_run(paths[0], fmt, store)
        return Store(store).load_run(run)
    if len(paths) > 1 or paths[0].exists():
        traces = read_paths(paths, fmt)
        if len(traces) != 1:
            raise InputError(f"{', '.join(map(str, paths))}: holds {len(traces)} traces; load them one by one, or "
                             "traceparse.add(...) them")
        _warn(traces[0].meta.warnings)
        return traces[0]
    s = Store(store)
    ref = str(path_or_id)
    try:
        kind, ref_id = s.resolve(ref)
    except StoreError:
        rank = s.rank_of_trace(ref)
        if rank is None:
            raise
        return s.load_rank(*rank)  # one rank of a run, by the trace id the traces view lists for it
    return s.load_run(ref_id) if kind == "run" else s.load(ref_id)


def add(path: "str | Path | list[str | Path]", fmt: str = "auto", store: str | Path | None = None) -> str:
    """Store a trace (a file, the files of one capture) or a run (a folder of one trace per rank) and return its
    id, for :func:`sql` (``traces=[id]``), :func:`load` and the CLI. Content already stored is recognised by its
    hash and not read again; what the reader read past is warned of (:class:`TraceparseWarning`)."""
    from traceparse.ingest import ingest as _ingest
    from traceparse.store import Store

    paths = _paths(path, "add")
    if len(paths) == 1 and paths[0].is_dir() and _is_run(paths[0], fmt):
        return _ingest_run(paths[0], fmt, store)
    results = _ingest(paths, store=Store(store), fmt=fmt)
    if len(results) != 1:
        raise InputError(f"{', '.join(map(str, paths))}: holds {len(results)} traces (stored: "
                         f"{', '.join(r.meta.id for r in results)}); add them one by one to have one id each")
    if not results[0].already_stored:
        _warn(results[0].meta.warnings)
    return results[0].meta.id


def analyze(trace: "Trace", rules: "str | list[str] | None" = None, settings: dict | None = None,
            gpu: str | None = None) -> "list[Finding]":
    """Run rules (default: every rule that applies) on a trace (:func:`load`) and return the findings."""
    from traceparse.analysis import analyze as _analyze
    from traceparse.trace import Trace

    if not isinstance(trace, Trace):
        raise TypeError(f"traceparse.analyze takes a Trace (traceparse.load(...) gives one), not "
                        f"{type(trace).__name__} {trace!r:.80}")
    return _analyze(trace, rules=[rules] if isinstance(rules, str) else rules, settings=settings, gpu=gpu)


def sql(query: str, *, store: str | Path | None = None, engine: str | None = None,
        traces: "str | list[str] | tuple" = (), runs: "str | list[str] | tuple" = ()):
    """Run one read-only SQL query over the store's views (docs/sql.md) and return a polars DataFrame
    (:func:`pandas_frame` for pandas with exact integers; polars' ``.to_pandas()`` makes a column with a null
    float64).

    ``engine``: ``"duckdb"`` (default when installed, extra ``sql``) or ``"polars"``; ``traces`` / ``runs``
    narrow the views to those stored traces and runs (ids, unique prefixes, a run's name; one, or a list).
    """
    from traceparse.views import sql as _sql

    return _sql(query, store=store, engine=engine, traces=[traces] if isinstance(traces, str) else traces,
                runs=[runs] if isinstance(runs, str) else runs)


def _paths(given, what: str) -> list[Path]:
    """The paths of a :func:`load` or :func:`add` argument: one path or id, or a list of paths."""
    items = list(given) if isinstance(given, (list, tuple)) else [given]
    if not items or not all(isinstance(p, (str, Path)) for p in items):
        raise TypeError(f"traceparse.{what} takes a path or store id, or a list of paths, not {given!r:.80}")
    return [Path(p) for p in items]


def _is_run(folder: Path, fmt: str) -> bool:
    """Whether ``folder`` is one trace per rank (no reader reads the folder itself as one trace)."""
    from traceparse.run import is_rank_directory

    return is_rank_directory(folder, fmt)


def _ingest_run(folder: Path, fmt: str, store) -> str:
    """Ingest a folder of rank traces into ``store`` as a run; its id."""
    from traceparse.run import ingest_run
    from traceparse.store import Store

    result = ingest_run([folder], store=Store(store), fmt=fmt)
    for one in result.windows or [result]:
        if not one.already_stored:
            _warn(one.warnings)
    if result.windows:  # stored, a run per window: one id would hide the others
        raise InputError(f"{folder}: holds {len(result.windows)} profiling windows of its ranks, stored as runs "
                         f"{', '.join(r.run['id'] for r in result.windows)}; load them one by one by id")
    return result.run["id"]


def _warn(messages) -> None:
    """Each of a reader's warnings as a :class:`TraceparseWarning`, pointing at the caller's line."""
    for message in messages:
        warnings.warn(message, TraceparseWarning, stacklevel=3)


__all__ = ["Device", "Finding", "InputError", "StoreError", "Trace", "TraceMeta", "TraceparseError",
           "TraceparseWarning", "__version__", "add", "analyze", "hookimpl", "load", "pandas_frame", "sql"]
