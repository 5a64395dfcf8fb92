"""Recognising a JAX/XLA profile by its content (confidence scale: :meth:`traceparse.reader.Reader.sniff`).

* An XSpace protobuf (``*.xplane.pb``): 0.8 when the bytes begin as an XSpace does: field 1 (``planes``,
  wire type 2: byte ``0x0a``), a length, then the plane's ``id`` (``0x08``) or ``name`` (``0x12``), and the
  head holds an XLA plane name (``/host:CPU``, ``/device:GPU:``, ``/host:metadata``, ...). 0.2 for the
  file name alone (read, then refused in one line if it is not one).
* A JSON timeline (``*.trace.json.gz``, ``perfetto_trace.json.gz``): 0.8 when a JSON object with
  ``traceEvents`` names an XLA plane as a process (``"/device:GPU:0"``, ``"/host:CPU"``) or an XLA stream
  as a thread (``"Stream #14(Compute,...)"``), or carries XLA's stats (``"hlo_op"``, ``"hlo_module"``).
  The ``chrome`` reader, which this one refines, reads any other Chrome trace.
* A directory: 0.8 when it holds a JAX profile (:func:`.profile_dir.profile_files` finds one) whose first
  file is one by its content, as above, so that ``traceparse analyze trace_dir/`` reads the directory
  ``jax.profiler.trace(trace_dir)`` wrote. The file names alone do not say: torch.profiler's
  ``tensorboard_trace_handler`` names its files ``*.pt.trace.json.gz``, which end as JAX's do.
"""

from __future__ import annotations

import re
from pathlib import Path

from traceparse_plugins.readers.jax.profile_dir import profile_files

#: Names of XLA planes, as they occur in an XSpace's bytes and as process names in the JSON timelines.
PLANE_NAMES = (b"/host:CPU", b"/device:GPU:", b"/device:TPU:", b"/host:metadata", b"/device:CUSTOM:")
_JSON_MARKERS = (b'"/device:GPU:', b'"/device:TPU:', b'"/host:CPU"', b'"hlo_op"', b'"hlo_module"')
_STREAM_THREAD = re.compile(rb'"Stream #\d+(\(|")')


def is_xspace(head: bytes) -> bool:
    """Whether ``head`` begins as an XSpace (its first field is a plane with an id or a name) naming an XLA plane."""
    if len(head) < 4 or head[0] != 0x0A:
        return False
    i = 1
    while i < min(len(head), 11) and head[i] & 0x80:  # the plane's length (a varint)
        i += 1
    return i + 1 < len(head) and head[i + 1] in (0x08, 0x12) and any(n in head for n in PLANE_NAMES)


def _is_profile_file(path: Path) -> bool:
    """Whether a file a profile directory holds is an XSpace or an XLA JSON timeline by its first bytes."""
    from traceparse.sources import read_head

    try:
        head = read_head(path)
    except (OSError, ValueError):
        return False
    return sniff(path, head) >= 0.8


def sniff(path: Path, head: bytes) -> float:
    """Confidence that ``path`` is a JAX/XLA profile (see the module docstring)."""
    if not head:
        if path.is_dir():
            files = profile_files(path)
            return 0.8 if files and _is_profile_file(files[0]) else 0.0
        return 0.0
    if is_xspace(head):
        return 0.8
    stripped = head.lstrip(b" \t\r\n\xef\xbb\xbf")
    if stripped.startswith(b"{") and b'"traceEvents"' in head:
        if any(m in head for m in _JSON_MARKERS) or _STREAM_THREAD.search(head):
            return 0.8
        return 0.0
    if path.name.endswith(".xplane.pb"):
        return 0.2
    return 0.0
