"""Reader ``rocprof``: the JSON trace of AMD's legacy rocprof (rocprofiler v1), ``results.json``.

``rocprof --hip-trace [--hsa-trace --sys-trace --roctx-trace] -o results.csv APP`` writes, beside its CSV files,
a Chrome trace made by rocprofiler's ``bin/tblextr.py`` (ROCm 2.x to 6.x; format notes in
``docs/formats/rocprof.md``). Its processes are rocprof's tracks, named by ``process_name`` metadata events:

- ``CPU HIP API``, ``CPU HSA API``, ``CPU KFD API``: runtime calls, ``api`` rows on the calling process and
  thread (``args.pid``/``args.tid``; before ROCm 4.3 ``args.proc-id`` is the process and ``args.pid`` the
  track). HSA's ``hsa_dispatch`` events are rocprof's own marks of a kernel dispatch, not calls: markers;
- ``COPY``: copies, ``memcpy`` rows, their direction from the name (``CopyHostToDevice`` is HtoD; HSA's
  ``async-copy`` names none), their device ``args.dev-id``, their stream ``args.stream-id`` (else the
  event's ``tid``);
- ``GPU<n>``: kernel dispatches on device ``n`` (rocprof's ``dev-id``: an agent number, not HIP's device
  index), ``kernel`` rows; a kernel record of the counter path (``args.KernelName``) gives its grid, workgroup
  and vector registers;
- ``Markers and Ranges``: ROCTX, a marker (rocprof writes it 1 ns long) or a range (``region``).

Other tracks (``GPU Barriers<n>``, ROCm 6.2's barrier packets) are skipped and counted in a warning; flow
events (``DataFlow``: a call to the copy or dispatch it queued) are links, not slices: they make the launch
links (``correlation_id``), and a copy none reaches takes the synchronous copy call it ran inside. Times are the
exact nanoseconds of ``args.BeginNs`` and ``args.EndNs`` (the top-level ``ts``/``dur`` are the same truncated to
microseconds, and since ROCm 3.10 may be shifted to the run's start). rocprofv2's JSON (no ``BeginNs``, tracks
``CPU``/``GPU``) and rocprofv3's (no ``traceEvents``) are other formats: not claimed.
"""

from __future__ import annotations

import re
from pathlib import Path

from traceparse.plugins import hookimpl
from traceparse.reader import ReadOptions, Reader
from traceparse.trace import Trace

#: The track names of rocprof v1 (ROCm 3.0–3.3 wrote them after an index: ``0 CPU HIP API``).
_TRACKS = re.compile(rb'"name"\s*:\s*"(?:\d+ )?(?:CPU HIP API|CPU HSA API|CPU KFD API|COPY|GPU\d+|Markers and Ranges)"')


def sniff(path: Path, head: bytes) -> float:
    """0.8 for a rocprof v1 ``results.json``: a Chrome trace whose head names rocprof's tracks and whose events
    carry ``BeginNs`` (rocprofv2's JSON has neither ``BeginNs`` nor those track names); else 0.0."""
    if b'"traceEvents"' not in head or b'"BeginNs"' not in head:
        return 0.0
    return 0.8 if _TRACKS.search(head) else 0.0


class RocprofReader(Reader):
    name = "rocprof"
    description = "AMD rocprof (rocprofiler v1) JSON traces: results.json of --hip-trace / --hsa-trace / --sys-trace"
    variants = ("results.json of rocprof v1, ROCm 3.x to 6.x (tblextr.py)", "gzip-compressed (.json.gz)")
    patterns = ("results.json", "*.json", "*.json.gz")
    refines = "chrome"

    def sniff(self, path: Path, head: bytes) -> float:
        return sniff(path, head)

    def read(self, paths: list[Path], options: ReadOptions) -> Trace:
        from traceparse_plugins.readers.rocprof.events import read_results

        return read_results(paths[0], options)


@hookimpl
def traceparse_readers():
    return [RocprofReader()]
