"""Reader of the Nsight Systems SQLite export (``nsys export --type sqlite``), gzip-compressed or not.

Tables read, each only when present (older exports lack some):

* ``CUPTI_ACTIVITY_KIND_KERNEL``: kernels; the name is ``demangledName``
  (full, with templates, what ``cuda_gpu_trace`` prints), else ``shortName``,
  else ``mangledName``, each an id into ``StringIds``.
* ``CUPTI_ACTIVITY_KIND_MEMCPY``: copies with ``bytes``, ``copyKind``,
  ``srcKind``, ``dstKind``, labelled through ``ENUM_CUDA_MEMCPY_OPER`` /
  ``ENUM_CUDA_MEM_KIND`` when the export has them, else through nsys's own
  numbering (:data:`memops.FALLBACK_MEM_KIND`, which is not CUPTI's).
* ``CUPTI_ACTIVITY_KIND_MEMSET``: memsets (``bytes``, ``memKind``).
* ``CUPTI_ACTIVITY_KIND_RUNTIME`` (and ``_DRIVER`` where an export has it):
  API calls, ``nameId`` into ``StringIds``; ``group`` is the event class
  (``CUDA runtime`` / ``CUDA driver``) from ``ENUM_NSYS_EVENT_CLASS``.
* ``NVTX_EVENTS``: push/pop and start/end ranges become markers with their
  duration, marks markers of duration 0; the text is ``text`` or ``textId``;
  ``group`` is the NVTX domain's name (null for the default domain).
* ``TARGET_INFO_GPU`` (``TARGET_INFO_CUDA_GPU`` before 2021.2) for devices,
  ``TARGET_INFO_CUDA_DEVICE`` for the CUDA ordinal each process saw,
  ``PROCESSES`` for process names, ``META_DATA_EXPORT`` for the version.

Process and thread ids come from nsys's serialized global ids as its own
report scripts decode them: pid = (globalTid >> 24) & 0xFFFFFF, tid =
globalTid & 0xFFFFFF (checked on the sample: globalPid 281545373908992 gives
pid 4196, the pid PROCESSES and TARGET_INFO_CUDA_CONTEXT_INFO give).
Timestamps are the export's integer ns. The database is opened read-only.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
import urllib.parse
from contextlib import closing
from pathlib import Path
from typing import Iterator

import polars as pl

from traceparse.errors import bad_input
from traceparse.reader import ReadOptions
from traceparse.sources import GZIP_DAMAGE, damaged_gzip, is_gzip
from traceparse.trace import Device, Trace, TraceMeta
from traceparse.validate import excerpt

from traceparse_plugins.readers.nsys import memops

BATCH_ROWS = 500_000
EVENT_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
                "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER", "NVTX_EVENTS")
#: NVTX event types of nsys (ENUM_NSYS_EVENT_TYPE), for exports without that table.
NVTX_RANGE_TYPES = {59: "NvtxPushPopRange", 60: "NvtxStartEndRange", 70: "NvtxtPushPopRange",
                    71: "NvtxtStartEndRange"}
NVTX_MARK_TYPES = {34: "NvtxMark"}
NVTX_DOMAIN_CREATE = 75
_PID = "((({g}) >> 24) & 16777215)"
_TID = "(({g}) & 16777215)"


def _pid_tid(cols: set[str]) -> str:
    """The SELECT terms for pid and tid, decoded from globalTid where the table has it."""
    if "globalTid" not in cols:
        return "NULL AS pid, NULL AS tid"
    return f"{_PID.format(g='a.globalTid')} AS pid, {_TID.format(g='a.globalTid')} AS tid"


def connect(path: Path) -> sqlite3.Connection:
    """Open ``path`` read-only (immutable: nothing is written, even a journal)."""
    uri = f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro&immutable=1"
    return sqlite3.connect(uri, uri=True)


def decompressed(path: Path, workdir: Path, options: ReadOptions) -> Path:
    """A plain copy of a gzip-compressed export in ``workdir`` (SQLite needs a real file)."""
    import gzip

    target = workdir / (path.name[:-3] if path.name.endswith(".gz") else path.name + ".sqlite")
    try:
        with gzip.open(path, "rb") as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, 16 * 1024 * 1024)
    except GZIP_DAMAGE as exc:
        raise damaged_gzip(path, exc) from None
    except EOFError:
        raise bad_input(path, None, "the gzip stream ends early (cut short?); the SQLite export cannot be read "
                                    "from a partial file") from None
    except OSError as exc:
        raise bad_input(path, None, f"cannot be decompressed: {exc}") from None
    options.progress(path.stat().st_size)
    return target


def tables_of(db: sqlite3.Connection, path: Path) -> set[str]:
    """Names of the database's tables and views; a one-line error if it is not a SQLite database."""
    try:
        return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
    except sqlite3.DatabaseError as exc:
        raise bad_input(path, None, f"not a readable SQLite database ({exc})") from None


