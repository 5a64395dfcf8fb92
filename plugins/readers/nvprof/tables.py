"""The result tables of an nvprof log, and how one line becomes one row of cells.

A :class:`Table` is one result table as nvprof printed it (a summary, a GPU
or API trace, metric or event results, the unified-memory summary), in text
or CSV, with its raw cells gathered column by column; :mod:`.events` turns
the cells into events. Splitting a line into cells is exact or it fails:
a line that looks like a row but does not split into the header's columns
raises a one-line :class:`~traceparse.errors.InputError` naming the line.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field

import polars as pl

from traceparse.errors import InputError, bad_input
from traceparse.sources import quoted_records

from .units import UNIT_WORDS as _UNIT_WORDS

#: Forms of result table.
SUMMARY, TRACE, METRICS, EVENTS, UNIFIED = "summary", "trace", "metrics", "events", "unified_memory"

#: Header label -> canonical column, per form. Labels not listed are kept under their own name and not read.
TRACE_LABELS = {
    "Start": "start", "Duration": "duration", "Grid Size": "grid", "Block Size": "block",
    "Grid X": "grid_x", "Grid Y": "grid_y", "Grid Z": "grid_z",
    "Block X": "block_x", "Block Y": "block_y", "Block Z": "block_z",
    "Regs*": "regs", "Regs": "regs", "Registers Per Thread": "regs",
    "SSMem*": "ssmem", "SSMem": "ssmem", "Static SMem": "ssmem",
    "DSMem*": "dsmem", "DSMem": "dsmem", "Dynamic SMem": "dsmem",
    "Size": "size", "Throughput": "throughput", "SrcMemType": "src_mem", "DstMemType": "dst_mem",
    "Device": "device", "Context": "context", "Stream": "stream",
    "Src Dev": "src_dev", "Src Ctx": "src_ctx", "Dst Dev": "dst_dev", "Dst Ctx": "dst_ctx",
    "Unified Memory": "unified_memory", "Virtual Address": "virtual_address",
    "Name": "name", "Correlation_ID": "correlation",
}
SUMMARY_LABELS = {"Type": "type", "Time(%)": "percent", "Time": "time", "Calls": "calls", "Avg": "avg",
                  "Min": "min", "Max": "max", "Name": "name"}
METRIC_LABELS = {"Device": "device", "Kernel": "kernel", "Invocations": "invocations", "Metric Name": "counter",
                 "Event Name": "counter", "Metric Description": "description", "Min": "min", "Max": "max",
                 "Avg": "avg", "Total": "total"}
UNIFIED_LABELS = {"Device": "device", "Count": "count", "Avg Size": "avg_size", "Min Size": "min_size",
                  "Max Size": "max_size", "Total Size": "total_size", "Total Time": "total_time", "Name": "name"}
LABELS = {SUMMARY: SUMMARY_LABELS, TRACE: TRACE_LABELS, METRICS: METRIC_LABELS, EVENTS: METRIC_LABELS,
          UNIFIED: UNIFIED_LABELS}

#: Words of nvprof's legend printed after a text GPU trace.
LEGEND = re.compile(r"^\s*(Regs|SSMem|DSMem|SrcMemType|DstMemType|Size|Throughput)\s*:\s")

#: A unified-memory summary cell before the name: a count, a size or time with its unit, or "-".
_UM_CELL = re.compile(r"^(?:-|[\d.]+(?:[eE][+-]?\d+)?[A-Za-z/]*)$")
_LABEL_RUNS = re.compile(r"\S+(?: \S+)*")  # runs of text separated by two or more spaces
# Possessive runs (*+, ++): \s and \S are disjoint, so each pattern matches what it did with plain runs, but
# no run of spaces is tried again from each of its positions: time linear in the line (issue 16).
_TYPE_LABEL = r"[A-Za-z][A-Za-z ()]*+"
_WORDS = r"\S++(?:\s++\S++)*+"  # words separated by spaces, first and last not a space
_SUMMARY_ROW = re.compile(
    rf"^\s*+(?:(?P<type>{_TYPE_LABEL}):)?+\s*+(?P<percent>\S+%)\s++(?P<time>\S++)\s++(?P<calls>\S++)\s++"
    rf"(?P<avg>\S++)\s++(?P<min>\S++)\s++(?P<max>\S++)\s++(?P<name>{_WORDS})\s*+$")
SUMMARY_ROW_START = re.compile(rf"^\s*+(?:{_TYPE_LABEL}:)?+\s*+[\d.]+%")
#: With ``-u`` (``--normalized-time-unit``) a units row follows the header and the cells are bare numbers: no ``%``.
SUMMARY_ROW_START_BARE = re.compile(rf"^\s*+(?:{_TYPE_LABEL}:)?+\s*+[\d.]+\s")
_SUMMARY_ROW_BARE = re.compile(
    rf"^\s*+(?:(?P<type>{_TYPE_LABEL}):)?+\s*+(?P<percent>[\d.]+)\s++(?P<time>\S++)\s++(?P<calls>\S++)\s++"
    rf"(?P<avg>\S++)\s++(?P<min>\S++)\s++(?P<max>\S++)\s++(?P<name>{_WORDS})\s*+$")
TRACE_ROW_START = re.compile(r"^\s*\d[\d.]*(?:ns|us|ms|s)\s")
COUNT_ROW_START = re.compile(r"^\s*\d+\s+\S")
_VALUE = r"(?:[A-Za-z]+ \(\d+\)|\S+)"  # a metric value: 12.5%, 1.2GB/s, 0.75, Low (1)
_METRIC_ROW = re.compile(rf"^\s*+(?P<invocations>\S++)\s++(?P<counter>\S++)\s++(?P<description>\S++(?:\s++\S++)*?)"
                         rf"\s++(?P<min>{_VALUE})\s++(?P<max>{_VALUE})\s++(?P<avg>{_VALUE})\s*+$")
_EVENT_ROW = re.compile(rf"^\s*+(?P<invocations>\S++)\s++(?P<counter>\S++)\s++(?P<min>{_VALUE})\s++(?P<max>{_VALUE})"
                        rf"\s++(?P<avg>{_VALUE})\s++(?P<total>{_VALUE})\s*+$")


@dataclass
class Table:
    """One nvprof result table: its form, where it came from, and its cells column by column."""

    form: str
    style: str                      # "text" or "csv"
    pid: int | None
    header_line: int
    labels: list[str]               # the header's labels, in order
    keys: list[str]                 # canonical column per label
    section: str | None = None      # default Type of summary rows (old layout without a Type column)
    section_guessed: bool = False   # True when no message said which section the rows belong to
    ends: list[int] = field(default_factory=list)   # text tables: right edge of each column in the header
    units: dict[str, str] = field(default_factory=dict)  # CSV: unit of each canonical column
    units_line: int | None = None
    columns: dict[str, list] = field(default_factory=dict)
    reached_eof: bool = False
    legend_seen: bool = False
    pending: list[str] = field(default_factory=list)          # raw rows split in bulk by :meth:`flush`
    pending_lines: list[int] = field(default_factory=list)
    pending_context: list[tuple] = field(default_factory=list)  # (device, kernel) of each pending row
    unended_line: int | None = None                            # the last line, when it has no line break
    cut: tuple[int, str, int] | None = None                    # (line, why, rows kept) of a last row cut short
    quote_open: bool = False                                   # CSV: the last queued line leaves a quote open
    chunks: list[pl.DataFrame] = field(default_factory=list)   # rows split in bulk
    fast_row: re.Pattern | None = None                         # what a row looks like, once that is certain

    def __post_init__(self) -> None:
        for key in dict.fromkeys(self.keys + ["_line", "_device", "_kernel", "_type"]):
            self.columns.setdefault(key, [])

    @property
    def rows(self) -> int:
        return len(self.columns["_line"]) + len(self.pending) + sum(c.height for c in self.chunks)

    def add(self, line_no: int, cells: dict[str, str | None], device: str | None = None,
            kernel: str | None = None, type_: str | None = None) -> None:
        """Append one row already split into cells; cells missing from ``cells`` are null."""
        for key, values in self.columns.items():
            if not key.startswith("_"):
                values.append(cells.get(key))
        self.columns["_line"].append(line_no)
        self.columns["_device"].append(device)
        self.columns["_kernel"].append(kernel)
        self.columns["_type"].append(type_)

    def queue(self, line_no: int, line: str, device: str | None = None, kernel: str | None = None) -> None:
        """Keep a row's raw line, to be split with the table's other rows in one go."""
        self.pending.append(line)
        self.pending_lines.append(line_no)
        self.pending_context.append((device, kernel))
        if self.style == "csv" and line.count('"') % 2:  # a quoted field goes on to the next line
            self.quote_open = not self.quote_open

    def flush(self, path) -> None:
        """Split the queued rows (CSV, or right-aligned text) into cells, column by column, in one go."""
        if not self.pending:
            return
        cells = _bulk_csv(self, path) if self.style == "csv" else _bulk_positional(self, path)
        if not self.pending:  # its one row was cut short with the file (``cut``)
            return
        n = cells.height
        devices, kernels = (list(c) for c in zip(*self.pending_context))
        context = {"_line": pl.Series(self.pending_lines, dtype=pl.Int64),
                   "_device": pl.Series(devices, dtype=pl.String), "_kernel": pl.Series(kernels, dtype=pl.String),
                   "_type": pl.Series([None] * n, dtype=pl.String)}
        chunk = cells.with_columns(**context)
        if self.style == "csv" and "device" in cells.columns and self.form in (METRICS, EVENTS, UNIFIED):
            chunk = chunk.with_columns(_device=pl.col("device"))
        if self.style == "csv" and "kernel" in cells.columns:
            chunk = chunk.with_columns(_kernel=pl.col("kernel"))
        if self.form == SUMMARY:
            given = pl.col("type").str.strip_chars() if "type" in cells.columns else pl.lit(None, dtype=pl.String)
            chunk = chunk.with_columns(_type=pl.when(given != "").then(given).otherwise(pl.lit(self.section)))
        self.chunks.append(chunk)
        self.pending, self.pending_lines, self.pending_context = [], [], []

    def frame(self) -> pl.DataFrame:
        """All rows as one DataFrame of string cells (``_line`` is the line number), in file order."""
        listed = pl.DataFrame({k: pl.Series(v, dtype=pl.Int64 if k == "_line" else pl.String)
                               for k, v in self.columns.items()})
        return pl.concat([listed, *self.chunks], how="diagonal_relaxed").sort("_line")


def text_header(line: str) -> tuple[list[str], list[int], list[int]]:
    """(labels, start offsets, end offsets) of a text table header: labels are separated by two or more spaces."""
    runs = list(_LABEL_RUNS.finditer(line))
    return [m.group() for m in runs], [m.start() for m in runs], [m.end() for m in runs]


def csv_cells(line: str) -> list[str]:
    """The fields of one CSV line (nvprof quotes text fields and never splits a row over lines)."""
    return next(csv.reader([line]))


def form_of(labels: list[str]) -> str | None:
    """Which kind of result table a header's labels announce; None if it is not an nvprof header."""
    names = set(labels)
    if {"Invocations", "Metric Name"} <= names:
        return METRICS
    if {"Invocations", "Event Name"} <= names:
        return EVENTS
    if {"Time(%)", "Time", "Calls", "Name"} <= names:
        return SUMMARY
    if labels[:2] == ["Start", "Duration"] and "Name" in names:
        return TRACE
    if {"Count", "Total Size", "Total Time", "Name"} <= names:
        return UNIFIED
    return None


