"""Rich terminal rendering: ingest summaries, trace details, findings."""

from __future__ import annotations

import re
from typing import Any

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from traceparse.rule import Finding
from traceparse.trace import TraceMeta

SEVERITY_STYLE = {"info": "cyan", "warning": "yellow", "critical": "bold red"}


def short_name(name: str | None, width: int = 70) -> str:
    """A demangled C++ kernel name shortened for the screen.

    Drops the return type and the parameter list, replaces template
    arguments nested deeper than one level with ``…``, and cuts what is
    left to ``width`` characters. JSON output always keeps the whole name.
    """
    if not name:
        return ""
    s = name.strip()
    s = re.sub(r"^(void|__global__ void)\s+", "", s)
    if s.endswith(")"):  # drop the trailing parameter list
        depth = 0
        for i in range(len(s) - 1, -1, -1):
            if s[i] == ")":
                depth += 1
            elif s[i] == "(":
                depth -= 1
                if depth == 0:
                    if i > 0 and s[:i].rstrip()[-1:] not in ("", "<", ","):
                        s = s[:i].rstrip()
                    break
    out, depth = [], 0
    for ch in s:
        if ch == "<":
            depth += 1
            if depth == 2:
                out.append("<…>")
            if depth == 1:
                out.append(ch)
            continue
        if ch == ">":
            depth -= 1
            if depth == 0:
                out.append(ch)
            continue
        if depth <= 1:
            out.append(ch)
    s = re.sub(r"\s+", " ", "".join(out))
    if len(s) > width:  # still too long: drop the template arguments altogether
        s = re.sub(r"<[^<>]*(<…>[^<>]*)*>", "<…>", s)
    return s if len(s) <= width else s[: width - 1] + "…"


def fmt_ns(ns: Any) -> str:
    """A duration in the most readable unit."""
    if ns is None:
        return "-"
    ns = float(ns)
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if abs(ns) >= scale:
            return f"{ns / scale:.3f} {unit}"
    return f"{ns:.0f} ns"


def fmt_value(key: str, value: Any) -> str:
    """A metric value for the screen, by its key's suffix."""
    if value is None:
        return "-"
    if key.endswith("_ns"):
        return fmt_ns(value)
    if key.endswith("_pct"):
        return f"{value:.1f}%"
    if key.endswith("bytes") and isinstance(value, (int, float)):
        return fmt_bytes(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def fmt_bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
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


def render_findings(console: Console, findings: list[Finding], traces: dict[str, TraceMeta]) -> None:
    """Print a panel per finding: severity, message, metrics, top items, suggestion."""
    current = None
    for finding in findings:
        if finding.trace != current:
            current = finding.trace
            meta = traces.get(current)
            label = f"{current}  {meta.path}" if meta else str(current)
            console.rule(f"[bold]{label}[/bold]")
        console.print(_finding_panel(finding))


def _finding_panel(finding: Finding) -> Panel:
    style = SEVERITY_STYLE.get(finding.severity, "white")
    parts: list[Any] = [Text(finding.message)]
    scalars = {k: v for k, v in finding.metrics.items() if not isinstance(v, (dict, list))}
    if scalars:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="dim")
        grid.add_column(justify="right")
        for k, v in scalars.items():
            grid.add_row(k, fmt_value(k, v))
        parts.append(grid)
    for k, v in finding.metrics.items():
        if isinstance(v, dict) and v and all(isinstance(x, dict) for x in v.values()):
            parts.append(_dict_table(k, v))
    if finding.items:
        parts.append(_items_table(finding.items))
    if finding.suggestion:
        parts.append(Text("→ " + finding.suggestion, style="green"))
    title = f"[{style}]{finding.severity.upper()}[/{style}]  [bold]{finding.rule}[/bold]: {finding.title}"
    return Panel(Group(*parts), title=title, title_align="left", border_style=style)


def _dict_table(title: str, data: dict[str, dict]) -> Table:
    columns = list(dict.fromkeys(k for row in data.values() for k in row))
    table = Table(title=title, title_justify="left", show_edge=False, header_style="bold")
    table.add_column(title.rstrip("s"))
    for c in columns:
        table.add_column(c, justify="right")
    for key, row in data.items():
        table.add_row(str(key), *(fmt_value(c, row.get(c)) for c in columns))
    return table


def _items_table(items: list[dict]) -> Table:
    columns = list(dict.fromkeys(k for item in items for k in item))
    table = Table(show_edge=False, header_style="bold")
    for c in columns:
        table.add_column(c, justify="left" if c in ("name", "category", "copy", "metric") else "right",
                         overflow="fold" if c != "name" else "ellipsis", no_wrap=c == "name",
                         ratio=3 if c == "name" else None)
    for item in items:
        cells = []
        for c in columns:
            v = item.get(c)
            cells.append(short_name(v) if c == "name" and isinstance(v, str) else fmt_value(c, v))
        table.add_row(*cells)
    return table