def check_tables(path: Path, tables: set[str]) -> None:
    """One-line error unless this is an nsys export with at least one table of events traceparse reads."""
    if "StringTable" in tables and "StringIds" not in tables:
        raise bad_input(path, None, "an nvprof SQLite profile (StringTable), not an Nsight Systems export: "
                                    "read it with --format nvprof")
    present = [t for t in EVENT_TABLES if t in tables]
    if not present:
        raise bad_input(path, None, "none of the tables traceparse reads is in this SQLite file "
                                    f"(expected at least one of {', '.join(EVENT_TABLES)}: an Nsight Systems "
                                    "export of a capture with -t cuda or -t nvtx)")
    needs_names = [t for t in present if t != "NVTX_EVENTS"]
    if needs_names and "StringIds" not in tables:
        raise bad_input(path, None, f"table StringIds is missing (the names of {needs_names[0]} are ids into it)")


def read_sqlite(path: Path, options: ReadOptions, *, source: Path | None = None,
                owned: tempfile.TemporaryDirectory | None = None) -> Trace:
    """Read an nsys SQLite export (plain or .gz) into a streamed :class:`Trace`.

    The metadata is filled before the events are read; the events come
    table by table, in batches, so an export larger than memory streams.
    ``source`` names the file a temporary export was made from (for messages);
    ``owned`` is a temporary directory to remove once the events are read.
    """
    shown = source or path
    meta = TraceMeta(tool="nsys", warnings=options.warnings)  # the same list: no warning is lost
    workdir = tempfile.TemporaryDirectory(prefix="traceparse-nsys-")
    try:
        plain = decompressed(path, Path(workdir.name), options) if is_gzip(path) else path
        db = connect(plain)
        tables = tables_of(db, shown)
        check_tables(shown, tables)
        _fill_meta(db, tables, meta, shown)
        try:
            enums = _Enums(db, tables)
        except sqlite3.DatabaseError as exc:
            raise bad_input(shown, None, f"cannot be read: {exc}") from None
    except BaseException:
        workdir.cleanup()
        if owned is not None:
            owned.cleanup()
        raise
    if not is_gzip(path):
        options.progress(path.stat().st_size)
    return Trace(_events(db, tables, enums, shown, options, [workdir, *([owned] if owned else [])]), meta)


def _events(db: sqlite3.Connection, tables: set[str], enums: "_Enums", path: Path, options: ReadOptions,
            workdirs: list[tempfile.TemporaryDirectory]) -> Iterator[pl.DataFrame]:
    try:
        with closing(db):
            for table, query in _queries(db, tables, enums):
                unfit = _Unfit(table)
                try:
                    cursor = db.execute(query.sql)
                    while rows := cursor.fetchmany(BATCH_ROWS):
                        yield query.finish(unfit.frame(rows, query.schema), enums)
                except sqlite3.DatabaseError as exc:
                    raise bad_input(path, table, f"cannot be read: {exc}") from None
                if unfit.count:
                    options.warn(unfit.warning(path))
            if enums.open_ranges:
                options.warn(f"{path}: {enums.open_ranges} NVTX ranges have no end (still open when the capture "
                             "stopped); they are kept with a null duration")
    finally:
        for workdir in workdirs:
            workdir.cleanup()