def new_table(form: str, style: str, pid: int | None, line_no: int, labels: list[str],
              ends: list[int] | None = None, section: str | None = None) -> Table:
    """A table for a header; its canonical keys follow the form's label map."""
    names = LABELS[form]
    keys: list[str] = []
    for label in labels:
        key = names.get(label, label)
        keys.append(key if key not in keys else f"{key}#{len(keys)}")  # a repeated label keeps its own column
    return Table(form, style, pid, line_no, labels, keys, section=section, ends=list(ends or []))


def text_units(table: Table, line: str) -> dict[str, str] | None:
    """The units row nvprof writes under a text header with ``-u`` (``%  ms  ms ...``): each unit to the column
    whose right edge it reaches (numbers are right-aligned), or None when ``line`` is no units row."""
    tokens = list(_LABEL_RUNS.finditer(line))
    if not tokens or not all(t.group() in _UNIT_WORDS for t in tokens) or not table.ends:
        return None
    units = {}
    for t in tokens:
        column = next((i for i, end in enumerate(table.ends) if t.end() <= end), None)
        if column is None:
            return None
        units[table.keys[column]] = t.group()
    return units


def split_text_row(table: Table, line: str, line_no: int, path) -> dict[str, str | None]:
    """Cells of one text row of ``table``; an :class:`InputError` if the line does not fit the header."""
    if table.form == SUMMARY:
        return _summary_cells(table, line, line_no, path)
    if table.form in (METRICS, EVENTS):
        pattern = _METRIC_ROW if table.form == METRICS else _EVENT_ROW
        m = pattern.match(line)
        if not m:
            raise bad_input(path, line_no, f"expected a {table.form[:-1]} row of {len(table.labels)} columns "
                                           f"({', '.join(table.labels)}), found {line.strip()!r}")
        return m.groupdict()
    return _positional_cells(table, line, line_no, path)


