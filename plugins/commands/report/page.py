"""The report as one self-contained HTML page: metadata, summary, charts, every finding with its tables.

The page loads nothing at view time: plotly.js is inlined once, the
figures are JSON in the page, and a Content-Security-Policy forbids every
request. Every text that comes from the trace is escaped here (names come
from untrusted files): :func:`esc` for HTML, :func:`script_json` for data
inside a ``<script>``.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from datetime import datetime, timezone
from typing import Any

from traceparse.meta import RANK_HOSTS, hosts
from traceparse.names import cut_apart, short_names
from traceparse.report import (MEMBER_KEYS, TABLE_ROWS, category_share_shown, cut_left_out, dict_rows,
                               finding_columns, fmt_ns, fmt_unit, fold_rows, fold_title, hosts_line, items_as_shown,
                               mean_of, shown_figures, spin_parts, spin_said)
from traceparse.report import _format_column as screen_column, _numbers as screen_numbers
from traceparse.rule import Finding
from traceparse.verdict import Column, is_quiet
from traceparse.text import visible_keeping_lines

#: No request of any kind: scripts and styles are inline, images (plotly's PNG export) data/blob URLs.
CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data: blob:; "
       "font-src data:; connect-src 'none'; base-uri 'none'; form-action 'none'")
#: Characters of a name in a table cell (the whole name is its tooltip).
NAME_WIDTH = 70

STYLE = """
:root { --fg: #1d2330; --muted: #5b6475; --line: #e3e6ec; --bg: #f6f7f9; --info: #2b7bb9; --warning: #b7791f;
        --critical: #c53030; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
       color: var(--fg); background: var(--bg); }
