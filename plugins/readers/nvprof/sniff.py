"""Recognising nvprof output by its own content (confidence scale: :meth:`traceparse.reader.Reader.sniff`).

* 1.0: nvprof's ``==PID==`` messages (``==1234== Profiling result:``...) or
  the ``========`` lines of a log imported into nvvp: signatures it writes.
* 0.8: a SQLite profile with nvprof's ``StringTable`` and
  ``CUPTI_ACTIVITY_KIND_*`` tables; a quoted CSV header of one of nvprof's
  tables (a log whose ``==PID==`` lines were cut away).
* 0.5: a text table header of one of nvprof's tables.
"""

from __future__ import annotations

import re
from pathlib import Path

from traceparse.sources import is_gzip

from .sqlite_db import is_sqlite, sniff_tables
from .tables import TRACE, csv_cells, form_of, text_header

_MESSAGE = re.compile(r"==\d+== (?:Profiling result:|NVPROF is profiling process|Profiling application:|"
                      r"Metric result:|Event result:|API calls:|Unified Memory profiling result:)")
_IMPORTED = re.compile(r"^={8} (?:Profiling result:|Metric result:|Event result:|API calls:|Warning: )", re.M)


def sniff(path: Path, head: bytes) -> float:
    """Confidence that ``path`` is nvprof output (see the module docstring)."""
    if is_sqlite(head):
        tables = _head_tables(head) if is_gzip(path) else sniff_tables(path)
        has_activity = any(t.startswith("CUPTI_ACTIVITY_KIND_") for t in tables)
        return 0.8 if "StringTable" in tables and has_activity else 0.0
    if b"\x00" in head[:4096]:
        return 0.0
    text = head.decode("utf-8", errors="replace")
    if _MESSAGE.search(text) or _IMPORTED.search(text):
        return 1.0
    return _header_score(text)


def _head_tables(head: bytes) -> set[str]:
    """Table names visible in the (decompressed) first bytes of a database, for gzip-compressed files."""
    names = set(re.findall(rb"CREATE TABLE\s+\"?([A-Za-z_][A-Za-z0-9_]*)", head))
    return {n.decode() for n in names}


def _header_score(text: str) -> float:
    """Confidence from an nvprof table header alone (a log whose ``==PID==`` lines were cut away)."""
    for line in text.splitlines()[:400]:
        stripped = line.strip()
        if stripped.startswith('"'):
            try:
                labels = csv_cells(stripped)
            except Exception:
                continue
            if form_of(labels):
                return 0.8
        elif "  " in stripped:
            labels, _, _ = text_header(line)
            form = form_of(labels)
            if form and (form != TRACE or {"Grid Size", "Regs*", "Device", "Throughput"} & set(labels)):
                return 0.5
    return 0.0