class _Unfit:
    """Rows of one table whose values are not of their column's type, dropped and counted (one warning).

    SQLite columns take any type: a REAL 1e308 or the text "abc" in an INTEGER column of an edited export
    made polars' row builder fail with a ComputeError (exit 3). A batch that does not build is walked row by
    row; a row with a value its column cannot hold is left out, the first one quoted in the warning.
    """

    def __init__(self, table: str):
        self.table, self.count, self.seen = table, 0, 0
        self.first: tuple[int, str, object] | None = None

    def frame(self, rows: list[tuple], schema: list[tuple[str, pl.DataType]]) -> pl.DataFrame:
        """``rows`` as a frame of ``schema``, without the rows that do not fit it."""
        offset, self.seen = self.seen, self.seen + len(rows)
        try:
            return pl.DataFrame(rows, schema=schema, orient="row")
        except (pl.exceptions.PolarsError, TypeError, ValueError, OverflowError):
            pass
        kept = []
        for i, row in enumerate(rows):
            bad = next(((name, v) for (name, dtype), v in zip(schema, row) if not _fits(v, dtype)), None)
            if bad is None:
                kept.append(row)
                continue
            self.count += 1
            if self.first is None:
                self.first = (offset + i + 1, *bad)
        return pl.DataFrame(kept, schema=schema, orient="row")

    def warning(self, path: Path) -> str:
        row, column, value = self.first
        rows = "1 row" if self.count == 1 else f"{self.count:,} rows"
        return (f"{path}: {self.table}: dropped {rows} whose {column} is not of the column's type (first: row "
                f"{row}, {column}={excerpt(value)})")


def _fits(value: object, dtype: pl.DataType) -> bool:
    if value is None:
        return True
    if dtype == pl.String:
        return isinstance(value, str)
    if dtype.is_integer():
        return type(value) is int and -2**63 <= value < 2**63
    if dtype.is_float():
        return type(value) in (int, float)
    return True


# -- queries -----------------------------------------------------------------
class _Query:
    """One SELECT and how its rows become normalized columns."""

    def __init__(self, sql: str, schema: list[tuple[str, pl.DataType]], finish):
        self.sql, self.schema, self._finish = sql, schema, finish

    def finish(self, frame: pl.DataFrame, enums: "_Enums") -> pl.DataFrame:
        return self._finish(frame, enums)


def _columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in db.execute(f'PRAGMA table_info("{table}")')}


def _pick(cols: set[str], alias: str, column: str, name: str | None = None) -> str:
    """``alias.column AS name`` if the table has the column, else ``NULL AS name``."""
    return f'{alias}."{column}" AS {name or column}' if column in cols else f"NULL AS {name or column}"


_I = pl.Int64
_S = pl.String


def _queries(db: sqlite3.Connection, tables: set[str], enums: "_Enums") -> Iterator[tuple[str, _Query]]:
    if "CUPTI_ACTIVITY_KIND_KERNEL" in tables:
        yield "CUPTI_ACTIVITY_KIND_KERNEL", _kernel_query(_columns(db, "CUPTI_ACTIVITY_KIND_KERNEL"))
    if "CUPTI_ACTIVITY_KIND_MEMCPY" in tables:
        yield "CUPTI_ACTIVITY_KIND_MEMCPY", _memcpy_query(_columns(db, "CUPTI_ACTIVITY_KIND_MEMCPY"))
    if "CUPTI_ACTIVITY_KIND_MEMSET" in tables:
        yield "CUPTI_ACTIVITY_KIND_MEMSET", _memset_query(_columns(db, "CUPTI_ACTIVITY_KIND_MEMSET"))
    for table in ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER"):
        if table in tables:
            yield table, _api_query(table, _columns(db, table))
    if "NVTX_EVENTS" in tables:
        yield "NVTX_EVENTS", _nvtx_query(_columns(db, "NVTX_EVENTS"), "StringIds" in tables, enums)


def _gpu_common(cols: set[str], g: str = "globalPid") -> list[str]:
    pid = f"{_PID.format(g=f'a.{g}')} AS pid" if g in cols else "NULL AS pid"
    return ["a.start AS start", "a.\"end\" - a.start AS duration", _pick(cols, "a", "deviceId"),
            _pick(cols, "a", "contextId"), _pick(cols, "a", "streamId"), _pick(cols, "a", "correlationId"), pid]


