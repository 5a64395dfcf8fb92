"""Rich terminal rendering: ingest summaries, trace details, findings."""

from __future__ import annotations

import re
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from traceparse.rule import SEVERITIES, Finding
from traceparse.verdict import Column
from traceparse.trace import TraceMeta

SEVERITY_STYLE = {"info": "cyan", "warning": "yellow", "critical": "bold red"}


def short_name(name: str | None, width: int = 70) -> str:
    """A demangled C++ kernel name shortened for the screen; JSON output always keeps the whole name.

    Steps, each taken only while the name is still longer than ``width``:
    drop the return type and parameter list; replace template arguments
    nested two deep with ``…``; drop casts such as ``(bool)1`` -> ``1``;
    keep only the last component of the qualified name; replace all
    template arguments with ``…``; cut.
    """
    if not name:
        return ""
    s = re.sub(r"^(void|__global__ void)\s+", "", name.strip())
    s = _drop_parameters(s)
    steps = (
        lambda x: _collapse_templates(x, keep_depth=1),
        lambda x: re.sub(r"\((?:bool|int|unsigned int|unsigned long|long|\w+_t|\w+)\)(?=[-\w])", "", x),
        _last_components,
        lambda x: _collapse_templates(x, keep_depth=0),
    )
    for step in steps:
        if len(s) <= width:
            break
        s = re.sub(r"\s+", " ", step(s))
    return s if len(s) <= width else s[: width - 1] + "…"


def _drop_parameters(s: str) -> str:
    if not s.endswith(")"):
        return s
    depth = 0
    for i in range(len(s) - 1, -1, -1):
        if s[i] == ")":
            depth += 1
        elif s[i] == "(":
            depth -= 1
            if depth == 0:
                head = s[:i].rstrip()
                return head if head and head[-1] not in "<,(" else s
    return s


def _collapse_templates(s: str, keep_depth: int) -> str:
    out, depth = [], 0
    for ch in s:
        if ch == "<":
            depth += 1
            if depth == keep_depth + 1:
                out.append("<…>")
            elif depth <= keep_depth:
                out.append(ch)
            continue
        if ch == ">":
            depth -= 1
            if depth < keep_depth:
                out.append(ch)
            continue
        if depth <= keep_depth:
            out.append(ch)
    return "".join(out)


def _last_components(s: str) -> str:
    head, sep, rest = s.partition("<")
    return head.split("::")[-1] + sep + rest


def fmt_ns(ns: Any) -> str:
    """A duration in the most readable unit."""
    if ns is None:
        return "-"
    ns = float(ns)
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if abs(ns) >= scale:
            return f"{ns / scale:.3f} {unit}"
    return f"{ns:.0f} ns"


