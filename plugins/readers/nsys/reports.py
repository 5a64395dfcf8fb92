"""The ``nsys stats`` reports traceparse reads, their names across releases, and their column spellings.

Report names changed in Nsight Systems 2021.6-2022.1 (``gputrace`` became
``cuda_gpu_trace``, ``gpukernsum`` ``cuda_gpu_kern_sum``, ...); column
headers changed several times between 2020 and 2025:

* 2020.x-2021.1 (``nsysstats.Report`` scripts): ``Start(sec)`` (seconds, 6
  decimals), ``Duration(nsec)``, byte columns with no unit (``StcSMem``,
  ``Bytes``), ``Thru(MB/s)``; summaries ``Time(%)``, ``Total Time (ns)``,
  ``Instances`` / ``Num Calls`` / ``Operations``, ``Average``, ``Minimum``,
  ``Maximum`` (ns, no unit); ``gpumemsizesum`` in KiB with bare headers.
* 2021.2-2023 (``nsysstats.StatsReport`` scripts, units printed from the
  column's ``:dur_ns`` / ``:mem_B`` / ``:thru_B`` tag): ``Start (ns)``,
  ``Duration (ns)``, ``StcSMem (MB)``, ``Bytes (MB)``, ``Throughput (MBps)``;
  ``Time (%)``, ``Avg (ns)``, ``Med (ns)``, ``Min (ns)``, ``Max (ns)``,
  ``StdDev (ns)``, ``Count``, ``Total (MB)``; ``Style`` in ``nvtx_sum``.
* 2024-2025: ``GreenCtx`` added, ``Throughput (MB/s)``; ``--timeunit``
  changes ``(ns)`` to ``(us)``, ``(ms)``, ``(s)``.

Columns are matched by their base name (the header without its unit,
case-insensitive); the unit is read from the header, with the release's
default where a header has none (:func:`default_unit`).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

#: Canonical report name -> older names it had.
ALIASES: dict[str, tuple[str, ...]] = {
    "cuda_gpu_trace": ("gputrace",),
    "cuda_api_trace": ("cudaapitrace",),
    "cuda_gpu_kern_sum": ("gpukernsum",),
    "cuda_api_sum": ("cudaapisum",),
    "cuda_gpu_mem_time_sum": ("gpumemtimesum",),
    "cuda_gpu_mem_size_sum": ("gpumemsizesum",),
    "nvtx_sum": ("nvtxsum", "nvtxppsum", "nvtx_pushpop_sum"),
    "cuda_gpu_sum": ("gpusum",),
}
#: Reports read, -> (tier, event kinds covered). Tier 0 = timed events; a kind
#: is taken from the lowest tier present, so summaries never double count traces.
COVERS: dict[str, tuple[int, tuple[str, ...]]] = {
    "cuda_gpu_trace": (0, ("kernel", "memcpy", "memset")),
    "cuda_api_trace": (0, ("api",)),
    "cuda_gpu_kern_sum": (1, ("kernel",)),
    "cuda_gpu_mem_time_sum": (1, ("memcpy", "memset")),
    "cuda_gpu_mem_size_sum": (1, ("memcpy", "memset")),
    "cuda_api_sum": (1, ("api",)),
    "nvtx_sum": (1, ("marker",)),
    "cuda_gpu_sum": (2, ("kernel", "memcpy", "memset")),
}
#: Other nsys stats reports: recognised in file names (for grouping) but not read.
OTHER_REPORTS = (
    "osrt_sum", "osrtsum", "nvtx_pushpop_trace", "nvtx_startend_sum", "nvtx_kern_sum", "nvtx_gpu_proj_sum",
    "nvtx_gpu_proj_trace", "cuda_api_gpu_sum", "cuda_gpu_kern_gb_sum", "cuda_kern_exec_sum",
    "cuda_kern_exec_trace", "cuda_gpu_mem_time_trace", "kernexecsum", "kernexectrace", "openmp_sum",
    "openmpevtsum", "openacc_sum", "openaccsum", "um_sum", "um_total_sum", "um_cpu_page_faults_sum",
    "umsum", "umtotalsum", "umcpupagefaults", "vulkan_api_sum", "vulkan_api_trace", "vulkan_marker_sum",
    "vulkan_gpu_marker_sum", "vulkanmarkerssum", "opengl_khr_range_sum", "opengl_khr_gpu_range_sum",
    "khrdebugsum", "khrdebuggpusum", "dx11_pix_sum", "dx12_gpu_marker_sum", "dx12_pix_sum", "pixsum",
    "wddm_queue_sum", "wddmqueuesdetails", "mpi_event_sum", "mpi_event_trace", "nvvideo_api_sum",
    "nvtxgpuprojsum", "nvtxgpuprojtrace", "network_sum", "syscall_sum",
)

_CANONICAL = {alias: name for name, aliases in ALIASES.items() for alias in (name, *aliases)}
_ALL_NAMES = sorted({*_CANONICAL, *OTHER_REPORTS}, key=len, reverse=True)


@functools.cache
def _file_name() -> re.Pattern:
    """``PREFIX_REPORT[_table].EXT`` as a regular expression, compiled when a name is first parsed: the
    alternation of every report's name and alias took 25 ms to compile, paid by every command at start-up."""
    return re.compile(r"^(?P<prefix>.+?)_(?P<report>" + "|".join(map(re.escape, _ALL_NAMES)) + r")(?P<table>_table)?"
                      r"\.(?P<ext>csv|tsv|txt)$", re.IGNORECASE)