_GPU_SCHEMA = [("start", _I), ("duration", _I), ("deviceId", _I), ("contextId", _I), ("streamId", _I),
               ("correlationId", _I), ("pid", _I)]


def _gpu_columns(frame: pl.DataFrame) -> dict[str, pl.Expr]:
    return {"start_ns": pl.col("start"), "duration_ns": pl.col("duration"), "device_id": pl.col("deviceId"),
            "context_id": pl.col("contextId"), "stream_id": pl.col("streamId"),
            "correlation_id": pl.col("correlationId"), "pid": pl.col("pid")}


def _kernel_query(cols: set[str]) -> _Query:
    names = [c for c in ("demangledName", "shortName", "mangledName") if c in cols]
    joins = "".join(f' LEFT JOIN StringIds n{i} ON n{i}.id = a."{c}"' for i, c in enumerate(names))
    name = f"COALESCE({', '.join(f'n{i}.value' for i in range(len(names)))})" if len(names) > 1 else (
        "n0.value" if names else "NULL")
    dims = ["gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ", "registersPerThread",
            "staticSharedMemory", "dynamicSharedMemory"]
    sql = (f"SELECT {', '.join(_gpu_common(cols))}, {name} AS name, "
           f"{', '.join(_pick(cols, 'a', d) for d in dims)} FROM CUPTI_ACTIVITY_KIND_KERNEL a{joins}")
    schema = [*_GPU_SCHEMA, ("name", _S), *[(d, _I) for d in dims]]

    def finish(frame: pl.DataFrame, enums: _Enums) -> pl.DataFrame:
        return frame.select(kind=pl.lit("kernel"), name=pl.col("name"), **_gpu_columns(frame),
                            grid_x="gridX", grid_y="gridY", grid_z="gridZ", block_x="blockX", block_y="blockY",
                            block_z="blockZ", registers_per_thread="registersPerThread",
                            static_smem_bytes="staticSharedMemory", dynamic_smem_bytes="dynamicSharedMemory")

    return _Query(sql, schema, finish)


def _memcpy_query(cols: set[str]) -> _Query:
    extra = ["bytes", "copyKind", "srcKind", "dstKind"]
    sql = (f"SELECT {', '.join(_gpu_common(cols))}, {', '.join(_pick(cols, 'a', c) for c in extra)} "
           "FROM CUPTI_ACTIVITY_KIND_MEMCPY a")
    schema = [*_GPU_SCHEMA, *[(c, _I) for c in extra]]

    def finish(frame: pl.DataFrame, enums: _Enums) -> pl.DataFrame:
        label = pl.col("copyKind").replace_strict(enums.copy_kind, default=None, return_dtype=pl.String)
        return frame.select(
            kind=pl.lit("memcpy"),
            name=pl.format("[CUDA memcpy {}]", label.fill_null("Unknown")),
            **_gpu_columns(frame),
            bytes="bytes",
            copy_kind=label.str.to_lowercase().replace_strict(memops.DIRECTIONS, default=None,
                                                               return_dtype=pl.String),
            src_memory=memops.memory_kind(pl.col("srcKind").replace_strict(enums.mem_kind, default=None,
                                                                           return_dtype=pl.String)),
            dst_memory=memops.memory_kind(pl.col("dstKind").replace_strict(enums.mem_kind, default=None,
                                                                           return_dtype=pl.String)),
        )

    return _Query(sql, schema, finish)


def _memset_query(cols: set[str]) -> _Query:
    sql = (f"SELECT {', '.join(_gpu_common(cols))}, {_pick(cols, 'a', 'bytes')}, {_pick(cols, 'a', 'memKind')} "
           "FROM CUPTI_ACTIVITY_KIND_MEMSET a")
    schema = [*_GPU_SCHEMA, ("bytes", _I), ("memKind", _I)]

    def finish(frame: pl.DataFrame, enums: _Enums) -> pl.DataFrame:
        return frame.select(
            kind=pl.lit("memset"), name=pl.lit(memops.MEMSET_NAME), **_gpu_columns(frame), bytes="bytes",
            dst_memory=memops.memory_kind(pl.col("memKind").replace_strict(enums.mem_kind, default=None,
                                                                           return_dtype=pl.String)),
        )

    return _Query(sql, schema, finish)


