"""rocprofv3's CSV output (ROCprofiler-SDK, ROCm 6.2 onward) to rows of the normalized event table.

``rocprofv3 --kernel-trace --hip-trace --memory-copy-trace --marker-trace [--output-format csv] -- APP`` writes one
file per kind of record and process, ``<pid>_<kind>.csv`` (in ``<hostname>/`` by default); ``rocpd convert
--output-format csv`` writes the same from a ROCm 7 database as ``out_<kind>.csv``, with a ``Guid`` column first.
Each file is named by its header, not its name, and its columns by name, any case (they moved and were renamed
between releases: ``docs/formats/rocprof.md``):

- ``kernel_trace``: kernel dispatches, ``kernel`` rows on the GPU agent ``Agent_Id``, stream ``Stream_Id`` (else
  the HSA queue ``Queue_Id``), grid in workgroups (``Grid_Size_*`` counts work-items), vector registers;
- ``hip_api_trace``, ``hsa_api_trace``, ``rccl_api_trace`` and other ``Domain,Function`` files: runtime calls,
  ``api`` rows; ``marker_api_trace``'s ROCTX ranges (one row a range, its message the ``Function``) are
  ``region`` rows and its marks (start = end) ``marker`` rows;
- ``memory_copy_trace``: copies, ``memcpy`` rows, their direction from ``Direction``, on the GPU end of the copy;
- ``agent_info``: the devices (a GPU's ``Agent_Id`` is its logical node id: ``1`` in ROCm 6, ``"Agent 1"`` in 7).

``Correlation_Id`` links a call to the dispatch or copy it queued (the innermost traced call of the thread; 0
where no call was traced) within one process. Times are integer nanoseconds (``CLOCK_BOOTTIME``), read exactly.
Summaries (``*_stats``), counters, allocations, scratch memory and PC samples are not timeline rows: skipped, named
in a warning.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from traceparse import units
from traceparse.errors import InputError, bad_input
from traceparse.figures import fmt_count
from traceparse.meta import Device
from traceparse.reader import ReadOptions
from traceparse.sources import open_binary, read_head
from traceparse.trace import Trace, TraceMeta

#: What each kind of file holds, told by its header's column names (lower-case, ``guid`` aside).
FORMS = {
    "kernel": {"kind", "agent_id", "queue_id", "kernel_name", "correlation_id", "start_timestamp", "end_timestamp"},
    "api": {"domain", "function", "process_id", "thread_id", "correlation_id", "start_timestamp", "end_timestamp"},
    "copy": {"kind", "direction", "source_agent_id", "destination_agent_id", "start_timestamp", "end_timestamp"},
    "agents": {"node_id", "logical_node_id", "agent_type"},
    "stats": {"name", "calls", "totaldurationns"},
    "counters": {"counter_name", "counter_value"},
    "allocations": {"kind", "operation", "agent_id", "start_timestamp"},
    "samples": {"sample_timestamp"},
}
#: The forms that are timeline rows; the others are read for devices (agents) or skipped.
TIMELINE = ("kernel", "api", "copy")
#: ``<prefix>_<kind>.csv``: the file names rocprofv3 and ``rocpd convert`` write.
FILE_NAME = re.compile(r"^(?P<prefix>.+?)_(?P<kind>(?:hip|hsa|marker|rccl|rocdecode|rocjpeg|kfd|ompt|openmp)"
                       r"_api_trace|hip_api|hsa_api|kernel_trace|memory_copy_trace|memory_allocation_trace|"
                       r"scratch_memory_trace|counter_collection|agent_info|pc_sampling_\w+|\w+_stats)\.csv$")
#: A copy's direction, as ``Direction`` names it (ROCm's docs once wrote it without the prefix).
DIRECTIONS = {"HOST_TO_DEVICE": "HtoD", "DEVICE_TO_HOST": "DtoH", "DEVICE_TO_DEVICE": "DtoD", "HOST_TO_HOST": "HtoH"}
#: An agent as rocprofv3 writes it: ``4`` (ROCm 6), ``"Agent 4"``, ``"GPU 0"`` (ROCm 7's ``--agent-index``).
_AGENT = re.compile(r"^\s*(?:(Agent|GPU|CPU)\s+)?(\d{1,9})\s*$")
#: The ROCTX domains of marker files: ranges and marks (the others, such as MARKER_CONTROL_API, are calls).
_ROCTX = ("MARKER_CORE_API", "MARKER_CORE_RANGE_API")


def header_form(head: bytes) -> str | None:
    """The form (a key of :data:`FORMS`) of a CSV whose first bytes are ``head``, or None: every name quoted, as
    rocprofv3's writer quotes them, and the form's columns all present."""
    first = head.split(b"\n", 1)[0].strip().lstrip(b"\xef\xbb\xbf")
    if not first.startswith(b'"') or b'"' not in first[1:]:
        return None
    try:
        names = {n.strip().lower() for n in next(csv.reader([first.decode("utf-8")]))}
    except (UnicodeDecodeError, csv.Error, StopIteration):
        return None
    names.discard("guid")
    return next((form for form, needed in FORMS.items() if needed <= names), None)


#: The files of the timeline, by their name's kind (a folder holding one is rocprofv3's output).
TIMELINE_FILES = ("kernel_trace", "hip_api_trace", "hsa_api_trace", "memory_copy_trace", "marker_api_trace")


def names_a_trace_file(name: str) -> bool:
    """Whether a file name is one of rocprofv3's timeline files (``1234_kernel_trace.csv``)."""
    match = FILE_NAME.match(name)
    return bool(match) and match.group("kind") in TIMELINE_FILES


