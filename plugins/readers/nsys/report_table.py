"""One ``nsys stats`` report as a typed table: canonical columns, times in ns, sizes in bytes.

A :class:`~traceparse_plugins.readers.nsys.sections.Section` (header cells and
text rows) becomes a :class:`ReportTable`: its report is identified from the
header (:func:`~traceparse_plugins.readers.nsys.reports.identify`), each
column it uses is converted exactly (times to integer ns, sizes to integer
bytes, counts and ids to integers) and a cell that is not a number where one
must be is a one-line error naming the file, the line and the column.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from traceparse.errors import bad_input

from traceparse_plugins.readers.nsys import reports, units
from traceparse_plugins.readers.nsys.sections import Section


@dataclass
class ReportTable:
    """A parsed report: ``frame`` has one column per canonical field it had."""

    report: str
    path: Path
    frame: pl.DataFrame
    layout: str
    units: dict[str, str] = field(default_factory=dict)      # field -> unit read (for meta)
    assumed: dict[str, str] = field(default_factory=dict)    # field -> unit assumed (bare header)
    resolution: dict[str, int] = field(default_factory=dict)  # field -> ns or bytes one last digit is worth
    headers: dict[str, str] = field(default_factory=dict)     # field -> header cell as written
    not_read: list[str] = field(default_factory=list)         # header cells traceparse has no use for


def report_of(section: Section, file_report: str | None) -> str | None:
    """The report a section holds (see :func:`reports.identify`)."""
    return reports.identify(_columns(section.header), file_report)


def _columns(header: list[str]) -> dict[str, tuple[str, str | None]]:
    columns: dict[str, tuple[str, str | None]] = {}
    for cell in header:
        base, unit = units.split_header(cell)
        name = reports.field_of(base)
        if name is not None and name not in columns:
            columns[name] = (base, unit)
    return columns


def build(section: Section, report: str) -> ReportTable:
    """Convert a section's text cells into a typed :class:`ReportTable` of ``report``."""
    path = section.path
    if not section.n_rows:
        raise bad_input(path, section.header_line, f"the {report} report has a header but no rows")
    thousands = section.layout == "column"
    table = ReportTable(report, path, pl.DataFrame(), section.layout)
    cells = section.columns()
    data: dict[str, pl.Series] = {}
    seen: set[str] = set()
    for index, cell in enumerate(section.header):
        base, unit = units.split_header(cell)
        name = reports.field_of(base)
        if name is None or name in seen or name == "throughput" or unit == "%":
            # throughput is bytes / duration and Time (%) a share of the total: both are recomputed
            if name is None:
                table.not_read.append(cell.strip())
            continue
        seen.add(name)
        table.headers[name] = cell.strip()
        raw = cells[index].alias(name)
        kind = reports.value_kind(report, name)
        try:
            data[name] = _convert(raw, kind, unit, report, name, table, thousands)
        except units.OutOfRange as exc:
            raise bad_input(path, section.line_of(exc.index),
                            f"column {cell.strip()!r}: {exc.text!r} is out of range (over 2^63 ns or bytes)") from None
        except units.NotANumber as exc:
            what = {"time": "a time", "size": "a size", "int": "a whole number"}[kind]
            raise bad_input(path, section.line_of(exc.index),
                            f"column {cell.strip()!r}: {exc.text!r} is not a number ({what} was expected)") from None
        except _UnknownUnit as exc:
            raise bad_input(path, section.header_line,
                            f"column {cell.strip()!r}: unknown unit {exc.args[0]!r} "
                            f"(expected ns/us/ms/s for times, B/KB/MB/GB/KiB/MiB/GiB for sizes)") from None
    missing = [header for name, header in reports.REQUIRED.get(report, {}).items() if name not in data]
    if missing:
        raise bad_input(path, section.header_line,
                        f"the {report} report has no {' or '.join(repr(m) for m in missing)} column "
                        f"(its columns: {', '.join(c.strip() for c in section.header)}); traceparse needs it")
    if "bytes" in data and "duration" in data:
        data["bytes"] = _bytes_from_throughput(section, cells, data["bytes"], data["duration"], thousands)
    table.frame = pl.DataFrame(data)
    return table


def _bytes_from_throughput(section: Section, cells: list[pl.Series], size: pl.Series, duration: pl.Series,
                           thousands: bool) -> pl.Series:
    """``size`` with the copies whose size reads "0.000 MB" (under the column's last digit: unknown) given their
    bytes from the Throughput column and their duration, where the report has one: a 128-byte copy beside a
    9.6 MB one was left out of its copies' bytes while its time counted (7.369 GB/s of copies that ran at 7.363)."""
    for index, cell in enumerate(section.header):
        base, unit = units.split_header(cell)
        if reports.field_of(base) != "throughput" or unit is None:
            continue
        per_second = units.size_factor(unit.removesuffix("/s").removesuffix("ps"))
        if per_second is None:
            return size
        rate = cells[index].str.replace_all(",", "" if thousands else ",").cast(pl.Float64, strict=False)
        recovered = (rate * per_second * duration.cast(pl.Float64) / 1e9).round(0).cast(pl.Int64, strict=False)
        unknown = size.is_null() & (rate > 0) & duration.is_not_null()
        return pl.select(pl.when(unknown).then(recovered).otherwise(size)).to_series().alias(size.name)
    return size


class _UnknownUnit(ValueError):
    pass


def _convert(raw: pl.Series, kind: str, unit: str | None, report: str, name: str, table: ReportTable,
             thousands: bool) -> pl.Series:
    if kind == "text":
        return raw
    if kind == "int":
        return units.integers(raw, thousands=thousands)
    if unit is None or unit == "":
        unit = reports.default_unit(report, kind)
        table.assumed[name] = unit
    factor = units.time_factor(unit) if kind == "time" else units.size_factor(unit)
    if factor is None:
        raise _UnknownUnit(unit)
    table.units[name] = unit
    out = units.decimals_to_int(raw, unit, thousands=thousands)
    if factor > 1:
        digits = units.fraction_digits(raw) if raw.str.contains(".", literal=True).any() else 0
        if factor // 10**digits > 1:  # a last digit worth a byte or a nanosecond (KiB to 3 decimals) is exact enough
            table.resolution[name] = factor // 10**digits
            if kind == "size":  # "0.000 MB": under half a last digit, not nothing (a copy of 40 bytes): unknown
                out = pl.select(pl.when(out != 0).then(out)).to_series().alias(out.name)
    return out