header { background: #1d2330; color: #fff; padding: 14px 28px; }
header h1 { margin: 0; font-size: 20px; font-weight: 600; }
header .sub { color: #c3c9d6; font-size: 13px; word-break: break-all; }
main { max-width: 1280px; margin: 0 auto; padding: 18px 28px 40px; }
h2 { font-size: 17px; margin: 26px 0 10px; }
.card { background: #fff; border: 1px solid var(--line); border-radius: 8px; padding: 14px 18px; margin-bottom: 14px; }
.cards { display: grid; grid-template-columns: repeat(auto-fit, minmax(min(190px, 100%), 1fr)); gap: 12px; margin-bottom: 14px; }
.cards .card { margin: 0; }
.big { font-size: 22px; font-weight: 600; }
.label { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
.muted { color: var(--muted); }
dl.meta { display: grid; grid-template-columns: max-content 1fr; gap: 4px 18px; margin: 0; }
dl.meta dt { color: var(--muted); }
dl.meta dd { margin: 0; word-break: break-word; }
.charts { display: grid; grid-template-columns: repeat(auto-fit, minmax(min(560px, 100%), 1fr)); gap: 14px; }
.charts .card { margin: 0; min-width: 0; }
.chart-title { font-weight: 600; }
.chart-note { color: var(--muted); font-size: 12px; margin-bottom: 4px; }
.sev { display: inline-block; padding: 1px 8px; border-radius: 10px; color: #fff; font-size: 11px; font-weight: 700;
       letter-spacing: .05em; vertical-align: 1px; }
.sev-info { background: var(--info); } .sev-warning { background: var(--warning); }
.sev-critical { background: var(--critical); }
details.finding { background: #fff; border: 1px solid var(--line); border-left: 5px solid var(--info);
                  border-radius: 8px; margin-bottom: 10px; padding: 10px 16px; }
details.finding.warning { border-left-color: var(--warning); }
details.finding.critical { border-left-color: var(--critical); }
details.finding > summary { cursor: pointer; font-size: 15px; }
details.finding > summary .rule { font-weight: 600; }
.suggestion { color: #276749; margin-top: 8px; }
.figures { display: grid; grid-template-columns: repeat(auto-fill, minmax(240px, 1fr)); gap: 2px 24px; margin: 10px 0; }
.figures div { display: flex; justify-content: space-between; border-bottom: 1px dotted var(--line); }
.figures span:first-child { color: var(--muted); }
.tablewrap { overflow-x: auto; max-width: 100%; margin: 8px 0; }
details.finding, .card { min-width: 0; overflow-wrap: anywhere; }
table { border-collapse: collapse; font-size: 13px; }
caption { text-align: left; color: var(--muted); font-size: 12px; padding: 4px 0; }
th, td { padding: 3px 10px; border-bottom: 1px solid var(--line); white-space: nowrap; }
th { text-align: left; background: #f0f2f5; font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
ul.worst { margin: 4px 0 0; padding-left: 18px; }
details.all-rows > summary { cursor: pointer; color: var(--muted); font-size: 12px; }
footer { color: var(--muted); font-size: 12px; margin-top: 30px; }
a { color: #2b6cb0; }
"""

#: Draws every figure of the page once plotly.js has loaded; a chart that fails to draw is an error in the console.
BOOT = """
(function () {
  var figures = JSON.parse(document.getElementById('figures').textContent);
  var config = {displaylogo: false, responsive: true};
  Object.keys(figures).forEach(function (id) {
    var fig = figures[id];
    Plotly.newPlot(id, fig.data, fig.layout, config);
  });
})();
"""


def esc(value: Any) -> str:
    """Text made safe for HTML content and attribute values: markup escaped, and control, direction and invisible
    characters shown as the terminal shows them (``\x1b``, ``\u202e``): raw, they are HTML parse errors, and
    an override reverses the text after it (a file name ``…\u202egol.exe`` read as ``…exe.log``)."""
    return html.escape(visible_keeping_lines("" if value is None else str(value)), quote=True)


def script_json(value: Any) -> str:
    """JSON that can sit inside a ``<script>`` element: ``<``, ``>`` and ``&`` as unicode escapes."""
    text = value if isinstance(value, str) else json.dumps(value)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def plain(value: Any) -> str:
    """A value that is not a number, as a person reads it: yes/no, -, lists joined by commas."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple, set)):
        return ", ".join(plain(v) for v in value)
    return str(value)


def format_column(column: Column, values: list[Any]) -> tuple[str, list[tuple[str, str | None]], bool]:
    """A column's header, its cells as (text, tooltip or None), and whether it is numeric (right-aligned).

    Names are shortened with the whole name as the tooltip; a column of
    numbers reads as the terminal's table shows it
    (:func:`traceparse.report._format_column`): durations and byte counts in
    one unit per column, named in the header, every number of a column to
    the same decimals, shares of one whole adding up to 100. The page wrote
    its own: 393.632 us where the screen said 393.6, a score 181.9 where it
    said 182.
    """
    label = column.label or column.key
    if column.unit in ("name", "text"):
        names = [v for v in values if column.unit == "name" and isinstance(v, str)]
        shortened = iter(cut_apart(short_names(names, NAME_WIDTH), NAME_WIDTH))
        cells = []
        for v in values:
            if column.unit == "name" and isinstance(v, str):
                short = next(shortened)
                cells.append((short, v if short != v else None))
            else:
                cells.append((plain(v), None))
        return label, cells, False
    if screen_numbers(values):  # numbers, or intervals of them ([6.20, 7.75])
        header, texts = screen_column(Column(column.key, label, column.unit), values)
        return header, [(text, None) for text in texts], True
    return label, [(plain(v), None) for v in values], False


def table_html(columns: list[Column], rows: list[dict], caption: str | None = None) -> str:
    """A finding's table: the declared columns, in order, with their units."""
    formatted = [format_column(c, [r.get(c.key) for r in rows]) for c in columns]
    head = "".join(f'<th class="{"num" if numeric else ""}">{esc(label)}</th>' for label, _, numeric in formatted)
    body = []
    for i in range(len(rows)):
        cells = []
        for label, column_cells, numeric in formatted:
            text, tip = column_cells[i]
            title = f' title="{esc(tip)}"' if tip else ""
            cells.append(f'<td class="{"num" if numeric else ""}"{title}>{esc(text)}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    cap = f"<caption>{esc(caption)}</caption>" if caption else ""
    return (f'<div class="tablewrap"><table>{cap}<thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def folded_table_html(columns: list[Column], rows: list[dict], caption: str | None, budget: int | None,
                      worst: str | None = None) -> str:
    """A table of more than ``budget + 1`` rows as the terminal folds it (:func:`traceparse.report.fold_rows`:
    ``budget`` rows, the worst by ``worst`` where declared, and one row for the rest), then every row in its
    order under a "all N rows" fold that opens on a click; a shorter table (or ``budget`` None) whole."""
    if budget is None or len(rows) <= budget + 1:
        return table_html(columns, rows, caption)
    shown = fold_rows(rows, columns[0].key, columns[1:], budget, worst)
    if len(rows) <= FOLD_ROWS_KEPT + 1:
        opened, summary = rows, f"all {len(rows):,} rows"
    else:  # a table of thousands of rows (13 streams of 256 ranks: 650 KB) keeps its worst, as the screen does
        opened = fold_rows(rows, columns[0].key, columns[1:], FOLD_ROWS_KEPT, worst)
        summary = (f"{FOLD_ROWS_KEPT:,} of {len(rows):,} rows, {'the worst' if worst else 'the first'} "
                   "(report --all keeps every row)")
    return (table_html(columns, shown, fold_title(caption, rows, budget, worst, columns))
            + f'<details class="all-rows"><summary>{esc(summary)}</summary>'
            + table_html(columns, opened, caption) + "</details>")


#: The rows a folded table keeps under its "all rows" fold: a row per rank up to 256 ranks; past that the worst
#: (or first) of them and one row for the rest, so that the page of a run of thousands of ranks stays a few MB.
FOLD_ROWS_KEPT = 256


def finding_html(finding: Finding, index: int, rows: int | None = TABLE_ROWS) -> str:
    """One finding: severity, rule and title (open unless info), message, figures, tables, items, suggestion.
    A table of a metric, or of items one per rank or device, longer than ``rows + 1`` is folded
    (:func:`folded_table_html`)."""
    parts = [f'<p class="message">{esc(finding.message)}</p>']
    figures = shown_figures(finding)
    if figures:
        cells = "".join(f"<div><span>{esc(label)}</span><span>{esc(value)}</span></div>" for label, value in figures)
        parts.append(f'<div class="figures">{cells}</div>')
    for key, columns in finding.tables.items():
        table = finding.metrics.get(key)
        if isinstance(table, dict) and table and columns:
            table_columns, table_rows = dict_rows(table, columns)
            parts.append(folded_table_html(table_columns, table_rows, key.replace("_", " "), rows,
                                           finding.worst.get(key)))
    if finding.items:
        columns = finding_columns(finding)
        member = bool(columns) and columns[0].key in MEMBER_KEYS  # one row per rank or device
        parts.append(folded_table_html(columns, items_as_shown(finding.items, columns), finding.items_title or None,
                                       rows if member else None,
                                       finding.worst.get("items")))
    if finding.suggestion:
        parts.append(f'<p class="suggestion">→ {esc(finding.suggestion)}</p>')
    sev = finding.severity if finding.severity in ("info", "warning", "critical") else "info"
    opened = "" if sev == "info" else " open"
    return (f'<details class="finding {sev}" id="finding-{index}"{opened}><summary>'
            f'<span class="sev sev-{sev}">{esc(sev.upper())}</span> <span class="rule">{esc(finding.rule)}</span>: '
            f'{esc(finding.title)}</summary>{"".join(parts)}</details>')


def metadata_html(trace, budget: int | None = TABLE_ROWS) -> str:
    """The trace's metadata: id, source, format, tool, events per kind, devices, tags, run, warnings. More than
    ``budget + 1`` source files (a run's ranks) show the first ``budget`` and the rest under a fold."""
    meta = trace.meta
    rows: list[tuple[str, str]] = [("id", meta.id or trace.id or "")]
    run = (meta.extra or {}).get("run") if meta.format == "run" else None
    if run:
        rows.append(("run", f"{run.get('name') or ''} — world size {run.get('world_size', '?')}, "
                            f"{len(run.get('ranks') or {})} ranks stored"))
        on = (meta.extra or {}).get(RANK_HOSTS) or {}
        if on:
            rows.append(("hosts", hosts_line(on, len(run.get("ranks") or {}))))
    elif hosts(meta):
        rows.append(("host" if len(hosts(meta)) == 1 else "hosts", ", ".join(hosts(meta))))
    sources = list(meta.source_paths)
    rows.append(("source", "\n".join(sources if budget is None or len(sources) <= budget + 1 else sources[:budget])))
    rows.append(("format", " / ".join(x for x in (meta.format, meta.variant) if x)))
    if meta.tool or meta.tool_version:
        rows.append(("tool", " ".join(x for x in (meta.tool, meta.tool_version) if x)))
    kinds = trace.events.group_by(trace.events["kind"].cast(str).alias("k")).len().sort("k")
    per_kind = ", ".join(f"{k} {n:,}" for k, n in kinds.iter_rows())
    rows.append(("events", f"{trace.events.height:,}" + (f" ({per_kind})" if per_kind else "")))
    for d in meta.devices:
        bits = [d.name or "?"]
        if d.compute_capability:
            bits.append(f"sm {d.compute_capability}")
        if d.sm_count:
            bits.append(f"{d.sm_count} SMs")
        if d.memory_bytes:
            bits.append(fmt_unit("bytes_binary", d.memory_bytes))
        rows.append((f"device {d.id if d.id is not None else '?'}", ", ".join(bits)))
    if meta.distributed:
        info = meta.distributed
        rows.append(("distributed", ", ".join(f"{k.replace('_', ' ')} {info[k]}" for k in ("rank", "world_size", "backend")
                                               if info.get(k) is not None)))
    if meta.tags:
        rows.append(("tags", " ".join(f"{k}={v}" for k, v in sorted(meta.tags.items()))))
    for w in meta.warnings:
        rows.append(("warning", w))
    folded = {"source": _rest_of(sources, budget)}
    body = "".join(f"<dt>{esc(k)}</dt><dd>{'<br>'.join(esc(x) for x in v.splitlines()) or '-'}"
                   f"{folded.get(k, '')}</dd>" for k, v in rows)
    return f'<div class="card"><dl class="meta">{body}</dl></div>'


def _rest_of(lines: list[str], budget: int | None) -> str:
    """The lines a list folded to its first ``budget`` leaves out, under a fold that opens on a click ("and 248
    more"); nothing where the list is not folded."""
    if budget is None or len(lines) <= budget + 1:
        return ""
    rest = lines[budget:]
    return (f'<details class="all-rows"><summary>and {len(rest):,} more</summary>'
            f'{"<br>".join(esc(x) for x in rest)}</details>')


def _busy_card(summary: dict, busy) -> tuple[str, str]:
    """GPU busy; a TPU's busy time (its lanes) where the trace's devices are TPUs (the terminal summary's words)."""
    others, lanes = summary.get("other_devices") or {}, summary.get("lane_busy_pct")
    if busy is None and lanes is not None and len(others) == 1:
        noun = esc(next(iter(others)))
        return (f"{noun} busy", f'<div class="big">{esc(fmt_unit("pct", lanes))}</div>'
                                f'<div class="muted">of the devices&#39; {noun} span (first to last activity on '
                                f'their lanes)</div>')
    whole = "the GPU&#39;s span" if summary.get("gpu_devices", 1) <= 1 else "the mean GPU&#39;s span"  # the terminal's
    spin = spin_parts(summary)
    cut = esc(cut_left_out(summary))
    said = (f"of {whole} (first to last activity{cut}): {esc(spin_said(summary, spin))}" if busy is not None and spin
            else f"of {whole} (first to last activity{cut})" if busy is not None else
            f"no GPU work: the devices are {esc(', '.join(f'{n} {k}' for k, n in sorted(others.items())))}"
            if others else "no timed GPU activity")
    return ("GPU busy", f'<div class="big">{esc(fmt_unit("pct", busy)) if busy is not None else "-"}</div>'
                        f'<div class="muted">{said}</div>')


def summary_html(summary: dict, anchors: dict[tuple[str, str], int]) -> str:
    """The summary cards: span, GPU busy, steps, bottleneck, top categories, and the worst findings as links."""
    steps = summary.get("steps") or 0
    step_time = summary.get("step_time_ns")
    if steps and step_time is not None:
        spread = (f"{fmt_ns(summary['step_min_ns'])} – {fmt_ns(summary['step_max_ns'])}"
                  if summary.get("step_min_ns") is not None else "")
        steps_card = (f'<div class="big">{steps} × {esc(fmt_ns(step_time))}</div>'
                      f'<div class="muted">mean step; range {esc(spread)}'
                      f'{"; " + esc(summary["step_source"]) if summary.get("step_source") else ""}</div>')
    else:
        steps_card = '<div class="big">-</div><div class="muted">no steps marked</div>'
    busy = summary.get("gpu_busy_pct")
    bottleneck = summary.get("bottleneck")
    if bottleneck:
        at_stake = (f", {esc(fmt_ns(bottleneck['impact_ns']))} {esc(bottleneck.get('said') or 'lost')}"
                    f"{esc(mean_of(bottleneck.get('range'), summary.get('ranks') or 1))}"
                    if bottleneck.get("impact_ns") else "")
        link = anchors.get((bottleneck["rule"], bottleneck["title"]))
        name = esc(bottleneck["rule"])
        bottleneck_card = (f'<div class="big"><a href="#finding-{link}">{name}</a></div>' if link is not None
                           else f'<div class="big">{name}</div>')
        bottleneck_card += (f'<div class="muted"><span class="sev sev-{esc(bottleneck["severity"])}">'
                            f'{esc(bottleneck["severity"].upper())}</span> {esc(bottleneck["title"])}{at_stake}</div>')
    else:
        bottleneck_card = '<div class="big">none</div><div class="muted">no finding with time at stake</div>'
    top = summary.get("top_categories") or []
    cats = ", ".join(f"{esc(c['category'])} {esc(fmt_unit('pct', category_share_shown(c)))}" for c in top
                     if c.get("share_pct") is not None)
    cards = [
        ("span", f'<div class="big">{esc(fmt_ns(summary.get("span_ns")))}</div><div class="muted">'
                 f'{"first to last timed event" if summary.get("span_ns") is not None else "no timed events"}</div>'),
        _busy_card(summary, busy),
        ("steps", steps_card),
        ("bottleneck", bottleneck_card),
        ("top kernel categories", f'<div>{cats or "-"}</div>'),
    ]
    cards[4:4] = [(line["label"], f'<div>{esc(line["text"])}</div>') for line in summary.get("highlights") or []]
    procs = summary.get("gpu_processes") or {}
    if len(procs) > 1:  # one trace of a multi-process job (the terminal's "processes" line)
        each = "; ".join(f"pid {pid}: GPU {', '.join(map(str, devices))}" for pid, devices in list(procs.items())[:4])
        cards.insert(3, ("processes", f'<div class="big">{len(procs):,}</div><div class="muted">ran GPU work in '
                                      f'this one trace ({esc(each)}{"; ..." if len(procs) > 4 else ""}): not a run '
                                      "of ranks; figures are per GPU, and a step is every process&#39;s range of "
                                      "it taken together (consecutive steps can overlap by the processes&#39; "
                                      "skew)</div>"))
    out = "".join(f'<div class="card"><div class="label">{esc(label)}</div>{body}</div>' for label, body in cards)
    worst = summary.get("worst") or []
    items = []
    for w in worst:
        link = anchors.get((w["rule"], w["title"]))
        at_stake = f" — {esc(fmt_ns(w['impact_ns']))} at stake" if w.get("impact_ns") else ""
        text = f"{esc(w['rule'])}: {esc(w['title'])}"
        text = f'<a href="#finding-{link}">{text}</a>' if link is not None else text
        items.append(f'<li><span class="sev sev-{esc(w["severity"])}">{esc(w["severity"].upper())}</span> '
                     f'{text}{at_stake}</li>')
    worst_html = (f'<div class="card"><div class="label">worst findings</div><ul class="worst">{"".join(items)}</ul>'
                  f'</div>' if items else "")
    return f'<div class="cards" id="summary">{out}</div>{worst_html}'


def report_name(trace) -> str:
    """What the page is about: a run's name and directory, else the trace's source path (or its id)."""
    run = (trace.meta.extra or {}).get("run") if trace.meta.format == "run" else None
    if run:
        paths = trace.meta.source_paths
        folder = str(Path(os.path.commonpath(paths))) if len(paths) > 1 else (paths[0] if paths else "")
        return f"run {run.get('name') or trace.id}" + (f" ({folder})" if folder else "")
    return trace.meta.path or trace.id or ""


def render_page(trace, summary: dict, findings: list[Finding], charts: list, missing: list[str], plotly_js: str,
                figure_json: dict[str, str], version: str, rows: int | None = TABLE_ROWS) -> str:
    """The whole page. ``figure_json`` maps each chart's id to its plotly figure as JSON text; tables and lists
    longer than ``rows + 1`` are folded (:func:`folded_table_html`), None: never."""
    anchors: dict[tuple[str, str], int] = {}
    for i, f in enumerate(findings):
        anchors.setdefault((f.rule, f.title), i)
    chart_cards = "".join(
        f'<div class="card" id="{esc(c.id)}-card"><div class="chart-title">{esc(c.title)}</div><div class="chart-note">{esc(c.note)}</div>'
        f'<div class="chart" id="{esc(c.id)}" data-chart="{esc(c.id)}"></div></div>' for c in charts)
    missing_html = "".join(f"<li>{esc(m)}</li>" for m in missing)
    missing_html = f'<ul class="muted">{missing_html}</ul>' if missing else ""
    figures = "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in figure_json.items()) + "}"
    name = report_name(trace)
    counts = {s: sum(1 for f in findings if f.severity == s) for s in ("critical", "warning", "info")}
    silent = sum(1 for f in findings if is_quiet(f, summary.get("span_ns")))  # as the terminal's summary counts
    counts["info"] -= silent  # and not counted as findings, as the terminal's "11 findings: ..." line
    tally = ", ".join(f"{n} {'warnings' if s == 'warning' and n != 1 else s}" for s, n in counts.items() if n)
    if silent:
        tally += f"; {silent} rule{'s' if silent != 1 else ''} with nothing to report"
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>traceparse report: {esc(name)}</title>
<style>{STYLE}</style>
<script>{plotly_js}</script>
</head>
<body>
<header><h1>traceparse report</h1><div class="sub">{esc(name)}</div></header>
<main>
<h2>Summary</h2>
{summary_html(summary, anchors)}
<h2>Trace</h2>
{metadata_html(trace, rows)}
<h2>Charts</h2>
<div class="charts">{chart_cards}</div>
{missing_html}
<h2>Findings <span class="muted">({len(findings) - silent}{": " + esc(tally) if tally else ""})</span></h2>
<div id="findings">{"".join(finding_html(f, i, rows) for i, f in enumerate(findings))}</div>
<footer>Written by traceparse {esc(version)} on {esc(now)}. Self-contained: opens without a network.</footer>
</main>
<script type="application/json" id="figures">{script_json(figures)}</script>
<script>{BOOT}</script>
</body>
</html>
"""
