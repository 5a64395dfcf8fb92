"""SQL over the store: stable views of every trace and run, the same in DuckDB and in polars.

The store keeps each trace's events as one Parquet file and each run as one
file per rank (:mod:`traceparse.store`). This module defines, once, the views
a query sees over those files, and runs a query on one of two engines:

- **DuckDB** (extra ``sql``): an in-memory database whose views read the
  Parquet in place (``read_parquet``), out of core;
- **polars** (always there): lazy frames (``scan_parquet``) in a
  :class:`polars.SQLContext`, collected on the streaming engine.

Either way predicates and projections reach the Parquet scan, so a query over
a run of many ranks reads only the columns and row groups it needs. Views
(docs/sql.md lists every column and its unit):

- ``events``: the normalized table (:mod:`traceparse.schema`) with ``run_id``
  and ``end_ns``; ``kernels`` (with ``category``), ``copies`` (memcpy and
  memset), ``api`` (with ``api_class``), ``ops``, ``markers``, ``counters``:
  the rows of one kind, their columns;
- ``traces``, ``runs``, ``tags``: the metadata beside the events;
- ``steps``: :func:`traceparse.measures.steps.step_series` of each trace;
- ``findings``: what the last ``traceparse analyze`` of each trace found.

A query is read-only: one statement, and only a query (``SELECT``, ``WITH``,
``VALUES``, DuckDB's ``FROM``-first); DuckDB runs with its configuration
locked, no extension loading, and file access limited to the store.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import polars as pl

from traceparse.errors import InputError, StoreError, spelled
from traceparse.expr import API_CLASSES, OTHER_CATEGORY, OTHER_CLASS, kernel_categories
from traceparse.schema import DTYPES
from traceparse.store import FINDINGS_FILE, Store

ENGINES = ("duckdb", "polars")
#: Every view, in the order docs/sql.md lists them.
VIEWS = ("events", "kernels", "copies", "api", "ops", "markers", "counters", "traces", "runs", "tags", "steps",
         "findings")
#: The statements a query may start with (after comments and opening parentheses).
QUERY_WORDS = ("SELECT", "WITH", "VALUES", "FROM")


class SQLError(InputError):
    """A query that cannot run: refused (not a query), or failed in the engine (its message, on one line)."""


# -- the views' columns: defined once, built for both engines ----------------------------------------------
#: ``events``: the schema's columns, with ``run_id`` after ``trace_id`` and ``end_ns`` after ``duration_ns``.
EVENT_COLUMNS: dict[str, pl.DataType] = {}
for _name, _dtype in DTYPES.items():
    EVENT_COLUMNS[_name] = pl.String if isinstance(_dtype, pl.Enum) else _dtype
    if _name == "trace_id":
        EVENT_COLUMNS["run_id"] = pl.String
    elif _name == "duration_ns":
        EVENT_COLUMNS["end_ns"] = pl.Int64

_HEAD = ("trace_id", "run_id", "rank", "event_id", "name")
_TIME = ("start_ns", "duration_ns", "end_ns", "calls")


@dataclass(frozen=True)
class KindView:
    """A view of the events of some kinds: its columns (from ``events``, or ``category`` / ``api_class``)."""

    kinds: tuple[str, ...]
    columns: tuple[str, ...]


KIND_VIEWS: dict[str, KindView] = {
    "kernels": KindView(("kernel",), _HEAD + ("category",) + _TIME + (
        "min_ns", "max_ns", "device_id", "context_id", "stream_id", "correlation_id", "external_id", "grid_x",
        "grid_y", "grid_z", "block_x", "block_y", "block_z", "registers_per_thread", "static_smem_bytes",
        "dynamic_smem_bytes", "bytes", "flops", "collective", "seq", "process_group", "hlo_module", "hlo_op")),
    "copies": KindView(("memcpy", "memset"), _HEAD + ("kind",) + _TIME + (
        "min_ns", "max_ns", "copy_kind", "src_memory", "dst_memory", "bytes", "device_id", "context_id",
        "stream_id", "src_device", "dst_device", "correlation_id", "external_id", "hlo_module", "hlo_op")),
    "api": KindView(("api",), _HEAD + ("api_class",) + _TIME + (
        "min_ns", "max_ns", "exclusive_ns", "pid", "tid", "correlation_id", "external_id", "device_id",
        "stream_id")),
    "ops": KindView(("op",), _HEAD + _TIME + (
        "exclusive_ns", "subcalls", "pid", "tid", "external_id", "parent_id", "data_from", "call_path", "input_dims",
        "input_types", "concrete_inputs", "flops", "device_id", "collective", "seq", "process_group",
        "process_group_choices", "peer_rank", "peer_rank_choices", "bytes")),
    "markers": KindView(("marker",), _HEAD + _TIME + (
        "pid", "tid", "device_id", "stream_id", "group", "parent_id", "collective", "seq", "process_group",
        "process_group_choices")),
    "counters": KindView(("counter",), _HEAD + ("start_ns", "duration_ns", "calls", "value", "value_min",
                                                "value_max", "value_sumsq", "unit", "device_id", "pid", "tid",
                                                "parent_id", "group")),
}

TRACES_SCHEMA = pl.Schema({
    "trace_id": pl.String, "run_id": pl.String, "rank": pl.Int32, "name": pl.String, "format": pl.String,
    "variant": pl.String, "reader": pl.String, "tool": pl.String, "tool_version": pl.String,
    "source_paths": pl.String, "sha256": pl.String, "schema_version": pl.Int64, "ingested_at": pl.String,
    "event_count": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64, "span_ns": pl.Int64, "devices": pl.String,
    "tags": pl.String, "warnings": pl.Int64})
RUNS_SCHEMA = pl.Schema({
    "run_id": pl.String, "name": pl.String, "format": pl.String, "world_size": pl.Int64, "ranks": pl.Int64,
    "backend": pl.String, "event_count": pl.Int64, "ingested_at": pl.String, "tags": pl.String,
    "schema_version": pl.Int64, "warnings": pl.Int64})
TAGS_SCHEMA = pl.Schema({"trace_id": pl.String, "run_id": pl.String, "key": pl.String, "value": pl.String})
STEPS_SCHEMA = pl.Schema({"trace_id": pl.String, "run_id": pl.String, "rank": pl.Int32, "step": pl.Int64,
                          "start_ns": pl.Int64, "end_ns": pl.Int64, "duration_ns": pl.Int64, "source": pl.String})


def findings_schema() -> pl.Schema:
    """The ``findings`` view's columns: the entry's ``trace_id`` or ``run_id``, then what analyze stored."""
    from traceparse.analysis import FINDINGS_SCHEMA

    return pl.Schema({"trace_id": pl.String, "run_id": pl.String, **FINDINGS_SCHEMA})


# -- what a query reads ------------------------------------------------------------------------------------
@dataclass
class RunFiles:
    """A stored run: its id, its run.json, and each rank's (rank, partition directory)."""

    id: str
    doc: dict
    ranks: list[tuple[int, Path]]


