"""Parsing ``ncu --csv`` output: the details page (long) and the raw page (wide).

Both are ncu's console output, so the CSV records are mixed with ``==PROF==``
/ ``==WARNING==`` / ``==ERROR==`` lines and with whatever the profiled
program printed. Every CSV record ncu writes starts with a double quote;
other lines are set aside (a record whose quoted field spans lines is joined
back first).

Header columns across versions:
- 2019.x to 2021.x: ``"ID","Process ID","Process Name","Host Name","Kernel
  Name","Kernel Time","Context","Stream",...``
- 2022.x and later: ``"Kernel Time"`` gone; ``"Block Size","Grid Size",
  "Device","CC"`` after ``"Stream"``.
- 2023.x and later, details page: rule columns ``"Rule Name","Rule Type",
  "Rule Description","Estimated Speedup Type","Estimated Speedup"`` after
  ``"Metric Value"``; metric rows then stop after ``"Metric Value"`` (shorter
  rows), rule rows leave the metric columns empty.
Details page: one record per kernel × metric (``"Section Name","Metric
Name","Metric Unit","Metric Value"``). Raw page: one record per kernel, a
column per metric (after the launch columns; most names contain ``__``), and a units row under the header.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import polars as pl

from traceparse.errors import bad_input
from traceparse.reader import ReadOptions
from traceparse.sources import open_binary

from .parsed import KERNEL_COLUMNS, METRIC_COLUMNS, RULE_COLUMNS, Parsed, frame

#: Header column -> kernel-table column, for the columns that describe the launch.
IDENTITY = {"ID": "id", "Process ID": "pid", "Process Name": "process", "Host Name": "host",
            "Kernel Name": "name", "Kernel Time": "kernel_time", "Context": "context", "Stream": "stream",
            "Block Size": "block", "Grid Size": "grid", "Device": "device", "CC": "cc"}
#: ncu's internal helper metrics, never a measurement a user asked for.
INTERNAL_METRICS = ("derived_tempMetric",)
DETAILS_COLUMNS = ("Section Name", "Metric Name", "Metric Unit", "Metric Value")
RULE_HEADER = {"Rule Name": "name", "Rule Type": "type", "Rule Description": "description",
               "Estimated Speedup Type": "speedup_type", "Estimated Speedup": "speedup"}
SUMMARY_COLUMNS = ("Minimum", "Maximum", "Average")
#: Longest record whose quoted field spans lines (an unclosed quote would otherwise take the whole file).
MAX_FIELD_CHARS = 16 * 1024 * 1024
TOOL_PREFIXES = ("==PROF==", "==WARNING==", "==ERROR==", "==WARN==", "==INFO==")


def looks_like_ncu_csv(head: bytes) -> bool:
    """True when ``head`` holds an ncu CSV header line."""
    return b'"ID","Process ID"' in head or (b'"ID",' in head and b'"Kernel Name"' in head)


def read_csv(path: Path, options: ReadOptions) -> Parsed:
    """Parse a details or raw page written by ``ncu --csv``."""
    records, lines, notes, truncated = _records(path, options)
    header_at = next((i for i, r in enumerate(records) if r and r[0] == "ID" and "Kernel Name" in r), None)
    if header_at is None:
        raise bad_input(path, None, 'not Nsight Compute CSV output: no header row starting "ID",...,"Kernel Name" '
                                    '(expected the output of ncu --csv or ncu --csv --page raw)')
    header = records[header_at]
    _check_header(path, lines[header_at], header)
    body = list(zip(records[header_at + 1:], lines[header_at + 1:]))
    if all(c in header for c in DETAILS_COLUMNS):
        parsed = _details(path, header, body, options, truncated)
    else:
        parsed = _raw(path, header, lines[header_at], body, options, truncated)
    parsed.notes.extend(notes)
    return parsed


def _records(path: Path, options: ReadOptions) -> tuple[list[list[str]], list[int], list[str], bool]:
    """The CSV records (and the line each starts on), the tool's messages, and whether the file ends mid-record."""
    texts: list[str] = []
    lines: list[int] = []
    messages: dict[str, int] = {}
    pending: list[str] = []
    start = 0
    other = 0
    with open_binary(path, text=True) as raw:
        stream = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="")
        for lineno, line in enumerate(stream, 1):
            options.progress(len(line))
            if pending:
                pending.append(line)
                quotes += line.count('"')
                size += len(line)
                if quotes % 2 == 0:
                    texts.append("".join(pending))
                    lines.append(start)
                    pending = []
                elif size > MAX_FIELD_CHARS:
                    raise bad_input(path, start, f"a quoted field longer than {MAX_FIELD_CHARS:,} characters "
                                                 "(an unclosed quote?)")
                continue
            if line.startswith('"'):
                if line.count('"') % 2:
                    pending, start, quotes, size = [line], lineno, line.count('"'), len(line)
                    continue
                texts.append(line)
                lines.append(lineno)
            elif line.startswith(TOOL_PREFIXES):
                if not line.startswith("==PROF=="):
                    messages[line.strip()] = messages.get(line.strip(), 0) + 1
            elif line.strip():
                other += 1
    truncated = bool(pending)
    notes = [m if n == 1 else f"{m} (x{n})" for m, n in messages.items()]
    if other:
        notes.append(f"{other} lines that are not ncu output (the profiled program's own output) were skipped")
    try:
        records = list(csv.reader(texts))
    except csv.Error as exc:  # pragma: no cover - csv.reader accepts any balanced text
        raise bad_input(path, None, f"not valid CSV: {exc}") from None
    return records, lines, notes, truncated