def _api_query(table: str, cols: set[str]) -> _Query:
    pid = _pid_tid(cols)
    sql = (f"SELECT a.start AS start, a.\"end\" - a.start AS duration, {_pick(cols, 'a', 'correlationId')}, {pid}, "
           f"s.value AS name, {_pick(cols, 'a', 'eventClass')} FROM {table} a "
           f"LEFT JOIN StringIds s ON s.id = a.nameId")
    schema = [("start", _I), ("duration", _I), ("correlationId", _I), ("pid", _I), ("tid", _I), ("name", _S),
              ("eventClass", _I)]
    default_group = "CUDA driver" if table.endswith("DRIVER") else None

    def finish(frame: pl.DataFrame, enums: _Enums) -> pl.DataFrame:
        group = pl.col("eventClass").replace_strict(enums.event_class, default=None, return_dtype=pl.String)
        return frame.select(kind=pl.lit("api"), name="name", start_ns="start", duration_ns="duration",
                            correlation_id="correlationId", pid="pid", tid="tid",
                            group=group.fill_null(pl.lit(default_group, dtype=pl.String)))

    return _Query(sql, schema, finish)


def _nvtx_query(cols: set[str], has_strings: bool, enums: "_Enums") -> _Query:
    text = _pick(cols, "a", "text")
    if "textId" in cols and has_strings:
        join = " LEFT JOIN StringIds s ON s.id = a.textId"
        text = "COALESCE(a.text, s.value) AS text" if "text" in cols else "s.value AS text"
    else:
        join = ""
    wanted = sorted({*enums.nvtx_ranges, *enums.nvtx_marks})
    pid = _pid_tid(cols)
    sql = (f"SELECT a.start AS start, a.\"end\" AS end_, a.eventType AS eventType, {text}, {pid}, "
           f"{_pick(cols, 'a', 'domainId')} FROM NVTX_EVENTS a{join} "
           f"WHERE a.eventType IN ({', '.join(map(str, wanted)) or 'NULL'})")
    schema = [("start", _I), ("end_", _I), ("eventType", _I), ("text", _S), ("pid", _I), ("tid", _I),
              ("domainId", _I)]

    def finish(frame: pl.DataFrame, enums: _Enums) -> pl.DataFrame:
        is_mark = pl.col("eventType").is_in(list(enums.nvtx_marks))
        enums.open_ranges += frame.filter(~is_mark & pl.col("end_").is_null()).height
        return frame.select(
            kind=pl.lit("marker"), name="text", start_ns="start",
            duration_ns=pl.when(is_mark).then(pl.lit(0, dtype=pl.Int64)).otherwise(pl.col("end_") - pl.col("start")),
            pid="pid", tid="tid",
            group=pl.col("domainId").replace_strict(enums.nvtx_domains, default=None, return_dtype=pl.String),
        )

    return _Query(sql, schema, finish)


# -- enums and metadata ------------------------------------------------------
class _Enums:
    """Label lookups from the export's ENUM_* tables, with nsys's numbering where an export lacks them."""

    def __init__(self, db: sqlite3.Connection, tables: set[str]):
        self.copy_kind = _enum(db, tables, "ENUM_CUDA_MEMCPY_OPER") or dict(memops.FALLBACK_COPY_KIND)
        self.mem_kind = _enum(db, tables, "ENUM_CUDA_MEM_KIND") or dict(memops.FALLBACK_MEM_KIND)
        self.event_class = _enum(db, tables, "ENUM_NSYS_EVENT_CLASS")
        types = _enum(db, tables, "ENUM_NSYS_EVENT_TYPE", "name")
        if types:
            self.nvtx_ranges = {i for i, n in types.items() if n.startswith("Nvtx") and n.endswith("Range")}
            self.nvtx_marks = {i for i, n in types.items() if n == "NvtxMark"}
            domain_create = {i for i, n in types.items() if n == "NvtxDomainCreate"}
        else:
            self.nvtx_ranges, self.nvtx_marks = set(NVTX_RANGE_TYPES), set(NVTX_MARK_TYPES)
            domain_create = {NVTX_DOMAIN_CREATE}
        self.nvtx_domains = _nvtx_domains(db, tables, domain_create)
        self.open_ranges = 0