def _summary_cells(table: Table, line: str, line_no: int, path) -> dict[str, str | None]:
    m = (_SUMMARY_ROW_BARE if table.units else _SUMMARY_ROW).match(line)
    if not m:
        wanted = [label for label in table.labels if label != "Type"]
        raise bad_input(path, line_no, f"expected {len(wanted)} columns ({', '.join(wanted)}) in a summary row, "
                                       f"found {len(line.split())} fields")
    return m.groupdict()


def _positional_cells(table: Table, line: str, line_no: int, path) -> dict[str, str | None]:
    """Split a right-aligned text row by the header's column edges; the last column (Name) takes the rest."""
    ends = table.ends
    last = len(ends) - 1
    cells: list[str | None] = [None] * len(ends)
    name_start = None
    for m in _LABEL_RUNS.finditer(line):
        column = next((i for i in range(last) if m.end() <= ends[i]), last)
        if column == last:
            name_start = m.start()
            break
        if cells[column] is not None:
            break  # two values in one column: the row does not fit the header
        cells[column] = m.group()
    missing = [table.labels[i] for i in range(last) if cells[i] is None]
    if (missing or name_start is None) and table.form == UNIFIED:
        fields = line.split(None, last)  # a wide value runs past its column (0.298016ms under "Total Time")
        if len(fields) == last + 1 and all(_UM_CELL.match(f) for f in fields[:last]):
            return dict(zip(table.keys, fields))
    if missing or name_start is None:
        found = len(_LABEL_RUNS.findall(line))
        raise bad_input(path, line_no, f"expected {len(ends)} columns ({', '.join(table.labels)}), found {found} "
                                       f"that do not line up with the header on line {table.header_line}")
    cells[last] = line[name_start:].strip()
    return dict(zip(table.keys, cells))