def _check_header(path: Path, line: int, header: list[str]) -> None:
    if any(c in header for c in SUMMARY_COLUMNS) and "Metric Value" not in header:
        raise bad_input(path, line, "this is ncu --print-summary output (Minimum/Maximum/Average per kernel name); "
                                    "traceparse reads per-launch results: run ncu --csv without --print-summary")
    seen = set()
    for name in header:
        if name in seen:
            raise bad_input(path, line, f"column {name!r} appears twice in the header")
        seen.add(name)


def _details(path: Path, header: list[str], body: list[tuple[list[str], int]], options: ReadOptions,
             truncated: bool) -> Parsed:
    """The details page: a record per kernel × metric, and rule records."""
    index = {name: i for i, name in enumerate(header)}
    width = len(header)
    ident = {col: index[h] for h, col in IDENTITY.items() if h in index}
    section, mname, munit, mvalue = (index[c] for c in DETAILS_COLUMNS)
    rule = {col: index[h] for h, col in RULE_HEADER.items() if h in index}
    if rule and len(rule) < len(RULE_HEADER):  # the rule columns come together: one alone is a damaged header
        missing = ", ".join(repr(h) for h in RULE_HEADER if h not in index)
        raise bad_input(path, None, f"the details page has rule columns but not {missing}: a column the reader "
                                    "needs is missing from the header")
    kernels: dict[str, dict] = {}
    metrics = {c: [] for c in METRIC_COLUMNS}
    rules = {c: [] for c in RULE_COLUMNS}
    minimum = min(mvalue + 1, width)
    for n, (record, line) in enumerate(body):
        if record == header:
            continue
        if len(record) < minimum:
            if truncated or n == len(body) - 1:
                options.incomplete(f"{path}: line {line}: the last record is cut short (the file ends early); "
                                   f"kept the {len(kernels)} kernels before it")
                break
            raise bad_input(path, line, f"expected at least {minimum} CSV fields as in the header, found {len(record)}")
        if len(record) < width:
            record = record + [""] * (width - len(record))
        key = _key(record, index)
        if key not in kernels:
            kernels[key] = _kernel(key, line, record, ident)
        if record[mname] or record[mvalue]:
            for col, value in (("key", key), ("line", line), ("group", record[section]), ("name", record[mname]),
                               ("unit", record[munit]), ("raw", record[mvalue])):
                metrics[col].append(value)
        elif rule and record[rule["name"]]:
            rules["key"].append(key)
            rules["line"].append(line)
            rules["group"].append(record[section])
            for col, i in rule.items():
                rules[col].append(record[i])
    if truncated:
        options.incomplete(f"{path}: the file ends inside a quoted field (truncated); kept the {len(kernels)} "
                           "complete kernels (the last one may miss metrics)")
    return Parsed("csv details page", _kernel_frame(kernels), frame(METRIC_COLUMNS, metrics),
                  frame(RULE_COLUMNS, rules))


