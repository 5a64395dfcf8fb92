"""Reader of the Nsight Systems export: SQLite (``nsys export --type sqlite``, gzip-compressed or not), and
the same tables as a directory of Parquet (``--type parquetdir``) or Arrow (``--type arrowdir``) files.

The queries are written once; :mod:`.tables` runs them over SQLite or over the
files (polars' SQL), so the three forms of one capture give the same events.

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
  API calls, ``nameId`` into ``StringIds`` without a version suffix
  (:mod:`.api_names`: ``cudaGraphLaunch_v10000`` is ``cudaGraphLaunch``), one record per call (nsys 2022's
  entry point nested inside its call, same ``correlationId``, is left out);
  ``group`` is the event class
  (``CUDA runtime`` / ``CUDA driver``) from ``ENUM_NSYS_EVENT_CLASS`` (0 and 1 without it).
* ``NVTX_EVENTS``: push/pop and start/end ranges become markers with their
  duration, marks markers of duration 0; the text is ``text`` or ``textId``;
  ``group`` is the NVTX domain's name (null for the default domain).
* ``TARGET_INFO_GPU`` (``TARGET_INFO_CUDA_GPU`` before 2021.2; both, merged by device id, in between) for devices,
  ``TARGET_INFO_CUDA_DEVICE`` for the CUDA ordinal each process saw,
  ``PROCESSES`` for process names, ``META_DATA_EXPORT`` (``EXPORT_META_DATA`` in nsys 2022) for the version.

Process and thread ids come from nsys's serialized global ids as its own
report scripts decode them: pid = (globalTid >> 24) & 0xFFFFFF, tid =
globalTid & 0xFFFFFF (checked on the sample: globalPid 281545373908992 gives
pid 4196, the pid PROCESSES and TARGET_INFO_CUDA_CONTEXT_INFO give).
Timestamps are the export's integer ns. The database is opened read-only.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import polars as pl

from traceparse.errors import bad_input, spelled
from traceparse.meta import CLOCK_ORIGIN_UTC_NS, GPU_PROCESSES, HOSTNAMES
from traceparse.reader import ReadOptions
from traceparse.sources import GZIP_DAMAGE, damaged_gzip, is_gzip
from traceparse.trace import Device, Trace, TraceMeta

from traceparse_plugins.readers.nsys import memops
from traceparse_plugins.readers.nsys.api_names import api_name
from traceparse_plugins.readers.nsys.tables import FileTables, SqliteTables, Tables, Unfit, connect

__all__ = ["EVENT_TABLES", "check_tables", "connect", "read_export_dir", "read_sqlite"]
EVENT_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
                "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER", "NVTX_EVENTS")
#: NVTX event types of nsys (ENUM_NSYS_EVENT_TYPE), for exports without that table.
NVTX_RANGE_TYPES = {59: "NvtxPushPopRange", 60: "NvtxStartEndRange", 70: "NvtxtPushPopRange",
                    71: "NvtxtStartEndRange"}
NVTX_MARK_TYPES = {34: "NvtxMark"}
NVTX_DOMAIN_CREATE = 75
#: API event classes of nsys (ENUM_NSYS_EVENT_CLASS), for exports without that table (2020 to 2022.2, schema up to
#: 2.9.1): their CUPTI_ACTIVITY_KIND_RUNTIME numbers them the same way (a real 2022.2.1 export has its cuda* calls
#: in class 0 and its one driver call, cuModuleGetLoadingMode, in class 1).
FALLBACK_EVENT_CLASS = {0: "CUDA runtime", 1: "CUDA driver"}


def _pid(db: Tables, column: str) -> str:
    """SQL for the pid in an nsys global id: (id >> 24) & 0xFFFFFF."""
    return db.shifted(column, 24)


def _tid(db: Tables, column: str) -> str:
    """SQL for the tid in an nsys global id: id & 0xFFFFFF."""
    return db.shifted(column, 0)


def _pid_tid(db: Tables, cols: set[str]) -> str:
    """The SELECT terms for pid and tid, decoded from globalTid where the table has it."""
    if "globalTid" not in cols:
        return "NULL AS pid, NULL AS tid"
    return f"{_pid(db, 'a.globalTid')} AS pid, {_tid(db, 'a.globalTid')} AS tid"


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


def check_tables(path: Path, tables: set[str], noun: str = "SQLite file") -> None:
    """One-line error unless this is an nsys export with at least one table of events traceparse reads."""
    if "StringTable" in tables and "StringIds" not in tables:
        raise bad_input(path, None, "an nvprof SQLite profile (StringTable), not an Nsight Systems export: "
                                    f"read it with {spelled('--format nvprof', 'fmt=' + repr('nvprof'))}")
    present = [t for t in EVENT_TABLES if t in tables]
    if not present:
        raise bad_input(path, None, f"none of the tables traceparse reads is in this {noun} "
                                    f"(expected at least one of {', '.join(EVENT_TABLES)}: an Nsight Systems "
                                    "export of a capture with -t cuda or -t nvtx)")
    needs_names = [t for t in present if t != "NVTX_EVENTS"]
    if needs_names and "StringIds" not in tables:
        missing = "table StringIds is missing" if noun == "SQLite file" else (
            "StringIds.parquet (or StringIds.arrow) is missing from the directory")
        raise bad_input(path, None, f"{missing} (the names of {needs_names[0]} are ids into it)")


def read_sqlite(path: Path, options: ReadOptions, *, source: Path | None = None,
                owned: tempfile.TemporaryDirectory | None = None) -> Trace:
    """Read an nsys SQLite export (plain or .gz) into a streamed :class:`Trace`.

    The metadata is filled before the events are read; the events come
    table by table, in batches, so an export larger than memory streams.
    ``source`` names the file a temporary export was made from (for messages);
    ``owned`` is a temporary directory to remove once the events are read.
    """
    shown = source or path
    workdir = tempfile.TemporaryDirectory(prefix="traceparse-nsys-")
    workdirs = [workdir, *([owned] if owned else [])]
    try:
        plain = decompressed(path, Path(workdir.name), options) if is_gzip(path) else path
        db = SqliteTables(plain, shown)
        trace = _read(db, "nsys SQLite export", options, workdirs)
    except BaseException:
        for w in workdirs:
            w.cleanup()
        raise
    if not is_gzip(path):
        options.progress(path.stat().st_size)
    return trace


def read_export_dir(directory: Path, options: ReadOptions) -> Trace:
    """Read a directory of per-table Parquet or Arrow files (``nsys export --type parquetdir|arrowdir``).

    The same queries as the SQLite export run over the files through polars'
    SQL (no DuckDB needed), so the events, devices and metadata are those of
    the SQLite export of the same capture.
    """
    db = FileTables(directory)
    form = db.noun.removesuffix(" directory")
    trace = _read(db, f"nsys {form} export", options, [])
    options.progress(sum(p.stat().st_size for p in db.files.values()))
    return trace


def _read(db: Tables, variant: str, options: ReadOptions, workdirs: list) -> Trace:
    """Metadata first (checked tables, devices, enums), then the events streamed table by table."""
    meta = TraceMeta(tool="nsys", warnings=options.warnings)  # the same list: no warning is lost
    try:
        check_tables(db.path, db.names, db.noun)
        _fill_meta(db, meta, variant)
        try:
            enums = _Enums(db)
        except db.errors as exc:
            raise bad_input(db.path, None, f"cannot be read: {exc}") from None
        if enums.per_process_correlation:
            meta.extra["correlation_ids"] = "pid * 2^32 + correlationId (nsys counts them per process)"
    except BaseException:
        db.close()
        raise
    return Trace(_events(db, enums, options, workdirs), meta)


def _events(db: Tables, enums: "_Enums", options: ReadOptions,
            workdirs: list[tempfile.TemporaryDirectory]) -> Iterator[pl.DataFrame]:
    path = db.path
    try:
        for table, query in _queries(db, enums):
            unfit = Unfit(table)
            try:
                for frame in db.frames(query.sql, query.schema, unfit):
                    yield query.finish(frame, enums)
            except db.errors as exc:
                raise bad_input(path, table, f"cannot be read: {exc}") from None
            if unfit.count:
                options.warn(unfit.warning(path))
        if enums.open_ranges:
            options.warn(f"{path}: {enums.open_ranges} NVTX ranges have no end (still open when the capture "
                         "stopped); they are kept with a null duration")
    finally:
        db.close()
        for workdir in workdirs:
            workdir.cleanup()


# -- queries -----------------------------------------------------------------
class _Query:
    """One SELECT and how its rows become normalized columns."""

    def __init__(self, sql: str, schema: list[tuple[str, pl.DataType]], finish):
        self.sql, self.schema, self._finish = sql, schema, finish

    def finish(self, frame: pl.DataFrame, enums: "_Enums") -> pl.DataFrame:
        return self._finish(frame, enums)


def _pick(cols: set[str], alias: str, column: str, name: str | None = None) -> str:
    """``alias.column AS name`` if the table has the column, else ``NULL AS name``."""
    return f'{alias}."{column}" AS {name or column}' if column in cols else f"NULL AS {name or column}"


_I = pl.Int64
_S = pl.String


def _queries(db: Tables, enums: "_Enums") -> Iterator[tuple[str, _Query]]:
    tables = db.names
    if "CUPTI_ACTIVITY_KIND_KERNEL" in tables:
        yield "CUPTI_ACTIVITY_KIND_KERNEL", _kernel_query(db, db.columns("CUPTI_ACTIVITY_KIND_KERNEL"))
    if "CUPTI_ACTIVITY_KIND_MEMCPY" in tables:
        yield "CUPTI_ACTIVITY_KIND_MEMCPY", _memcpy_query(db, db.columns("CUPTI_ACTIVITY_KIND_MEMCPY"))
    if "CUPTI_ACTIVITY_KIND_MEMSET" in tables:
        yield "CUPTI_ACTIVITY_KIND_MEMSET", _memset_query(db, db.columns("CUPTI_ACTIVITY_KIND_MEMSET"))
    for table in ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER"):
        if table in tables:
            yield table, _api_query(db, table, db.columns(table))
    if "NVTX_EVENTS" in tables:
        yield "NVTX_EVENTS", _nvtx_query(db, db.columns("NVTX_EVENTS"), "StringIds" in tables, enums)


def _gpu_common(db: Tables, cols: set[str], g: str = "globalPid") -> list[str]:
    pid = f"{_pid(db, f'a.{g}')} AS pid" if g in cols else "NULL AS pid"
    return ["a.start AS start", "a.\"end\" - a.start AS duration", _pick(cols, "a", "deviceId"),
            _pick(cols, "a", "contextId"), _pick(cols, "a", "streamId"), _pick(cols, "a", "correlationId"), pid]


_GPU_SCHEMA = [("start", _I), ("duration", _I), ("deviceId", _I), ("contextId", _I), ("streamId", _I),
               ("correlationId", _I), ("pid", _I)]


def _gpu_columns(frame: pl.DataFrame, enums: "_Enums") -> dict[str, pl.Expr]:
    return {"start_ns": pl.col("start"), "duration_ns": pl.col("duration"), "device_id": pl.col("deviceId"),
            "context_id": pl.col("contextId"), "stream_id": pl.col("streamId"),
            "correlation_id": _correlation(enums), "pid": pl.col("pid")}


#: In an export of several processes a row's correlation id is pid * PROCESS_CORRELATION + its correlationId.
PROCESS_CORRELATION = 2**32


def _correlation(enums: "_Enums") -> pl.Expr:
    """The correlation id of a row: CUPTI's ``correlationId``, which counts per process, so in an export of
    several processes (one report of a whole torchrun job) ``pid`` × 2^32 + it, unique across them (measured:
    13 of 690 kernel ids and 4,852 runtime-call ids occur in both ranks' processes of fixtures/nsys/nccl_run's
    job report; linked by the id alone, a kernel of one rank was its launch call in the other)."""
    corr = pl.col("correlationId")
    if not enums.per_process_correlation:
        return corr
    return pl.when(pl.col("pid").is_not_null() & corr.is_between(0, PROCESS_CORRELATION - 1)).then(
        pl.col("pid") * PROCESS_CORRELATION + corr).otherwise(corr)


def _kernel_query(db: Tables, cols: set[str]) -> _Query:
    names = [c for c in ("demangledName", "shortName", "mangledName") if c in cols]
    joins = "".join(f' LEFT JOIN StringIds n{i} ON n{i}.id = a."{c}"' for i, c in enumerate(names))
    name = f"COALESCE({', '.join(f'n{i}.value' for i in range(len(names)))})" if len(names) > 1 else (
        "n0.value" if names else "NULL")
    dims = ["gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ", "registersPerThread",
            "staticSharedMemory", "dynamicSharedMemory"]
    sql = (f"SELECT {', '.join(_gpu_common(db, cols))}, {name} AS name, "
           f"{', '.join(_pick(cols, 'a', d) for d in dims)} FROM CUPTI_ACTIVITY_KIND_KERNEL a{joins}")
    schema = [*_GPU_SCHEMA, ("name", _S), *[(d, _I) for d in dims]]

    def finish(frame: pl.DataFrame, enums: _Enums) -> pl.DataFrame:
        return frame.select(kind=pl.lit("kernel"), name=pl.col("name"), **_gpu_columns(frame, enums),
                            grid_x="gridX", grid_y="gridY", grid_z="gridZ", block_x="blockX", block_y="blockY",
                            block_z="blockZ", registers_per_thread="registersPerThread",
                            static_smem_bytes="staticSharedMemory", dynamic_smem_bytes="dynamicSharedMemory")

    return _Query(sql, schema, finish)


def _memcpy_query(db: Tables, cols: set[str]) -> _Query:
    extra = ["bytes", "copyKind", "srcKind", "dstKind"]
    sql = (f"SELECT {', '.join(_gpu_common(db, cols))}, {', '.join(_pick(cols, 'a', c) for c in extra)} "
           "FROM CUPTI_ACTIVITY_KIND_MEMCPY a")
    schema = [*_GPU_SCHEMA, *[(c, _I) for c in extra]]

    def finish(frame: pl.DataFrame, enums: _Enums) -> pl.DataFrame:
        label = pl.col("copyKind").replace_strict(enums.copy_kind, default=None, return_dtype=pl.String)
        return frame.select(
            kind=pl.lit("memcpy"),
            name=pl.format("[CUDA memcpy {}]", label.fill_null("Unknown")),
            **_gpu_columns(frame, enums),
            bytes="bytes",
            copy_kind=label.str.to_lowercase().replace_strict(memops.DIRECTIONS, default=None,
                                                               return_dtype=pl.String),
            src_memory=memops.memory_kind(pl.col("srcKind").replace_strict(enums.mem_kind, default=None,
                                                                           return_dtype=pl.String)),
            dst_memory=memops.memory_kind(pl.col("dstKind").replace_strict(enums.mem_kind, default=None,
                                                                           return_dtype=pl.String)),
        )

    return _Query(sql, schema, finish)


def _memset_query(db: Tables, cols: set[str]) -> _Query:
    sql = (f"SELECT {', '.join(_gpu_common(db, cols))}, {_pick(cols, 'a', 'bytes')}, {_pick(cols, 'a', 'memKind')} "
           "FROM CUPTI_ACTIVITY_KIND_MEMSET a")
    schema = [*_GPU_SCHEMA, ("bytes", _I), ("memKind", _I)]

    def finish(frame: pl.DataFrame, enums: _Enums) -> pl.DataFrame:
        return frame.select(
            kind=pl.lit("memset"), name=pl.lit(memops.MEMSET_NAME), **_gpu_columns(frame, enums), bytes="bytes",
            dst_memory=memops.memory_kind(pl.col("memKind").replace_strict(enums.mem_kind, default=None,
                                                                           return_dtype=pl.String)),
        )

    return _Query(sql, schema, finish)


def _api_query(db: Tables, table: str, cols: set[str]) -> _Query:
    pid = _pid_tid(db, cols)
    sql = (f"SELECT a.start AS start, a.\"end\" - a.start AS duration, {_pick(cols, 'a', 'correlationId')}, {pid}, "
           f"s.value AS name, {_pick(cols, 'a', 'eventClass')} FROM {table} a "
           f"LEFT JOIN StringIds s ON s.id = a.nameId")
    schema = [("start", _I), ("duration", _I), ("correlationId", _I), ("pid", _I), ("tid", _I), ("name", _S),
              ("eventClass", _I)]
    default_group = "CUDA driver" if table.endswith("DRIVER") else None

    def finish(frame: pl.DataFrame, enums: _Enums) -> pl.DataFrame:
        group = pl.col("eventClass").replace_strict(enums.event_class, default=None, return_dtype=pl.String)
        frame = _one_record_per_call(frame)
        return frame.select(kind=pl.lit("api"), name=api_name(pl.col("name")),
                            start_ns="start", duration_ns="duration",
                            correlation_id=_correlation(enums), pid="pid", tid="tid",
                            group=group.fill_null(pl.lit(default_group, dtype=pl.String)))

    return _Query(sql, schema, finish)


def _one_record_per_call(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame``'s API records less those nested inside another record of the same call: nsys 2022 records a call
    twice, the entry point inside the call (``cudaMalloc_v3020`` within ``cudaMalloc``, one thread, one
    ``correlationId``, which is one call's); counted both, a real 2022.2 export read 95 calls taking 1.088 s where it
    made 50 taking 703.1 ms (hpcgroup/pipit's saxpy-mpi-cuda_nsys_perlmutter0.sqlite). The outer record is kept:
    the call as the program made it, its time whole. Records of no correlation id are kept as they are."""
    if frame.height == 0 or frame["correlationId"].null_count() == frame.height:
        return frame
    call = ["pid", "tid", "correlationId"]
    order = frame.with_row_index("_row").sort([*call, "start", "duration"], descending=[False] * 4 + [True],
                                              nulls_last=True)
    end = pl.col("start") + pl.col("duration")
    inner = (pl.col("correlationId").is_not_null() & (pl.int_range(pl.len()).over(call) > 0)
             & (pl.col("start") >= pl.col("start").first().over(call)) & (end <= end.first().over(call)))
    drop = order.filter(inner)["_row"]
    if drop.len() == 0:
        return frame
    return frame.with_row_index("_row").filter(~pl.col("_row").is_in(drop.implode())).drop("_row")