def _join_quoted(table: Table) -> None:
    """Queued CSV lines joined into one row where a quoted field holds a line break (RFC 4180: a kernel name or
    an NVTX range written over two lines); each row keeps its first line's number and context."""
    if not any(line.count('"') % 2 for line in table.pending):
        return
    rows, starts = quoted_records(table.pending)
    lines = [table.pending_lines[i] for i in starts]
    context = [table.pending_context[i] for i in starts]
    if table.unended_line is not None and table.unended_line not in lines:
        table.unended_line = lines[-1]  # the last row's first line: its number in messages
    table.pending, table.pending_lines, table.pending_context = rows, lines, context


def _drop_cut_row(table: Table) -> None:
    """The last queued CSV row left out where the file ends inside it (no line break after it, and a quoted field
    open or fewer fields than the header): ``table.cut`` says which line and why, for the reader's warning."""
    if table.unended_line is None or not table.pending or table.pending_lines[-1] != table.unended_line:
        return
    last = table.pending[-1]
    width = len(table.labels)
    unquoted = re.sub(r'"(?:[^"]|"")*"', "", last)
    why = ("a quoted field does not close" if '"' in unquoted
           else f"{unquoted.count(',') + 1} of the header's {width} fields" if unquoted.count(",") + 1 < width
           else None)
    if why is None:
        return
    table.cut = (table.unended_line, why, table.rows - 1)
    table.pending.pop()
    table.pending_lines.pop()
    table.pending_context.pop()
    table.unended_line = None