def group_key(path: Path) -> tuple[Path, str] | None:
    """(folder, prefix) of a rocprofv3 file name (``1234_kernel_trace.csv``: the files of one process), else None."""
    match = FILE_NAME.match(path.name)
    return (path.parent, match.group("prefix")) if match else None


@dataclass
class _Table:
    """One CSV file: its path, form, columns (lower-case names, every cell text; ``_line`` each row's line and, in
    a timeline file, ``_start``/``_end`` its times as integers) and the prefix of its name."""

    path: Path
    form: str
    frame: pl.DataFrame
    prefix: str | None

    def col(self, name: str) -> pl.Expr:
        return pl.col(name) if name in self.frame.columns else pl.lit(None, dtype=pl.String)


def read_csv_trace(paths: list[Path], options: ReadOptions) -> Trace:
    """The rows of rocprofv3 CSV files (one process's, or a folder of them), with devices from ``agent_info``."""
    files = _files(paths)
    if not files and paths[0].is_dir():
        raise bad_input(paths[0], None, "a directory, not a file: give the trace file itself, or a folder of "
                                        "rocprofv3's CSV files (there is none here)")
    tables, skipped = [], []
    for path in files:
        form = header_form(_head(path))
        if form is None:
            continue
        if form in TIMELINE or form == "agents":
            tables.append(_read(path, form, options))
        else:
            skipped.append(path.name)
    if not any(t.form in TIMELINE for t in tables):
        what = ", ".join(sorted(skipped)) or ", ".join(p.name for p in files)
        raise bad_input(paths[0], None, f"no rocprofv3 trace file to read (found {what}: summaries, counters or "
                                        "allocations; the timeline is in <pid>_kernel_trace.csv, "
                                        "<pid>_hip_api_trace.csv, <pid>_memory_copy_trace.csv)")
    if skipped:
        options.warn(f"{paths[0] if len(paths) == 1 else paths[0].parent}: skipped files that are not timeline "
                     f"rows: {', '.join(sorted(skipped))}")
    agents = next((t for t in tables if t.form == "agents"), None)
    gpu_index, devices = _devices(agents) if agents is not None else ({}, [])
    if agents is None and any(t.form in ("kernel", "copy") for t in tables):
        options.warn(f"{paths[0]}: no agent_info.csv beside the trace: device ids are rocprofv3's agent numbers "
                     "(logical node ids, CPUs counted first), not HIP's device indices")
    frames = [_rows(t, gpu_index) for t in tables if t.form in TIMELINE]
    frame = _one_pid_each(pl.concat(frames, how="diagonal_relaxed"))
    frame = _unique_links(frame, options, paths[0])
    guid = any("guid" in t.frame.columns for t in tables)
    meta = TraceMeta(tool="rocprofv3", variant="rocprofv3 CSV" + (" (rocpd convert)" if guid else ""),
                     devices=devices)
    meta.summary.update({f"{k}_rows": n for k, n in frame.group_by("kind").len().sort("kind").iter_rows()})
    meta.warnings = options.warnings
    return Trace(frame.drop("_prefix"), meta)


