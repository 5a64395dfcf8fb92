"""Recognising Nsight Systems output by its own content (confidence scale: :meth:`traceparse.reader.Reader.sniff`).

* 1.0: ``.nsys-rep`` / ``.qdrep`` starting with ``NVIDIA Tegra Profiler Report``.
* 0.8: a SQLite export, whose schema names nsys's own tables (``StringIds``,
  ``TARGET_INFO_*``, ``NVTX_EVENTS``, ``ENUM_NSYS_*``, ``META_DATA_EXPORT``);
  a directory of per-table Parquet or Arrow files (``nsys export --type
  parquetdir|arrowdir``) holding ``CUPTI_ACTIVITY_KIND_*`` or ``NVTX_EVENTS``
  with ``StringIds`` or ``TARGET_INFO_*`` beside them, each file starting
  with its format's magic (``PAR1``, ``ARROW1``, an IPC stream's message);
  ``nsys stats`` CSV/TSV whose header has nsys's own column names
  (``CorrId``, ``GrdX``, ``Reg/Trd``, ``StcSMem``, ``Total Time``,
  ``Num Calls``, ``Range``...); the default console table (that header, a
  dash underline).
* 0.5: nsys console messages (``usage: nsys stats``...), claimed so the
  reader can say what is wrong with them.
* 0.2: only the name: an ``.nsys-rep`` without its magic, an empty file named
  ``PREFIX_REPORT.csv`` (nsys writes one for a report without data, claimed
  so it joins its capture), or such a CSV of a report traceparse does not read.
"""

from __future__ import annotations

import re
import sqlite3
from contextlib import closing
from pathlib import Path

from traceparse.sources import is_gzip

from traceparse_plugins.readers.nsys import reports
from traceparse_plugins.readers.nsys.nsys_rep import MAGIC
from traceparse_plugins.readers.nsys.tables import SUFFIXES, connect, table_files
from traceparse_plugins.readers.nsys.sections import header_cells, _DASHES, _looks_like_header, _cut

SQLITE_MAGIC = b"SQLite format 3\x00"
_NSYS_TABLES = (b"StringIds", b"TARGET_INFO_", b"NVTX_EVENTS", b"ENUM_NSYS_", b"META_DATA_EXPORT", b"EXPORT_META_DATA")
_NSYS_MESSAGE = re.compile(r"^[ \t]*(usage: nsys|WARNING: Existing SQLite export|NOTICE: Existing SQLite export|"
                           r"Processing \[.*\] with \[|\*\* .*\((cuda|nvtx|osrt|gpu)\w*\):)", re.MULTILINE)


def kind_of(path: Path, head: bytes) -> str | None:
    """``rep``, ``sqlite``, ``tables`` (a directory), ``text`` or None: which kind of nsys file this looks like."""
    if path.is_dir():
        return "tables"
    if head.startswith(MAGIC):
        return "rep"
    if head.startswith(SQLITE_MAGIC):
        return "sqlite"
    name = path.name.lower()
    if name.endswith((".nsys-rep", ".qdrep")):
        return "rep"
    if head and b"\x00" not in head[:4096].split(b"\n", 1)[0]:  # a NUL in a name further on is still text
        return "text"
    return None


def sniff(path: Path, head: bytes) -> float:
    """Confidence that ``path`` is Nsight Systems output (see the module docstring)."""
    kind = kind_of(path, head)
    if kind == "tables":
        return _sniff_directory(path)
    if kind == "rep":
        return 1.0 if head.startswith(MAGIC) else 0.2
    if kind == "sqlite":
        return _sniff_sqlite(path, head)
    if not head:
        named = reports.parse_file_name(path.name)
        return 0.2 if named and named.supported and path.is_file() else 0.0
    if kind == "text":
        score = _sniff_text(head)
        if score == 0.0 and b"," in head.split(b"\n", 1)[0] and reports.parse_file_name(path.name):
            return 0.2  # PREFIX_REPORT.csv of a report traceparse does not read: claimed, then skipped or refused
        return score
    return 0.0


_EVENT_FILES = ("CUPTI_ACTIVITY_KIND_", "NVTX_EVENTS")
_BESIDE = ("StringIds", "TARGET_INFO_", "META_DATA_EXPORT", "ENUM_NSYS_")
#: The first bytes of a Parquet file, an Arrow IPC file and an Arrow IPC stream (a continuation marker).
_FILE_MAGIC = {".parquet": (b"PAR1",), ".arrow": (b"ARROW1", b"\xff\xff\xff\xff")}


def _sniff_directory(path: Path) -> float:
    """0.8 for a per-table nsys export directory: its event tables and nsys's own tables, in their formats."""
    try:
        files = table_files(path)
    except OSError:
        return 0.0
    events = [p for name, p in files.items() if name.startswith(_EVENT_FILES)]
    if not events or not any(name.startswith(_BESIDE) for name in files):
        return 0.0
    for p in events[:3]:
        try:
            with open(p, "rb") as f:
                head = f.read(8)
        except OSError:
            continue
        if head.startswith(_FILE_MAGIC[p.suffix.lower()]):
            return 0.8
    return 0.2 if all(p.suffix.lower() in SUFFIXES for p in events) else 0.0


def _sniff_sqlite(path: Path, head: bytes) -> float:
    if any(marker in head for marker in _NSYS_TABLES):
        return 0.8
    if not is_gzip(path):
        try:
            with closing(connect(path)) as db:
                names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.Error:
            return 0.0
        if "StringIds" in names:
            return 0.8
    return 0.0


#: The start of a JSON object or array of objects (``[3/8] Executing ...``, nsys's console, is not one).
_JSON_START = re.compile(r"\s*(\{|\[\s*[{\]])")


def _sniff_text(head: bytes) -> float:
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff")
    if _JSON_START.match(text):  # a JSON document (a Chrome trace): no nsys table starts so, and its first
        return 0.5 if _NSYS_MESSAGE.search(text) else 0.0  # line, often all of it, is no CSV to split
    lines = text.split("\n")
    if len(head) >= 64 * 1024:
        lines = lines[:-1]  # the last line may be cut by the head's end
    lines = [line.rstrip("\r") for line in lines]
    for i, line in enumerate(lines[:200]):
        if line.strip() and header_cells(line) is not None:
            return 0.8
        if i and _DASHES.match(line):
            spans = [(m.start(), m.end()) for m in re.finditer(r"-+", line)]
            if _looks_like_header(_cut(lines[i - 1], spans)):
                return 0.8
    if _NSYS_MESSAGE.search(text):
        return 0.5
    return 0.0