def _enum(db: sqlite3.Connection, tables: set[str], table: str, prefer: str = "label") -> dict[int, str]:
    if table not in tables:
        return {}
    cols = _columns(db, table)
    column = prefer if prefer in cols else "label" if "label" in cols else "name" if "name" in cols else None
    if column is None or "id" not in cols:
        return {}
    return {i: str(v) for i, v in db.execute(f'SELECT id, "{column}" FROM {table}')
            if v is not None and type(i) is int}  # an id that is no integer names nothing


def _nvtx_domains(db: sqlite3.Connection, tables: set[str], create_types: set[int]) -> dict[int, str]:
    if "NVTX_EVENTS" not in tables or not create_types:
        return {}
    cols = _columns(db, "NVTX_EVENTS")
    if "domainId" not in cols:
        return {}
    text = "a.text" if "text" in cols else "NULL"
    join = ""
    if "textId" in cols and "StringIds" in tables:
        text, join = f"COALESCE({text}, s.value)", " LEFT JOIN StringIds s ON s.id = a.textId"
    rows = db.execute(f"SELECT a.domainId, {text} FROM NVTX_EVENTS a{join} "
                      f"WHERE a.eventType IN ({', '.join(map(str, create_types))})")
    return {int(d): str(t) for d, t in rows if d is not None and t is not None}


#: Device field -> column names it has had (TARGET_INFO_GPU first, then TARGET_INFO_CUDA_GPU).
_DEVICE_COLUMNS = {
    "id": ("id", "deviceId"),
    "name": ("name",),
    "sm_count": ("smCount", "numMultiprocessors"),
    "memory_bytes": ("totalMemory", "totalGlobalMem", "globalMemorySize"),
    "cc_major": ("computeMajor", "computeCapabilityMajor"),
    "cc_minor": ("computeMinor", "computeCapabilityMinor"),
}


def _devices(db: sqlite3.Connection, tables: set[str]) -> list[Device]:
    table = next((t for t in ("TARGET_INFO_GPU", "TARGET_INFO_CUDA_GPU") if t in tables), None)
    if table is None:
        return []
    cursor = db.execute(f"SELECT * FROM {table}")
    names = [d[0] for d in cursor.description]
    cuda_ids = _cuda_ordinals(db, tables)
    devices = []
    for row in cursor:
        record = dict(zip(names, row))
        get = {field: next((record[c] for c in options if record.get(c) is not None), None)
               for field, options in _DEVICE_COLUMNS.items()}
        used = {c for options in _DEVICE_COLUMNS.values() for c in options}
        extra = {k: v for k, v in record.items() if k not in used and v not in (None, "")}
        clock_hz = record.get("clockRate") if table == "TARGET_INFO_GPU" else None  # documented in Hz there
        if get["id"] is not None and get["id"] in cuda_ids:
            extra["cuda_ordinals"] = cuda_ids[get["id"]]
        devices.append(Device(
            id=get["id"], name=get["name"], sm_count=get["sm_count"], memory_bytes=get["memory_bytes"],
            compute_capability=(f"{get['cc_major']}.{get['cc_minor']}"
                                if get["cc_major"] is not None and get["cc_minor"] is not None else None),
            core_clock_mhz=clock_hz / 1e6 if isinstance(clock_hz, (int, float)) and clock_hz else None,
            extra=extra,
        ))
    return sorted(devices, key=lambda d: (type(d.id) is not int, d.id if type(d.id) is int else 0))