@dataclass(frozen=True)
class FileName:
    """What a file name ``PREFIX_REPORT[_table].EXT`` says."""

    prefix: str
    report: str          # canonical name, or the other report's name as written
    supported: bool      # a report traceparse reads
    table: bool          # the ``_table`` suffix (default text format)


def parse_file_name(name: str) -> FileName | None:
    """Split ``resnet_cuda_gpu_trace.csv`` into prefix and report; None if the name names no nsys report."""
    m = _file_name().match(name)
    if not m:
        return None
    written = m.group("report").lower()
    canonical = _CANONICAL.get(written)
    return FileName(m.group("prefix"), canonical or written, canonical is not None, bool(m.group("table")))


# -- columns -----------------------------------------------------------------
#: Header base name (lower-case, single spaces) -> canonical field.
FIELDS: dict[str, str] = {
    "start": "start", "start time": "start",
    "end": "end",
    "duration": "duration",
    "corrid": "corr",
    "grdx": "grid_x", "grdy": "grid_y", "grdz": "grid_z",
    "blkx": "block_x", "blky": "block_y", "blkz": "block_z",
    "reg/trd": "regs",
    "stcsmem": "ssmem", "dymsmem": "dsmem",
    "bytes": "bytes",
    "throughput": "throughput", "thru": "throughput",
    "srcmemkd": "src_kind", "dstmemkd": "dst_kind",
    "device": "device", "ctx": "context", "greenctx": "green_context", "strm": "stream",
    "pid": "pid", "tid": "tid", "result": "result", "t-pri": "thread_priority", "thread name": "thread_name",
    "name": "name", "operation": "operation", "range": "range", "style": "style", "category": "category",
    "total time": "total_time", "total": "total",
    "instances": "count", "num calls": "count", "calls": "count", "count": "count", "operations": "count",
    "avg": "avg", "average": "avg", "med": "med", "median": "med",
    "min": "min", "minimum": "min", "max": "max", "maximum": "max", "stddev": "stddev", "std dev": "stddev",
    "localmem": "local_mem", "shrdmemexec": "smem_executed",
}
#: Fields whose cells are times, sizes or plain integers.
TIME_FIELDS = {"start", "end", "duration", "total_time", "avg", "med", "min", "max", "stddev"}
SIZE_FIELDS = {"ssmem", "dsmem", "bytes", "total", "local_mem", "smem_executed"}
INT_FIELDS = {"corr", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "regs", "context",
              "green_context", "stream", "pid", "tid", "count", "result", "thread_priority"}
