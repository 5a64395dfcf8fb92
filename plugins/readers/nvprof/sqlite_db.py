"""nvprof's SQLite output (``nvprof -o file.nvvp`` / ``.prof`` / ``.nvprof``), opened read-only.

nvprof stores CUPTI activity records one table per kind, the columns named
after the fields of CUPTI's record structures: ``CUPTI_ACTIVITY_KIND_KERNEL``
and ``_CONCURRENT_KERNEL`` (start, end, deviceId, contextId, streamId,
correlationId, gridX..blockZ, registersPerThread, staticSharedMemory,
dynamicSharedMemory, name), ``_MEMCPY`` (copyKind, srcKind, dstKind, bytes,
...), ``_MEMCPY2`` (peer copies, with srcDeviceId/dstDeviceId), ``_MEMSET``
(value, bytes, memoryKind), ``_RUNTIME`` and ``_DRIVER`` (cbid, processId,
threadId, correlationId), ``_DEVICE`` (the GPUs). Strings (kernel and device
names) are ids into ``StringTable(_id_, value)``; API calls are CUPTI
callback ids, named here from CUPTI's cupti_runtime_cbid.h / cupti_driver_cbid.h
(the two CSV files beside this module). Timestamps are ns on the host clock.

An Nsight Systems export also has ``CUPTI_ACTIVITY_KIND_*`` tables, but keeps
its strings in ``StringIds``; it is refused here with a pointer to the nsys
reader.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import re
import shutil
import sqlite3
import tempfile
from importlib import resources
from pathlib import Path
from typing import Callable, Iterator

import polars as pl

from traceparse.errors import InputError, bad_input, spelled
from traceparse.sources import GZIP_DAMAGE, damaged_gzip, is_gzip
from traceparse.trace import Device
from traceparse.validate import excerpt

KERNEL_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL")
MEMCPY_TABLES = ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMCPY2")
MEMSET_TABLE = "CUPTI_ACTIVITY_KIND_MEMSET"
API_TABLES = {"CUPTI_ACTIVITY_KIND_RUNTIME": "runtime", "CUPTI_ACTIVITY_KIND_DRIVER": "driver"}
DEVICE_TABLE = "CUPTI_ACTIVITY_KIND_DEVICE"
ACTIVITY_TABLES = (*KERNEL_TABLES, *MEMCPY_TABLES, MEMSET_TABLE, *API_TABLES)

#: CUpti_ActivityMemcpyKind (cupti_activity.h): 1 HtoD ... 10 PtoP.
COPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD", 9: "HtoH",
              10: "PtoP"}
#: CUpti_ActivityMemoryKind -> schema memory kind (device_static, managed_static have none: null).
MEMORY_KINDS = {1: "pageable", 2: "pinned", 3: "device", 4: "array", 5: "managed"}
SCHEMA_COPY_KINDS = {"HtoD", "DtoH", "DtoD", "HtoH", "PtoP"}

_REQUIRED = {
    "kernel": ("start", "end", "name"),
    "memcpy": ("start", "end", "copyKind", "bytes"),
    "memset": ("start", "end", "bytes"),
    "api": ("start", "end", "cbid"),
}
_VERSION_SUFFIX = re.compile(r"_v\d{4,}$")


def is_sqlite(head: bytes) -> bool:
    """True for the SQLite file header."""
    return head.startswith(b"SQLite format 3\x00")


@contextlib.contextmanager
def open_readonly(path: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection to ``path`` (a gzip-compressed database is unpacked to a temporary file first)."""
    with contextlib.ExitStack() as stack:
        target = path
        if is_gzip(path):
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "profile.sqlite"
            try:
                with gzip.open(path, "rb") as src, open(tmp, "wb") as dst:
                    shutil.copyfileobj(src, dst)
            except GZIP_DAMAGE as exc:
                raise damaged_gzip(path, exc) from None
            except EOFError:
                raise bad_input(path, None, "the gzip stream ends early (cut short?); the SQLite database cannot "
                                            "be read from a partial file") from None
            except OSError as exc:
                raise bad_input(path, None, f"the gzip stream cannot be read ({exc})") from None
            target = tmp
        uri = target.resolve().as_uri() + "?mode=ro"
        try:
            conn = sqlite3.connect(uri, uri=True)
            conn.execute("SELECT name FROM sqlite_master LIMIT 1").fetchall()
        except sqlite3.DatabaseError as exc:
            raise bad_input(path, None, f"not a readable SQLite database ({exc})") from None
        stack.callback(conn.close)
        yield conn


