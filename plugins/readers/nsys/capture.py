"""The ``nsys stats`` reports of one capture, read together into one trace without double counting.

``nsys stats --report R1 --report R2 --format csv --output PREFIX`` writes
``PREFIX_R1.csv``, ``PREFIX_R2.csv``...; :func:`group` puts the files of a
prefix together and :func:`read_capture` reads them as one trace.

Trace and summary reports of the same events overlap: ``cuda_gpu_kern_sum``
totals the kernels ``cuda_gpu_trace`` lists one by one. Each event kind is
therefore taken from the most detailed report present (tier 0: traces; 1:
the per-kind summaries; 2: ``cuda_gpu_sum``, which mixes kernels and memory
operations); the rows other reports have of that kind are left out, and
``meta.extra["reports"]`` says which report each kind came from. The
by-time and by-size memory summaries describe the same operations and are
merged into one row per operation.

An empty report file (nsys writes 0 bytes when a report had no data) is a
warning when other reports of the capture are read with it, and an error
when it is the only file.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from traceparse.errors import bad_input
from traceparse.reader import ReadOptions
from traceparse.trace import Trace, TraceMeta

from traceparse_plugins.readers.nsys import events, reports
from traceparse_plugins.readers.nsys.report_table import ReportTable, build, report_of
from traceparse_plugins.readers.nsys.sections import EmptyReport, sections_of

_SUPPORTED = ", ".join(reports.COVERS)


def group(paths: list[Path]) -> list[list[Path]]:
    """Group report files by ``PREFIX`` (same directory); other files stay alone, in the order given."""
    groups: dict[tuple[Path, str], list[Path]] = {}
    order: list[tuple[Path, str]] = []
    for path in paths:
        named = reports.parse_file_name(path.name)
        key = (path.parent, named.prefix) if named else (path, "")
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(path)
    return [groups[k] for k in order]


def _preference(path: Path) -> tuple[int, str]:
    """Read CSV before TSV before text tables, so a duplicate report is skipped in its weaker form."""
    suffix = path.name.lower()
    rank = 0 if suffix.endswith(".csv") else 1 if suffix.endswith(".tsv") else 2
    return rank, path.name


def read_capture(paths: list[Path], options: ReadOptions) -> Trace:
    """Read the report files of one capture into one :class:`Trace`."""
    alone = len(paths) == 1
    tables: dict[str, ReportTable] = {}
    skipped: dict[str, str] = {}
    meta = TraceMeta(tool="nsys", warnings=options.warnings)  # the same list: no warning is lost
    for path in sorted(paths, key=_preference):
        named = reports.parse_file_name(path.name)
        file_report = named.report if named else None
        if named and not named.supported:
            if alone:
                raise bad_input(path, None, f"the {named.report} report is not one traceparse reads "
                                            f"(it reads {_SUPPORTED})")
            skipped[path.name] = f"{named.report}: a report traceparse does not read"
            options.warn(f"{path}: skipped the {named.report} report (not read by traceparse)")
            continue
        if named and named.supported and named.report in tables:
            reason = f"same report as {tables[named.report].path.name}"
            skipped[path.name] = reason
            options.warn(f"{path}: skipped: {reason}")
            continue
        try:
            sections = sections_of(path, options.incomplete)
        except EmptyReport as exc:
            if alone:
                raise bad_input(path, None, exc.reason) from None
            skipped[path.name] = exc.reason
            options.warn(f"{path}: {exc.reason}; the other reports are read")
            options.progress(path.stat().st_size)
            continue
        for section in sections:
            report = report_of(section, section.announced or file_report)
            if report is None:
                raise bad_input(path, section.header_line,
                                "cannot tell which nsys stats report this table is; name the file "
                                f"PREFIX_REPORT.csv with REPORT one of {_SUPPORTED}")
            if report not in reports.COVERS:
                if alone and len(sections) == 1:
                    raise bad_input(path, None, f"the {report} report is not one traceparse reads "
                                                f"(it reads {_SUPPORTED})")
                skipped[f"{path.name}:{section.header_line}"] = f"{report}: a report traceparse does not read"
                options.warn(f"{path}: skipped the {report} report (not read by traceparse)")
                continue
            if report in tables:
                where = f"{path.name}:{section.header_line}"
                skipped[where] = f"second {report} table (the first, from {tables[report].path.name}, is read)"
                options.warn(f"{path}:{section.header_line}: skipped: {skipped[where]}")
                continue
            tables[report] = build(section, report)
            _note_truncated_names(tables[report], options)
        options.progress(path.stat().st_size)
    if not tables:
        raise bad_input(paths[0], None, "none of these files holds an nsys stats report traceparse reads "
                                        f"({_SUPPORTED})")
    frame, used = _combine(tables, options)
    _fill_meta(meta, tables, used, skipped, options)
    return Trace(frame, meta)


def _note_truncated_names(table: ReportTable, options: ReadOptions) -> None:
    """Warn when the console table cut long names (nsys ends them with an ellipsis)."""
    if table.layout != "column":
        return
    for column in ("name", "operation", "range"):
        if column in table.frame.columns:
            cut = int(table.frame[column].str.ends_with("\u2026").sum())
            if cut:
                options.warn(f"{table.path}: nsys cut {cut} of the {table.frame.height} names in this table "
                             "(they end with '\u2026'); the --format csv report has them in full")


def _combine(tables: dict[str, ReportTable], options: ReadOptions) -> tuple[pl.DataFrame, dict[str, list[str]]]:
    """Event rows of every kind from its most detailed report; returns them and report -> kinds used."""
    rows = {name: events.to_events(t) for name, t in tables.items()}
    best: dict[str, int] = {}
    for name in tables:
        tier, kinds = reports.COVERS[name]
        for kind in kinds:
            best[kind] = min(best.get(kind, tier), tier)
    used: dict[str, list[str]] = {}
    parts: dict[str, pl.DataFrame] = {}
    for name, frame in rows.items():
        tier, kinds = reports.COVERS[name]
        keep = [k for k in kinds if best[k] == tier]
        used[name] = keep
        parts[name] = frame.filter(pl.col("kind").is_in(keep))
    memory = events.merge_memory_summaries(parts.pop("cuda_gpu_mem_time_sum", None),
                                           parts.pop("cuda_gpu_mem_size_sum", None))
    frames = [f for f in (*parts.values(), memory) if f is not None and f.height]
    _cross_check(rows, tables, options)
    if not frames:
        return pl.DataFrame({"kind": pl.Series([], dtype=pl.String)}), used
    return pl.concat(frames, how="diagonal_relaxed"), used


def _cross_check(rows: dict[str, pl.DataFrame], tables: dict[str, ReportTable], options: ReadOptions) -> None:
    """Warn when a summary and a trace of the same events disagree: the files are likely of different captures."""
    pairs = (("cuda_gpu_kern_sum", "cuda_gpu_trace", "kernel"), ("cuda_api_sum", "cuda_api_trace", "api"))
    for summary, trace, kind in pairs:
        if summary not in rows or trace not in rows:
            continue
        calls = int(rows[summary]["calls"].sum() or 0)
        events_n = rows[trace].filter(pl.col("kind") == kind).height
        total = int(rows[summary]["duration_ns"].sum() or 0)
        timed = int(rows[trace].filter(pl.col("kind") == kind)["duration_ns"].sum() or 0)
        if calls != events_n or total != timed:
            options.warn(f"{tables[summary].path}: counts {calls} {kind} calls ({total} ns) but "
                         f"{tables[trace].path} lists {events_n} ({timed} ns): the files may not come from "
                         f"the same capture; the {trace} events are kept")


def _fill_meta(meta: TraceMeta, tables: dict[str, ReportTable], used: dict[str, list[str]],
               skipped: dict[str, str], options: ReadOptions) -> None:
    layouts = sorted({t.layout for t in tables.values()})
    meta.variant = f"nsys stats {'/'.join(layouts)} reports: {', '.join(sorted(tables))}"
    if "cuda_gpu_trace" in tables:
        meta.devices = events.devices_of(tables["cuda_gpu_trace"])
    meta.extra["reports"] = {
        name: {"file": t.path.name, "rows": t.frame.height, "kinds_used": used[name],
               "kinds_left_to_other_reports": [k for k in reports.COVERS[name][1] if k not in used[name]]}
        for name, t in sorted(tables.items())
    }
    if skipped:
        meta.extra["files_skipped"] = skipped
    not_read = {name: t.not_read for name, t in sorted(tables.items()) if t.not_read}
    if not_read:
        meta.extra["columns_not_read"] = not_read
    meta.extra["units"] = {name: t.units for name, t in sorted(tables.items()) if t.units}
    assumed = {name: t.assumed for name, t in sorted(tables.items()) if t.assumed}
    if assumed:
        meta.extra["units_assumed"] = assumed
    for name, t in sorted(tables.items()):
        rounded = []
        for column, step in sorted(t.resolution.items()):
            unit = "bytes" if reports.value_kind(name, column) == "size" else "ns"
            meta.extra.setdefault("resolution", {})[f"{name}.{column}"] = f"{step} {unit}"
            rounded.append(f"{t.headers[column]!r} to {step} {unit}")
        if rounded and used[name]:
            options.warn(f"{t.path}: nsys rounded {', '.join(rounded)} (too few decimals for the unit); "
                         "the SQLite export (nsys export --type sqlite) has exact values")
