"""Parsing ncu's plain-text console output (the default details page).

Layout (2022.x to 2025.x; 2019.x-2021.x differ as noted)::

    ==PROF== Connected to process 2083 (/usr/bin/python3.12)
    ==PROF== Profiling "kernel" - 0 (1/5): 0%....50%....100% - 10 passes
    [2083] python3.12@127.0.0.1
      NAME (1, 3136, 1)x(128, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
        Section: GPU Speed Of Light Throughput
        ----------------------- ----------- ------------
        Metric Name             Metric Unit Metric Value
        ----------------------- ----------- ------------
        Duration                         us       210.94
        ----------------------- ----------- ------------

        OPT   Est. Local Speedup: 13.11%
              The difference between ...

The dashed line gives the column widths (name, unit, value). With
``--print-summary per-kernel`` a kernel line ends ``Device 0, CC 9.0,
Invocations N`` (no context, no stream) and its tables have ``Minimum``,
``Maximum`` and ``Average`` columns: the average is read as the value, the
minimum and maximum as its bounds, the kernel stands for its N launches. Older versions
print ``NAME, 2020-Apr-07 17:01:05, Context 1, Stream 7`` as the kernel line
and no ``Metric Name`` header row in the table. Rule results (``OPT``,
``INF``, ``WRN``, ``ERR`` + text, optionally ``Est. Speedup: N%``, a global
estimate, or ``Est. Local Speedup: N%``) follow their section's table, two
results of one section separated by a ``----- -----`` line; text output does
not name the rule, so the result is named after the section.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

from traceparse.errors import bad_input
from traceparse.reader import ReadOptions
from traceparse.sources import open_binary

from .parsed import KERNEL_COLUMNS, RULE_COLUMNS, SUMMARY_METRIC_COLUMNS, Parsed, frame

PROCESS = re.compile(r"^\[(?P<pid>\d+)\] (?P<process>.+?)@(?P<host>\S+)\s*$")
KERNEL = re.compile(r"^  (?P<name>\S.*?) \((?P<grid>\d+, ?\d+, ?\d+)\)x\((?P<block>\d+, ?\d+, ?\d+)\), "
                    r"Context (?P<context>\d+), Stream (?P<stream>\d+)"
                    r"(?:, Device (?P<device>\d+), CC (?P<cc>\d+\.\d+))?")
#: ``--print-summary per-kernel``: one block per kernel name, its metrics' Minimum, Maximum and Average over the
#: ``Invocations``.
KERNEL_SUMMARY = re.compile(r"^  (?P<name>\S.*?) \((?P<grid>\d+, ?\d+, ?\d+)\)x\((?P<block>\d+, ?\d+, ?\d+)\), "
                            r"Device (?P<device>\d+), CC (?P<cc>\d+\.\d+), Invocations (?P<invocations>\d+)\s*$")
SUMMARY_HEADER = ["Metric Name", "Metric Unit", "Minimum", "Maximum", "Average"]
KERNEL_OLD = re.compile(r"^  (?P<name>\S.*?), (?P<kernel_time>\d{4}-[A-Za-z]{3}-\d{1,2} \d{1,2}:\d{2}:\d{2}), "
                        r"Context (?P<context>\d+), Stream (?P<stream>\d+)")
SECTION = re.compile(r"^    Section: (?P<section>\s*+\S++(?:\s++\S++)*+)\s*+$")  # possessive: linear time
DASHES = re.compile(r"^    -+( -+)+\s*$")
RULE = re.compile(r"^    (?P<type>OPT|INF|WRN|ERR|WARN|ERROR)\s{2,}+(?P<text>(?:\S++(?:\s++\S++)*+)?+)\s*+$")
CONTINUATION = re.compile(r"^ {10}(?P<text>\S++(?:\s++\S++)*+)\s*+$")
#: ncu prints numbers in the user's locale: under a LC_NUMERIC such as fi_FI or de_DE ``12 837 852,30`` (a space or a
#: no-break space between thousands, a decimal comma) where the C locale prints ``12,837,852.30``.
LOCALE_GROUPED = re.compile(r"^[+-]?\d{1,3}(?:[ \u00a0\u202f]\d{3})+(?:,\d+)?$")
LOCALE_DECIMAL = re.compile(r"^[+-]?\d+,(?:\d{1,2}|\d{4,})$")  # a comma not followed by three digits
LOCALE_NUMBER = re.compile(r"^[+-]?(?:\d{1,3}(?:[ \u00a0\u202f]\d{3})+|\d+)(?:,\d+)?$")
C_DECIMAL = re.compile(r"^[+-]?[\d,]*\.\d+$")
SPEEDUP = re.compile(r"^Est\. (?:(?P<kind>Local|Global) )?Speedup: (?P<value>[\d.,]+)%\s*(?P<rest>.*)$")


def looks_like_ncu_text(head: bytes) -> bool:
    """True when ``head`` looks like ncu console output."""
    return b"==PROF==" in head or (b"    Section: " in head and b"Context " in head)


def read_text(path: Path, options: ReadOptions) -> Parsed:
    """Parse ncu's plain-text details output into string tables."""
    state = _State(path)
    with open_binary(path, text=True) as raw:
        stream = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="")
        last = ""
        for lineno, line in enumerate(stream, 1):
            options.progress(len(line))
            last = line
            state.feed(lineno, line.rstrip("\r\n"))
    if last and not last.endswith("\n"):
        state.drop_partial_last()
    state.close(options)
    _decimal_comma(state, options)
    if not state.kernels:
        raise bad_input(path, None, "not Nsight Compute output: no kernel result (a line 'NAME (grid)x(block), "
                                    "Context N, Stream N' followed by 'Section:' tables) was found")
    kernels = {c: [k.get(c) for k in state.kernels] for c in KERNEL_COLUMNS}
    summary = any(k.get("invocations") is not None for k in state.kernels)
    return Parsed("text --print-summary per-kernel" if summary else "text", frame(KERNEL_COLUMNS, kernels),
                  frame(SUMMARY_METRIC_COLUMNS, state.metrics), frame(RULE_COLUMNS, state.rules), notes=state.notes)