def _nvtx_query(db: Tables, cols: set[str], has_strings: bool, enums: "_Enums") -> _Query:
    text = _pick(cols, "a", "text")
    if "textId" in cols and has_strings:
        join = " LEFT JOIN StringIds s ON s.id = a.textId"
        text = "COALESCE(a.text, s.value) AS text" if "text" in cols else "s.value AS text"
    else:
        join = ""
    wanted = sorted({*enums.nvtx_ranges, *enums.nvtx_marks})
    pid = _pid_tid(db, cols)
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

    def __init__(self, db: Tables):
        self.copy_kind = _enum(db, "ENUM_CUDA_MEMCPY_OPER") or dict(memops.FALLBACK_COPY_KIND)
        self.mem_kind = _enum(db, "ENUM_CUDA_MEM_KIND") or dict(memops.FALLBACK_MEM_KIND)
        self.event_class = _enum(db, "ENUM_NSYS_EVENT_CLASS") or dict(FALLBACK_EVENT_CLASS)
        types = _enum(db, "ENUM_NSYS_EVENT_TYPE", "name")
        if types:
            self.nvtx_ranges = {i for i, n in types.items() if n.startswith("Nvtx") and n.endswith("Range")}
            self.nvtx_marks = {i for i, n in types.items() if n == "NvtxMark"}
            domain_create = {i for i, n in types.items() if n == "NvtxDomainCreate"}
        else:
            self.nvtx_ranges, self.nvtx_marks = set(NVTX_RANGE_TYPES), set(NVTX_MARK_TYPES)
            domain_create = {NVTX_DOMAIN_CREATE}
        self.nvtx_domains = _nvtx_domains(db, domain_create)
        self.open_ranges = 0
        #: correlation ids count per process: made unique where GPU rows and API calls come from several
        self.per_process_correlation = len(_correlated_processes(db)) > 1