def _files(paths: list[Path]) -> list[Path]:
    """The CSV files of ``paths``, a folder's in name order."""
    out = []
    for path in paths:
        out.extend(sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(".csv"))
                   if path.is_dir() else [path])
    return out


def _head(path: Path) -> bytes:
    """The file's first bytes, decompressed (a gzip stream cut short gives what it has)."""
    return read_head(path, 4096)


def _read(path: Path, form: str, options: ReadOptions) -> _Table:
    """``path`` as text columns named in lower case; a last row the profiler did not finish is left out."""
    with open_binary(path, text=True) as f:
        data = f.read()
    if b"\n" not in data.strip():  # a header alone (ended inside its last name or not): no rows
        data = data.strip() + b"\n"
    elif not data.endswith(b"\n") and _cut_short(data):  # each row ends with a line break
        line = data.count(b"\n") + 1
        options.incomplete(f"{path}:{line}: the file ends inside a row (the profiler stopped while writing it): "
                           "that row is left out")
        data = data[: data.rfind(b"\n") + 1]
    try:
        frame = pl.read_csv(io.BytesIO(data), infer_schema=False, quote_char='"', raise_if_empty=False)
    except pl.exceptions.PolarsError:
        raise _csv_error(path, data) from None
    frame = frame.rename({c: c.strip().lower() for c in frame.columns})
    frame = frame.with_columns(_line=pl.int_range(2, frame.height + 2, dtype=pl.Int64))
    frame = frame.filter(~pl.all_horizontal(pl.exclude("_line").is_null()))  # blank lines
    if form in TIMELINE:  # integer nanoseconds, through the one converter of decimal text (null where none)
        frame = frame.with_columns(**{f"_{end}": units.column_to_int(frame[f"{end}_timestamp"], "ns", strict=False)
                                      for end in ("start", "end")})
    match = FILE_NAME.match(path.name)
    return _Table(path, form, frame, match.group("prefix") if match else None)


def _cut_short(data: bytes) -> bool:
    """Whether the last row of ``data`` (no line break after it) was cut while written: fields missing, or its
    times no whole pair (``...,3000,30`` of ``3000,3050``: an end before its start)."""
    lines = data.decode("utf-8", errors="replace")
    header = next(csv.reader([lines[: lines.find("\n")]]), [])
    last = next(csv.reader([lines[lines.rfind("\n") + 1:]]), [])
    if len(last) != len(header):
        return True
    names = [n.strip().lower() for n in header]
    if "start_timestamp" not in names or "end_timestamp" not in names:
        return False
    start, end = (last[names.index(f"{e}_timestamp")].strip() for e in ("start", "end"))
    return not (start.isascii() and start.isdigit() and end.isascii() and end.isdigit() and int(end) >= int(start))


def _csv_error(path: Path, data: bytes) -> InputError:
    """The one-line error of a CSV polars could not read: the first row whose fields do not match the header."""
    rows = csv.reader(io.StringIO(data.decode("utf-8", errors="replace")))
    try:
        width = len(next(rows))
        for row in rows:
            if len(row) != width:
                return bad_input(path, rows.line_num, f"{width} comma-separated fields as in the header, got "
                                                      f"{len(row)}")
    except csv.Error as exc:
        return bad_input(path, rows.line_num, f"CSV as rocprofv3 writes it ({exc})")
    return bad_input(path, None, "CSV as rocprofv3 writes it")


def _integer(expr: pl.Expr) -> pl.Expr:
    """Decimal text as Int64 (null where empty or no integer)."""
    return expr.str.strip_chars().str.to_integer(strict=False).cast(pl.Int64, strict=False)


