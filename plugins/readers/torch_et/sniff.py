"""Recognising a PyTorch execution trace by its own structure (confidence scale: :meth:`traceparse.reader.Reader.sniff`).

``torch.profiler.ExecutionTraceObserver`` writes one JSON object whose first
keys are ``"schema"`` (``"1.0.1"``, ``"1.1.1-chakra.0.0.4"``...), ``"pid"``,
``"time"``, ``"start_ts"`` and then ``"nodes"``: that signature is 1.0. A
directory holding exactly one such file beside other JSON files (its Kineto
trace) is 0.8: the pair, read together. Anything else is 0.0.
"""

from __future__ import annotations

import re
from pathlib import Path

from traceparse.sources import read_head

_SIGNATURE = re.compile(rb'^(?:\xef\xbb\xbf)?\s*\{\s*"schema"\s*:\s*"[^"\\]{0,64}"\s*,\s*"pid"\s*:\s*-?\d+')
_PID = re.compile(rb'"pid"\s*:\s*(-?\d+)')
_SCHEMA = re.compile(rb'"schema"\s*:\s*"([^"\\]{0,64})"')
#: File names a directory's trace files have (an execution trace and its Kineto trace are JSON, often gzip).
JSON_SUFFIXES = (".json", ".json.gz")
#: At most this many files of a directory are looked at (a sniffer reads "a few names inside it").
MAX_DIRECTORY_FILES = 64


def is_execution_trace(head: bytes) -> bool:
    """True when ``head`` (the first bytes, decompressed) starts like an execution trace."""
    return bool(_SIGNATURE.match(head)) and b'"nodes"' in head


def head_facts(head: bytes) -> tuple[str | None, int | None]:
    """The ``schema`` and ``pid`` an execution trace's head names (None where it does not)."""
    schema, pid = _SCHEMA.search(head), _PID.search(head)
    return (schema.group(1).decode("utf-8", "replace") if schema else None,
            int(pid.group(1)) if pid else None)


def kineto_pid(head: bytes) -> int | None:
    """The pid of the first event after ``traceEvents`` in a Kineto trace's head (None if the head has none)."""
    at = head.find(b'"traceEvents"')
    m = _PID.search(head, at) if at >= 0 else None
    return int(m.group(1)) if m else None


def directory_files(path: Path) -> list[Path]:
    """The JSON files of a directory (sorted, hidden ones left out), at most :data:`MAX_DIRECTORY_FILES`."""
    try:
        files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")
                       and p.name.lower().endswith(JSON_SUFFIXES))
    except OSError:
        return []
    return files[:MAX_DIRECTORY_FILES]


def execution_traces_in(files: list[Path]) -> list[Path]:
    """Those of ``files`` that start like an execution trace (unreadable ones left out)."""
    out = []
    for path in files:
        try:
            if is_execution_trace(read_head(path, 4096)):
                out.append(path)
        except Exception:  # a sniffer never raises
            continue
    return out


def sniff(path: Path, head: bytes) -> float:
    """1.0 for an execution trace; 0.8 for a directory of one execution trace and other JSON files; else 0.0."""
    if path.is_dir():
        files = directory_files(path)
        return 0.8 if len(files) >= 2 and len(execution_traces_in(files)) == 1 else 0.0
    return 1.0 if is_execution_trace(head) else 0.0