def _enum(db: Tables, table: str, prefer: str = "label") -> dict[int, str]:
    if table not in db.names:
        return {}
    cols = db.columns(table)
    column = prefer if prefer in cols else "label" if "label" in cols else "name" if "name" in cols else None
    if column is None or "id" not in cols:
        return {}
    return {i: str(v) for i, v in db.rows(f'SELECT id, "{column}" FROM {table}')
            if v is not None and type(i) is int}  # an id that is no integer names nothing


def _nvtx_domains(db: Tables, create_types: set[int]) -> dict[int, str]:
    tables = db.names
    if "NVTX_EVENTS" not in tables or not create_types:
        return {}
    cols = db.columns("NVTX_EVENTS")
    if "domainId" not in cols:
        return {}
    text = "a.text" if "text" in cols else "NULL"
    join = ""
    if "textId" in cols and "StringIds" in tables:
        text, join = f"COALESCE({text}, s.value)", " LEFT JOIN StringIds s ON s.id = a.textId"
    rows = db.rows(f"SELECT a.domainId, {text} FROM NVTX_EVENTS a{join} "
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


def _devices(db: Tables) -> list[Device]:
    table = next((t for t in ("TARGET_INFO_GPU", "TARGET_INFO_CUDA_GPU") if t in db.names), None)
    if table is None:
        return []
    names, rows = db.records(f"SELECT * FROM {table}")
    cuda_ids = _cuda_ordinals(db)
    details = _cuda_gpu_details(db) if table == "TARGET_INFO_GPU" else {}
    devices = []
    for row in rows:
        record = dict(zip(names, row))
        device_id = next((record[c] for c in _DEVICE_COLUMNS["id"] if record.get(c) is not None), None)
        for column, value in details.get(device_id, {}).items():
            if record.get(column) is None:
                record[column] = value
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


def _cuda_gpu_details(db: Tables) -> dict[int, dict]:
    """deviceId -> the TARGET_INFO_CUDA_GPU row, for exports that have both device tables.

    Exports of about 2020.5-2021.1 (no META_DATA_EXPORT) write a TARGET_INFO_GPU of only ``vmId``, ``deviceId``,
    ``name``, ``busLocation``, ``isDiscrete``, and the SM count, memory size and compute capability in
    TARGET_INFO_CUDA_GPU beside it (one row per device and process): the two are merged by device id."""
    if "TARGET_INFO_CUDA_GPU" not in db.names or "deviceId" not in db.columns("TARGET_INFO_CUDA_GPU"):
        return {}
    names, rows = db.records("SELECT * FROM TARGET_INFO_CUDA_GPU")
    out: dict[int, dict] = {}
    for row in rows:
        record = dict(zip(names, row))
        if type(record["deviceId"]) is int:
            out.setdefault(record["deviceId"], record)
    return out


def _cuda_ordinals(db: Tables) -> dict[int, list[dict]]:
    if "TARGET_INFO_CUDA_DEVICE" not in db.names:
        return {}
    cols = db.columns("TARGET_INFO_CUDA_DEVICE")
    if not {"gpuId", "cudaId"} <= cols:
        return {}
    pid = "pid" if "pid" in cols else "NULL"
    out: dict[int, list[dict]] = {}
    for gpu, cuda, p in db.rows(f"SELECT gpuId, cudaId, {pid} FROM TARGET_INFO_CUDA_DEVICE"):
        if type(gpu) is int:  # SQLite columns take any type
            out.setdefault(gpu, []).append({"cuda_id": cuda, "pid": p})
    return out


def _fill_meta(db: Tables, meta: TraceMeta, variant: str) -> None:
    tables = db.names
    try:
        meta.devices = _devices(db)
        # nsys 2023 on names it META_DATA_EXPORT; 2022.x EXPORT_META_DATA (same keys)
        export = _key_values(db, "META_DATA_EXPORT") or _key_values(db, "EXPORT_META_DATA")
        version = export.get("EXPORT_PRODUCT_VERSION")
        meta.tool_version = version
        meta.variant = variant + (f" (schema {export['EXPORT_SCHEMA_VERSION']})"
                                  if "EXPORT_SCHEMA_VERSION" in export else "")
        meta.extra["tables_read"] = [t for t in EVENT_TABLES if t in tables]
        for key in ("EXPORT_SCHEMA_VERSION", "EXPORT_PRODUCT_DATE", "EXPORT_PARAM_INPUT_FILE",
                    "EXPORT_PARAM_TIME_NORMALIZE"):
            if key in export:
                meta.extra[key.lower()] = export[key]
        if ("TARGET_INFO_SESSION_START_TIME" in tables
                and "utcEpochNs" in db.columns("TARGET_INFO_SESSION_START_TIME")):
            row = db.rows("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1")
            if row and row[0][0]:
                meta.extra["session_start_utc_ns"] = row[0][0]
                # The export's times count from its session's start (measured on nsys 2025.3.1: two per-rank
                # reports of one job, sessions started 6.19 ms apart, have every NCCL collective's ends 6.2 ms
                # apart; moved by the difference of utcEpochNs they end together, as in one report of the job).
                # Only for an export that says its times are as recorded (EXPORT_PARAM_TIME_NORMALIZE false, no
                # time shift), as measured: not one made with --ts-normalize or a time shift, nor an export that
                # does not say.
                shifted = any(export.get(k, "0") not in ("0", "") for k in ("EXPORT_PARAM_TIME_SHIFT",
                                                                            "EXPORT_CONFIG_TIME_SHIFT"))
                as_recorded = export.get("EXPORT_PARAM_TIME_NORMALIZE", "").lower() == "false"
                if type(row[0][0]) is int and as_recorded and not shifted:
                    meta.extra[CLOCK_ORIGIN_UTC_NS] = row[0][0]
        if "TARGET_INFO_SYSTEM_ENV" in tables and {"name", "value"} <= set(db.columns("TARGET_INFO_SYSTEM_ENV")):
            hostnames = [v for (v,) in db.rows("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'")
                         if isinstance(v, str) and v.strip()]  # one per target (host) of the capture
            if hostnames:
                meta.extra[HOSTNAMES] = list(dict.fromkeys(hostnames))
        meta.extra["processes"] = _processes(db)
        gpu = _gpu_processes(db)
        if len(gpu) > 1:
            meta.extra[GPU_PROCESSES] = gpu
            names = meta.extra["processes"]
            each = "; ".join(f"pid {pid}{f' ({names[pid]})' if names.get(pid) else ''}: GPU "
                             f"{', '.join(map(str, devices))}" for pid, devices in list(gpu.items())[:8])
            more = f"; and {len(gpu) - 8:,} more" if len(gpu) > 8 else ""
            meta.warnings.append(
                f"{db.path}: {len(gpu)} processes ran GPU work in this one report ({each}{more}): it is read as "
                "one trace, not a run of ranks; its figures are per GPU, and a step is every process's range of "
                "that step taken together (consecutive steps can overlap by the processes' skew). For per-rank "
                "figures profile each rank into its own report (nsys profile -o rank%q{RANK} under torchrun) and "
                "ingest the reports together as a run")
        names = _thread_names(db)
        if names:
            meta.extra["thread_names"] = names
    except db.errors as exc:
        raise bad_input(db.path, None, f"cannot be read: {exc}") from None


def _key_values(db: Tables, table: str) -> dict[str, str]:
    if table not in db.names or not {"name", "value"} <= db.columns(table):
        return {}
    return {str(k): str(v) for k, v in db.rows(f"SELECT name, value FROM {table}") if v is not None}


def _thread_names(db: Tables) -> dict[str, str]:
    """``pid/tid`` -> thread name (``ThreadNames``), for the threads that made CUDA calls."""
    tables = db.names
    if ("ThreadNames" not in tables or "StringIds" not in tables
            or not {"nameId", "globalTid"} <= db.columns("ThreadNames")):
        return {}
    active = [f"SELECT DISTINCT globalTid AS g FROM {table}" for table in
              ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER")
              if table in tables and "globalTid" in db.columns(table)]
    if not active:
        return {}
    sql = (f"SELECT {_pid(db, 't.globalTid')} AS p, {_tid(db, 't.globalTid')} AS t, s.value AS n "
           f"FROM ThreadNames t JOIN StringIds s ON s.id = t.nameId WHERE t.globalTid IN ({' UNION '.join(active)}) "
           "ORDER BY p, t")
    return {f"{p}/{t}": str(n) for p, t, n in db.rows(sql) if n}


def _correlated_processes(db: Tables) -> set[int]:
    """The pids of the rows with correlation ids: GPU work (globalPid) and CUDA calls (globalTid)."""
    tables = db.names
    parts = [f"SELECT DISTINCT {_pid(db, g)} AS p FROM {table}"
             for table, g in (("CUPTI_ACTIVITY_KIND_KERNEL", "globalPid"), ("CUPTI_ACTIVITY_KIND_MEMCPY", "globalPid"),
                              ("CUPTI_ACTIVITY_KIND_MEMSET", "globalPid"), ("CUPTI_ACTIVITY_KIND_RUNTIME", "globalTid"),
                              ("CUPTI_ACTIVITY_KIND_DRIVER", "globalTid"))
             if table in tables and {g, "correlationId"} <= db.columns(table)]
    if not parts:
        return set()
    return {p for (p,) in db.rows(" UNION ".join(parts)) if type(p) is int}


def _gpu_processes(db: Tables) -> dict[str, list[int]]:
    """pid -> the devices it ran kernels, copies or memsets on, in order of pid (the process in a GPU row's
    globalPid, as its report scripts decode it)."""
    tables = db.names
    parts = [f"SELECT DISTINCT {_pid(db, 'globalPid')} AS p, deviceId AS d FROM {table}"
             for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
             if table in tables and {"globalPid", "deviceId"} <= db.columns(table)]
    if not parts:
        return {}
    out: dict[int, set[int]] = {}
    for p, d in db.rows(" UNION ".join(parts)):
        if type(p) is int and type(d) is int:
            out.setdefault(p, set()).add(d)
    return {str(p): sorted(out[p]) for p in sorted(out)}


def _processes(db: Tables) -> dict[str, str]:
    """pid -> process name, for the processes that have GPU activity or CUDA calls."""
    tables = db.names
    if "PROCESSES" not in tables or not {"pid", "name", "globalPid"} <= db.columns("PROCESSES"):
        return {}
    active: list[str] = []
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        if table in tables and "globalPid" in db.columns(table):
            active.append(f"SELECT DISTINCT {_pid(db, 'globalPid')} AS p FROM {table}")
    for table in ("CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_DRIVER"):
        if table in tables and "globalTid" in db.columns(table):
            active.append(f"SELECT DISTINCT {_pid(db, 'globalTid')} AS p FROM {table}")
    if not active:
        return {}
    sql = (f"SELECT DISTINCT pid, name FROM PROCESSES WHERE pid IN ({' UNION '.join(active)}) ORDER BY pid")
    return {str(p): n for p, n in db.rows(sql) if p is not None}