def _agent(expr: pl.Expr) -> pl.Expr:
    """An ``Agent_Id`` as its number (``4``, ``"Agent 4"``, ``"GPU 0"``)."""
    return _integer(expr.str.extract(r"(\d{1,9})\s*$", 1))


def _device(expr: pl.Expr, gpu_index: dict[int, int]) -> pl.Expr:
    """A GPU agent as the device id shown: its HIP index where agent_info.csv gives it, else the agent's number.
    ``GPU <n>`` (``--agent-index=type-relative``) is that index already."""
    number = _agent(expr)
    mapped = number.replace_strict(gpu_index, default=number, return_dtype=pl.Int64) if gpu_index else number
    return pl.when(expr.str.strip_chars().str.starts_with("GPU")).then(number).otherwise(mapped).cast(pl.Int32)


def _rows(table: _Table, gpu_index: dict[int, int]) -> pl.DataFrame:
    """One file's rows in the table's columns (``_prefix``: the file name's, for :func:`_one_pid_each`); a row
    that ends before it starts, or has no times, is a one-line error naming its line."""
    t, c = table, table.col
    start, end = pl.col("_start"), pl.col("_end")
    bad = t.frame.filter(start.is_null() | end.is_null() | (end < start))
    if bad.height:
        line = int(bad["_line"][0])
        raw = t.frame.filter(pl.col("_line") == line).select(c("start_timestamp"), c("end_timestamp")).row(0)
        got = " and ".join("nothing" if v is None else repr(v) for v in raw)
        raise bad_input(t.path, line, "Start_Timestamp and End_Timestamp, integer nanoseconds with the end no earlier "
                                      f"than the start, got {got}")
    common = dict(start_ns=start, duration_ns=end - start, _prefix=pl.lit(t.prefix, dtype=pl.String),
                  correlation_id=pl.when(_integer(c("correlation_id")) > 0).then(_integer(c("correlation_id"))))
    if t.form == "kernel":
        def per_dim(axis: str) -> tuple[pl.Expr, pl.Expr]:
            grid, size = _integer(c(f"grid_size_{axis}")), _integer(c(f"workgroup_size_{axis}"))
            # Grid_Size counts work-items; HSA runs a last workgroup in part: the workgroups are the ratio, rounded up
            return (pl.when(size > 0).then((grid + size - 1) // size).cast(pl.Int32, strict=False),
                    pl.when(size > 0).then(size).cast(pl.Int32, strict=False))

        dims = {f"{k}_{axis}": e for axis in "xyz" for k, e in zip(("grid", "block"), per_dim(axis))}
        # (Thread_Id is the host thread that queued the dispatch, not where it ran: no thread, as every GPU row)
        return t.frame.select(kind=pl.lit("kernel"), name=c("kernel_name"), **common,
                              device_id=_device(c("agent_id"), gpu_index),
                              stream_id=pl.coalesce(_integer(c("stream_id")), _integer(c("queue_id"))),
                              registers_per_thread=_integer(c("vgpr_count")).cast(pl.Int32, strict=False),
                              static_smem_bytes=_integer(c("lds_block_size")), **dims)
    if t.form == "copy":
        direction = c("direction").str.strip_chars().str.replace(r"^MEMORY_COPY_", "")
        copy_kind = direction.replace_strict(DIRECTIONS, default=None, return_dtype=pl.String)
        src, dst = _device(c("source_agent_id"), gpu_index), _device(c("destination_agent_id"), gpu_index)
        return t.frame.select(kind=pl.lit("memcpy"), name=pl.lit("Memcpy ") + copy_kind.fill_null("?"), **common,
                              copy_kind=copy_kind, stream_id=_integer(c("stream_id")),
                              device_id=pl.when(copy_kind == "HtoD").then(dst).when(copy_kind == "HtoH")
                              .then(pl.lit(None, dtype=pl.Int32)).otherwise(src),
                              src_device=pl.when(copy_kind == "DtoD").then(src),
                              dst_device=pl.when(copy_kind == "DtoD").then(dst))
    domain = c("domain").str.strip_chars()
    roctx = domain.is_in(list(_ROCTX))
    common["correlation_id"] = pl.when(~roctx).then(common["correlation_id"])  # a range queues no GPU work
    return t.frame.select(kind=pl.when(roctx & (end == start)).then(pl.lit("marker"))
                          .when(roctx).then(pl.lit("region")).otherwise(pl.lit("api")),
                          name=c("function"), **common, pid=_integer(c("process_id")), tid=_integer(c("thread_id")),
                          group=pl.when(roctx).then(pl.lit("roctx")).otherwise(domain))


def _one_pid_each(frame: pl.DataFrame) -> pl.DataFrame:
    """Kernel and copy rows (their files name no process) given their process: the file name's prefix where it
    is a pid, else the one process the calls name."""
    pids = frame["pid"].drop_nulls().unique() if "pid" in frame.columns else pl.Series([], dtype=pl.Int64)
    only = int(pids[0]) if pids.len() == 1 else None
    prefix_pid = _integer(pl.col("_prefix"))
    if "pid" not in frame.columns:
        frame = frame.with_columns(pid=pl.lit(None, dtype=pl.Int64))
    return frame.with_columns(pid=pl.coalesce("pid", prefix_pid, pl.lit(only, dtype=pl.Int64)))


def _unique_links(frame: pl.DataFrame, options: ReadOptions, path: Path) -> pl.DataFrame:
    """Correlation ids made unique across processes (each process counts from 1): the first process's ids as
    written, each next one's moved past the ids before it. Rows of no known process keep no link."""
    if "correlation_id" not in frame.columns:
        return frame
    callers = frame.filter(pl.col("kind") == "api")["pid"].drop_nulls().n_unique()
    unowned = frame.filter(pl.col("pid").is_null() & pl.col("correlation_id").is_not_null()).height
    if unowned and callers > 1:  # with no call of any process, there is nothing to link to either way
        options.warn(f"{path}: {fmt_count(unowned, 'dispatch or copy', 'dispatches and copies')} of no known process "
                     f"(calls of {callers} processes, and a file name that is no pid): not linked to their calls")
        frame = frame.with_columns(correlation_id=pl.when(pl.col("pid").is_not_null()).then("correlation_id"))
    tops = frame.group_by("pid").agg(pl.col("correlation_id").max()).drop_nulls("pid").sort("pid")
    offset, offsets = 0, {}
    for pid, top in tops.iter_rows():
        offsets[pid] = offset
        offset += int(top or 0)
    moved = pl.col("pid").replace_strict(offsets, default=0, return_dtype=pl.Int64).fill_null(0)
    return frame.with_columns(correlation_id=pl.col("correlation_id") + moved)


def _devices(table: _Table) -> tuple[dict[int, int], list[Device]]:
    """From agent_info.csv: {a GPU's logical node id: its index among the GPUs} and the GPUs as devices."""
    c = table.col
    gpus = (table.frame.select(node=_integer(c("logical_node_id")), type=c("agent_type").str.strip_chars(),
                               name=pl.coalesce(c("product_name"), c("model_name"), c("name")),
                               gfx=c("name"), version=_integer(c("gfx_target_version")),
                               cus=_integer(c("cu_count")), wave=_integer(c("wave_front_size")),
                               clock=_integer(c("max_engine_clk_fcompute")))
            .filter(pl.col("type") == "GPU").drop_nulls("node").sort("node"))
    index = {int(node): i for i, node in enumerate(gpus["node"].to_list())}
    # Gfx_Target_Version 90402 is gfx942: major 9, minor 4 (as HIP's device properties give them), stepping 2
    devices = [Device(id=index[int(r["node"])], name=(r["name"] or "").strip() or None, sm_count=r["cus"],
                      compute_capability=(f"{r['version'] // 10000}.{r['version'] // 100 % 100}"
                                          if r["version"] else None),
                      core_clock_mhz=float(r["clock"]) if r["clock"] else None,
                      extra={"vendor": "AMD", "agent": int(r["node"]),
                             **({"gfx": r["gfx"].strip()} if r["gfx"] else {}),
                             **({"warp_size": r["wave"]} if r["wave"] else {})})
               for r in gpus.iter_rows(named=True)]
    return index, devices