def _cuda_ordinals(db: sqlite3.Connection, tables: set[str]) -> dict[int, list[dict]]:
    if "TARGET_INFO_CUDA_DEVICE" not in tables:
        return {}
    cols = _columns(db, "TARGET_INFO_CUDA_DEVICE")
    if not {"gpuId", "cudaId"} <= cols:
        return {}
    pid = "pid" if "pid" in cols else "NULL"
    out: dict[int, list[dict]] = {}
    for gpu, cuda, p in db.execute(f"SELECT gpuId, cudaId, {pid} FROM TARGET_INFO_CUDA_DEVICE"):
        if type(gpu) is int:  # SQLite columns take any type
            out.setdefault(gpu, []).append({"cuda_id": cuda, "pid": p})
    return out


def _fill_meta(db: sqlite3.Connection, tables: set[str], meta: TraceMeta, path: Path) -> None:
    try:
        meta.devices = _devices(db, tables)
        export = _key_values(db, tables, "META_DATA_EXPORT")
        version = export.get("EXPORT_PRODUCT_VERSION")
        meta.tool_version = version
        meta.variant = "nsys SQLite export" + (f" (schema {export['EXPORT_SCHEMA_VERSION']})"
                                              if "EXPORT_SCHEMA_VERSION" in export else "")
        meta.extra["tables_read"] = [t for t in EVENT_TABLES if t in tables]
        for key in ("EXPORT_SCHEMA_VERSION", "EXPORT_PRODUCT_DATE", "EXPORT_PARAM_INPUT_FILE",
                    "EXPORT_PARAM_TIME_NORMALIZE"):
            if key in export:
                meta.extra[key.lower()] = export[key]
        if "TARGET_INFO_SESSION_START_TIME" in tables and "utcEpochNs" in _columns(db, "TARGET_INFO_SESSION_START_TIME"):
            row = db.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1").fetchone()
            if row and row[0]:
                meta.extra["session_start_utc_ns"] = row[0]
        meta.extra["processes"] = _processes(db, tables)
        names = _thread_names(db, tables)
        if names:
            meta.extra["thread_names"] = names
    except sqlite3.DatabaseError as exc:
        raise bad_input(path, None, f"cannot be read: {exc}") from None


def _key_values(db: sqlite3.Connection, tables: set[str], table: str) -> dict[str, str]:
    if table not in tables or not {"name", "value"} <= _columns(db, table):
        return {}
    return {str(k): str(v) for k, v in db.execute(f"SELECT name, value FROM {table}") if v is not None}


def _thread_names(db: sqlite3.Connection, tables: set[str]) -> dict[str, str]:
    """``pid/tid`` -> thread name (``ThreadNames``), for the threads that made CUDA calls."""
    if ("ThreadNames" not in tables or "StringIds" not in tables
            or not {"nameId", "globalTid"} <= _columns(db, "ThreadNames")):
        return {}
    active = [f"SELECT DISTINCT globalTid AS g FROM {table}" for table in
              ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER")
              if table in tables and "globalTid" in _columns(db, table)]
    if not active:
        return {}
    sql = (f"SELECT {_PID.format(g='t.globalTid')}, {_TID.format(g='t.globalTid')}, s.value FROM ThreadNames t "
           f"JOIN StringIds s ON s.id = t.nameId WHERE t.globalTid IN ({' UNION '.join(active)})")
    return {f"{p}/{t}": str(n) for p, t, n in db.execute(sql) if n}


def _processes(db: sqlite3.Connection, tables: set[str]) -> dict[str, str]:
    """pid -> process name, for the processes that have GPU activity or CUDA calls."""
    if "PROCESSES" not in tables or not {"pid", "name", "globalPid"} <= _columns(db, "PROCESSES"):
        return {}
    active: list[str] = []
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        if table in tables and "globalPid" in _columns(db, table):
            active.append(f"SELECT DISTINCT {_PID.format(g='globalPid')} AS p FROM {table}")
    for table in ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER"):
        if table in tables and "globalTid" in _columns(db, table):
            active.append(f"SELECT DISTINCT {_PID.format(g='globalTid')} AS p FROM {table}")
    if not active:
        return {}
    sql = (f"SELECT DISTINCT pid, name FROM PROCESSES WHERE pid IN ({' UNION '.join(active)}) ORDER BY pid")
    return {str(p): n for p, n in db.execute(sql) if p is not None}