@dataclass
class Selection:
    """The stored traces and runs a query sees (all of them, or those ``--trace`` / ``--run`` name)."""

    store: Store
    traces: list[str] = field(default_factory=list)
    runs: list[RunFiles] = field(default_factory=list)

    def event_files(self) -> list[tuple[str | None, list[Path]]]:
        """The Parquet files of the events, grouped: (None, the traces' files), then (run id, its ranks' files)."""
        groups: list[tuple[str | None, list[Path]]] = []
        if self.traces:
            groups.append((None, [self.store.events_path(t) for t in self.traces]))
        for run in self.runs:
            if run.ranks:
                groups.append((run.id, [d / "events.parquet" for _, d in run.ranks]))
        return groups


def select(store: Store | str | Path | None = None, traces: Iterable[str] = (), runs: Iterable[str] = ()
           ) -> Selection:
    """The traces and runs of ``store`` a query sees: every one, or only the ``traces`` (ids or unique prefixes)
    and ``runs`` (ids, prefixes or names) given. A damaged run (run.json unreadable) is left out."""
    store = store if isinstance(store, Store) else Store(store)
    store.require()  # a mistyped store answers no query, not an empty one
    traces, runs = list(traces or ()), list(runs or ())
    if not traces and not runs:
        trace_ids, run_ids = store.ids(), store.run_ids()
    else:
        trace_ids = [_resolve(store, ref, "trace") for ref in traces]
        run_ids = [_resolve(store, ref, "run") for ref in runs]
    out = Selection(store, list(dict.fromkeys(trace_ids)))
    for run_id in dict.fromkeys(run_ids):
        try:
            doc = store.run_meta(run_id)
        except Exception:  # DamagedEntry: `traceparse list` names it; a query reads the others
            continue
        ranks = sorted(int(r) for r in doc.get("ranks", {}))
        out.runs.append(RunFiles(run_id, doc, [(r, store.rank_dir(run_id, r)) for r in ranks]))
    return out