def _bulk_csv(table: Table, path) -> pl.DataFrame:
    """Cells of every queued CSV row; an error at the first row with a field count unlike the header's."""
    _join_quoted(table)
    _drop_cut_row(table)
    width = len(table.labels)
    if not table.pending:
        return pl.DataFrame(schema={k: pl.String for k in table.keys})
    lines = pl.Series(table.pending, dtype=pl.String)
    fields = lines.str.replace_all(r'"(?:[^"]|"")*"', "").str.count_matches(",") + 1
    if bool((fields == width).all()):
        try:  # the common, well-formed case: polars' CSV parser reads every row at once
            frame = pl.read_csv(io.StringIO("\n".join(table.pending)), has_header=False, new_columns=table.keys,
                                infer_schema=False, quote_char='"')
        except pl.exceptions.PolarsError:
            frame = None
        if frame is not None and frame.height == len(table.pending):
            return frame.with_columns(pl.all().replace("", None))
    rows = []
    for line, no in zip(table.pending, table.pending_lines):  # find the row at fault
        try:
            fields = next(csv.reader((line,)))
        except csv.Error as exc:
            if no == table.unended_line:
                raise cut_mid_line(path, no) from None
            raise bad_input(path, no, f"not a CSV row: {exc}") from None
        if len(fields) != width:
            if no == table.unended_line:
                raise cut_mid_line(path, no)
            raise bad_input(path, no, f"expected {width} comma-separated fields as in the header on line "
                                      f"{table.header_line}, found {len(fields)}")
        rows.append(fields)
    return pl.DataFrame(rows, schema={k: pl.String for k in table.keys}, orient="row").with_columns(
        pl.all().replace("", None))


def _bulk_positional(table: Table, path) -> pl.DataFrame:
    """Cells of every queued right-aligned text row, sliced at the header's column edges.

    A row whose values do not end exactly at the column edges (with a space
    after each) is split token by token instead, or rejected when it does
    not fit the header.
    """
    ends, keys = table.ends, table.keys
    last = len(ends) - 1
    frame = pl.DataFrame({"line": table.pending, "no": table.pending_lines}, schema={"line": pl.String, "no": pl.Int64})
    line = pl.col("line")
    starts = [0] + ends[:-1]
    cells = [line.str.slice(starts[i], ends[i] - starts[i]).str.strip_chars().alias(keys[i]) for i in range(last)]
    cells.append(line.str.slice(ends[last - 1] if last else 0).str.strip_chars().alias(keys[last]))
    aligned = pl.lit(True)
    for i in range(last):
        aligned = aligned & (line.str.slice(ends[i] - 1, 1) != " ") & (line.str.slice(ends[i], 1) == " ")
    split = frame.with_columns(*cells, aligned=aligned)
    split = split.with_columns(aligned=pl.col("aligned") & pl.all_horizontal(pl.col(k).str.len_chars() > 0
                                                                             for k in keys))
    odd = split.filter(~pl.col("aligned"))
    if odd.height:
        fixed = []
        for text, no in zip(odd["line"], odd["no"]):
            try:
                fixed.append(dict(_positional_cells(table, text, no, path), no=no))
            except InputError:
                if no == table.unended_line and no == table.pending_lines[-1]:  # the file ends inside it
                    table.cut = (no, "the row does not line up with the header", table.rows - 1)
                    split = split.filter(pl.col("no") != no)
                    for queued in (table.pending, table.pending_lines, table.pending_context):
                        queued.pop()
                    table.unended_line = None
                    continue
                raise
        patch = pl.DataFrame(fixed, schema={**{k: pl.String for k in keys}, "no": pl.Int64})
        split = pl.concat([split.filter("aligned").select(*keys, "no"), patch]).sort("no")
    return split.select(keys)


def cut_mid_line(path, line_no: int) -> InputError:
    """The error for a last line that stops inside a row."""
    return bad_input(path, line_no, "the file ends in the middle of this line (cut short?): expected a complete row")