#: Fields that only nsys reports have (a header needs one of them to be taken for nsys).
NSYS_ONLY = {"corr", "grid_x", "block_x", "regs", "ssmem", "src_kind", "stream", "thread_priority",
             "total_time", "range", "style", "operation", "thread_name"}


#: The columns each report must have (its events are built from them, events.py), as nsys heads them.
REQUIRED = {
    "cuda_gpu_trace": {"start": "Start", "duration": "Duration", "name": "Name"},
    "cuda_api_trace": {"start": "Start", "duration": "Duration", "name": "Name"},
    "cuda_gpu_kern_sum": {"name": "Name"},
    "cuda_api_sum": {"name": "Name"},
    "nvtx_sum": {"range": "Range"},
    "cuda_gpu_mem_time_sum": {"operation": "Operation"},
    "cuda_gpu_mem_size_sum": {"operation": "Operation"},
    "cuda_gpu_sum": {"operation": "Operation"},
}


def field_of(base: str) -> str | None:
    """The canonical field for a header base name, or None for a column traceparse does not use."""
    return FIELDS.get(" ".join(base.lower().split()))


def identify(columns: dict[str, tuple[str, str | None]], file_report: str | None) -> str | None:
    """Which report a header belongs to, from its fields; None if it cannot tell.

    ``columns`` maps each canonical field to its header's (base name,
    unit). The file name (``file_report``) only breaks ties the header
    cannot: ``cuda_api_sum`` and ``osrt_sum`` have the same columns.
    """
    fields = set(columns)
    if {"start", "duration"} <= fields:
        if fields & {"grid_x", "block_x", "regs", "src_kind", "ssmem", "stream", "bytes"}:
            return "cuda_gpu_trace"
        if "name" in fields and fields & {"corr", "result", "thread_name", "thread_priority"}:
            return file_report if file_report not in (None, "cuda_gpu_trace") else "cuda_api_trace"
        return None
    if "count" not in fields:
        return None
    if "range" in fields:
        return "nvtx_sum"
    if "operation" in fields:
        if "category" in fields:
            return "cuda_gpu_sum"
        if "total_time" in fields:
            return "cuda_gpu_mem_time_sum"
        if "total" in fields:
            return "cuda_gpu_mem_size_sum"
        return None
    if "name" in fields and "total_time" in fields:
        if file_report is not None and file_report not in COVERS.keys() - {"cuda_gpu_kern_sum", "cuda_api_sum"}:
            return file_report
        count = columns["count"][0].lower()
        return "cuda_gpu_kern_sum" if count == "instances" else "cuda_api_sum"
    return None


def value_kind(report: str, field: str) -> str:
    """How a report's column is read: ``time``, ``size``, ``int`` or ``text``."""
    if report == "cuda_gpu_mem_size_sum" and field in {"total", "avg", "med", "min", "max", "stddev"}:
        return "size"
    if field in TIME_FIELDS:
        return "time"
    if field in SIZE_FIELDS:
        return "size"
    if field in INT_FIELDS:
        return "int"
    return "text"


def default_unit(report: str, kind: str) -> str:
    """The unit of a column whose header names none, as the release that wrote it used.

    ``gpumemsizesum`` (2020-2021.1) wrote sizes in KiB with bare headers
    (``Total``, ``Average``: its own help says "All memory values given in
    KiB"); other bare size columns (``StcSMem``, ``Bytes`` of ``gputrace``)
    are bytes; bare times are ns.
    """
    if kind == "size":
        return "KiB" if report == "cuda_gpu_mem_size_sum" else "B"
    return "ns"
