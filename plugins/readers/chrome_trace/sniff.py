"""Recognising Chrome Trace Event JSON (confidence scale: :meth:`traceparse.reader.Reader.sniff`).

* 1.0: a traceparse export: the document's first key is ``"traceparse"``
  (a signature the exporter writes first).
* 0.5: a JSON object with a ``"traceEvents"`` key, or a JSON array whose
  head has ``"ph"`` keys: Chrome's generic structure, which more specific
  readers (torch) refine.
"""

from __future__ import annotations

from pathlib import Path

from traceparse_plugins.readers.chrome_trace.export import is_export


def sniff(path: Path, head: bytes) -> float:
    if is_export(head):
        return 1.0
    stripped = head.lstrip(b" \t\r\n\xef\xbb\xbf")
    if stripped.startswith(b"{") and b'"traceEvents"' in head:
        return 0.5
    if stripped.startswith(b"[") and b'"ph"' in head:
        return 0.5
    return 0.0
