"""Reading an nvprof log line by line into its result tables.

nvprof prefixes its own messages with ``==PID==`` (``========`` when it
re-reads a saved profile with ``-i``); the result tables that follow a
``Profiling result:``, ``API calls:``, ``Metric result:``, ``Event result:``
or ``Unified Memory profiling result:`` message are not prefixed. The
program's own output is interleaved: lines without the prefix outside a
table, text in front of a prefix on the same line, and lines inside a table
that do not look like a row are skipped. A line that looks like a row but
does not fit its header is an error naming the line.

The log may be cut short: a table that runs into the end of the file, a
process that never printed its results. What was complete is kept and the
reader warns. A last line that stops inside a row is an error.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field
from pathlib import Path

from traceparse.reader import ReadOptions
from traceparse.sources import open_binary

from .devices import DeviceBook
from .tables import (COUNT_ROW_START, EVENTS, LEGEND, METRICS, SUMMARY, SUMMARY_ROW_START, SUMMARY_ROW_START_BARE,
                     TRACE, TRACE_ROW_START, UNIFIED, Table, csv_cells, form_of, new_table,
                     split_text_row, text_header, text_units)
from .units import UNIT_WORDS

_PID_PREFIX = re.compile(r"==([0-9]+)== ?")
_PID_MAX = 2**63 - 1  # the pid column is Int64
_IMPORT_PREFIX = re.compile(r"^={8} ?(.*)$")
_DEVICE_LINE = re.compile(r'^\s*Device "(.*)"\s*$')
_KERNEL_LINE = re.compile(r"^\s*Kernel: (.*?)\s*$")
_CSV_ROW_START = re.compile(r'^\s*[\d"]')
_TOTAL_LINE = re.compile(r"^\s*Total ([A-Za-z ]+?): (\d+)\s*$")  # unified memory: Total CPU Page faults: 9

#: Message (after the prefix) -> (what follows, default Type of its summary rows).
_SECTIONS = [
    (re.compile(r"^Profiling result:?\s*$"), ("result", None)),
    (re.compile(r"^API calls:?\s*$"), ("result", "API calls")),
    (re.compile(r"^Metric result:?\s*$"), ("metrics", None)),
    (re.compile(r"^Event result:?\s*$"), ("events", None)),
    (re.compile(r"^Unified Memory profiling result:?\s*$"), ("unified", None)),
    (re.compile(r"^(?:CPU profiling result|OpenACC|OpenMP|Data collected|System profiling)"), ("skip", None)),
]
_KNOWN_IMPORT_MESSAGES = re.compile(r"^(?:Profiling result|API calls|Metric result|Event result|Unified Memory|"
                                    r"Warning|Error|CPU profiling|Data collected|Device \")")


@dataclass
class Process:
    """What the log says about one profiled process."""

    pid: int | None
    command: str | None = None
    timed_out: bool = False


@dataclass
class ScanResult:
    """Everything read from one log."""

    tables: list[Table] = field(default_factory=list)
    processes: dict[int | None, Process] = field(default_factory=dict)
    devices: DeviceBook = field(default_factory=DeviceBook)
    messages: list[str] = field(default_factory=list)  # nvprof's own warnings and errors
    skipped_lines: int = 0
    result_files: list[str] = field(default_factory=list)


class LogScanner:
    """A line-by-line state machine over one nvprof log."""

    def __init__(self, path: Path, options: ReadOptions):
        self.path, self.options = path, options
        self.out = ScanResult()
        self.table: Table | None = None
        self.expect: str | None = None        # what the last section message announced
        self.section: str | None = None       # default Type of summary rows under it
        self.pid: int | None = None
        self.device: str | None = None
        self.kernel: str | None = None
        self.last_type: str | None = None
        self.pending_csv: Table | None = None  # a CSV header waiting for its units row
        self.bad_pid: tuple[int, str] | None = None  # the first ==PID== past Int64 (line, digits), and how many
        self.bad_pids = 0

    # -- driving -----------------------------------------------------------
    def scan(self) -> ScanResult:
        """Read the whole log; return its tables and what else it says."""
        with open_binary(self.path, text=True) as raw:
            text = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline=None)
            consumed = 0
            for line_no, raw_line in enumerate(text, 1):
                consumed += len(raw_line)
                if consumed > 1 << 20:
                    self.options.progress(consumed)
                    consumed = 0
                table = self.table
                if (table is not None and table.fast_row is not None and raw_line.endswith("\n")
                        and not table.quote_open and "==" not in raw_line and table.fast_row.match(raw_line)):
                    table.queue(line_no, raw_line.rstrip("\r\n"), self.device, self.kernel)  # a row of a long table
                    continue
                self.line(raw_line.rstrip("\r\n"), line_no, last_unended=not raw_line.endswith("\n"))
            self.options.progress(consumed)
        self.close_table(eof=True)
        if self.bad_pid is not None:
            no, digits = self.bad_pid
            lines = "1 nvprof message" if self.bad_pids == 1 else f"{self.bad_pids:,} nvprof messages"
            self.options.warn(f"{self.path}:{no}: {lines} with a process id that does not fit Int64 (first: "
                              f"=={digits if len(digits) <= 40 else digits[:39] + '…'}==); read without a pid")
        return self.out

    def line(self, line: str, no: int, last_unended: bool) -> None:
        if self.table is not None and self.table.quote_open:  # the rest of a quoted field holding a line break
            self.queue(self.table, line, no, last_unended)
            return
        if "==" in line:
            m = _PID_PREFIX.search(line)
            if m:
                self.message(self.process_id(m.group(1), no), line[m.end():].strip(), no)
                return
            m = _IMPORT_PREFIX.match(line)
            if m and _KNOWN_IMPORT_MESSAGES.match(m.group(1)):
                self.message(None, m.group(1).strip(), no)
                return
        table = self.table
        if table is not None and table.fast_row is not None and table.fast_row.match(line):
            self.queue(table, line, no, last_unended)
            return
        if not line.strip():
            self.close_table()
            return
        if self.table is not None:
            self.table_line(line, no, last_unended)
        elif self.expect != "skip":
            self.header_or_context(line, no)
        else:
            self.out.skipped_lines += 1

    # -- messages ----------------------------------------------------------
    def process_id(self, digits: str, no: int) -> int | None:
        """The ``==PID==`` prefix's number, or None (counted, one warning at the end) when it does not fit the
        ``pid`` column (Int64): a wrapped or refused number would lose the log."""
        pid = int(digits)
        if pid <= _PID_MAX:
            return pid
        if self.bad_pid is None:
            self.bad_pid = (no, digits)
        self.bad_pids += 1
        return None

    # -- messages ----------------------------------------------------------
    def message(self, pid: int | None, msg: str, no: int) -> None:
        """An nvprof message. Section messages end the open table; others (another process's progress,
        warnings) may come while a table is being printed and leave it open."""
        process = self.out.processes.setdefault(pid, Process(pid))
        for pattern, (expect, section) in _SECTIONS:
            if pattern.match(msg):
                self.close_table()
                self.pid = pid
                self.expect, self.section = expect, section
                self.device = self.kernel = self.last_type = None
                if expect == "skip" and not msg.startswith("Data collected"):
                    self.options.warn(f"{self.path}:{no}: nvprof's {msg.rstrip(':')} section is not read")
                return
        m = _DEVICE_LINE.match(msg)
        if m:
            self.close_table()
            self.pid = pid
            self.device = m.group(1)
            self.out.devices.note(self.device)
            return
        if msg.startswith("NVPROF is profiling process"):
            m = re.match(r"NVPROF is profiling process \d+, command: (.*)$", msg)
            process.command = m.group(1) if m else process.command
        elif msg.startswith("Profiling application:"):
            process.command = process.command or msg.split(":", 1)[1].strip()
        elif msg.startswith("Execution timeout"):
            process.timed_out = True
        elif msg.startswith("Generated result file:"):
            self.out.result_files.append(msg.split(":", 1)[1].strip())
        elif msg.startswith(("Warning:", "Error:")):
            text = f"nvprof {msg}" + (f" (process {pid})" if pid is not None else "")
            if text not in self.out.messages:
                self.out.messages.append(text)
            return
        if msg.startswith(("NVPROF is profiling", "Profiling application")):
            self.expect = None

    # -- headers -----------------------------------------------------------
    def header_or_context(self, line: str, no: int) -> None:
        """A line after a section message: a Device line, a header, or program output."""
        m = _DEVICE_LINE.match(line)
        if m:
            self.device = m.group(1)
            self.out.devices.note(self.device)
            return
        stripped = line.lstrip()
        if stripped.startswith('"'):
            labels = csv_cells(stripped)
            form = form_of(labels)
            if form is not None:
                self.open_table(new_table(form, "csv", self.pid, no, labels, section=self.default_type(form)))
                return
        else:
            labels, _, ends = text_header(line)
            form = form_of(labels)
            if form is not None:
                self.open_table(new_table(form, "text", self.pid, no, labels, ends, section=self.default_type(form)))
                return
        self.out.skipped_lines += 1

    def default_type(self, form: str) -> str | None:
        if form != SUMMARY:
            return None
        return self.section or "GPU activities"

    def open_table(self, table: Table) -> None:
        table.section_guessed = table.form == SUMMARY and self.section is None and "type" not in table.keys
        if table.style == "text" and table.form == TRACE:
            table.fast_row = TRACE_ROW_START
        self.table = table
        self.last_type = None

    # -- rows --------------------------------------------------------------
    def table_line(self, line: str, no: int, last_unended: bool) -> None:
        table = self.table
        if table.style == "csv":
            self.csv_line(table, line, no, last_unended)
            return
        if LEGEND.match(line) and table.form == TRACE:
            table.legend_seen = True
            self.close_table()
            return
        m = _DEVICE_LINE.match(line)
        if m:
            self.device = m.group(1)
            self.out.devices.note(self.device)
            return
        if table.form in (METRICS, EVENTS):
            m = _KERNEL_LINE.match(line)
            if m:
                self.kernel = m.group(1)
                return
        if table.form == UNIFIED:
            m = _TOTAL_LINE.match(line)
            if m:
                table.add(no, {"name": m.group(1), "count": m.group(2)}, device=self.device)
                return
        if table.rows == 0 and table.units_line is None and table.form in (SUMMARY, TRACE, UNIFIED):
            units = text_units(table, line)
            if units:  # -u ms: the columns' units, the cells below bare numbers
                table.units, table.units_line = units, no
                return
        if not self.looks_like_row(table, line):
            labels, _, _ = text_header(line)
            if form_of(labels) is not None:  # a new header straight after a table
                self.close_table()
                self.header_or_context(line, no)
            else:
                self.out.skipped_lines += 1
            return
        if table.form in (TRACE, UNIFIED):
            self.queue(table, line, no, last_unended)
            return
        try:
            cells = split_text_row(table, line, no, self.path)
        except Exception:
            if last_unended:  # the file ends inside this row: the rows before it are read
                table.cut = (no, "the row does not line up with the header", table.rows)
                return
            raise
        self.add_row(table, cells, no, last_unended)

    def looks_like_row(self, table: Table, line: str) -> bool:
        if table.form == SUMMARY:
            return bool((SUMMARY_ROW_START_BARE if table.units else SUMMARY_ROW_START).match(line))
        if table.form == TRACE:
            return bool(TRACE_ROW_START.match(line))
        return bool(COUNT_ROW_START.match(line))

    def csv_line(self, table: Table, line: str, no: int, last_unended: bool) -> None:
        first = line.lstrip()[:1]
        if table.rows == 0 and table.units_line is None and table.form in (SUMMARY, TRACE, UNIFIED):
            try:
                cells = csv_cells(line)
            except Exception:
                cells = []
            if len(cells) == len(table.labels) and all(c.strip() in UNIT_WORDS or not c.strip() for c in cells):
                table.units = {key: unit.strip() for key, unit in zip(table.keys, cells) if unit.strip()}
                table.units_line = no
                table.fast_row = _CSV_ROW_START
                return
        if not (first.isdigit() or first in '",-.'):
            self.out.skipped_lines += 1
            return
        self.queue(table, line, no, last_unended)

    def queue(self, table: Table, line: str, no: int, last_unended: bool) -> None:
        table.queue(no, line, self.device, self.kernel)
        if last_unended:
            table.unended_line = no

    def add_row(self, table: Table, cells: dict, no: int, last_unended: bool) -> None:
        """Add a text summary, metric or event row (split on the spot: such tables are short)."""
        type_ = None
        if table.form == SUMMARY:
            type_ = (cells.get("type") or "").strip() or self.last_type or table.section
            self.last_type = type_
        table.add(no, cells, device=self.device, kernel=self.kernel, type_=type_)
        if last_unended:
            self.options.warn(f"{self.path}:{no}: the file does not end with a line break; "
                              f"the last row may be incomplete")

    def close_table(self, eof: bool = False) -> None:
        if self.table is None:
            return
        self.table.flush(self.path)
        for chunk in self.table.chunks:  # device names the rows carry (full ones resolve cut-off ones)
            for column in ("device", "_device", "src_dev", "dst_dev"):
                if column in chunk.columns:
                    for text in chunk[column].drop_nulls().unique(maintain_order=True).to_list():
                        self.out.devices.note(text)
        if self.table.cut is not None:
            line, why, kept = self.table.cut
            self.options.incomplete(f"{self.path}:{line}: cut short ({why}); kept the {kept:,} complete "
                                    f"row{'s' if kept != 1 else ''} before it")
        elif self.table.unended_line is not None:
            self.options.warn(f"{self.path}:{self.table.unended_line}: the file does not end with a line break; "
                              f"the last row may be incomplete")
        self.table.reached_eof = eof
        self.out.tables.append(self.table)
        self.table = None
