"""Recognising a Kineto trace by its own structure (confidence scale: :meth:`traceparse.reader.Reader.sniff`).

A Kineto trace is a JSON object whose first key is one of Kineto's top-level
keys (``schemaVersion`` since PyTorch 1.9, ``traceEvents`` before) and whose
head shows Kineto's own vocabulary: its top-level keys (``deviceProperties``,
``distributedInfo``), its event categories (``cpu_op``, ``cuda_runtime``,
``kernel``, ``python_function``), its ``External id`` argument or its
``PyTorch Profiler`` process names. That is a self-describing structure:
0.8. A Kineto document that another tool rewrote with its own key first
(TraceLens' harness puts a ``"metadata"`` object before ``traceEvents`` and
Kineto's keys after it) is claimed at 0.8 too when its head has both of
Kineto's own top-level keys ``"schemaVersion"`` and ``"deviceProperties"``,
or Kineto's ``"External id"`` argument with one of its host categories
(``cpu_op``, ``cuda_runtime``, ``python_function``). The pre-release Kineto of
PyTorch 1.8 (late 2020) wrote a bare array of events: claimed at 0.8 when its
head has Kineto's ``"External id"`` argument and its ``"Operator"`` category or
``"Trace name": "PyTorch Profiler"``. Anything else is not claimed
(0.0); a generic Chrome trace is the ``chrome`` reader's, which this reader
refines.
"""

from __future__ import annotations

import re
from pathlib import Path

#: Top-level keys Kineto writes (any of them may come first, depending on the version and on who rewrote the file).
KINETO_KEYS = frozenset({
    b"schemaVersion", b"traceEvents", b"deviceProperties", b"distributedInfo", b"traceName", b"displayTimeUnit",
    b"baseTimeNanoseconds", b"cupti_version", b"cuda_runtime_version", b"cuda_driver_version", b"hip_runtime_version",
    b"roctracer_version", b"record_shapes", b"with_flops", b"profile_memory", b"with_stack", b"with_modules",
    b"trace_id",
})
#: Kineto's own words: top-level keys, event categories, argument and process names.
KINETO_MARKERS = (b'"deviceProperties"', b'"schemaVersion"', b'"distributedInfo"', b'"cpu_op"', b'"cuda_runtime"',
                  b'"Operator"', b'"python_function"', b'"kernel"', b'"External id"', b'"PyTorch Profiler')
_REWRITTEN_KEYS = (b'"schemaVersion"', b'"deviceProperties"')
_HOST_CATEGORIES = (b'"cpu_op"', b'"cuda_runtime"', b'"python_function"')
_FIRST_KEY = re.compile(rb'^(?:\xef\xbb\xbf)?\s*\{\s*"([^"\\]{1,64})"\s*:')


_ARRAY_START = re.compile(rb'^(?:\xef\xbb\xbf)?\s*\[\s*\{')
_EARLY_KINETO = (b'"Operator"', b'"PyTorch Profiler"')


def sniff(path: Path, head: bytes) -> float:
    """0.8 for a Kineto document, else 0.0."""
    if _ARRAY_START.match(head):  # PyTorch 1.8's pre-release Kineto: a bare array of events
        return 0.8 if b'"External id"' in head and any(m in head for m in _EARLY_KINETO) else 0.0
    m = _FIRST_KEY.match(head)
    if not m or b'"traceEvents"' not in head:
        return 0.0
    if m.group(1) not in KINETO_KEYS:  # rewritten by another tool: Kineto's own top-level keys must be there
        keys = all(key in head for key in _REWRITTEN_KEYS)
        events = b'"External id"' in head and any(cat in head for cat in _HOST_CATEGORIES)
        return 0.8 if keys or events else 0.0
    return 0.8 if any(marker in head for marker in KINETO_MARKERS) else 0.0