def _resolve(store: Store, ref: str, want: str) -> str:
    """The id of the stored trace (``want`` "trace") or run that ``ref`` names; a one-line error for the other,
    and for none (naming the run or trace sought)."""
    if not store.matches(ref):
        raise StoreError(f"{ref}: {store.no_entry(want)}")
    kind, entry_id = store.resolve(ref)
    if kind != want:
        raise InputError(spelled(f"--{want} {ref}: names a {kind}, not a {want}; use --{kind} {ref}",
                                 f"{want}s=[{ref!r}]: names a {kind}, not a {want}; pass {kind}s=[{ref!r}]"))
    return entry_id


def referenced(query: str) -> set[str]:
    """The views ``query`` mentions as a word (case-insensitive): only those that cost work to build (metadata,
    steps, findings) are built for it."""
    words = set(re.findall(r"[a-z_]+", query.lower()))
    return {v for v in VIEWS if v in words}


# -- refusing what is not a query --------------------------------------------------------------------------
def _statements(query: str) -> list[str]:
    """``query`` cut into statements at semicolons outside quotes and comments, comments removed, empty ones
    dropped."""
    out, cur, i, n = [], [], 0, len(query)
    while i < n:
        c = query[i]
        if c in "'\"":
            j = i + 1
            while j < n and not (query[j] == c and (j + 1 >= n or query[j + 1] != c)):
                j += 2 if query[j] == c else 1
            cur.append(query[i:j + 1])
            i = j + 1
        elif query.startswith("--", i):
            j = query.find("\n", i)
            i = n if j < 0 else j
            cur.append(" ")
        elif query.startswith("/*", i):
            j = query.find("*/", i + 2)
            i = n if j < 0 else j + 2
            cur.append(" ")
        elif c == ";":
            out.append("".join(cur))
            cur = []
            i += 1
        else:
            cur.append(c)
            i += 1
    out.append("".join(cur))
    return [s.strip() for s in out if s.strip()]


#: polars' SQL table functions, which read any file: the polars engine refuses them (DuckDB limits its own to the
#: store's directory).
_TABLE_FUNCTIONS = re.compile(r"\bread_[a-z_]+\s*\(", re.IGNORECASE)


def _without_strings(statement: str) -> str:
    return re.sub(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"", "''", statement)


def check_query(query: str) -> str:
    """``query`` if it is one read-only query; else a one-line :class:`SQLError` naming what was refused.

    The store is read-only to SQL: ``INSERT``, ``COPY``, ``ATTACH``, ``CREATE``, ``PRAGMA``, ``INSTALL`` /
    ``LOAD``, ``SET`` and every other statement that is not a query are refused before an engine sees them.
    """
    statements = _statements(query)
    if not statements:
        raise SQLError("the query is empty: give one SELECT statement, e.g. traceparse sql \"SELECT * FROM traces\"")
    if len(statements) > 1:
        raise SQLError(f"{len(statements)} statements given: give one query (no ';' between statements)")
    word = re.match(r"[\s(]*([A-Za-z_]*)", statements[0]).group(1).upper()
    if word not in QUERY_WORDS:
        raise SQLError(f"{word or statements[0][:20]!s} refused: only a query (SELECT or WITH ...) runs here; "
                       "the store is read-only to SQL")
    return statements[0]


# -- polars ------------------------------------------------------------------------------------------------
def _scan(files: list[Path], run_id: str | None) -> pl.LazyFrame:
    """The events of ``files`` as one lazy scan (older files' missing columns as nulls), with ``run_id``."""
    frame = pl.scan_parquet(files, schema=DTYPES, missing_columns="insert", extra_columns="ignore",
                            hive_partitioning=False)
    return frame.with_columns(run_id=pl.lit(run_id, dtype=pl.String))