def _decimal_comma(state: "_State", options: ReadOptions) -> None:
    """Numbers of a decimal-comma locale, rewritten as the C locale writes them.

    Only when the file shows the locale (a number grouped by spaces, or a comma followed by other than three digits)
    and no value has a decimal point: then ``1,234`` is 1.234, not 1234."""
    values = [v.strip() for c in ("raw", "raw_min", "raw_max") for v in state.metrics[c] if v]
    if not any(LOCALE_GROUPED.match(v) or LOCALE_DECIMAL.match(v) for v in values):
        return
    if any(C_DECIMAL.match(v) for v in values):
        return  # both conventions in one file: no guess (the comma values are then refused as not numbers)

    def c_locale(value: str | None) -> str | None:
        if value is None or not LOCALE_NUMBER.match(value.strip()):
            return value
        return re.sub(r"[ \u00a0\u202f]", "", value.strip()).replace(",", ".")

    for column in ("raw", "raw_min", "raw_max"):
        state.metrics[column] = [c_locale(v) for v in state.metrics[column]]
    options.warn(f"{state.path}: numbers are written in a decimal-comma locale (e.g. '12 837 852,30'): read with ',' "
                 "as the decimal mark and spaces between thousands")


class _State:
    """The line-by-line parse: current process, kernel, section, table columns and rule."""

    def __init__(self, path: Path):
        self.path = path
        self.pid = self.process = self.host = None
        self.kernels: list[dict] = []
        self.metrics = {c: [] for c in SUMMARY_METRIC_COLUMNS}
        self.rules = {c: [] for c in RULE_COLUMNS}
        self.notes: list[str] = []
        self.section: str | None = None
        self.columns: list[tuple[int, int]] | None = None  # open table: (start, end) per column
        self.rows_in_table = 0
        self.rule: dict | None = None
        self.header_open = False
        self.summary_table = False
        self.orphan_sections = 0

    def key(self) -> str:
        return self.kernels[-1]["key"]

    def feed(self, lineno: int, line: str) -> None:
        if line.startswith("==") and "==" in line[2:12]:
            self._end_rule()
            if line.startswith(("==ERROR==", "==WARNING==")) and line not in self.notes:
                self.notes.append(line)
            return
        if self.columns is not None:
            self._table_line(lineno, line)
            return
        m = PROCESS.match(line)
        if m:
            self._end_rule()
            self.pid, self.process, self.host = m.group("pid"), m.group("process"), m.group("host")
            return
        m = KERNEL.match(line) or KERNEL_OLD.match(line) or KERNEL_SUMMARY.match(line)
        if m:
            self._end_rule()
            fields = m.groupdict()
            self.kernels.append({
                "key": f"{self.pid or ''}:{len(self.kernels)}", "line": lineno, "id": str(len(self.kernels)),
                "name": fields["name"], "pid": self.pid, "process": self.process, "host": self.host,
                "context": fields.get("context"), "stream": fields.get("stream"), "device": fields.get("device"),
                "cc": fields.get("cc"), "grid": _paren(fields.get("grid")), "block": _paren(fields.get("block")),
                "kernel_time": fields.get("kernel_time"), "invocations": fields.get("invocations"),
            })
            self.section = None
            return
        if not self.kernels:
            if SECTION.match(line):  # a result's tables with no kernel line above them (cut off, or reordered)
                self.orphan_sections += 1
            return
        m = SECTION.match(line)
        if m:
            self._end_rule()
            self.section = m.group("section")
            return
        if DASHES.match(line):
            if self.rule is not None:  # "----- -----" between two rule results of one section: no table
                self._end_rule()
                return
            self.columns = _columns(line)
            self.rows_in_table = 0
            self.header_open = self.summary_table = False
            return
        m = RULE.match(line)
        if m:
            self._end_rule()
            self.rule = {"line": lineno, "type": m.group("type"), "parts": [m.group("text")]}
            return
        m = CONTINUATION.match(line)
        if m and self.rule is not None:
            self.rule["parts"].append(m.group("text"))
            return
        self._end_rule()

    def _table_line(self, lineno: int, line: str) -> None:
        if DASHES.match(line):
            if self.header_open:  # the dashed line under the header row (2022+): the table goes on
                self.header_open = False
                return
            self.columns = None  # the closing dashed line
            return
        if not line.strip():
            self.columns = None
            return
        cols = self.columns
        cells = [line[s:e].strip() if e is not None else line[s:].strip() for s, e in cols]
        if self.rows_in_table == 0 and cells[:3] == ["Metric Name", "Metric Unit", "Metric Value"]:
            self.header_open = True
            return
        if self.rows_in_table == 0 and cells == SUMMARY_HEADER:  # --print-summary: the mean is the value
            self.header_open = self.summary_table = True
            return
        self.rows_in_table += 1
        if len(cols) != (5 if self.summary_table else 3):
            return  # a table of another shape (charts, breakdowns): not metrics
        low, high = (cells[2], cells[3]) if self.summary_table else (None, None)
        for col, value in (("key", self.key()), ("line", lineno), ("group", self.section), ("name", cells[0]),
                           ("unit", cells[1]), ("raw", cells[-1]), ("raw_min", low), ("raw_max", high)):
            self.metrics[col].append(value)

    def _end_rule(self) -> None:
        if self.rule is None or not self.kernels:
            self.rule = None
            return
        text = " ".join(p for p in self.rule["parts"] if p)
        speedup, kind = None, None
        m = SPEEDUP.match(text)
        if m:
            # ncu's text names the local estimates ("Est. Local Speedup") and prints the global ones plain
            speedup, kind, text = m.group("value"), (m.group("kind") or "global").lower(), m.group("rest")
        self.rules["key"].append(self.key())
        self.rules["line"].append(self.rule["line"])
        self.rules["group"].append(self.section)
        # a section's global and local estimates come from different rules (Occupancy's theoretical and
        # achieved): their kinds keep them apart
        name = self.section or self.rule["type"]
        self.rules["name"].append(f"{name} (local)" if kind == "local" else name)
        self.rules["type"].append(self.rule["type"])
        self.rules["speedup_type"].append(kind)
        self.rules["speedup"].append(speedup)
        self.rules["description"].append(text)
        self.rule = None

    def drop_partial_last(self) -> None:
        """The file ends without a newline: its last line may be cut, so a metric read from it is dropped."""
        if self.columns is not None and self.metrics["key"] and self.rows_in_table:
            for col in self.metrics.values():
                col.pop()
            self.notes.append("the last line is cut short (no newline at the end of the file); it was ignored")

    def close(self, options: ReadOptions) -> None:
        self._end_rule()
        if self.columns is not None:
            options.incomplete(f"{self.path}: the file ends inside a section table (truncated output); "
                               "kept the metrics read before that point")
        if self.orphan_sections and self.kernels:
            options.warn(f"{self.path}: {self.orphan_sections} section tables come before the first kernel line "
                         "(NAME ..., Context N, Stream N) and were skipped: they belong to no kernel the file names")


def _columns(dashes: str) -> list[tuple[int, int | None]]:
    """Column (start, end) pairs from a dashed rule line; the last column runs to the end of the line."""
    spans = [(m.start(), m.end()) for m in re.finditer(r"-+", dashes)]
    out: list[tuple[int, int | None]] = []
    for i, (start, end) in enumerate(spans):
        out.append((start, end if i < len(spans) - 1 else None))
    return out


def _paren(text: str | None) -> str | None:
    return f"({text})" if text else None