def table_names(conn: sqlite3.Connection) -> set[str]:
    """Names of the tables in the database."""
    return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def sniff_tables(path: Path) -> set[str]:
    """Table names of a database file, or an empty set when it cannot be opened."""
    try:
        with open_readonly(path) as conn:
            return table_names(conn)
    except (InputError, sqlite3.Error, OSError):
        return set()


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in conn.execute(f'PRAGMA table_info("{table}")')]


def _cbid_names(which: str) -> dict[int, str]:
    """CUPTI callback id -> API name, from the CSV copied out of CUPTI's header."""
    text = resources.files(__package__).joinpath(f"cupti_{which}_cbid.csv").read_text(encoding="utf-8")
    prefix = "CUPTI_RUNTIME_TRACE_CBID_" if which == "runtime" else "CUPTI_DRIVER_TRACE_CBID_"
    names = {}
    for row in csv.DictReader(text.splitlines()):
        name = row["enumerator"].removeprefix(prefix)
        names[int(row["cbid"])] = _VERSION_SUFFIX.sub("", name) if which == "runtime" else name
    return names


class NvprofDatabase:
    """Reads the events and devices of one nvprof SQLite file."""

    def __init__(self, path: Path, conn: sqlite3.Connection):
        self.path, self.conn = path, conn
        self.tables = table_names(conn)
        self.strings: dict[int, str] | None = None

    def check(self) -> None:
        """Refuse a database that is not nvprof's: no StringTable, an nsys export, or no activity tables."""
        if "StringIds" in self.tables:
            raise bad_input(self.path, None, "an Nsight Systems SQLite export (it has a StringIds table), not nvprof "
                                             f"output: read it with {spelled('--format nsys', 'fmt=' + repr('nsys'))}")
        present = [t for t in ACTIVITY_TABLES if t in self.tables]
        missing = [] if "StringTable" in self.tables else ["it has no table StringTable"]
        if not present:
            missing.append("it has none of the tables " + ", ".join(ACTIVITY_TABLES))
        if missing:
            raise bad_input(self.path, None, f"not an nvprof SQLite profile: {'; '.join(missing)}")

    def string_table(self) -> dict[int, str]:
        if self.strings is None:
            cols = _columns(self.conn, "StringTable")
            key = "_id_" if "_id_" in cols else "id"
            if key not in cols or "value" not in cols:
                raise bad_input(self.path, "table StringTable", "expected columns _id_ and value")
            self.strings = dict(self.conn.execute(f'SELECT "{key}", value FROM StringTable'))
        return self.strings

    def _select(self, table: str, role: str, wanted: list[str]) -> pl.DataFrame:
        """Rows of ``table`` with the ``wanted`` columns it has (missing optional ones come back null)."""
        cols = _columns(self.conn, table)
        for col in _REQUIRED[role]:
            if col not in cols:
                raise bad_input(self.path, f"table {table}", f"has no column {col!r}: expected nvprof's {role} records")
        key = "_id_" if "_id_" in cols else "rowid"
        for col in ("start", "end"):
            bad = self.conn.execute(f'SELECT {key}, "{col}" FROM "{table}" WHERE typeof("{col}") != \'integer\' '
                                    f"LIMIT 1").fetchone()
            if bad:
                raise bad_input(self.path, f"table {table} row {key}={bad[0]}",
                                f"{col} must be an integer timestamp in ns, found {bad[1]!r}")
        bad = self.conn.execute(f'SELECT {key} FROM "{table}" WHERE "end" < start LIMIT 1').fetchone()
        if bad:
            raise bad_input(self.path, f"table {table} row {key}={bad[0]}", "ends before it starts")
        present = [c for c in wanted if c in cols]
        odd = " OR ".join(f"typeof(\"{c}\") NOT IN ('integer', 'null')" for c in present)
        bad = self.conn.execute(f'SELECT {key}, {", ".join(f"{chr(34)}{c}{chr(34)}" for c in present)} '
                                f'FROM "{table}" WHERE {odd} LIMIT 1').fetchone()
        if bad:
            col, value = next((c, v) for c, v in zip(present, bad[1:]) if not (v is None or isinstance(v, int)))
            raise bad_input(self.path, f"table {table} row {key}={bad[0]}", f"{col} must be an integer, found {value!r}")
        select = ", ".join(f'"{c}"' if c in cols else f'NULL AS "{c}"' for c in wanted)
        rows = self.conn.execute(f'SELECT {select} FROM "{table}"').fetchall()
        return pl.DataFrame(rows, schema={c: pl.Int64 for c in wanted}, orient="row")

    def kernels(self) -> list[pl.DataFrame]:
        wanted = ["start", "end", "deviceId", "contextId", "streamId", "correlationId", "gridX", "gridY", "gridZ",
                  "blockX", "blockY", "blockZ", "registersPerThread", "staticSharedMemory", "dynamicSharedMemory",
                  "name"]
        frames = []
        strings = self.string_table()
        for table in KERNEL_TABLES:
            if table not in self.tables:
                continue
            df = self._select(table, "kernel", wanted)
            missing = df.filter(~pl.col("name").is_in(list(strings)))
            if missing.height:
                raise bad_input(self.path, f"table {table}", f"kernel name id {missing['name'][0]} is not in StringTable")
            frames.append(df.select(
                kind=pl.lit("kernel"),
                name=pl.col("name").replace_strict(list(strings), list(strings.values()), return_dtype=pl.String),
                start_ns="start", duration_ns=pl.col("end") - pl.col("start"),
                device_id="deviceId", context_id="contextId", stream_id="streamId", correlation_id="correlationId",
                grid_x="gridX", grid_y="gridY", grid_z="gridZ", block_x="blockX", block_y="blockY", block_z="blockZ",
                registers_per_thread="registersPerThread", static_smem_bytes="staticSharedMemory",
                dynamic_smem_bytes="dynamicSharedMemory"))
        return frames

    def copies(self) -> list[pl.DataFrame]:
        wanted = ["start", "end", "deviceId", "contextId", "streamId", "correlationId", "copyKind", "srcKind",
                  "dstKind", "bytes"]
        frames = []
        for table in MEMCPY_TABLES:
            if table not in self.tables:
                continue
            df = self._select(table, "memcpy", wanted)
            direction = pl.col("copyKind").replace_strict(list(COPY_KINDS), list(COPY_KINDS.values()), default=None,
                                                          return_dtype=pl.String)
            frames.append(df.select(
                kind=pl.lit("memcpy"),
                name=pl.format("[CUDA memcpy {}]", direction.fill_null(pl.col("copyKind").cast(pl.String))),
                start_ns="start", duration_ns=pl.col("end") - pl.col("start"),
                device_id="deviceId", context_id="contextId", stream_id="streamId", correlation_id="correlationId",
                bytes="bytes",
                copy_kind=pl.when(direction.is_in(list(SCHEMA_COPY_KINDS))).then(direction),
                src_memory=_memory(pl.col("srcKind")), dst_memory=_memory(pl.col("dstKind"))))
        return frames

    def sets(self) -> list[pl.DataFrame]:
        if MEMSET_TABLE not in self.tables:
            return []
        wanted = ["start", "end", "deviceId", "contextId", "streamId", "correlationId", "bytes", "memoryKind"]
        df = self._select(MEMSET_TABLE, "memset", wanted)
        return [df.select(kind=pl.lit("memset"), name=pl.lit("[CUDA memset]"), start_ns="start",
                          duration_ns=pl.col("end") - pl.col("start"), device_id="deviceId", context_id="contextId",
                          stream_id="streamId", correlation_id="correlationId", bytes="bytes",
                          dst_memory=_memory(pl.col("memoryKind")))]

    def api_calls(self) -> list[pl.DataFrame]:
        frames = []
        for table, which in API_TABLES.items():
            if table not in self.tables:
                continue
            names = _cbid_names(which)
            df = self._select(table, "api", ["start", "end", "cbid", "processId", "threadId", "correlationId"])
            name = pl.col("cbid").replace_strict(list(names), list(names.values()), default=None, return_dtype=pl.String)
            frames.append(df.select(
                kind=pl.lit("api"),
                name=name.fill_null(pl.format(f"CUPTI {which} cbid {{}}", pl.col("cbid"))),
                start_ns="start", duration_ns=pl.col("end") - pl.col("start"),
                pid="processId", tid="threadId", correlation_id="correlationId", group=pl.lit(which)))
        return frames

    def events(self) -> pl.DataFrame:
        """Every activity, sorted by start; GPU work gets the pid of the API call with its correlation id."""
        frames = self.kernels() + self.copies() + self.sets() + self.api_calls()
        events = (pl.concat(frames, how="diagonal_relaxed").sort("start_ns", maintain_order=True)
                  .with_columns(calls=pl.lit(1, dtype=pl.Int64)))
        if "pid" in events.columns:
            launchers = (events.filter((pl.col("kind") == "api") & (pl.col("correlation_id") > 0))
                         .group_by("correlation_id").agg(pl.col("pid").first().alias("_launcher")))
            events = (events.join(launchers, on="correlation_id", how="left", maintain_order="left")
                      .with_columns(pid=pl.coalesce("pid", "_launcher")).drop("_launcher"))
        return events

    def devices(self, warn: Callable[[str], None] = lambda message: None) -> list[Device]:
        """The GPUs of ``CUPTI_ACTIVITY_KIND_DEVICE`` (names from StringTable, clock kHz -> MHz).

        SQLite columns take any type: a clock that is not a number (``1.4GHz``) is left unknown with one
        warning to ``warn`` naming the file, the column and the value (the other properties are checked by
        :func:`traceparse.validate.validate_devices`, which warns the same way)."""
        if DEVICE_TABLE not in self.tables:
            return []
        cols = _columns(self.conn, DEVICE_TABLE)
        self.conn.row_factory = sqlite3.Row
        try:
            rows = [dict(r) for r in self.conn.execute(f'SELECT * FROM "{DEVICE_TABLE}"')]
        finally:
            self.conn.row_factory = None
        strings = self.string_table()
        devices = []
        bad_clocks = []
        for r in rows:
            name = r.get("name")
            major, minor = r.get("computeCapabilityMajor"), r.get("computeCapabilityMinor")
            clock = r.get("coreClockRate")
            if clock is not None and (isinstance(clock, bool) or not isinstance(clock, (int, float))):
                bad_clocks.append(clock)
            extra = {k: v for k, v in r.items() if k in cols and not isinstance(v, bytes) and k not in (
                "_id_", "id", "name", "numMultiprocessors", "globalMemorySize", "computeCapabilityMajor",
                "computeCapabilityMinor", "coreClockRate")}
            devices.append(Device(
                id=r.get("id"),
                name=strings.get(name, name if isinstance(name, str) else None),
                sm_count=r.get("numMultiprocessors"),
                memory_bytes=r.get("globalMemorySize"),
                compute_capability=f"{major}.{minor}" if major is not None and minor is not None else None,
                core_clock_mhz=clock / 1000 if isinstance(clock, (int, float)) and not isinstance(clock, bool)
                else None,
                extra=extra))
        if bad_clocks:
            others = f" (and {len(bad_clocks) - 1} more)" if len(bad_clocks) > 1 else ""
            warn(f"{self.path}: {DEVICE_TABLE}.coreClockRate {excerpt(bad_clocks[0])} is not a number of kHz"
                 f"{others}; the clock is left unknown")
        return devices


def _memory(kinds: pl.Expr) -> pl.Expr:
    return kinds.replace_strict(list(MEMORY_KINDS), list(MEMORY_KINDS.values()), default=None, return_dtype=pl.String)
