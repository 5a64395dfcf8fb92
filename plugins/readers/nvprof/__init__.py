"""Reader ``nvprof``: every output form of NVIDIA's nvprof (CUDA 7 to 11), detected by content.

Reads, from one file:

- text logs (nvprof's stderr, ``--log-file``, with the program's output mixed
  in; one or several ``==PID==`` processes): the summary (``Profiling result:``,
  ``Type Time(%) Time Calls Avg Min Max Name``, ``GPU activities:`` and
  ``API calls:``, or the older layout without a Type column and with a
  separate ``API calls:`` section) as aggregated rows; ``--print-gpu-trace``
  and ``--print-api-trace`` tables as timed events; ``--metrics`` /
  ``--events`` results as counter rows tied to their kernel; the unified
  memory summary as marker rows;
- the same in ``--csv`` form (quoted header, units row, ``--normalized-time-unit``);
- the SQLite profile of ``-o file.nvvp`` (see :mod:`.sqlite_db`);

and, given together, a timeline log and the metrics or events log of another run of the same program as
one trace, the counters standing for every launch of their kernel (:mod:`.capture`).

Times become integer ns and sizes integer bytes exactly (see :mod:`.units`;
nvprof's KB/MB/GB are binary). docs/formats/nvprof.md maps every column.
Detection (:mod:`.sniff`): ``==PID==`` messages, nvprof's own table
headers, and for SQLite its ``StringTable`` and CUPTI activity tables.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import polars as pl

from traceparse.errors import bad_input
from traceparse.report import fmt_ns as fmt_shift
from traceparse.plugins import hookimpl
from traceparse.reader import ReadOptions, Reader
from traceparse.sources import read_head
from traceparse.trace import Device, Trace, TraceMeta

from . import capture
from .counters import link_counters
from .events import table_frame
from .log_scan import LogScanner, ScanResult
from .sniff import sniff
from .sqlite_db import NvprofDatabase, is_sqlite, open_readonly
from .streams import serialize_streams
from .tables import SUMMARY, TRACE



class NvprofReader(Reader):
    name = "nvprof"
    description = "NVIDIA nvprof (CUDA 7-11): text and CSV logs, metrics/events, SQLite .nvvp profiles"
    variants = (
        "summary: GPU activities and API calls (with or without the Type column)",
        "--print-gpu-trace / --print-api-trace (text)",
        "--csv of summary, GPU trace, API trace (units row, --normalized-time-unit)",
        "--metrics / --events results (text and CSV)",
        "unified memory summary",
        "several ==PID== processes in one log; program output mixed in",
        "SQLite profile (-o file.nvvp / .prof)",
    )
    patterns = ("*.log", "*.txt", "*.csv", "*.nvvp", "*.prof", "*.nvprof")

    def sniff(self, path: Path, head: bytes) -> float:
        return sniff(path, head)

    def group(self, paths: list[Path]) -> list[list[Path]]:
        """One trace per path, except that a log of metric or event results goes with the timeline log of the
        same program given with it (:mod:`.capture`)."""
        return capture.group(paths, lambda p: not is_sqlite(read_head(p, 64)))

    def read(self, paths: list[Path], options: ReadOptions) -> Trace:
        path = paths[0]
        if is_sqlite(read_head(path, 64)):
            return _read_sqlite(path, options)
        return _read_log(path, options, extra=paths[1:])


def _read_sqlite(path: Path, options: ReadOptions) -> Trace:
    try:
        with open_readonly(path) as conn:
            db = NvprofDatabase(path, conn)
            db.check()
            events = db.events()
            devices = db.devices(options.warn)
    except sqlite3.DatabaseError as exc:  # a damaged or cut .nvvp: SQLite finds it out while reading
        raise bad_input(path, None, f"the nvprof database is damaged ({exc}): re-export it with nvprof") from None
    meta = TraceMeta(tool="nvprof", variant="SQLite profile", devices=devices,
                     warnings=options.warnings)  # the same list: no warning is lost
    if events.height == 0:
        raise bad_input(path, None, "the nvprof profile has activity tables but no records in them")
    options.progress(path.stat().st_size)
    return Trace(link_counters(events), meta)


def _read_log(path: Path, options: ReadOptions, extra: list[Path] = ()) -> Trace:
    """A log, and the metrics or events logs of other runs of its program (``extra``: :mod:`.capture`)."""
    scan = LogScanner(path, options).scan()
    filled = [t for t in scan.tables if t.rows]
    _check_complete(path, scan, filled, options)
    others = []
    for other in extra:
        more = LogScanner(other, options).scan()
        more_filled = [t for t in more.tables if t.rows]
        _check_complete(other, more, more_filled, options)
        for index, name in more.devices.by_index.items():  # full names resolve the timeline's cut Device cells
            scan.devices.by_index.setdefault(index, name)
        others.append((other, more, more_filled))
    frames = [table_frame(path, table, scan.devices) for table in filled]
    events = pl.concat(frames, how="diagonal_relaxed")
    for other, more, more_filled in others:
        counters = pl.concat([table_frame(other, table, more.devices) for table in more_filled],
                             how="diagonal_relaxed")
        events, counters = capture.attach(events, counters, other, path, options.warn)
        events = pl.concat([events, counters], how="diagonal_relaxed")
        filled = filled + more_filled
        scan.processes.update({pid: p for pid, p in more.processes.items() if pid not in scan.processes})
        scan.messages.extend(f"({other.name}) {m}" for m in more.messages)
    for message in scan.messages:
        options.warn(f"{path}: {message}")
    events, moved, most = serialize_streams(events)  # printed starts are rounded: one stream never overlaps itself
    if moved:
        options.warn(f"{path}: {moved} GPU event{'s' * (moved != 1)} started, as printed, before the previous one on "
                     f"{'their' if moved != 1 else 'its'} stream ended (nvprof prints Start with few digits); moved "
                     f"later by at most {fmt_shift(most)} so that no two events of one stream overlap")
    meta = TraceMeta(tool="nvprof", variant=", ".join(dict.fromkeys(f"{t.form.replace('_', ' ')} ({t.style})"
                                                                    for t in filled)),
                     devices=[Device(id=i, name=n) for i, n in sorted(scan.devices.by_index.items())],
                     warnings=options.warnings)  # the same list: no warning is lost
    meta.extra["processes"] = {str(p.pid): p.command for p in scan.processes.values() if p.pid is not None}
    timed_out = [p.pid for p in scan.processes.values() if p.timed_out]
    if timed_out:
        meta.extra["timed_out_pids"] = timed_out
    if scan.result_files:
        meta.extra["result_files"] = scan.result_files
    meta.extra["skipped_lines"] = scan.skipped_lines
    return Trace(link_counters(events), meta)


def _check_complete(path: Path, scan: ScanResult, filled: list, options: ReadOptions) -> None:
    """Refuse a log with no result rows; warn about the parts a log cut short lost."""
    if not filled:
        if scan.tables:
            raise bad_input(path, scan.tables[0].header_line,
                            "a result table header with no rows under it: expected at least one result row")
        if any(p.command for p in scan.processes.values()):
            raise bad_input(path, None, "an nvprof log without any result table: it ends before nvprof printed its "
                                        "results (run killed or log cut short?)")
        raise bad_input(path, None, "not an nvprof log: found no nvprof result table (expected a '==PID== Profiling "
                                    "result:' section, an nvprof CSV header, or an nvprof SQLite profile)")
    for table in scan.tables:
        if not table.rows:
            options.warn(f"{path}:{table.header_line}: this result table has no rows (log cut short?)")
        elif table.form == TRACE and table.style == "text" and table.reached_eof and "regs" in table.keys:
            options.warn(f"{path}: the GPU trace under line {table.header_line} runs into the end of the file "
                         f"without nvprof's closing legend (log cut short?); kept its {table.rows} complete rows")
        elif table.form == SUMMARY and table.reached_eof:
            short = _summary_short(table)
            if short is not None:
                section, total, rows = short
                options.incomplete(f"{path}: the {section} table under line {table.header_line} runs into the end "
                                   f"of the file with its Time(%) summing to {total:.2f}%, not 100% (log cut "
                                   f"short?); kept its {rows} complete rows")
    with_results = {t.pid for t in filled}
    for process in scan.processes.values():
        if process.pid is not None and process.command and process.pid not in with_results:
            options.warn(f"{path}: process {process.pid} ({process.command}) has no results in the log "
                         f"(killed, or the log cut short?)")


def _summary_short(table) -> tuple[str, float, int] | None:
    """(section, Time(%) sum, rows) of a summary table's last section when its shares fall short of 100% by more
    than their rounding (two decimals a row): rows after the end of the file are missing. None when whole."""
    frame = table.frame()
    if "percent" not in frame.columns or frame.height == 0:
        return None
    section = frame["_type"][-1] or table.section or "summary"
    mine = frame.filter(pl.col("_type").fill_null(table.section or "summary") == section)
    shares = mine["percent"].str.strip_chars().str.strip_suffix("%").cast(pl.Float64, strict=False)
    if shares.null_count():
        return None
    total = float(shares.sum())
    return (section, total, mine.height) if total < 100 - (0.005 * mine.height + 0.05) else None


@hookimpl
def traceparse_readers():
    return [NvprofReader()]