def fmt_unit(unit: str, value: Any) -> str:
    """A value for the screen, by its declared unit (:data:`traceparse.verdict.UNITS`)."""
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if unit == "ns":
        return fmt_ns(value)
    if unit == "pct":
        return f"{value:.1f}%"
    if unit == "bytes":
        return fmt_bytes(value)
    if unit == "bytes_binary":
        return fmt_bytes_binary(value)
    if unit == "count":
        return f"{value:,}" if isinstance(value, int) else f"{value:,.1f}"
    if unit == "gbps":
        return f"{value:.2f} GB/s"
    if unit == "flops":
        return f"{value / 1e9:.4g} GFLOP"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def fmt_bytes(n: float) -> str:
    """A byte count in SI units (1 kB = 1000 B)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_bytes_binary(n: float) -> str:
    """A byte count in binary units (1 KiB = 1024 B)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def trace_summary(meta: TraceMeta, already_stored: bool = False) -> Panel:
    """The panel ``ingest`` and ``show`` print: events per kind, span, devices, tags, warnings."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_row("id", meta.id or "")
    table.add_row("source", "\n".join(meta.source_paths))
    table.add_row("format", " / ".join(x for x in (meta.format, meta.variant) if x))
    if meta.tool or meta.tool_version:
        table.add_row("tool", " ".join(x for x in (meta.tool, meta.tool_version) if x))
    summary = meta.summary or {}
    kinds = summary.get("events_per_kind", {})
    table.add_row("events", f"{meta.event_count:,}" + (" (" + ", ".join(f"{k} {v:,}" for k, v in kinds.items()) + ")"
                                                        if kinds else "") if meta.event_count is not None else "-")
    table.add_row("time span", fmt_ns(summary.get("span_ns")))
    for d in meta.devices:
        bits = [d.name or "?"]
        identified = _identified(d)
        if identified:
            bits[0] += f" ({identified})"
        if d.compute_capability:
            bits.append(f"sm {d.compute_capability}")
        if d.sm_count:
            bits.append(f"{d.sm_count} SMs")
        if d.memory_bytes:
            bits.append(f"{d.memory_bytes / 2**30:.0f} GiB")
        table.add_row(f"device {d.id if d.id is not None else '?'}", ", ".join(bits))
    if meta.tags:
        table.add_row("tags", " ".join(f"{k}={v}" for k, v in sorted(meta.tags.items())))
    for w in meta.warnings:
        table.add_row(Text("warning", style="yellow"), w)
    title = "already in the store" if already_stored else "ingested"
    return Panel(table, title=f"[bold]{title}[/bold]", expand=False)


def _identified(device) -> str:
    """For a device whose name is missing or generic: the catalog entry its properties name, and the look-alikes."""
    from traceparse.catalog import find_gpu, identify_gpu

    try:
        if device.name and find_gpu(device.name) is not None:
            return ""
        spec, fits = identify_gpu(device)
    except Exception:  # the catalog is an aid to the reader here, never a reason for show to fail
        return ""
    if spec is None:
        return ""
    others = [f for f in fits if f != spec["name"]]
    return f"{spec['name']} by its properties" + (f"; also fits {', '.join(others)}" if others else "")


def render_findings(console: Console, findings: list[Finding], traces: dict[str, TraceMeta]) -> None:
    """Print a panel per finding, most severe first within each trace, then a one-line tally."""
    order = {trace: i for i, trace in enumerate(dict.fromkeys(f.trace for f in findings))}
    ranked = sorted(findings, key=lambda f: (order[f.trace], -SEVERITIES.index(f.severity)))
    current = None
    for finding in ranked:
        if finding.trace != current:
            current = finding.trace
            meta = traces.get(current)
            label = f"{current}  {meta.path}" if meta else str(current)
            console.rule(f"[bold]{label}[/bold]")
        console.print(_finding_panel(finding))
    if findings:
        console.print(_tally(findings))


def _tally(findings: list[Finding]) -> str:
    counts = {sev: sum(1 for f in findings if f.severity == sev) for sev in reversed(SEVERITIES)}
    label = {"warning": "warnings"}  # "2 critical", "2 info", but "2 warnings"
    parts = [f"[{SEVERITY_STYLE[sev]}]{n} {label.get(sev, sev) if n != 1 else sev}[/{SEVERITY_STYLE[sev]}]"
             for sev, n in counts.items() if n]
    return f"{len(findings)} finding{'s' if len(findings) != 1 else ''}: " + ", ".join(parts)


def _finding_panel(finding: Finding) -> Panel:
    style = SEVERITY_STYLE.get(finding.severity, "white")
    parts: list[Any] = [Text(finding.message)]
    figures = _figures(finding)
    if figures:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="dim")
        grid.add_column(justify="right")
        for key, unit in figures.items():
            grid.add_row(key, fmt_unit(unit, finding.metrics.get(key)))
        parts.append(grid)
    for key, columns in finding.tables.items():
        data = finding.metrics.get(key)
        if isinstance(data, dict) and data:
            parts.append(_dict_table(key, data, columns))
    if finding.items:
        parts.append(_items_table(finding.items, _columns(finding)))
    if finding.suggestion:
        parts.append(Text("→ " + finding.suggestion, style="green"))
    title = f"[{style}]{finding.severity.upper()}[/{style}]  [bold]{finding.rule}[/bold]: {finding.title}"
    return Panel(Group(*parts), title=title, title_align="left", border_style=style)


def _figures(finding: Finding) -> dict[str, str]:
    """The headline figures: those the finding declares, else every scalar metric shown as is."""
    if finding.figures:
        return dict(finding.figures)
    return {k: "number" for k, v in finding.metrics.items() if not isinstance(v, (dict, list))}


def _columns(finding: Finding) -> list[Column]:
    """The item columns: those the finding declares, else every key of its items shown as is."""
    if finding.columns:
        return list(finding.columns)
    keys = dict.fromkeys(k for item in finding.items for k in item)
    return [Column(k, k, "number") for k in keys]


def _dict_table(title: str, data: dict[str, dict], columns: list[Column]) -> Table:
    """A metric that is a table: the first declared column labels the row keys, the others its values."""
    head, rest = columns[0], columns[1:]
    table = Table(title=title, title_justify="left", show_edge=False, header_style="bold")
    table.add_column(head.label, no_wrap=True)
    for c in rest:
        table.add_column(c.label, justify="right", no_wrap=True)
    for key, row in data.items():
        table.add_row(str(key), *(fmt_unit(c.unit, row.get(c.key)) for c in rest))
    return table


def _items_table(items: list[dict], columns: list[Column]) -> Table:
    rows = [[_cell(c, item.get(c.key)) for c in columns] for item in items]
    table = Table(show_edge=False, header_style="bold")
    for i, c in enumerate(columns):
        if c.unit == "name":
            table.add_column(c.label, overflow="ellipsis", min_width=24)
            continue
        widest = max([len(c.label)] + [len(r[i]) for r in rows])
        table.add_column(c.label, no_wrap=True, min_width=widest, justify="left" if c.unit in ("text", "name") else "right")
    for row in rows:
        table.add_row(*row)
    return table


NAME_WIDTH = 60


def _cell(column: Column, value: Any) -> str:
    """A table cell; long text (kernel names, the kernel before a gap) is shortened.

    Names lose the spaces after commas so that the table cuts them with …
    instead of wrapping them over several lines.
    """
    if isinstance(value, str) and (column.unit == "name" or len(value) > NAME_WIDTH):
        return short_name(value, NAME_WIDTH).replace(", ", ",")
    return fmt_unit(column.unit, value)
