"""One way to reach the tables of an nsys export, whichever form it was written in.

``nsys export`` writes the same tables, with the same columns, as one SQLite
database (``--type sqlite``) or as a directory of one file per table
(``--type parquetdir``: ``TABLE.parquet``; ``--type arrowdir``: ``TABLE.arrow``,
Arrow IPC streams). The reader's queries (:mod:`.sqlite_export`) are written
once, in the SQL that SQLite and polars' SQL engine both run; a :class:`Tables`
runs them over its form:

* :class:`SqliteTables`: Python's ``sqlite3``, rows fetched in batches.
* :class:`FileTables`: polars' ``SQLContext`` over the files, each table a
  query names read once (by pyarrow, validated in full: a damaged file is an
  error naming it, never a crash inside a decoder), then kept in memory.

The one construct the two dialects spell differently, nsys's global-id
decoding (``>>``/``&`` in SQLite, ``DIV``/``%`` in polars), comes from
:meth:`Tables.shifted`. A damaged file is reported by name, as one line.
"""

from __future__ import annotations

import re
import sqlite3
import urllib.parse
from pathlib import Path
from typing import Iterator

import polars as pl

from traceparse.errors import bad_input
from traceparse.text import one_line
from traceparse.validate import excerpt, fits_int64

BATCH_ROWS = 500_000
#: File name endings of a per-table export, and the form each is.
SUFFIXES = {".parquet": "Parquet", ".arrow": "Arrow"}
_TABLE_REFERENCE = re.compile(r"\b(?:FROM|JOIN)\s+\"?(\w+)", re.IGNORECASE)
_MAIN_ALIAS = re.compile(r"\bFROM\s+\w+\s+a\b")
#: the row number FileTables adds to each table it reads (nsys names no column so)
_ROW = "__traceparse_row"


class Tables:
    """The tables of one export: names, columns, and the rows of a query (SQLite's or polars' SQL)."""

    #: what the export is, for messages ("SQLite file", "Parquet directory")
    noun = "export"
    #: exceptions a query may raise that mean the data cannot be read (caught by the caller, reported as one line)
    errors: tuple[type[BaseException], ...] = ()

    def __init__(self, path: Path):
        self.path = path
        self.names: set[str] = set()

    def columns(self, table: str) -> set[str]:
        """The column names of ``table``."""
        raise NotImplementedError

    def rows(self, sql: str) -> list[tuple]:
        """All rows of a (small) query, as tuples."""
        raise NotImplementedError

    def records(self, sql: str) -> tuple[list[str], list[tuple]]:
        """The column names and rows of a (small) query, for ``SELECT *``."""
        raise NotImplementedError

    def frames(self, sql: str, schema: list[tuple[str, pl.DataType]], unfit: "Unfit") -> Iterator[pl.DataFrame]:
        """The rows of an event query as frames of ``schema``, in batches; rows that do not fit go to ``unfit``."""
        raise NotImplementedError

    def shifted(self, column: str, bits: int) -> str:
        """SQL for ``(column >> bits) & 0xFFFFFF`` (24 bits of an nsys global id) in this dialect."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the database or the frames read."""


# -- SQLite ------------------------------------------------------------------
def connect(path: Path) -> sqlite3.Connection:
    """Open ``path`` read-only (immutable: nothing is written, even a journal)."""
    uri = f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro&immutable=1"
    return sqlite3.connect(uri, uri=True)


