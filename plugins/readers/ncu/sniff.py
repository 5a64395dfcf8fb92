"""Recognising Nsight Compute output by its own content (confidence scale: :meth:`traceparse.reader.Reader.sniff`).

* 1.0: an ``.ncu-rep`` report's magic bytes; ncu's ``==PROF==`` console lines.
* 0.8: an ncu CSV header (``"ID","Process ID"``... or ``"ID"`` with
  ``"Kernel Name"``); the text output's section tables (``    Section: ``
  with a ``Context`` line).
* 0.2: only the name (``.ncu-rep``, ``.nsight-cuprof-report``).
"""

from __future__ import annotations

from pathlib import Path

from .csv_form import looks_like_ncu_csv
from .report_form import REPORT_SUFFIXES, looks_like_report


def sniff(path: Path, head: bytes) -> float:
    """Confidence that ``path`` is Nsight Compute output (see the module docstring)."""
    if looks_like_report(head) or b"==PROF==" in head:
        return 1.0
    if looks_like_ncu_csv(head) or (b"    Section: " in head and b"Context " in head):
        return 0.8
    if path.name.endswith(REPORT_SUFFIXES):
        return 0.2
    return 0.0
