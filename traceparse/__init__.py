"""traceparse: GPU and deep-learning profiler output as one normalized event table, and analyses over it.

Python API::

    import traceparse
    trace = traceparse.load("trace.json.gz")      # a path, or a store id / prefix
    trace.events                                  # polars DataFrame (traceparse.schema)
    trace.to_pandas()
    findings = traceparse.analyze(trace, rules=["kernel-share"])
    traceparse.sql("SELECT name, SUM(duration_ns) AS ns FROM kernels GROUP BY name ORDER BY ns DESC")  # polars
"""

from __future__ import annotations

__version__ = "0.1.0"

from pathlib import Path
from typing import TYPE_CHECKING

from traceparse.errors import InputError, StoreError, TraceparseError

if TYPE_CHECKING:
    from traceparse.plugins import hookimpl
    from traceparse.rule import Finding
    from traceparse.trace import Device, Trace, TraceMeta

#: Names imported when first used (PEP 562): ``import traceparse`` (and ``traceparse --version``) does not
#: load polars, pluggy or the plugins.
_LAZY = {"hookimpl": "traceparse.plugins", "Finding": "traceparse.rule", "Device": "traceparse.trace",
         "Trace": "traceparse.trace", "TraceMeta": "traceparse.trace"}


def __getattr__(name: str):
    """The public names that need polars or pluggy, imported on first use."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'traceparse' has no attribute {name!r}")


def load(path_or_id: str | Path, fmt: str = "auto", store: str | Path | None = None) -> "Trace":
    """Load a trace from a file (read directly, the store untouched) or from the store by id or unique prefix.

    A run's id (or name) gives the run as one trace (:meth:`traceparse.store.Store.load_run`).
    """
    from traceparse.ingest import read_paths
    from traceparse.store import Store

    if Path(path_or_id).exists():
        traces = read_paths([path_or_id], fmt)
        if len(traces) != 1:
            raise InputError(f"{path_or_id}: holds {len(traces)} traces; use traceparse.ingest.read_paths")
        return traces[0]
    s = Store(store)
    kind, ref_id = s.resolve(str(path_or_id))
    return s.load_run(ref_id) if kind == "run" else s.load(ref_id)


def analyze(trace: "Trace", rules: list[str] | None = None, settings: dict | None = None,
            gpu: str | None = None) -> "list[Finding]":
    """Run rules (default: every rule that applies) on a trace and return the findings."""
    from traceparse.analysis import analyze as _analyze

    return _analyze(trace, rules=rules, settings=settings, gpu=gpu)


def sql(query: str, *, store: str | Path | None = None, engine: str | None = None, traces: list[str] | tuple = (),
        runs: list[str] | tuple = ()):
    """Run one read-only SQL query over the store's views (docs/sql.md) and return a polars DataFrame
    (``.to_pandas()`` for pandas).

    ``engine``: ``"duckdb"`` (default when installed, extra ``sql``) or ``"polars"``; ``traces`` / ``runs``
    narrow the views to those stored traces and runs (ids, unique prefixes, a run's name).
    """
    from traceparse.views import sql as _sql

    return _sql(query, store=store, engine=engine, traces=traces, runs=runs)


__all__ = ["Device", "Finding", "InputError", "StoreError", "Trace", "TraceMeta", "TraceparseError",
           "__version__", "analyze", "hookimpl", "load", "sql"]