class SqliteTables(Tables):
    """An nsys SQLite export, opened read-only."""

    noun = "SQLite file"
    errors = (sqlite3.DatabaseError,)

    def __init__(self, path: Path, shown: Path):
        super().__init__(shown)
        self.db = connect(path)
        try:
            self.names = {r[0] for r in self.db.execute(
                "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
        except sqlite3.DatabaseError as exc:
            self.db.close()
            raise bad_input(shown, None, f"not a readable SQLite database ({exc})") from None

    def columns(self, table: str) -> set[str]:
        return {r[1] for r in self.db.execute(f'PRAGMA table_info("{table}")')}

    def rows(self, sql: str) -> list[tuple]:
        return self.db.execute(sql).fetchall()

    def records(self, sql: str) -> tuple[list[str], list[tuple]]:
        cursor = self.db.execute(sql)
        return [d[0] for d in cursor.description], cursor.fetchall()

    def frames(self, sql: str, schema: list[tuple[str, pl.DataType]], unfit: "Unfit") -> Iterator[pl.DataFrame]:
        cursor = self.db.execute(sql)
        while rows := cursor.fetchmany(BATCH_ROWS):
            yield unfit.frame(rows, schema)

    def shifted(self, column: str, bits: int) -> str:
        return f"((({column}) >> {bits}) & 16777215)" if bits else f"(({column}) & 16777215)"

    def close(self) -> None:
        self.db.close()


# -- a directory of one file per table -------------------------------------------
def table_files(directory: Path) -> dict[str, Path]:
    """Table name -> its file, for the ``TABLE.parquet`` / ``TABLE.arrow`` files of ``directory``."""
    out: dict[str, Path] = {}
    for path in sorted(directory.iterdir()):
        if path.suffix.lower() in SUFFIXES and path.is_file():
            out.setdefault(path.stem, path)
    return out


#: what reading a damaged file raises (pyarrow's ArrowInvalid is a ValueError, its IOError an OSError)
_READ_ERRORS = (pl.exceptions.PolarsError, OSError, ValueError, TypeError)


class FileTables(Tables):
    """An nsys ``parquetdir`` / ``arrowdir`` export: one Parquet or Arrow IPC file per table."""

    def __init__(self, directory: Path):
        super().__init__(directory)
        self.files = table_files(directory)
        self.names = set(self.files)
        forms = sorted({SUFFIXES[p.suffix.lower()] for p in self.files.values()})
        self.noun = f"{'/'.join(forms) or 'Parquet or Arrow'} directory"
        self._columns: dict[str, set[str]] = {}
        self._loaded: dict[str, pl.LazyFrame] = {}

    def columns(self, table: str) -> set[str]:
        if table not in self._columns:
            self._columns[table] = set(self._frame(table).collect_schema().names()) - {_ROW}
        return self._columns[table]

    def _frame(self, table: str) -> pl.LazyFrame:
        """The table's file, read and validated once (an error naming the file if it does not read)."""
        if table not in self._loaded:
            import pyarrow

            path = self.files[table]
            try:
                data = _read_arrow(path)
                data.validate(full=True)
                # the columns alone: metadata is not read, and damaged metadata made polars' converter panic
                data = type(data).from_arrays(data.columns, names=data.column_names)
                self._loaded[table] = pl.from_arrow(data).lazy().with_row_index(_ROW)
            except (*_READ_ERRORS, pyarrow.ArrowException) as exc:
                raise self._damaged(path, exc) from None
        return self._loaded[table]

    def _query(self, sql: str) -> pl.DataFrame:
        names = [t for t in dict.fromkeys(_TABLE_REFERENCE.findall(sql)) if t in self.files]
        context = pl.SQLContext({t: self._frame(t) for t in names})
        try:
            return context.execute(sql).collect()
        except _READ_ERRORS as exc:
            where = self.files[names[0]] if names else self.path
            raise bad_input(where, None, f"cannot be read: {one_line(str(exc))}") from None

    def _damaged(self, path: Path, exc: BaseException):
        form = SUFFIXES.get(path.suffix.lower(), "table")
        return bad_input(path, None, f"not a readable {form} file of an nsys export ({one_line(str(exc))})")

    def rows(self, sql: str) -> list[tuple]:
        return self._query(sql).rows()

    def records(self, sql: str) -> tuple[list[str], list[tuple]]:
        frame = self._query(sql).drop(_ROW, strict=False)
        frame = frame.with_columns(pl.col(pl.Boolean).cast(pl.Int64))  # SQLite has no booleans: 1/0 as there
        return frame.columns, frame.rows()

    def frames(self, sql: str, schema: list[tuple[str, pl.DataType]], unfit: "Unfit") -> Iterator[pl.DataFrame]:
        # polars' joins do not keep the order of rows: the main table's (alias ``a``) row number keeps it
        if not sql.startswith("SELECT ") or not _MAIN_ALIAS.search(sql):
            raise ValueError("an event query reads its main table as alias a")
        frame = self._query(sql.replace("SELECT ", f"SELECT a.{_ROW} AS {_ROW}, ", 1)).sort(_ROW).drop(_ROW)
        frame = unfit.cast(frame, schema)
        for offset in range(0, frame.height, BATCH_ROWS):
            yield frame.slice(offset, BATCH_ROWS)

    def shifted(self, column: str, bits: int) -> str:
        return f"(DIV({column}, {1 << bits}) % 16777216)" if bits else f"(({column}) % 16777216)"

    def close(self) -> None:
        self._loaded.clear()


def _read_arrow(path: Path):
    """A ``pyarrow.Table`` of a Parquet file, an Arrow IPC stream (what ``nsys export --type arrowdir`` writes)
    or an Arrow IPC file."""
    import pyarrow.ipc
    import pyarrow.parquet

    if path.suffix.lower() == ".parquet":
        return pyarrow.parquet.read_table(path)
    with open(path, "rb") as f:
        stream = f.read(6) != b"ARROW1"
    if stream:
        with pyarrow.ipc.open_stream(path) as reader:
            return reader.read_all()
    with pyarrow.ipc.open_file(path) as reader:
        return reader.read_all()


# -- rows that do not fit their column ---------------------------------------------
class Unfit:
    """Rows of one table whose values are not of their column's type, dropped and counted (one warning).

    SQLite columns take any type: a REAL 1e308 or the text "abc" in an INTEGER column of an edited export
    made polars' row builder fail with a ComputeError (exit 3). A batch that does not build is walked row by
    row; a row with a value its column cannot hold is left out, the first one quoted in the warning. A typed
    file (Parquet, Arrow) is cast to the same columns: a value the cast cannot hold (an unsigned id past
    2**63) is counted the same way.
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

    def cast(self, frame: pl.DataFrame, schema: list[tuple[str, pl.DataType]]) -> pl.DataFrame:
        """A typed ``frame`` cast to ``schema``, without the rows holding a value the cast loses."""
        cast = frame.select(pl.col(name).cast(dtype, strict=False) for name, dtype in schema)
        lost = pl.Series([False] * frame.height, dtype=pl.Boolean)
        for name, _ in schema:
            lost = lost | (frame[name].is_not_null() & cast[name].is_null())
        count = int(lost.sum())
        if count:
            i = int(lost.arg_true()[0])
            column = next(name for name, _ in schema if frame[name][i] is not None and cast[name][i] is None)
            if self.first is None:
                self.first = (self.seen + i + 1, column, frame[column][i])
            self.count += count
            cast = cast.filter(~lost)
        self.seen += frame.height
        return cast

    def warning(self, path: Path) -> str:
        """The one warning for the rows left out of this table."""
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
        return type(value) is int and fits_int64(value)
    if dtype.is_float():
        return type(value) in (int, float)
    return True