def _event_exprs() -> list[pl.Expr]:
    out = []
    for name, dtype in EVENT_COLUMNS.items():
        if name == "end_ns":
            out.append((pl.col("start_ns") + pl.col("duration_ns")).alias("end_ns"))
        else:
            out.append(pl.col(name).cast(dtype))
    return out


def _first_match(subject: pl.Expr, table: list[tuple[str, str]], default: str) -> pl.Expr:
    """polars: the label of the first ``(label, regex)`` row whose regex is found in ``subject``, else ``default``."""
    expr = pl.lit(default)
    for label, pattern in reversed(table):
        expr = pl.when(subject.str.contains(pattern)).then(pl.lit(label)).otherwise(expr)
    return expr


def _computed_polars(name: str) -> pl.Expr:
    if name == "category":
        return _first_match(pl.col("name").str.to_lowercase(), kernel_categories(), OTHER_CATEGORY).alias(name)
    if name == "api_class":
        return _first_match(pl.col("name"), API_CLASSES, OTHER_CLASS).alias(name)
    return pl.col(name)


def polars_views(selection: Selection, wanted: Iterable[str] = VIEWS) -> dict[str, pl.LazyFrame]:
    """Every view as a polars LazyFrame (``events`` and the kind views scan the Parquet lazily); the metadata,
    steps and findings views are built only when in ``wanted``, else empty."""
    wanted = set(wanted)
    scans = [_scan(files, run_id) for run_id, files in selection.event_files()]
    raw = pl.concat(scans, how="vertical") if scans else pl.LazyFrame(schema={**DTYPES, "run_id": pl.String})
    views = {"events": raw.select(_event_exprs())}
    for name, view in KIND_VIEWS.items():  # the kind filter before the casts, so that it reaches the scan too
        views[name] = raw.filter(pl.col("kind").is_in(list(view.kinds))).select(_event_exprs()).select(
            [_computed_polars(c) for c in view.columns])
    for name, frame in _small_views(selection, wanted).items():
        views[name] = frame.lazy()
    return views


# -- DuckDB ------------------------------------------------------------------------------------------------
_DUCK_TYPES = {pl.String: "VARCHAR", pl.Int64: "BIGINT", pl.Int32: "INTEGER", pl.Float64: "DOUBLE",
               pl.Boolean: "BOOLEAN"}