def _raw(path: Path, header: list[str], header_line: int, body: list[tuple[list[str], int]], options: ReadOptions,
         truncated: bool) -> Parsed:
    """The raw page: a record per kernel, a column per metric, units in the row under the header."""
    index = {name: i for i, name in enumerate(header)}
    ident = {col: index[h] for h, col in IDENTITY.items() if h in index}
    # metrics: every column after the launch columns (ncu 2025's source-counter metrics such as
    # `memory_l2_theoretical_sectors_global` have no `__`), and any `__` column; not ncu's internal
    # `derived_tempMetric*`, which a .ncu-rep read through ncu_report leaves out too
    last_launch = max((index[h] for h in IDENTITY if h in index), default=-1)
    metric_cols = [i for i, name in enumerate(header)
                   if ("__" in name or i > last_launch) and name not in IDENTITY
                   and not name.startswith(INTERNAL_METRICS)]
    if not metric_cols:
        raise bad_input(path, header_line, "not an ncu page traceparse reads: the header has neither the details "
                                           "columns (Section Name, Metric Name, Metric Unit, Metric Value) nor "
                                           "metric columns (names with __) of the raw page")
    if not body:
        raise bad_input(path, header_line, "the raw page ends after its header: no units row and no kernels")
    units, units_line = body[0]
    id_col = index["ID"]
    if len(units) != len(header) or (units[id_col] if id_col < len(units) else "").strip():
        found = units[id_col] if units and id_col < len(units) else ""
        raise bad_input(path, units_line, "raw page without its units row: the row under the header must hold the "
                                          f"metric units (an empty ID cell), found ID {found!r}; export with "
                                          "ncu --csv --page raw, which writes the units row")
    kernels: dict[str, dict] = {}
    rows: list[list[str]] = []
    row_lines: list[int] = []
    keys: list[str] = []
    width = len(header)
    skip_units = False
    for n, (record, line) in enumerate(body[1:]):
        if record == header:  # a repeated header (another process) and its units row
            skip_units = True
            continue
        if skip_units:
            skip_units = False
            if record and not record[id_col].strip():
                continue
        if len(record) != width:
            if n == len(body) - 2:
                options.warn(f"{path}: line {line}: the last kernel's record has {len(record)} of {width} fields "
                             f"(the file ends early); kept the {len(kernels)} complete kernels")
                break
            raise bad_input(path, line, f"expected {width} CSV fields as in the header, found {len(record)}")
        key = _key(record, index)
        if key in kernels:
            raise bad_input(path, line, f"kernel ID {record[id_col]!r} appears twice")
        kernels[key] = _kernel(key, line, record, ident)
        rows.append(record)
        row_lines.append(line)
        keys.append(key)
    if truncated:
        options.incomplete(f"{path}: the file ends inside a quoted field (truncated); kept the {len(kernels)} "
                           "complete kernels")
    columns = list(zip(*rows)) if rows else [()] * width
    device_cols = [i for i in metric_cols if header[i].startswith("device__attribute_")]
    launch_cols = [i for i in metric_cols if i not in set(device_cols)]
    wide = pl.DataFrame({"key": keys, "line": pl.Series(row_lines, dtype=pl.Int64),
                         **{header[i]: pl.Series(header[i], list(columns[i]), dtype=pl.String) for i in metric_cols}})
    if "Device" in index:  # device attributes describe the GPU: one kernel per device is enough
        wide = wide.with_columns(_device=pl.Series(list(columns[index["Device"]]), dtype=pl.String))
    else:
        wide = wide.with_columns(_device=pl.lit(""))
    first_per_device = wide.unique(subset="_device", keep="first", maintain_order=True)
    parts = [wide.unpivot(index=["key", "line"], on=[header[i] for i in launch_cols], variable_name="name",
                          value_name="raw")]
    if device_cols:
        parts.append(first_per_device.unpivot(index=["key", "line"], on=[header[i] for i in device_cols],
                                              variable_name="name", value_name="raw"))
    long = pl.concat(parts)
    unit_table = pl.DataFrame({"name": [header[i] for i in metric_cols], "unit": [units[i] for i in metric_cols]})
    long = (long.join(unit_table, on="name", how="left", maintain_order="left")
            .with_columns(group=pl.lit(None, dtype=pl.String))
            .select(METRIC_COLUMNS))
    return Parsed("csv raw page", _kernel_frame(kernels), long)


def _key(record: list[str], index: dict[str, int]) -> str:
    pid = record[index["Process ID"]] if "Process ID" in index else ""
    return f"{pid}:{record[index['ID']]}"


def _kernel(key: str, line: int, record: list[str], ident: dict[str, int]) -> dict:
    kernel = {col: record[i] for col, i in ident.items()}
    kernel["key"], kernel["line"] = key, line
    return kernel


def _kernel_frame(kernels: dict[str, dict]) -> pl.DataFrame:
    data = {c: [k.get(c) for k in kernels.values()] for c in KERNEL_COLUMNS}
    return frame(KERNEL_COLUMNS, data)
