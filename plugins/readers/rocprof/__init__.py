"""Reader ``rocprof``: AMD's rocprof traces: the JSON of the legacy rocprof (rocprofiler v1), ``results.json``,
and the CSV files of rocprofv3 (ROCprofiler-SDK, ROCm 6.2 onward: :mod:`.csv_trace`).

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
``CPU``/``GPU``) and rocprofv3's JSON (no ``traceEvents``) are other formats: not claimed.

rocprofv3's CSV files (``<pid>_kernel_trace.csv``, ``<pid>_hip_api_trace.csv``...) are claimed by their header
and grouped by their prefix (the files of one process are one trace); a folder of them is one trace.
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
    carry ``BeginNs`` (rocprofv2's JSON has neither ``BeginNs`` nor those track names); 0.8 for a rocprofv3 CSV
    file (its header's columns) or a folder holding rocprofv3 trace files by name; else 0.0."""
    if path.is_dir() or head.lstrip(b"\xef\xbb\xbf").startswith(b'"'):
        from traceparse_plugins.readers.rocprof.csv_trace import header_form, names_a_trace_file

        if not path.is_dir():
            return 0.8 if header_form(head) is not None else 0.0
        try:
            return 0.8 if any(names_a_trace_file(p.name) for p in path.iterdir()) else 0.0
        except OSError:
            return 0.0
    if b'"traceEvents"' not in head or b'"BeginNs"' not in head:
        return 0.0
    return 0.8 if _TRACKS.search(head) else 0.0



class RocprofReader(Reader):
    name = "rocprof"
    description = ("AMD rocprof traces: rocprof v1's results.json (--hip-trace / --hsa-trace / --sys-trace) and "
                   "rocprofv3's CSV files (kernel, HIP/HSA API, memory copy and ROCTX traces, agent_info)")
    variants = ("results.json of rocprof v1, ROCm 3.x to 6.x (tblextr.py)", "gzip-compressed (.json.gz)",
                "rocprofv3 CSV, ROCm 6.2 to 7.x: <pid>_kernel_trace.csv, _hip_api_trace.csv, _memory_copy_trace.csv, "
                "_marker_api_trace.csv, _agent_info.csv ... (one process's files, or a folder)",
                "rocpd convert --output-format csv (out_*.csv, a Guid column)")
    patterns = ("results.json", "*.json", "*.json.gz", "*_kernel_trace.csv", "*_hip_api_trace.csv",
                "*_memory_copy_trace.csv")
    refines = "chrome"

    def sniff(self, path: Path, head: bytes) -> float:
        return sniff(path, head)

    def group(self, paths: list[Path]) -> list[list[Path]]:
        """rocprofv3's files of one prefix (a process: ``1234_kernel_trace.csv``, ``1234_hip_api_trace.csv``) in one
        group; a folder, a results.json or a file of another name alone, in the order given."""
        from traceparse_plugins.readers.rocprof.csv_trace import group_key

        groups: dict[object, list[Path]] = {}
        for path in paths:
            key = group_key(path) if path.is_file() else None
            groups.setdefault(key if key is not None else path, []).append(path)
        return list(groups.values())

    def read(self, paths: list[Path], options: ReadOptions) -> Trace:
        from traceparse.sources import read_head

        from traceparse_plugins.readers.rocprof.csv_trace import header_form, read_csv_trace

        # (a FIFO or another file that is no regular file goes to the JSON form, which refuses it unopened)
        if paths[0].is_dir() or paths[0].is_file() and header_form(read_head(paths[0])) is not None:
            return read_csv_trace(paths, options)
        from traceparse_plugins.readers.rocprof.events import read_results

        return read_results(paths[0], options)


@hookimpl
def traceparse_readers():
    return [RocprofReader()]