def _q(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _lit(text: str | None) -> str:
    return "NULL" if text is None else "'" + str(text).replace("'", "''") + "'"


def _sql_first_match(subject: str, table: list[tuple[str, str]], default: str) -> str:
    """DuckDB: the same classification as :func:`_first_match`, as a ``CASE`` of ``regexp_matches``."""
    whens = " ".join(f"WHEN regexp_matches({subject}, {_lit(p)}) THEN {_lit(label)}" for label, p in table)
    return f"CASE {whens} ELSE {_lit(default)} END"


def _computed_sql(name: str) -> str:
    if name == "category":
        return f"{_sql_first_match('lower(name)', kernel_categories(), OTHER_CATEGORY)} AS category"
    if name == "api_class":
        return f"{_sql_first_match('name', API_CLASSES, OTHER_CLASS)} AS api_class"
    return _q(name)


def _read(con, files: list[Path]) -> tuple[str, set[str]]:
    """``read_parquet`` of ``files`` (by name, no hive columns) and the columns those files have."""
    listed = "[" + ", ".join(_lit(str(f)) for f in files) + "]"
    source = f"read_parquet({listed}, union_by_name = true, hive_partitioning = false)"
    present = {row[0] for row in con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()}
    return source, present


def duckdb_views(con, selection: Selection, wanted: Iterable[str] = VIEWS) -> None:
    """Create every view in the DuckDB connection ``con``: ``events`` and the kind views over ``read_parquet``
    of the store's files, the small views (metadata, steps, findings) as registered tables."""
    wanted = set(wanted)
    parts = []
    for run_id, files in selection.event_files():
        source, present = _read(con, files)
        cols = []
        for name, dtype in EVENT_COLUMNS.items():
            if name == "run_id":
                cols.append(f"CAST({_lit(run_id)} AS VARCHAR) AS run_id")
            elif name == "end_ns":
                cols.append("CAST(start_ns + duration_ns AS BIGINT) AS end_ns")
            elif name in present:
                cols.append(f"CAST({_q(name)} AS {_DUCK_TYPES[dtype]}) AS {_q(name)}")
            else:
                cols.append(f"CAST(NULL AS {_DUCK_TYPES[dtype]}) AS {_q(name)}")
        parts.append(f"SELECT {', '.join(cols)} FROM {source}")
    if not parts:
        cols = ", ".join(f"CAST(NULL AS {_DUCK_TYPES[t]}) AS {_q(n)}" for n, t in EVENT_COLUMNS.items())
        parts.append(f"SELECT {cols} WHERE false")
    con.execute("CREATE VIEW events AS " + " UNION ALL ".join(parts))
    for name, view in KIND_VIEWS.items():
        kinds = ", ".join(_lit(k) for k in view.kinds)
        cols = ", ".join(_computed_sql(c) for c in view.columns)
        con.execute(f"CREATE VIEW {name} AS SELECT {cols} FROM events WHERE kind IN ({kinds})")
    for name, frame in _small_views(selection, wanted).items():
        con.register(f"__{name}", frame.to_arrow())
        con.execute(f"CREATE VIEW {name} AS SELECT * FROM __{name}")


# -- the small views: metadata, steps, findings ------------------------------------------------------------
def _small_views(selection: Selection, wanted: set[str]) -> dict[str, pl.DataFrame]:
    """The metadata, steps and findings views: built when ``wanted``, else empty with their columns."""
    builders = {"traces": (_traces, TRACES_SCHEMA), "runs": (_runs, RUNS_SCHEMA), "tags": (_tags, TAGS_SCHEMA),
                "steps": (_steps, STEPS_SCHEMA), "findings": (_findings, findings_schema())}
    out = {}
    for name, (build, schema) in builders.items():
        rows = build(selection) if name in wanted else []
        if isinstance(rows, pl.DataFrame):
            out[name] = rows.select(schema.names()).cast(dict(schema))
        else:
            out[name] = pl.DataFrame(rows, schema=schema, strict=False)
    return out


def _metas(selection: Selection):
    """(trace metadata, run id, rank) of every trace seen, a run's ranks after the traces; unreadable ones left out."""
    for trace_id in selection.traces:
        try:
            yield selection.store.meta(trace_id), None, None
        except Exception:  # DamagedEntry
            continue
    for run in selection.runs:
        for rank, _ in run.ranks:
            try:
                yield selection.store.rank_meta(run.id, rank), run.id, rank
            except Exception:
                continue


def _traces(selection: Selection) -> list[dict]:
    from traceparse.report import trace_label

    rows = []
    for meta, run_id, rank in _metas(selection):
        summary = meta.summary or {}
        rows.append({
            "trace_id": meta.id, "run_id": run_id, "rank": rank, "name": trace_label(meta), "format": meta.format,
            "variant": meta.variant, "reader": meta.reader, "tool": meta.tool, "tool_version": meta.tool_version,
            "source_paths": json.dumps(meta.source_paths), "sha256": meta.sha256,
            "schema_version": meta.schema_version, "ingested_at": meta.ingested_at, "event_count": meta.event_count,
            "start_ns": summary.get("start_ns"), "end_ns": summary.get("end_ns"), "span_ns": summary.get("span_ns"),
            "devices": json.dumps([d.name for d in meta.devices]), "tags": json.dumps(meta.tags, sort_keys=True),
            "warnings": len(meta.warnings)})
    return rows


def _runs(selection: Selection) -> list[dict]:
    rows = []
    for run in selection.runs:
        doc = run.doc
        rows.append({
            "run_id": run.id, "name": doc.get("name"), "format": doc.get("format"), "world_size": doc.get("world_size"),
            "ranks": len(run.ranks), "backend": doc.get("backend"), "event_count": doc.get("event_count"),
            "ingested_at": doc.get("ingested_at"), "tags": json.dumps(doc.get("tags") or {}, sort_keys=True),
            "schema_version": doc.get("schema_version"), "warnings": len(doc.get("warnings") or [])})
    return rows


def _tags(selection: Selection) -> list[dict]:
    rows = [{"trace_id": meta.id, "run_id": run_id, "key": k, "value": str(v)}
            for meta, run_id, _ in _metas(selection) for k, v in sorted(meta.tags.items())]
    rows += [{"trace_id": None, "run_id": run.id, "key": k, "value": str(v)}
             for run in selection.runs for k, v in sorted((run.doc.get("tags") or {}).items())]
    return rows


#: The columns :func:`traceparse.measures.steps.step_series` reads.
_STEP_COLUMNS = ("trace_id", "kind", "name", "pid", "start_ns", "duration_ns")


def _steps(selection: Selection) -> pl.DataFrame:
    """:func:`~traceparse.measures.steps.step_series` of each trace, one file at a time (only the columns it
    reads), so a run's steps are per rank and memory holds one rank's few columns at once."""
    from traceparse.measures.steps import step_series

    parts = []
    files = [(None, None, selection.store.events_path(t)) for t in selection.traces]
    files += [(run.id, rank, d / "events.parquet") for run in selection.runs for rank, d in run.ranks]
    for run_id, rank, path in files:
        events = pl.scan_parquet(path, hive_partitioning=False).select(_STEP_COLUMNS).collect()
        steps = step_series(events)
        if steps.height:
            parts.append(steps.with_columns(run_id=pl.lit(run_id, dtype=pl.String),
                                            rank=pl.lit(rank, dtype=pl.Int32)))
    return pl.concat(parts) if parts else pl.DataFrame(schema=STEPS_SCHEMA)


def _findings(selection: Selection) -> pl.DataFrame:
    """The findings the last ``analyze`` of each trace and run kept (:meth:`Store.save_findings`)."""
    schema = findings_schema()
    parts = []
    entries = [(t, None, selection.store.traces_dir / t) for t in selection.traces]
    entries += [(None, run.id, selection.store.runs_dir / run.id) for run in selection.runs]
    for trace_id, run_id, directory in entries:
        path = directory / FINDINGS_FILE
        if path.is_file():
            try:
                found = pl.read_parquet(path)
            except (OSError, pl.exceptions.PolarsError):  # cut short: that analysis is not kept, the others are
                continue
            found = found.with_columns(trace_id=pl.lit(trace_id, dtype=pl.String), run_id=pl.lit(run_id, dtype=pl.String))
            parts.append(found.select(pl.col(c).cast(t) if c in found.columns else pl.lit(None, dtype=t).alias(c)
                                      for c, t in schema.items()))  # a column an older analyze did not keep: null
    return pl.concat(parts, how="vertical_relaxed") if parts else pl.DataFrame(schema=schema)


# -- running a query ---------------------------------------------------------------------------------------
def duckdb_available() -> bool:
    """True when DuckDB can be imported (the ``sql`` extra)."""
    try:
        import duckdb  # noqa: F401
    except ImportError:
        return False
    return True


def pick_engine(engine: str | None = None) -> str:
    """``engine`` when given and usable, else DuckDB when installed, else polars."""
    if engine is None:
        return "duckdb" if duckdb_available() else "polars"
    if engine not in ENGINES:
        raise InputError(spelled(f"--engine {engine}: expected one of {', '.join(ENGINES)}",
                                 f"engine={engine!r}: expected one of {', '.join(map(repr, ENGINES))}"))
    if engine == "duckdb" and not duckdb_available():
        raise InputError(spelled("--engine duckdb", "engine='duckdb'") + ": DuckDB is not installed: pip install "
                         f"'traceparse[sql]' (or use {spelled('--engine polars', 'engine=' + repr('polars'))})")
    return engine


def _message(exc: Exception) -> str:
    """The engine's message, its first line."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[0].strip() if lines else type(exc).__name__


def _duckdb_connection(selection: Selection, wanted: set[str]):
    """An in-memory DuckDB with the views, no extension loading, file access limited to the store, settings
    locked."""
    import duckdb

    con = duckdb.connect(":memory:", config={"autoinstall_known_extensions": False,
                                             "autoload_known_extensions": False})
    root = str(selection.store.root.resolve())
    con.execute(f"SET allowed_directories = [{_lit(root + '/')}]")
    con.execute("SET enable_external_access = false")
    duckdb_views(con, selection, wanted)
    con.execute("SET lock_configuration = true")
    return con


def run_query(query: str, selection: Selection, engine: str, *, normalize: bool = True) -> pl.DataFrame:
    """The result of one read-only ``query`` over ``selection``'s views on ``engine``, as a polars DataFrame
    (with ``normalize``, the types both engines give alike: :func:`normalized`)."""
    statement = check_query(query)
    wanted = referenced(statement)
    if engine == "duckdb":
        import duckdb

        try:
            kinds = [s.type.name for s in duckdb.extract_statements(statement)]
        except duckdb.Error as exc:
            raise SQLError(f"duckdb: {_message(exc)}") from None
        if kinds != ["SELECT"]:
            raise SQLError(f"{kinds[0] if kinds else 'the statement'} refused: only a query (SELECT or WITH ...) "
                           "runs here; the store is read-only to SQL")
        try:
            con = _duckdb_connection(selection, wanted)
            try:
                relation = con.sql(statement)
                # DuckDB 1.x: .arrow() is the table; 2.x names it to_arrow_table()
                table = relation.to_arrow_table() if hasattr(relation, "to_arrow_table") else relation.arrow()
            finally:
                con.close()
        except duckdb.Error as exc:
            raise SQLError(f"duckdb: {_message(exc)}") from None
        names = table.column_names
        if len(set(names)) < len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise SQLError(f"duckdb: the result has two columns named {dup!r}: name each column once (AS ...)")
        result = pl.from_arrow(table)
    else:
        function = _TABLE_FUNCTIONS.search(_without_strings(statement))
        if function:
            raise SQLError(f"polars: {function.group(0).rstrip('( ')}() refused: a query reads the store's views "
                           "(docs/sql.md), not other files")
        try:
            context = pl.SQLContext(polars_views(selection, wanted), eager=False)
            result = context.execute(statement).collect(engine="streaming")
        except pl.exceptions.PolarsError as exc:
            raise SQLError(f"polars: {_message(exc)}") from None
    return normalized(result) if normalize else result


def normalized(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with the types that differ between engines made alike: every integer (DuckDB's HUGEINT sums,
    polars' UInt32 counts) as Int64, a whole decimal as Int64 and any other as Float64, Float32 as Float64,
    categorical as String. A value that does not fit Int64 keeps its column a decimal."""
    casts = {}
    for name, dtype in frame.schema.items():
        if dtype.is_integer() and dtype != pl.Int64:
            casts[name] = pl.Int64
        elif isinstance(dtype, pl.Decimal):
            casts[name] = pl.Int64 if dtype.scale == 0 else pl.Float64
        elif dtype == pl.Float32:
            casts[name] = pl.Float64
        elif isinstance(dtype, (pl.Categorical, pl.Enum)):
            casts[name] = pl.String
    out = frame
    for name, dtype in casts.items():
        try:
            out = out.with_columns(pl.col(name).cast(dtype, strict=True))
        except pl.exceptions.PolarsError:  # past Int64: kept as it is
            continue
    return out


def sql(query: str, *, store: Store | str | Path | None = None, engine: str | None = None,
        traces: Iterable[str] = (), runs: Iterable[str] = ()) -> pl.DataFrame:
    """Run one read-only SQL query over the store's views and return the result as a polars DataFrame.

    ``engine`` is ``"duckdb"`` (the default when installed: ``pip install 'traceparse[sql]'``) or
    ``"polars"``; ``traces`` / ``runs`` narrow the views to those traces and runs (ids, unique prefixes, a run's
    name). docs/sql.md lists the views and their columns. :func:`traceparse.trace.pandas_frame` gives a pandas
    DataFrame whose integer columns stay exact (polars' own ``.to_pandas()`` turns one with a null into float64)::

        traceparse.sql("SELECT name, SUM(duration_ns) AS ns FROM kernels GROUP BY name ORDER BY ns DESC LIMIT 5")
    """
    return run_query(query, select(store, traces, runs), pick_engine(engine))
